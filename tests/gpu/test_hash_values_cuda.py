"""HashIndex.find_or_insert_values on the GPU (one kernel: find, place, initialise, copy out)
against the cpu backend's (find_or_insert, init_rows, gather_rows) and against the cuda
backend's own three ops, on fresh random keys with repeats within a call and held keys among
them. Needs a GPU and PyCUDA.
"""
import numpy as np
import pytest

pytest.importorskip("pycuda")

from sok1x.backend import cpu  # noqa: E402
from sok1x.backend import random_init  # noqa: E402
from sok1x.engine.tables import hybrid_rows  # noqa: E402

KEY_LIMIT = 2 ** 62
CAPACITY = 6000


@pytest.fixture(autouse=True)
def ordered_host_rows():
    """Split tables' host rows take the ordered second pass (hash_settle_host_rows) whatever
    their size (by default only host parts of 512 MiB or more do)."""
    from sok1x.backend.cuda import host_row_order as cuda_host_order
    cuda_host_order.MIN_HOST_BYTES, before = 0, cuda_host_order.MIN_HOST_BYTES
    yield
    cuda_host_order.MIN_HOST_BYTES = before


def _keys(rng, n, distinct):
    pool = rng.integers(0, KEY_LIMIT, size=distinct, dtype=np.int64)
    return pool[rng.integers(0, distinct, size=n)]


def _row_of(keys, rows):
    return dict(zip(keys.tolist(), rows.tolist()))


def _values(cuda, table, hbm_rows):
    """A cuda row array holding `table`: plain, or split with rows past hbm_rows in host
    memory."""
    values = hybrid_rows.new_rows_array(cuda, table.shape, np.float32, hbm_rows)
    every = cuda.asarray(np.arange(table.shape[0], dtype=np.int64))
    hybrid_rows.put_rows(cuda, values, every, table)
    return values


@pytest.mark.parametrize("dim,kind,hbm_rows,walk_blocks", [
    (1, "uniform", None, 0), (8, "uniform", None, 0), (64, "uniform", None, 0),
    (100, "uniform", None, 0), (64, "truncated_normal", None, 0), (16, "normal", CAPACITY // 3, 0),
    (6, "uniform", CAPACITY // 2, 0), (16, "normal", CAPACITY // 3, 2),
    (64, "uniform", CAPACITY // 2, 3), (64, "uniform", CAPACITY // 2, -1)])
def test_find_or_insert_values_equals_the_cpu_and_the_three_ops(cuda, rng, dim, kind, hbm_rows,
                                                                 walk_blocks):
    """walk_blocks: the ordered walks' blocks (host_row_order.walked_by; 0: a thread an item,
    -1: launch()'s grid)."""
    from sok1x.backend.cuda import host_row_order as cuda_host_order
    with cuda_host_order.walked_by(walk_blocks):
        _equals_the_cpu_and_the_three_ops(cuda, rng, dim, kind, hbm_rows)


def _equals_the_cpu_and_the_three_ops(cuda, rng, dim, kind, hbm_rows):
    spec = random_init.make_spec(kind, -0.05 if kind == "uniform" else 0.0, 0.05, 11)
    table = rng.standard_normal((CAPACITY, dim)).astype(np.float32)
    held = np.unique(_keys(rng, 1200, 1200))
    held_rows = rng.permutation(2000)[:held.shape[0]].astype(np.int64)
    calls = [np.concatenate([_keys(rng, 3000, 1500), held[:400]]), _keys(rng, 700, 300)]
    for call in calls:
        rng.shuffle(call)

    cpu_index, cpu_table = cpu.HashIndex(CAPACITY), table.copy()
    fused, fused_values = cuda.HashIndex(CAPACITY), _values(cuda, table, hbm_rows)
    three, three_values = cuda.HashIndex(CAPACITY), _values(cuda, table, hbm_rows)
    for index in (cpu_index, fused, three):
        index.assign(cuda.asarray(held) if index is not cpu_index else held,
                     cuda.asarray(held_rows) if index is not cpu_index else held_rows)
    # New keys take the pool's rows, past every held row.
    next_row = int(held_rows.max()) + 1
    pool = np.arange(next_row, CAPACITY, dtype=np.int64)
    cpu_stats = np.zeros((CAPACITY, 2), np.int64)  # (last step, count) per row
    stats = cuda.zeros((CAPACITY, 2), np.int64)
    for step, keys in enumerate(calls):
        cpu_rows, cpu_vectors, cpu_new, _ = cpu_index.find_or_insert_values(
            keys, cpu_table, spec, 5, row_pool=pool, touch=(cpu_stats, step + 3))
        rows, vectors, new_keys, new_rows = (cuda.to_host(a) for a in fused.find_or_insert_values(
            cuda.asarray(keys), fused_values, spec, 5, row_pool=cuda.asarray(pool),
            touch=(stats, step + 3)))
        three_rows, three_new, three_new_rows = three.find_or_insert(
            cuda.asarray(keys), row_pool=cuda.asarray(pool))
        hybrid_rows.init_rows(cuda, three_values, three_new_rows, three_new, spec, 5)
        three_vectors = cuda.to_host(hybrid_rows.gather_rows(cuda, three_values, three_rows))
        pool = pool[new_keys.shape[0]:]

        np.testing.assert_allclose(vectors, cpu_vectors, rtol=0, atol=1e-6)  # an ulp of log/cos
        assert np.array_equal(vectors, three_vectors)
        assert np.array_equal(np.sort(new_keys), np.sort(cpu_new))
        assert fused.size == cpu_index.size == three.size
        mine, theirs = _row_of(keys, rows), _row_of(keys, cpu_rows)
        assert all(mine[k] == theirs[k] for k in held.tolist() if k in mine)  # held keys keep rows
        assert len(set(mine.values())) == len(mine), "two keys share a row"
        assert sorted(new_rows.tolist()) == sorted(mine[k] for k in new_keys.tolist())
        # last step and count, key by key
        assert np.array_equal(cuda.to_host(stats)[rows], cpu_stats[cpu_rows])
    got = cuda.to_host(hybrid_rows.gather_rows(cuda, fused_values, cuda.asarray(
        np.arange(CAPACITY, dtype=np.int64))))
    keys, rows = (cuda.to_host(a) for a in fused.export())
    cpu_keys, cpu_rows = cpu_index.export()
    cpu_row = _row_of(np.asarray(cpu_keys), np.asarray(cpu_rows))
    np.testing.assert_allclose(got[rows], cpu_table[[cpu_row[k] for k in keys.tolist()]],
                               rtol=0, atol=1e-6)
    untouched = np.setdiff1d(np.arange(CAPACITY), rows)
    assert np.array_equal(got[untouched], table[untouched])


def test_find_or_insert_values_overflow_changes_no_row_past_the_pool(cuda, rng):
    """Too many new keys for the rows given: OverflowError, the index as before, and no table
    row written but the pool's."""
    dim, spec = 16, random_init.make_spec("uniform", -0.05, 0.05, 3)
    table = rng.standard_normal((CAPACITY, dim)).astype(np.float32)
    values = cuda.asarray(table)
    index = cuda.HashIndex(CAPACITY)
    held = np.unique(_keys(rng, 500, 500))
    index.assign(cuda.asarray(held), cuda.asarray(np.arange(held.shape[0], dtype=np.int64)))
    pool = np.arange(CAPACITY - 10, CAPACITY, dtype=np.int64)
    keys = np.concatenate([held[:50], np.setdiff1d(_keys(rng, 3000, 3000), held)])
    with pytest.raises(OverflowError):
        index.find_or_insert_values(cuda.asarray(keys), values, spec, 5,
                                    row_pool=cuda.asarray(pool))
    assert index.size == held.shape[0]
    assert (cuda.to_host(index.find(cuda.asarray(keys[50:]))) == -1).all()
    assert np.array_equal(cuda.to_host(index.find(cuda.asarray(held))),
                          np.arange(held.shape[0]))
    got = cuda.to_host(values)
    assert np.array_equal(got[:CAPACITY - 10], table[:CAPACITY - 10])


def test_find_or_insert_values_on_no_keys(cuda):
    index = cuda.HashIndex(16)
    values = cuda.zeros((16, 4), np.float32)
    spec = random_init.make_spec("constant", 1.5, 0.0, 0)
    rows, vectors, new_keys, new_rows = index.find_or_insert_values(
        cuda.asarray(np.zeros(0, np.int64)), values, spec, 1)
    assert rows.shape == (0,) and vectors.shape == (0, 4) and new_keys.shape == (0,)
    with pytest.raises(TypeError):
        index.find_or_insert_values(cuda.asarray(np.zeros(1, np.int64)),
                                    cuda.zeros((16,), np.float32), spec, 1)
