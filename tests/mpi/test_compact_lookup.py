"""The lookup for a seam that crosses the host (engine api.compact_lookup) on the cpu backend,
against the engine's own pooled lookup of the same tables: per table it hands back the pooled
vectors or the batch's distinct rows with int32 indices, whichever is fewer bytes; pooled by
NumPy as a framework would (tf.gather, tf.math.unsorted_segment_sum), the distinct rows give the
pooled lookup's outputs, and their gradients (the sums per distinct row) its gradients, at any
number of ranks. Bad input fails every rank as pooled_lookup's does."""
import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup.compact import distinct_pays
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=13)
VOCAB = 64


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


def make_tables(tag, dims, hashed=None):
    names = ["compact_%s_%d" % (tag, t) for t in range(len(dims))]
    for name, dim, hashtable in zip(names, dims, hashed or (False,) * len(dims)):
        api.create_table(name, dim, 4 * VOCAB, hashtable, SPEC, replace=True)
    return names


def framework_pooling(rows, indices, item):
    """What the graph computes from distinct rows: gather, weight, segment sum, mean."""
    per_key = rows[indices].astype(np.float64)
    weights = np.ones(len(indices)) if item.weights is None else item.weights.astype(np.float64)
    segments = np.arange(len(indices)) if item.segment_ids is None else item.segment_ids
    out = np.zeros((item.num_segments, rows.shape[1]))
    np.add.at(out, segments, per_key * weights[:, None])
    if item.combiner == "mean":
        total = np.bincount(segments, weights=weights, minlength=item.num_segments)
        out = np.where(total[:, None] != 0, out / np.where(total == 0, 1, total)[:, None], 0.0)
    return out


def framework_gradient(top, indices, distinct, item):
    """The gradient of the distinct rows from the pooled output's gradient `top`: the gather's
    gradient (per key its row's share) summed per distinct row."""
    weights = np.ones(len(indices)) if item.weights is None else item.weights.astype(np.float64)
    segments = np.arange(len(indices)) if item.segment_ids is None else item.segment_ids
    if item.combiner == "mean":
        total = np.bincount(segments, weights=weights, minlength=item.num_segments)
        weights = weights / total[segments]
    grads = np.zeros((distinct, top.shape[1]))
    np.add.at(grads, indices, top[segments].astype(np.float64) * weights[:, None])
    return grads.astype(np.float32)


def inputs_of_every_kind(rng):
    """Per table a PooledInput: one key per row with repeats (distinct pays), eight distinct keys
    per row (pooled pays), weighted mean over repeats, and one key per row, none repeated."""
    one_hot = rng.integers(0, 8, size=40) * SIZE + RANK
    multi = np.arange(64) + 64 * RANK
    weighted = rng.integers(0, 5, size=60)
    unrepeated = rng.permutation(VOCAB)[:24]
    return [PooledInput(one_hot, None, 40, None, "sum"),
            PooledInput(multi, np.arange(64) // 8, 8, None, "sum"),
            PooledInput(weighted, np.sort(rng.integers(0, 30, size=60)), 30,
                        rng.random(60).astype(np.float32), "mean"),
            PooledInput(unrepeated, None, 24, None, "sum")]


def by_key(name, pair):
    """(values, keys) of a backward's (values, shard rows), in key order; rows -1 are a bounded
    step's padding (SOK1X_BOUNDED_STEP=1), whose values must be zeros, dropped."""
    values, rows = (np.asarray(a) for a in pair)
    assert not values[rows < 0].any(), "a padded row -1 carries a gradient"
    values, rows = values[rows >= 0], rows[rows >= 0]
    table = runtime.get().tables[name]
    if table.use_hashtable:
        held_keys, held_rows = table.index.export()
        key_of_row = dict(zip(held_rows.tolist(), held_keys.tolist()))
        keys = np.array([key_of_row[r] for r in rows.tolist()], np.int64)
    else:
        keys = rows * SIZE + RANK
    order = np.argsort(keys)
    return values[order], keys[order]


@pytest.mark.parametrize("hashed", [False, True])
def test_the_fewer_bytes_give_the_pooled_lookups_outputs_and_gradients(hashed):
    dims = (16, 16, 8, 4)
    rng = np.random.default_rng([3, RANK])
    inputs = inputs_of_every_kind(rng)
    tops = [rng.standard_normal((item.num_segments, dim)).astype(np.float32)
            for item, dim in zip(inputs, dims)]
    names = make_tables("kinds%d" % hashed, dims, (hashed,) * 4)
    pooled, token = api.pooled_lookup(names, "compact_ref_fwd", inputs, True)
    want_grads = [by_key(name, pair) for name, pair in zip(names, api.pooled_lookup_grad(
        names, "compact_ref_bwd", token, tops))]
    make_tables("kinds%d" % hashed, dims, (hashed,) * 4)  # the same tables anew
    compact, token = api.compact_lookup(names, "compact_fwd", inputs, True)
    forms = []
    grads = []
    for result, item, want, top, dim in zip(compact, inputs, pooled, tops, dims):
        if result.indices is None:
            forms.append("pooled")
            np.testing.assert_array_equal(result.rows, want)
            grads.append(top)
            continue
        forms.append("distinct")
        assert result.indices.dtype == np.int32
        distinct = result.rows.shape[0]
        assert distinct == len(np.unique(item.keys))
        assert distinct_pays(distinct, len(item.keys), item.num_segments, dim, 4)
        np.testing.assert_allclose(framework_pooling(result.rows, result.indices, item), want,
                                   rtol=1e-5, atol=1e-6)
        grads.append(framework_gradient(top, result.indices, distinct, item))
    assert forms == ["distinct", "pooled", "distinct", "pooled"]
    got_grads = api.compact_lookup_grad(names, "compact_bwd", token, grads)
    for got, want, name in zip(got_grads, want_grads, names):
        got = by_key(name, got)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_a_float16_layer_takes_distinct_rows_by_its_own_bytes():
    # 40 keys of 8 distinct rows, dim 4: float32 8 * 16 + 160 = 288 < 640; float16 224 < 320
    assert distinct_pays(8, 40, 40, 4, 4) and distinct_pays(8, 40, 40, 4, 2)
    # 30 of 30 distinct, 10 rows, dim 8: never
    assert not distinct_pays(30, 30, 10, 8, 4) and not distinct_pays(30, 30, 10, 8, 2)
    # 12 of 40 keys over 10 rows, dim 8: float32 384 + 160 = 544 > 320 (and float16)
    assert not distinct_pays(12, 40, 10, 8, 2)


def test_a_filtered_table_crosses_pooled():
    names = make_tables("filter", (4,), (True,))
    keys = np.repeat(np.arange(4) + 10 * RANK, 5)
    result, token = api.compact_lookup(names, "compact_filter_fwd", [
        PooledInput(keys, None, 20, None, "sum", 0.5)], True)
    assert result[0].indices is None and result[0].rows.shape == (20, 4)
    api.compact_lookup_grad(names, "compact_filter_bwd", token, [np.ones((20, 4), np.float32)])


def test_bad_input_on_one_rank_fails_every_rank_and_changes_nothing():
    names = make_tables("bad", (4, 4), (True, True))
    keys = np.repeat(np.arange(3), 2) + 100 * RANK
    good = [PooledInput(keys, None, 6, None, "sum")] * 2
    api.compact_lookup(names, "compact_bad_fwd_0", good, True)
    held = [runtime.get().tables[n].index.size for n in names]
    cases = {
        "segment": (PooledInput(keys, np.arange(6), 3, None, "sum"), "output row 5, outside"),
        "negative": (PooledInput(keys - 1000, None, 6, None, "sum"), "is negative"),
        "weights": (PooledInput(keys, None, 6, np.ones(5, np.float32), "sum"),
                    "weights for 6 keys"),
    }
    for what, (bad, message) in cases.items():
        inputs = [good[0], bad if RANK == SIZE - 1 else good[1]]
        with pytest.raises(InvalidInputError, match=message):
            api.compact_lookup(names, "compact_bad_fwd_" + what, inputs, True)
        assert [runtime.get().tables[n].index.size for n in names] == held


@pytest.mark.parametrize("hot", [1, 8])
def test_tables_of_one_dim_cross_joined(hot):
    """26 tables of one dim as dlrm26's: one array of rows and one of indices for all (where
    distinct rows pay, one key per row and many repeats), or the pooled rows joined (eight
    distinct keys per row), and one joined gradient back."""
    count, batch, dim = 26, 12, 8
    rng = np.random.default_rng([7, RANK, hot])
    inputs = []
    for _ in range(count):
        keys = (rng.integers(0, 4, size=batch) if hot == 1 else
                rng.permutation(4 * VOCAB)[:batch * hot]) * SIZE + RANK
        segments = None if hot == 1 else np.arange(batch * hot) // hot
        inputs.append(PooledInput(keys, segments, batch, None, "sum"))
    tops = rng.standard_normal((count * batch, dim)).astype(np.float32)
    names = make_tables("joined%d" % hot, (dim,) * count)
    pooled, token = api.pooled_lookup(names, "joined_ref_fwd", inputs, True)
    want_grads = [by_key(name, pair) for name, pair in zip(names, api.pooled_lookup_grad(
        names, "joined_ref_bwd", token, np.split(tops, count)))]
    make_tables("joined%d" % hot, (dim,) * count)
    joined, token = api.compact_lookup(names, "joined_fwd", inputs, True, joined=True)
    if hot == 1:
        assert joined.indices.dtype == np.int32 and joined.indices.shape == (count * batch,)
        np.testing.assert_array_equal(joined.row_counts, [len(np.unique(i.keys)) for i in inputs])
        np.testing.assert_allclose(joined.rows[joined.indices], np.concatenate(pooled))
        grads = np.zeros(joined.rows.shape, np.float32)
        np.add.at(grads, joined.indices, tops)
    else:
        assert joined.indices is None
        np.testing.assert_array_equal(joined.rows, np.concatenate(pooled))
        grads = tops
    got = api.compact_lookup_grad(names, "joined_bwd", token, [grads])
    for (got_values, got_keys), (want_values, want_keys) in zip(
            [by_key(name, pair) for name, pair in zip(names, got)], want_grads):
        np.testing.assert_array_equal(got_keys, want_keys)
        np.testing.assert_allclose(got_values, want_values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("count,hot", [(1, 1), (26, 1), (26, 8)])
def test_a_keyed_lookup_crosses_its_distinct_rows_once_for_all_tables(count, hot):
    """A KeyedInput over one table or a group of 26 (compact_keyed_lookup): one key per row
    with repeats crosses as the unit's distinct rows and int32 indices (keys repeated across
    tables are different rows), eight distinct keys per row as the pooled rows."""
    batch, dim = 12, 8
    rng = np.random.default_rng([9, RANK, count, hot])
    keys = [(rng.integers(0, 4, size=batch) if hot == 1 else
             rng.permutation(4 * VOCAB)[:batch * hot]) * SIZE + RANK for _ in range(count)]
    segments = None if hot == 1 else [np.arange(batch * hot) // hot] * count
    inputs = [PooledInput(k, None if segments is None else segments[t], batch, None, "sum")
              for t, k in enumerate(keys)]
    tops = rng.standard_normal((count * batch, dim)).astype(np.float32)
    names = make_tables("keyed%d_%d" % (count, hot), (dim,) * count)
    pooled, token = api.pooled_lookup(names, "keyed_ref_fwd", inputs, True)
    want_grads = [by_key(name, pair) for name, pair in zip(names, api.pooled_lookup_grad(
        names, "keyed_ref_bwd", token, np.split(tops, count)))]
    make_tables("keyed%d_%d" % (count, hot), (dim,) * count)
    keyed = api.KeyedInput(np.concatenate(keys), [batch * hot] * count,
                           None if segments is None else np.concatenate(segments),
                           [batch] * count, None, "sum")
    joined, token = api.compact_keyed_lookup(names, "keyed_fwd", keyed, True)
    if hot == 1:
        distinct = sum(len(np.unique(k)) for k in keys)
        assert joined.indices.dtype == np.int32 and joined.rows.shape == (distinct, dim)
        np.testing.assert_allclose(joined.rows[joined.indices], np.concatenate(pooled))
        grads = np.zeros(joined.rows.shape, np.float32)
        np.add.at(grads, joined.indices, tops)
    else:
        assert joined.indices is None
        np.testing.assert_allclose(joined.rows, np.concatenate(pooled), rtol=1e-6, atol=1e-6)
        grads = tops
    got = api.compact_lookup_grad(names, "keyed_bwd", token, [grads])
    for (got_values, got_keys), (want_values, want_keys) in zip(
            [by_key(name, pair) for name, pair in zip(names, got)], want_grads):
        np.testing.assert_array_equal(got_keys, want_keys)
        np.testing.assert_allclose(got_values, want_values, rtol=1e-5, atol=1e-5)
