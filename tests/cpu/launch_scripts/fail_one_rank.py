"""Rank 1 fails in the way argv[1] names while rank 0 waits for it; used by test_launch.py.

Modes: raise-in-barrier, raise-in-recv, exit-3, kill-9 (rank 1 dies from SIGKILL), os-exit-5
(rank 1 leaves through os._exit(5)), raise-before-mpi (rank 1 raises before importing mpi4py;
rank 0 waits in a barrier), raise-beside-no-mpi (rank 1 raises; rank 0 never starts MPI and
sleeps), hang (nothing fails: both ranks say they are waiting, with their process ids, then rank 0
waits for rank 1 forever), kill-9-then-rank-0 (below).

kill-9-then-rank-0: rank 1 dies from SIGKILL, and rank 0 from SIGKILL a moment later, once the
launcher has a record of rank 1's death (or after RECORD_WAIT_S without one, as an older sok1x-run
gives). Rank 1 leaves a child of its own holding its output pipes and MPI connection open for
HOLD_S, so that mpiexec notices rank 0's death first: hydra's report then names rank 0, as it did
now and then in CI when the clean-up killed rank 0 close behind rank 1. Both ranks print
"rank R pids <process id> <parent's process id>" first, for the test to read mpiexec's report.
"""
import os
import signal
import sys
import time

RECORD_WAIT_S = 3.0
HOLD_S = 6.0

mode = sys.argv[1]
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


def say_pids():
    sys.stdout.write("rank %d pids %d %d\n" % (rank, os.getpid(), os.getppid()))
    sys.stdout.flush()


def wait_for_record_of_rank_1():
    """Returns once sok1x-run's status folder holds a failure of rank 1, or RECORD_WAIT_S on."""
    from sok1x.launch import job_status
    status_dir = job_status.status_dir_from_environment()
    deadline = time.monotonic() + RECORD_WAIT_S
    while time.monotonic() < deadline:
        if status_dir and any(r["rank"] == 1 for r in job_status.read_failures(status_dir)):
            return
        time.sleep(0.01)


if mode == "raise-beside-no-mpi":
    if rank == 1:
        raise RuntimeError("rank 1 broke while rank 0 never started MPI")
    time.sleep(600)
if mode == "raise-before-mpi" and rank == 1:
    raise RuntimeError("rank 1 broke before MPI")

from mpi4py import MPI  # noqa: E402

world = MPI.COMM_WORLD
if mode == "hang":
    sys.stdout.write("rank %d waiting, pids %d %d\n" % (world.Get_rank(), os.getpid(),
                                                        os.getppid()))
    sys.stdout.flush()
    if world.Get_rank() == 1:
        time.sleep(600)
if mode == "kill-9-then-rank-0":
    say_pids()
    world.Barrier()
    if world.Get_rank() == 1:
        if os.fork() == 0:
            time.sleep(HOLD_S)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    wait_for_record_of_rank_1()
    os.kill(os.getpid(), signal.SIGKILL)
if world.Get_rank() == 1:
    if mode in ("raise-in-barrier", "raise-in-recv"):
        raise ValueError("rank 1 broke on purpose")
    if mode == "exit-3":
        sys.exit(3)
    if mode == "kill-9":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "os-exit-5":
        os._exit(5)
if mode == "raise-in-recv":
    world.recv(source=1)
else:
    world.Barrier()
print("rank %d finished" % world.Get_rank(), flush=True)
