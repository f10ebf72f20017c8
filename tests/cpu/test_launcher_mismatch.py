"""A process that MPI sees as a job of one while its launcher started several (horovodrun with
Gloo) fails at sok1x's Init with advice, instead of training every table alone."""
import os
import subprocess
import sys

from mpi_jobs import mpiexec

BRING_UP = "import sok1x; sok1x.init(backend='cpu'); print('UP%d' % sok1x.num_gpus())"


def _bring_up(ranks, **environment):
    command = [sys.executable, "-c", BRING_UP]
    if ranks:
        command = [mpiexec(), "-n", str(ranks)] + command
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **environment)
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120, env=env)


def test_a_job_of_one_that_horovodrun_counts_as_two_fails_with_advice():
    result = _bring_up(0, HOROVOD_SIZE="2", HOROVOD_RANK="1")
    assert result.returncode != 0 and "UP" not in result.stdout, result.stdout
    assert "HOROVOD_SIZE=2" in result.stderr and "mpiexec -n 2" in result.stderr, \
        result.stderr[-2000:]


def test_the_same_count_from_mpi_and_the_launcher_comes_up():
    result = _bring_up(2, HOROVOD_SIZE="2")
    # Both ranks came up as a job of two (their lines may interleave on the launcher's stdout).
    assert result.returncode == 0 and "UP2" in result.stdout, result.stderr[-2000:]
    assert "UP1" not in result.stdout, result.stdout
    alone = _bring_up(0, HOROVOD_SIZE="1")
    assert alone.returncode == 0 and "UP1" in alone.stdout, alone.stderr[-2000:]
