"""sok1x-run: start a sok1x job under MPI and make it fail as a whole when one rank fails.

`sok1x-run -np N script.py [args]` (or `python -m sok1x.launch ...`) finds mpiexec, adds the flags
the MPI flavour needs and runs every rank through `sok1x.launch.rank_guard`, which turns an uncaught
exception on one rank into an MPI abort of the whole job. The launcher watches the job as well:
each rank's guard runs the script in a child process and records how and when it ended
(rank_watch), so a rank that fails before MPI is up, or dies from a signal or os._exit, also ends
the job, and the last line the launcher prints names the first rank that failed, even where
mpiexec's own report names another. Plain `mpiexec -np N python script.py` keeps working: sok1x
itself never needs this package. Nothing here imports TensorFlow.
"""
