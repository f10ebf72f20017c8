"""optimizer.get_slot(var, name) of sok1x variables as SOK's TF2 programs read and write it
(jobs/slot_view_job.py), against stock TensorFlow's slots, at 1, 2 and 4 ranks and through both
seams."""
import pytest
from mpi_jobs import run_passing_job, skip_before_tensorflow


@pytest.mark.parametrize("ranks,seam", [(1, "dlpack"), (2, "dlpack"), (4, "dlpack"),
                                        (2, "host")])
def test_slot_views(ranks, seam):
    skip_before_tensorflow((2, 11), "tf.keras.optimizers.legacy (SOK's TF2 programs' optimizers)")
    run_passing_job(ranks, seam, "slot_view_job.py", "SLOT VIEWS OK")
