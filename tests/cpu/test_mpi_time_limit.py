"""An MPI test of tests/mpi that passes its time limit (--timeout) ends the job with every rank's
threads printed, past pytest's capture: the test that hung and where each rank waits. Here one
rank waits on a lock it holds itself, inside a weak reference's callback that a collection runs
(as a 2-rank CI job once hung), while the other waits in a barrier for it. With pytest-timeout's
own ways the hung rank's threads were never shown: its signal is swallowed by that callback (the
rank then goes on) and is not handled while a rank waits in a collective, and its thread way
fails on the ranks that have no terminal reporter. (The CI job that hung ended without a
line.)"""
import os
import re
import shutil
import sys
import textwrap

from mpi_jobs import lane_a_only, mpiexec, run_stoppable

MPI_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mpi")

HANGING_TEST = """
    import gc
    import threading
    import weakref

    from mpi4py import MPI


    class Holder:
        pass


    def test_one_rank_waits_on_itself_in_a_collection():
        if MPI.COMM_WORLD.Get_rank() == 1:
            lock = threading.Lock()
            holder = Holder()
            holder.itself = holder
            reference = weakref.ref(holder, lambda _: lock.acquire())  # noqa: F841
            del holder
            with lock:
                gc.collect()  # the wait of rank 1
        MPI.COMM_WORLD.Barrier()  # the wait of rank 0
    """


@lane_a_only("it runs no TensorFlow and no sok1x")
def test_a_test_past_its_time_limit_ends_the_job_with_every_ranks_threads(tmp_path):
    shutil.copy(os.path.join(MPI_TESTS, "conftest.py"), str(tmp_path))
    (tmp_path / "test_hangs.py").write_text(textwrap.dedent(HANGING_TEST))
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "pytest", "-q", "-p",
               "no:cacheprovider", "--timeout=5", str(tmp_path)]
    finished = run_stoppable(command, dict(os.environ), timeout=120)
    output = finished.stdout + finished.stderr
    assert finished.returncode != 0, finished.explain()
    for rank in (0, 1):
        header = (r"rank %d of 2: \S*test_hangs\.py::test_one_rank_waits_on_itself_in_a_"
                  r"collection passed its time limit of 5 s" % rank)
        assert re.search(header, output), finished.explain()
    # faulthandler names files and lines: both waits' lines are in the stacks
    lines = textwrap.dedent(HANGING_TEST).splitlines()
    for wait in ("the wait of rank 1", "the wait of rank 0"):
        number = next(i for i, line in enumerate(lines, 1) if wait in line)
        assert 'test_hangs.py", line %d' % number in output, finished.explain()
