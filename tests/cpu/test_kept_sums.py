"""backend.sums_kept (backend/kept_sums.py): the cpu backend writes every row of a segment_sum
whatever is bound, so its results equal the unbound ones; an array of another length or dtype
is refused on both backends alike (cuda's kernels are tested in tests/gpu)."""
import numpy as np
import pytest

from sok1x.backend import cpu


def test_a_bound_array_changes_no_sum_and_a_wrong_one_is_refused():
    rng = np.random.default_rng(5)
    values = rng.standard_normal((300, 8)).astype(np.float32)
    ids = rng.integers(-2, 40, size=300)
    want = cpu.segment_sum(values, ids, 50)
    dirty = np.zeros(50, np.int8)  # "every row holds zeros": the cpu backend zeros them anyway
    with cpu.sums_kept(dirty):
        got = cpu.segment_sum(values, ids, 50)
    assert np.array_equal(got, want)
    for wrong in (np.zeros(49, np.int8), np.zeros(50, np.int64)):
        with pytest.raises(ValueError, match="sums_kept: a sum into 50 rows"):
            with cpu.sums_kept(wrong):
                cpu.segment_sum(values, ids, 50)
    assert np.array_equal(cpu.segment_sum(values, ids, 50), want)  # nothing bound after
