"""An optimizer's step count survives a restart executing eagerly (TF2): Adam on a schedule,
stopped, restored in a new process by tf.train.Checkpoint of the optimizer or sok.dump /
sok.load with it, trains on as the job that never stopped (jobs/optimizer_restart_job.py), at
1 and 2 ranks. Graph mode: tests/mpi/test_optimizer_restarts.py."""
import shutil
import tempfile

import pytest
from mpi_jobs import run_passing_job, skip_before_tensorflow


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_job_restarted_eagerly_trains_as_one_that_never_stopped(ranks):
    skip_before_tensorflow((2, 11), "TF 2.11+ Keras optimizer (the twin's) executing eagerly")
    folder = tempfile.mkdtemp(prefix="sok1x-restarts-")
    try:
        run_passing_job(ranks, "dlpack", "optimizer_restart_job.py", "", "first", folder,
                        timeout=300)
        run_passing_job(ranks, "dlpack", "optimizer_restart_job.py", "OPTIMIZER RESTARTS OK",
                        "rest", folder, timeout=300)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
