"""Communication: the process group (MPI COMM_WORLD) and the collectives sok1x exchanges data with.

`mpi` moves NumPy buffers (the cpu backend, and every small host-side exchange such as counts and
error flags); `nccl` moves device buffers (the cuda backend). Both offer the same collectives with
the same argument order, so the engine's algorithms are written once.
"""
from sok1x.comm.process_group import keep_ucx_memory_events_off

keep_ucx_memory_events_off()  # before anything loads MPI (process_group.py says why)
