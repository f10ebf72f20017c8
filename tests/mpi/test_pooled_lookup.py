"""The engine's fused pooled lookup (several tables, one exchange) on the cpu backend against a
NumPy model of tf.nn.embedding_lookup_sparse: weighted and unweighted sum and mean, empty output
rows, every placement, at any number of ranks; bad input fails every rank and changes nothing."""
import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import random_init
from sok1x.backend.cpu import random_rows as cpu_random
from sok1x.engine import api, runtime
from sok1x.engine.op_keys import name_key
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=9)


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


def initial(name, keys, dim):
    return cpu_random.initial_values(SPEC, name_key("table:" + name), keys, dim)


def reference(vectors, segments, weights, batch, combiner):
    """tf.nn.embedding_lookup_sparse's pooling, in float64."""
    w = np.ones(len(segments)) if weights is None else weights.astype(np.float64)
    out = np.zeros((batch, vectors.shape[1]))
    np.add.at(out, segments, vectors.astype(np.float64) * w[:, None])
    if combiner == "mean":
        total = np.bincount(segments, weights=w, minlength=batch)
        out = np.where(total[:, None] != 0, out / np.where(total == 0, 1, total)[:, None], 0.0)
    return out


def make_tables(tag, placement, dims):
    names = []
    for t, dim in enumerate(dims):
        names.append("pooled_%s_%d" % (tag, t))
        api.create_table(names[-1], dim, 512, placement == "hash" or t == 1, SPEC,
                         replace=True, placement=placement)
    return names


@pytest.mark.parametrize("placement", ["mod", "hash", ("rank", 0), ("rank", "last")])
def test_three_tables_in_one_exchange_match_the_reference(placement):
    if placement == ("rank", "last"):
        placement = ("rank", SIZE - 1)
    dims = (4, 8, 3)
    names = make_tables(str(placement).replace(" ", ""), placement, dims)
    rng = np.random.default_rng([5, RANK])
    inputs, wants, top = [], [], []
    for t, (name, dim) in enumerate(zip(names, dims)):
        batch = 6 + t
        nnz = 9 + 4 * t
        keys = rng.integers(0, 512 if placement == ("rank", SIZE - 1) or placement == (
            "rank", 0) else 512 * SIZE, size=nnz)
        segments = np.sort(rng.integers(1, batch, size=nnz))  # row 0 stays empty
        weights = None if t == 0 else rng.random(nnz).astype(np.float32)
        combiner = ("sum", "mean", "mean")[t]
        inputs.append(PooledInput(keys, segments, batch, weights, combiner))
        wants.append(reference(initial(name, keys, dim), segments, weights, batch, combiner))
        top.append(rng.standard_normal((batch, dim)).astype(np.float32))
    outputs, token = api.pooled_lookup(names, "pooled_fwd", inputs, True)
    for got, want in zip(outputs, wants):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[0], 0.0)
    grads = api.pooled_lookup_grad(names, "pooled_bwd", token, top)
    for t, ((values, rows), item) in enumerate(zip(grads, inputs)):
        # d loss / d table[k] = sum over k's places of top[segment] * weight (/ row weight sum)
        w = np.ones(len(item.keys)) if item.weights is None else item.weights.astype(np.float64)
        scale = w
        if item.combiner == "mean":
            total = np.bincount(item.segment_ids, weights=w, minlength=item.num_segments)
            scale = w / total[item.segment_ids]
        per_place = top[t][item.segment_ids].astype(np.float64) * scale[:, None]
        want = {}
        for part in COMM.allgather((item.keys, per_place)):
            for key, grad in zip(part[0].tolist(), part[1]):
                want[key] = want.get(key, 0.0) + grad
        table = runtime.get().tables[names[t]]
        if table.use_hashtable:
            held_keys, held_rows = table.index.export()
            key_of_row = dict(zip(held_rows.tolist(), held_keys.tolist()))
            keys = [key_of_row[r] for r in rows.tolist()]
        elif table.placement.kind == "rank":
            keys = rows.tolist()
        else:
            keys = (rows * SIZE + RANK).tolist()
        got = dict(zip(keys, values))
        mine = {k: v for k, v in want.items() if k in got}
        owned = COMM.allreduce(len(got))
        assert owned == len(want)
        for key, grad in mine.items():
            np.testing.assert_allclose(got[key], grad, rtol=1e-5, atol=1e-6)


def test_bad_input_on_one_rank_fails_every_rank_and_changes_nothing():
    names = make_tables("bad", "hash", (4, 4))
    keys = np.arange(6) + 100 * RANK
    good = [PooledInput(keys, np.arange(6) // 2, 3, None, "sum")] * 2
    api.pooled_lookup(names, "bad_fwd_0", good, True)
    held = [runtime.get().tables[n].index.size for n in names]
    cases = {
        "weights": PooledInput(keys, np.arange(6) // 2, 3, np.ones(5, np.float32), "sum"),
        "segment": PooledInput(keys, np.arange(6), 3, None, "sum"),
        "negative": PooledInput(keys - 1000, np.arange(6) // 2, 3, None, "sum"),
        "combiner": PooledInput(keys, np.arange(6) // 2, 3, None, "sqrtn"),
    }
    messages = {"weights": "weights for 6 keys", "segment": "output row 5, outside",
                "negative": "is negative", "combiner": "combiner must be one of"}
    for what, bad in cases.items():
        inputs = [good[0], bad if RANK == SIZE - 1 else good[1]]
        with pytest.raises(InvalidInputError, match=messages[what]):
            api.pooled_lookup(names, "bad_fwd_" + what, inputs, True)
        assert [runtime.get().tables[n].index.size for n in names] == held


def test_an_update_trusts_only_the_rows_its_own_backward_made():
    from sok1x.engine.lookup import distinct_rows
    names = make_tables("trusted", "mod", (4,))
    keys = np.arange(8) * SIZE + RANK  # this rank's own keys, two per output row
    item = PooledInput(keys, np.arange(8) // 2, 4, None, "sum")
    _, token = api.pooled_lookup(names, "trusted_fwd", [item], True)
    (values, rows), = api.pooled_lookup_grad(names, "trusted_bwd", token,
                                             [np.ones((4, 4), np.float32)])
    assert distinct_rows.is_known(rows)
    copy = rows.copy()
    assert not distinct_rows.is_known(copy)
    hyper = {"lr": 1.0}
    before = runtime.get().tables[names[0]].values.copy()
    # The same rows twice in a copy: summed, as TensorFlow sums an IndexedSlices' repeats.
    api.apply_optimizer_update(names[0], "sgd", "SGD", {}, hyper,
                               np.concatenate([values, values]), np.concatenate([copy, copy]))
    after = runtime.get().tables[names[0]].values
    np.testing.assert_allclose(before[copy] - after[copy], 2 * values, rtol=1e-6)
    bad = copy.copy()
    bad[0] = 10 ** 6
    with pytest.raises(InvalidInputError, match="gradient rows must be in"):
        api.apply_optimizer_update(names[0], "sgd", "SGD", {}, hyper, values, bad)
