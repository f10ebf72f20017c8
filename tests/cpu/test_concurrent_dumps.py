"""Jobs that sok1x.dump into one folder at the same time keep each other's tables and leave no
file that no manifest names (DESIGN D8), as real MPI jobs: a 1-rank and a 2-rank job dump
their own three tables into one folder, starting at the same moment, round after round; then a
job loads all six and finds each as its job's last round left it, and every dump file in the
folder is one the manifest names. In both formats: SOK's files (sok.dump's default for these
sok1x.Variable tables; SOK's reader reads each table's last round too) and sharded."""
import os
import subprocess
import sys

import pytest

from mpi_jobs import JOBS, mpiexec, run_job, skip_before_tensorflow

JOB = "concurrent_dump_job.py"
ROUNDS = 25


def _start(ranks, *args):
    command = [mpiexec(), "-n", str(ranks), sys.executable, os.path.join(JOBS, JOB)]
    return subprocess.Popen(command + [str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


@pytest.mark.parametrize("file_format", ["sok", "sharded"])
def test_concurrent_dumps_into_one_folder_keep_every_table(tmp_path, file_format):
    # The jobs dump round after round through sok1x's eager v2 calls (the folder's lock is the
    # engine's, whatever the TensorFlow; test_sharded_checkpoint covers dumps in graph mode).
    skip_before_tensorflow((2, 0), "eager execution (the jobs run SOK's v2 calls at once)")
    folder, start = str(tmp_path / "dumps"), tmp_path / "start"
    start.mkdir()  # the jobs' ready files: both start their rounds once both are up
    jobs = {"alpha": _start(1, "dump", file_format, folder, "alpha", start, 2, ROUNDS),
            "beta": _start(2, "dump", file_format, folder, "beta", start, 2, ROUNDS)}
    for tag, job in jobs.items():
        stdout, stderr = job.communicate(timeout=240)
        assert job.returncode == 0 and "DUMPED " + tag in stdout, stdout + stderr[-4000:]
    for ranks in (1, 2):
        check = run_job(ranks, JOB, "check", file_format, folder, ROUNDS, "alpha", "beta")
        assert check.returncode == 0 and "CHECKED" in check.stdout, (
            check.stdout + check.stderr[-4000:])
