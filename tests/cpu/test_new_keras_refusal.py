"""TF 2.11+ Keras optimizers that sok1x (and SOK) refuse on its variables
(jobs/new_keras_refusal_job.py): a clear error on every rank, the table unchanged, at 1, 2 and
4 ranks and through both seams."""
import pytest
from mpi_jobs import run_passing_job, skip_before_tensorflow


@pytest.mark.parametrize("ranks,seam", [(1, "dlpack"), (2, "dlpack"), (4, "dlpack"),
                                        (2, "host")])
def test_new_keras_refusal(ranks, seam):
    skip_before_tensorflow((2, 11), "new Keras optimizers (the ones sok1x refuses)")
    run_passing_job(ranks, seam, "new_keras_refusal_job.py", "NEW KERAS REFUSAL OK")
