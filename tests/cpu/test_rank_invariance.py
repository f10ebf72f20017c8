"""D10: with the global batch split over ranks, an N-rank job computes what a 1-rank job does."""
import numpy as np
import pytest
from mpi_jobs import lane_a_only, run_job

pytestmark = lane_a_only("outputs over rank counts; lane B's MPI suites compare 1, 2 and 4 ranks")


def outputs_of(ranks, folder):
    folder.mkdir()
    result = run_job(ranks, "lookup_job.py", folder)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    parts = [np.load(str(folder / ("rank%d.npz" % r))) for r in range(ranks)]
    return {name: np.concatenate([p[name] for p in parts]) for name in ("dense", "sparse")}


@pytest.mark.parametrize("ranks", [2, 4])
def test_n_ranks_give_the_one_rank_outputs(tmp_path, ranks):
    single = outputs_of(1, tmp_path / "one")
    several = outputs_of(ranks, tmp_path / "several")
    np.testing.assert_array_equal(several["dense"], single["dense"])
    np.testing.assert_allclose(several["sparse"], single["sparse"], rtol=1e-6, atol=1e-7)
    assert np.abs(single["dense"]).max() <= 0.05  # SOK's default: uniform in [-0.05, 0.05]
    assert np.unique(single["dense"]).size > 100
