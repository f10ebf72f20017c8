"""SOK's v2 API executing eagerly (TF2, tf.GradientTape), in MPI jobs of their own: seed 003's
program, SOK's v2 SGD check and OptimizerWrapper around tf.keras optimizers (jobs/v2_eager_job.py),
and the idioms of SOK's own TF2 scripts (jobs/sok_eager_idioms_job.py), at 2 and 4 ranks."""
import pytest
from mpi_jobs import run_passing_job, skip_before_tensorflow

TF2_EAGER = "TensorFlow 2 eager execution (SOK's v2 API executing eagerly, tf.GradientTape)"

STEPS = 30  # SOK's check runs 100; 30 here for CI time (100 pass too)


# CI time: no 1-rank job (tests/mpi runs the check at 1 rank in graph mode, and the eager code
# path does not depend on the rank count); host staging at 2 ranks only (its eager path differs
# from zero-copy only in how inputs cross).
@pytest.mark.parametrize("ranks,seam", [(2, "dlpack"), (4, "dlpack"), (2, "host")])
def test_v2_api_eagerly(ranks, seam):
    skip_before_tensorflow((2, 0), TF2_EAGER)
    run_passing_job(ranks, seam, "v2_eager_job.py", "V2 EAGER OK", STEPS, timeout=240)


@pytest.mark.parametrize("ranks,seam", [(2, "dlpack"), (4, "dlpack"), (2, "host")])
def test_sok_scripts_eager_idioms(ranks, seam):
    skip_before_tensorflow((2, 0), TF2_EAGER)
    run_passing_job(ranks, seam, "sok_eager_idioms_job.py", "SOK EAGER IDIOMS OK", timeout=240)
