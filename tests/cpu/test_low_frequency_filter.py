"""sok1x.lookup_sparse(..., use_low_frequency_filter=True) on DynamicVariables
(jobs/low_frequency_filter_job.py) against stock TensorFlow, at 1, 2 and 4 ranks and through both
seams; the keys a table admits do not depend on the rank count (DESIGN D10)."""
import os

from mpi_jobs import run_job


def _admitted(ranks, seam, monkeypatch):
    monkeypatch.setitem(os.environ, "SOK1X_SEAM", seam)
    result = run_job(ranks, "low_frequency_filter_job.py", timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "LOW FREQUENCY FILTER OK" in result.stdout
    return [line for line in result.stdout.splitlines() if line.startswith("ADMITTED ")]


def test_low_frequency_filter_on_any_rank_count(monkeypatch):
    one = _admitted(1, "dlpack", monkeypatch)
    assert len(one) == 1
    for ranks, seam in [(2, "dlpack"), (4, "dlpack"), (2, "host")]:
        assert _admitted(ranks, seam, monkeypatch) == one, (ranks, seam)
