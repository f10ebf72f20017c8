"""A sok1x.Variable's shape, reads and writes as SOK's TF2 programs see them executing eagerly
(jobs/variable_face_job.py), against a stock tf.Variable holding SOK's shard, at 1, 2 and 4
ranks and through both seams. tests/mpi/test_variable_faces.py checks graph mode."""
import pytest
from mpi_jobs import run_passing_job, skip_before_tensorflow


@pytest.mark.parametrize("ranks,seam", [(1, "dlpack"), (2, "dlpack"), (4, "dlpack"),
                                        (2, "host")])
def test_variable_faces(ranks, seam):
    skip_before_tensorflow((2, 0), "TensorFlow 2 eager execution (SOK's TF2 programs' variables)")
    run_passing_job(ranks, seam, "variable_face_job.py", "VARIABLE FACES OK")
