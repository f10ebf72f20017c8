"""A sok1x.Variable's shape, reads and writes as SOK's TF2 programs see them executing eagerly
(jobs/variable_face_job.py), against a stock tf.Variable holding SOK's shard, at 1, 2 and 4
ranks and through both seams. tests/mpi/test_variable_faces.py checks graph mode."""
import os

import pytest
from mpi_jobs import run_job


@pytest.mark.parametrize("ranks,seam", [(1, "dlpack"), (2, "dlpack"), (4, "dlpack"),
                                        (2, "host")])
def test_variable_faces(ranks, seam, monkeypatch):
    monkeypatch.setitem(os.environ, "SOK1X_SEAM", seam)
    result = run_job(ranks, "variable_face_job.py", timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "VARIABLE FACES OK" in result.stdout
