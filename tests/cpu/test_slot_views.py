"""optimizer.get_slot(var, name) of sok1x variables as SOK's TF2 programs read and write it
(jobs/slot_view_job.py), against stock TensorFlow's slots, at 1, 2 and 4 ranks and through both
seams."""
import os

import pytest
from mpi_jobs import run_job


@pytest.mark.parametrize("ranks,seam", [(1, "dlpack"), (2, "dlpack"), (4, "dlpack"),
                                        (2, "host")])
def test_slot_views(ranks, seam, monkeypatch):
    monkeypatch.setitem(os.environ, "SOK1X_SEAM", seam)
    result = run_job(ranks, "slot_view_job.py", timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "SLOT VIEWS OK" in result.stdout
