"""DeepRec's collective strategy brings Horovod up where Horovod is installed, and a failing job
with Horovod imported ends with its error within seconds (before, a one-rank job whose Horovod
brought MPI up hung in MPI_Abort's exit for good, deaf to SIGTERM)."""
import os
import re
import sys

import pytest
from mpi_jobs import JOBS, mpiexec, run_stoppable

pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed in this environment")

JOB = os.path.join(JOBS, "horovod_collective_job.py")
FAIL_LIMIT_S = 30  # the job ends in about 3 s; it used to hang for ever


def _run(ranks, mode, timeout):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return run_stoppable([mpiexec(), "-n", str(ranks), sys.executable, JOB, mode], env, timeout)


@pytest.mark.parametrize("ranks", [1, 2])
def test_collective_strategy_brings_horovod_up(ranks):
    done = _run(ranks, "up", 120)
    assert done.returncode == 0, done.explain()
    # found anywhere in the stream: two ranks' lines can still meet without a newline between
    lines = sorted(re.findall(r"hvd \d+ of \d+; mpi \d+ of \d+", done.stdout))
    assert lines == ["hvd %d of %d; mpi %d of %d" % (r, ranks, r, ranks) for r in range(ranks)]
    assert done.stdout.count("again %d" % ranks) == ranks, done.explain()


@pytest.mark.parametrize("ranks", [1, 2])
def test_failing_job_with_horovod_exits_with_its_error(ranks):
    done = _run(ranks, "fail", FAIL_LIMIT_S)  # raises JobHung past the limit
    assert done.returncode != 0, done.explain()
    assert "RuntimeError: the program's own error" in done.stderr, done.explain()
    assert "sok1x: rank 0 failed: RuntimeError" in done.stderr, done.explain()
