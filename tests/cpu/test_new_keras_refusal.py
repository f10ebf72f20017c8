"""TF 2.11+ Keras optimizers that sok1x (and SOK) refuse on its variables
(jobs/new_keras_refusal_job.py): a clear error on every rank, the table unchanged, at 1, 2 and
4 ranks and through both seams."""
import os

import pytest
from mpi_jobs import run_job


@pytest.mark.parametrize("ranks,seam", [(1, "dlpack"), (2, "dlpack"), (4, "dlpack"),
                                        (2, "host")])
def test_new_keras_refusal(ranks, seam, monkeypatch):
    monkeypatch.setitem(os.environ, "SOK1X_SEAM", seam)
    result = run_job(ranks, "new_keras_refusal_job.py", timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "NEW KERAS REFUSAL OK" in result.stdout
