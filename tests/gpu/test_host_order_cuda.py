"""The order in which the row kernels walk a split (hybrid) table's rows (backend/cuda_host_order):
a permutation of the batch with device rows first and host rows in ascending regions, and row
ops on split arrays that give, walked in that order, what NumPy gives on the whole table and
what the same ops give walked as given. Needs a GPU and PyCUDA.
"""
import numpy as np
import pytest

pytest.importorskip("pycuda")

from sok1x.backend import cpu  # noqa: E402
from sok1x.backend.cuda import context as cuda_context  # noqa: E402
from sok1x.backend.cuda import host_row_order as cuda_host_order  # noqa: E402
from sok1x.backend import random_init  # noqa: E402
from sok1x.engine.tables import hybrid_rows  # noqa: E402

CAPACITY = 20000
HBM_ROWS = 3000  # 17,000 host rows: regions of 16 rows, so a region holds several of a batch
ROW_BYTES = 16  # the order tests' rows: 4 float32


@pytest.fixture(autouse=True)
def any_host_part():
    """Orders host parts of any size (the default orders only large ones), cut into regions of
    at least 256 bytes (16 rows of the 4-float tables; the default regions are larger than
    these tables' host parts)."""
    before = cuda_host_order.MIN_HOST_BYTES, cuda_host_order.REGION_BYTES
    cuda_host_order.MIN_HOST_BYTES, cuda_host_order.REGION_BYTES = 0, 16 * ROW_BYTES
    yield
    cuda_host_order.MIN_HOST_BYTES, cuda_host_order.REGION_BYTES = before


def _split(cuda, table):
    values = hybrid_rows.SplitRows(cuda, table.shape, np.float32, HBM_ROWS)
    hybrid_rows.put_rows(cuda, values, cuda.asarray(np.arange(table.shape[0])), table)
    return values


def _whole(cuda, values):
    return cuda.to_host(hybrid_rows.gather_rows(cuda, values,
                                                cuda.asarray(np.arange(values.shape[0]))))


def _region(rows, zero_negative=False, valid=None):
    """Each position's region as host_order.cu defines it (0: no host row)."""
    host_rows = CAPACITY - HBM_ROWS
    shift = cuda_host_order._region_shift(host_rows, ROW_BYTES)
    rows = rows.copy()
    if not zero_negative:
        rows[rows < 0] += CAPACITY
    region = np.where((rows >= HBM_ROWS) & (rows < CAPACITY), 1 + ((rows - HBM_ROWS) >> shift), 0)
    if valid is not None:
        region[valid:] = 0
    return region


@pytest.mark.parametrize("zero_negative,valid", [(False, None), (True, None), (False, 5000)])
def test_the_order_is_a_permutation_with_host_rows_in_ascending_regions(cuda, rng, zero_negative,
                                                                       valid):
    rows = rng.integers(-50, CAPACITY, size=9000).astype(np.int64)
    order = _ordered(cuda, rows, zero_negative, valid)
    assert np.array_equal(np.sort(order), np.arange(rows.shape[0]))
    regions = _region(rows, zero_negative, valid)[order]
    assert (np.diff(regions) >= 0).all(), "regions out of order"
    assert cuda_host_order._region_shift(CAPACITY - HBM_ROWS, ROW_BYTES) == 4
    assert np.unique(regions).shape[0] > 500, "too few regions to test the grouping"
    # the counts hold one more than the highest region a host row can get
    assert cuda_host_order._region_count(CAPACITY - HBM_ROWS, 4) == _region(
        np.arange(CAPACITY, dtype=np.int64)).max() + 1


@pytest.mark.parametrize("region_bytes,max_regions,shift", [(ROW_BYTES, 1 << 20, 0),
                                                            (3 * ROW_BYTES, 1 << 20, 2),
                                                            (ROW_BYTES, 64, 9)])
def test_regions_are_as_long_as_asked_and_as_many_as_allowed(cuda, rng, region_bytes,
                                                             max_regions, shift):
    """One row a region (17,002 regions: a scan of several tiles) orders every host row by its
    address; with at most 64 regions, 2^9 rows make one (17,000 >> 9 = 33)."""
    before = cuda_host_order.REGION_BYTES, cuda_host_order.MAX_REGIONS
    cuda_host_order.REGION_BYTES, cuda_host_order.MAX_REGIONS = region_bytes, max_regions
    try:
        assert cuda_host_order._region_shift(CAPACITY - HBM_ROWS, ROW_BYTES) == shift
        rows = rng.integers(-50, CAPACITY, size=9000).astype(np.int64)
        order = _ordered(cuda, rows, True, None)
    finally:
        cuda_host_order.REGION_BYTES, cuda_host_order.MAX_REGIONS = before
    assert np.array_equal(np.sort(order), np.arange(rows.shape[0]))
    assert cuda_host_order._region_count(CAPACITY - HBM_ROWS, shift) == 2 + (
        (CAPACITY - HBM_ROWS - 1) >> shift)
    host = np.where(rows >= HBM_ROWS, rows - HBM_ROWS, -1)[order]
    assert (np.diff(host >> shift) >= 0).all(), "host rows out of address order"
    if shift == 0:
        assert (host[:-1] <= host[1:]).all()


def _ordered(cuda, rows, zero_negative, valid):
    """host_order's order of `rows` of a split table of CAPACITY rows, HBM_ROWS on the device."""
    values = _split(cuda, np.zeros((CAPACITY, 4), np.float32))
    count = None if valid is None else cuda.asarray(np.array([valid], np.uint64))
    with cuda_context.entered():
        order = cuda_host_order.host_order(
            values, cuda.asarray(rows), zero_negative=zero_negative,
            count_ptr=0 if count is None else int(count.gpudata))
    return cuda.to_host(order)


def test_a_groups_rows_split_per_member_are_ordered_by_their_host_address(cuda, rng):
    """A table group's rows split per member (hybrid_rows.GroupedRows): the order puts the
    device rows (and rows -1) first, then the host rows by their place in the host block."""
    rows, hbm = [4000, 0, 9000, 3000, 7000], [1000, 0, 1, 3000, 2500]
    values = hybrid_rows.GroupedRows(cuda, rows, hbm, (4,), np.float32)
    total = sum(rows)
    batch = rng.integers(-1, total, size=12000).astype(np.int64)
    with cuda_context.entered():
        order = cuda.to_host(cuda_host_order.host_order(values, cuda.asarray(batch),
                                                        zero_negative=True))
    assert np.array_equal(np.sort(order), np.arange(batch.shape[0]))
    starts = np.concatenate([[0], np.cumsum(rows)])
    host_starts = np.concatenate([[0], np.cumsum(np.subtract(rows, hbm))])
    member = np.searchsorted(starts, batch, side="right") - 1
    local = batch - starts[np.maximum(member, 0)]
    in_host = (batch >= 0) & (local >= np.asarray(hbm)[np.maximum(member, 0)])
    place = np.where(in_host, host_starts[np.maximum(member, 0)] + local
                     - np.asarray(hbm)[np.maximum(member, 0)], -1)
    shift = cuda_host_order._region_shift(int(values.shape[0]) - values.hbm_rows, ROW_BYTES)
    regions = np.where(place >= 0, 1 + (place >> shift), 0)[order]
    assert (np.diff(regions) >= 0).all(), "host rows out of address order"
    assert np.unique(regions).shape[0] > 500, "too few regions to test the grouping"


def test_a_table_that_is_not_split_or_has_a_small_host_part_gets_no_order(cuda):
    plain = cuda.zeros((10, 4), np.float32)
    whole = hybrid_rows.SplitRows(cuda, (10, 4), np.float32, 10)  # every row on the device
    split = hybrid_rows.SplitRows(cuda, (10, 4), np.float32, 6)  # 4 host rows of 16 bytes
    rows = cuda.asarray(np.arange(10))
    with cuda_context.entered():
        for table in (plain, whole):
            assert cuda_host_order.host_order(table, rows) is None
        assert cuda_host_order.host_order(split, rows) is not None
        cuda_host_order.MIN_HOST_BYTES = 4 * 16 + 1
        assert cuda_host_order.host_order(split, rows) is None
        cuda_host_order.MIN_HOST_BYTES = 4 * 16
        assert cuda_host_order.host_order(split, rows) is not None


def test_an_ordered_walk_launches_as_walk_blocks_says(cuda, rng, monkeypatch):
    """A gather walking a split table's order launches a thread a 16-byte word (WALK_BLOCKS 0),
    at most n blocks (n), or launch()'s grid (-1); a walk as given, launch()'s grid."""
    from sok1x.backend.cuda import rows as cuda_rows
    values = _split(cuda, np.zeros((CAPACITY, 64), np.float32))  # 16 words of 16 bytes a row
    rows = cuda.asarray(rng.integers(0, CAPACITY, size=9000).astype(np.int64))
    launched, real = [], cuda_rows.launch
    monkeypatch.setattr(cuda_rows, "launch", lambda *a, **k: (launched.append(k.get("blocks")),
                                                               real(*a, **k)))
    for blocks in (0, 5, -1):
        with cuda_host_order.walked_by(blocks):
            cuda.gather_rows(values, rows)
    with cuda_host_order.walked_as_given():
        cuda.gather_rows(values, rows)
    assert launched == [-(-9000 * 16 // 256), 5, None, None]


@pytest.mark.parametrize("dim,walk_blocks", [(1, 0), (8, 0), (64, 0), (100, 0), (8, 3), (64, 5),
                                             (100, -1)])
def test_row_ops_on_split_rows_equal_numpy_and_the_unordered_walk(cuda, rng, dim, walk_blocks):
    """walk_blocks: the ordered walks' blocks (host_row_order.WALK_BLOCKS; 0: a thread an item,
    3 and 5: each thread walks many rows of the batch, -1: launch()'s grid)."""
    table = rng.standard_normal((CAPACITY, dim)).astype(np.float32)
    rows = rng.permutation(CAPACITY)[:8000].astype(np.int64)  # distinct, for put and update
    looked_up = np.concatenate([rows, [-1, -1], rng.integers(0, CAPACITY, size=500)])
    src = rng.standard_normal((rows.shape[0], dim)).astype(np.float32)
    grads = rng.standard_normal((rows.shape[0], dim)).astype(np.float32)
    keys = rng.integers(0, 2 ** 62, size=rows.shape[0]).astype(np.int64)
    spec = random_init.make_spec("uniform", -0.05, 0.05, 11)

    expected = np.where((looked_up >= 0)[:, None], table[looked_up], 0)
    ordered, unordered = _split(cuda, table), _split(cuda, table)
    for values, walk in ((ordered, lambda: cuda_host_order.walked_by(walk_blocks)),
                         (unordered, cuda_host_order.walked_as_given)):
        with walk():
            gathered = cuda.to_host(cuda.gather_rows(values, cuda.asarray(looked_up)))
            assert np.array_equal(gathered, expected)
            taken = cuda.to_host(cuda.take_rows(values, cuda.asarray(np.array([-3, 5, HBM_ROWS]))))
            assert np.array_equal(taken, table[[-3, 5, HBM_ROWS]])
            cuda.put_rows(values, cuda.asarray(rows[:3000]), cuda.asarray(src[:3000]))
            cuda.init_rows(values, cuda.asarray(rows[3000:6000]), cuda.asarray(keys[3000:6000]),
                           spec, 5)
            accum = _split(cuda, np.full((CAPACITY, dim), 0.1, np.float32))
            cuda.update_adagrad(values, accum, cuda.asarray(rows), cuda.asarray(grads), 0.1, 1e-7)
            values.accum = _whole(cuda, accum)

    reference = table.copy()
    reference[rows[:3000]] = src[:3000]
    cpu.init_rows(reference, rows[3000:6000], keys[3000:6000], spec, 5)
    accum = np.full((CAPACITY, dim), 0.1, np.float32)
    cpu.update_adagrad(reference, accum, rows, grads, 0.1, 1e-7)
    # The same kernel on the same element: the walk changes no bit.
    assert np.array_equal(_whole(cuda, ordered), _whole(cuda, unordered))
    assert np.array_equal(ordered.accum, unordered.accum)
    # Against NumPy: init and put exactly (untouched rows too), the update to float rounding
    # (the kernel may fuse a multiply and an add).
    untouched = np.setdiff1d(np.arange(CAPACITY), rows)
    assert np.array_equal(_whole(cuda, ordered)[untouched], table[untouched])
    np.testing.assert_allclose(_whole(cuda, ordered), reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ordered.accum, accum, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n,count", [(1, 1), (5000, 3000), (5000, 0)])
def test_init_rows_with_a_count_writes_the_counted_rows_only(cuda, rng, n, count):
    """init_rows walked in order writes the first `count` rows and no other, with the count as a
    NumPy array (copied to the device for the call) or as a device array."""
    table = rng.standard_normal((CAPACITY, 8)).astype(np.float32)
    rows = rng.permutation(CAPACITY)[:n].astype(np.int64)
    keys = rng.integers(0, 2 ** 62, size=n).astype(np.int64)
    spec = random_init.make_spec("uniform", -0.05, 0.05, 11)
    reference = table.copy()
    cpu.init_rows(reference, rows, keys, spec, 5, np.array([count], np.uint64))
    for as_numpy in (True, False):
        values = _split(cuda, table)
        counted = np.array([count], np.uint64)
        cuda.init_rows(values, cuda.asarray(rows), cuda.asarray(keys), spec, 5,
                       counted if as_numpy else cuda.asarray(counted))
        assert np.array_equal(_whole(cuda, values), reference)
