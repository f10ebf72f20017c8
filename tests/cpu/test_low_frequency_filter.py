"""sok1x.lookup_sparse(..., use_low_frequency_filter=True) on DynamicVariables
(jobs/low_frequency_filter_job.py) against stock TensorFlow, at 1, 2 and 4 ranks and through both
seams; the keys a table admits do not depend on the rank count (DESIGN D10)."""
from mpi_jobs import run_passing_job


def _admitted(ranks, seam):
    result = run_passing_job(ranks, seam, "low_frequency_filter_job.py", "LOW FREQUENCY FILTER OK")
    return [line for line in result.stdout.splitlines() if line.startswith("ADMITTED ")]


def test_low_frequency_filter_on_any_rank_count():
    one = _admitted(1, "dlpack")
    assert len(one) == 1
    for ranks, seam in [(2, "dlpack"), (4, "dlpack"), (2, "host")]:
        assert _admitted(ranks, seam) == one, (ranks, seam)
