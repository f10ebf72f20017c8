"""The keyed lookup (engine/lookup/keyed.py: the keys of all tables as one array, one output array
back, TorchRec's KeyedJaggedTensor) on the cpu backend, at any number of ranks: it equals the same
tables looked up one by one through the per-table pooled lookup (forward, gradients, updated rows
and optimizer slots), for a table group, one table, and tables that cannot share a pass; a step
waits on the host as often for many tables as for one; bad input in one table fails the step on
every rank, names the table and changes no table."""
import gc
import sys
import weakref

import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup.keyed import KeyedInput
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=23)
HASHED_SPEC = random_init.make_spec("constant", 0.25)  # the same rows whatever the table's name
DIM, CAPACITY = 8, 30


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


def make_pair(tag, count, placement="mod", hashed=()):
    """Tables looked up keyed and copies looked up one by one, with the same rows."""
    keyed = ["keyed_%s_%d" % (tag, t) for t in range(count)]
    alone = ["single_%s_%d" % (tag, t) for t in range(count)]
    for names in (keyed, alone):
        for t, name in enumerate(names):
            spec = HASHED_SPEC if t in hashed else SPEC  # a hash table's rows: made on sight
            api.create_table(name, DIM, CAPACITY + 4 * (t % 3), t in hashed, spec, replace=True,
                             placement=placement)
    for a, b in zip(keyed, alone):
        if not api.shard(a).use_hashtable:
            api.shard(b).values[...] = api.shard(a).values
    return keyed, alone


def batch(rng, count, step, combiner, weighted, key_range):
    """Per table PooledInputs (keys relative to the table) and their top gradients."""
    inputs, tops = [], []
    for t in range(count):
        rows = 2 + t % 4
        nnz = 3 + (5 * t + step) % 9
        keys = rng.integers(0, key_range, size=nnz)
        segments = np.sort(rng.integers(0, rows, size=nnz))
        weights = rng.random(nnz).astype(np.float32) if weighted else None
        inputs.append(PooledInput(keys, segments, rows, weights, combiner))
        tops.append(rng.standard_normal((rows, DIM)).astype(np.float32))
    return inputs, tops


def keyed_of(inputs):
    weights = None if inputs[0].weights is None else np.concatenate([i.weights for i in inputs])
    return KeyedInput(np.concatenate([i.keys for i in inputs]),
                      np.array([i.keys.shape[0] for i in inputs]),
                      np.concatenate([i.segment_ids for i in inputs]),
                      np.array([i.num_segments for i in inputs]), weights, inputs[0].combiner)


def dense(values, rows, count):
    out = np.zeros((count, DIM))
    np.add.at(out, np.asarray(rows), np.asarray(values, dtype=np.float64))
    return out


def by_table(array, counts):
    cuts = np.concatenate([[0], np.cumsum(counts)])
    return [np.asarray(array)[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


HYPER = {"adagrad": ("Adagrad", {"lr": 0.1, "epsilon": 1e-7}, ("accumulator",)),
         "lazy_adam": ("Adam", {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
                       ("m", "v"))}


@pytest.mark.parametrize("count,placement,combiner,weighted,rule,hashed", [
    (6, "mod", "sum", False, "lazy_adam", ()),
    (5, "rank", "mean", True, "adagrad", ()),
    (1, "mod", "mean", False, "adagrad", ()),
    (4, "mod", "sum", True, "lazy_adam", (1,)),  # a hash table beside a group: per table
])
def test_keyed_equals_the_tables_one_by_one(count, placement, combiner, weighted, rule, hashed):
    if placement == "rank":
        placement = ("rank", SIZE - 1)
    tag = "%d_%s_%s_%s" % (count, placement[0], combiner, rule)
    keyed, alone = make_pair(tag, count, placement, hashed)
    key_range = CAPACITY if placement != "mod" else CAPACITY * SIZE
    rng = np.random.default_rng([11, RANK])
    prefix, hyper, slots = HYPER[rule]
    for step in range(3):
        inputs, tops = batch(rng, count, step, combiner, weighted, key_range)
        out, token = api.keyed_lookup(keyed, "keyed_fwd", keyed_of(inputs), True)
        values, rows, counts = api.keyed_lookup_grad(keyed, "keyed_bwd", token,
                                                     np.concatenate(tops))
        assert counts.shape == (count,) and int(counts.sum()) == rows.shape[0]
        outs = by_table(out, [i.num_segments for i in inputs])
        grads = list(zip(by_table(values, counts), by_table(rows, counts)))
        updated = api.apply_keyed_update(keyed, rule, prefix, {}, hyper, values, rows, counts)
        for t, name in enumerate(alone):
            (want,), one = api.pooled_lookup([name], "single_fwd_%d" % t, [inputs[t]], True)
            (want_values, want_rows), = api.pooled_lookup_grad([name], "single_bwd_%d" % t, one,
                                                                [tops[t]])
            np.testing.assert_allclose(outs[t], want, rtol=1e-5, atol=1e-6)
            held = api.shard(name).values.shape[0]
            np.testing.assert_allclose(dense(grads[t][0], grads[t][1], held),
                                       dense(want_values, want_rows, held), rtol=1e-5,
                                       atol=1e-6)
            # a bounded step (SOK1X_BOUNDED_STEP=1) reports its pieces: rows -1 included
            padded = bool((np.asarray(grads[t][1]) < 0).any())
            distinct = len(np.unique(np.asarray(want_rows)[np.asarray(want_rows) >= 0]))
            assert updated[t] == (counts[t] if padded else distinct)
            api.apply_optimizer_update(name, rule, prefix, {}, hyper, want_values, want_rows)
    for a, b in zip(keyed, alone):
        np.testing.assert_allclose(api.shard(a).values, api.shard(b).values, rtol=1e-5,
                                   atol=1e-6)
        for slot in slots:
            np.testing.assert_allclose(api.shard(a).slots["%s/%s" % (prefix, slot)],
                                       api.shard(b).slots["%s/%s" % (prefix, slot)], rtol=1e-5,
                                       atol=1e-6)


def test_a_keyed_update_takes_changed_values_and_checks_other_rows():
    keyed, alone = make_pair("update", 4)
    rng = np.random.default_rng([12, RANK])
    inputs, tops = batch(rng, 4, 0, "sum", False, CAPACITY * SIZE)
    hyper = {"lr": 0.5}
    _, token = api.keyed_lookup(keyed, "update_fwd", keyed_of(inputs), True)
    values, rows, counts = api.keyed_lookup_grad(keyed, "update_bwd", token,
                                                 np.concatenate(tops))
    api.apply_keyed_update(keyed, "sgd", "SGD", {}, hyper, np.clip(values, -0.01, 0.01), rows,
                           counts)
    own = [rng.integers(0, CAPACITY, size=5) for _ in keyed]  # repeats are summed
    own_values = rng.standard_normal((20, DIM)).astype(np.float32)
    api.apply_keyed_update(keyed, "sgd", "SGD", {}, hyper, own_values, np.concatenate(own),
                           [5] * 4)
    for t, name in enumerate(alone):
        (_,), one = api.pooled_lookup([name], "update_one_fwd_%d" % t, [inputs[t]], True)
        (v, r), = api.pooled_lookup_grad([name], "update_one_bwd_%d" % t, one, [tops[t]])
        api.apply_optimizer_update(name, "sgd", "SGD", {}, hyper, np.clip(v, -0.01, 0.01), r)
        api.apply_optimizer_update(name, "sgd", "SGD", {}, hyper, own_values[5 * t:5 * t + 5],
                                   own[t])
        np.testing.assert_allclose(api.shard(keyed[t]).values, api.shard(name).values,
                                   rtol=1e-6, atol=1e-7)
    before = [api.shard(name).values.copy() for name in keyed]
    bad = np.concatenate(own)
    bad[13] = CAPACITY + 4 * 2  # table 2 holds CAPACITY + 8 rows, this is row CAPACITY + 8
    with pytest.raises(InvalidInputError, match="keyed_update_2"):
        api.apply_keyed_update(keyed, "sgd", "SGD", {}, hyper, own_values, bad, [5] * 4)
    with pytest.raises(InvalidInputError, match="counts"):
        api.apply_keyed_update(keyed, "sgd", "SGD", {}, hyper, own_values, bad, [5, 5, 5])
    for name, values_before in zip(keyed, before):
        np.testing.assert_array_equal(api.shard(name).values, values_before)


def test_tables_of_other_dims_are_refused():
    for t, dim in enumerate((8, 16)):
        api.create_table("keyed_dims_%d" % t, dim, CAPACITY, False, SPEC, replace=True)
    item = KeyedInput(np.zeros(2, np.int64), [1, 1], np.zeros(2, np.int64), [1, 1], None, "sum")
    with pytest.raises(ValueError, match="one dim"):
        api.keyed_lookup(["keyed_dims_0", "keyed_dims_1"], "dims_fwd", item, True)


def test_a_keyed_step_waits_as_often_for_many_tables_as_for_one():
    per_table = {}
    for count in (1, 12):
        keyed, _ = make_pair("waits_%d" % count, count)
        rng = np.random.default_rng([13, RANK])
        item = keyed_of(batch(rng, count, 0, "sum", False, CAPACITY * SIZE)[0])
        for _ in range(3):
            before = runtime.get().stats()
            out, token = api.keyed_lookup(keyed, "waits_fwd_%d" % count, item, True)
            values, rows, counts = api.keyed_lookup_grad(keyed, "waits_bwd_%d" % count, token,
                                                         np.ones_like(out))
            api.apply_keyed_update(keyed, "sgd", "SGD", {}, {"lr": 0.1}, values, rows, counts)
            after = runtime.get().stats()
        per_table[count] = {k: after[k] - before[k] for k in ("host_waits", "data_collectives",
                                                              "host_collectives")}
    assert per_table[12] == per_table[1], per_table
    assert per_table[1]["host_waits"] <= 2, per_table


@pytest.mark.parametrize("count,combiner,weighted,hashed", [
    (5, "sum", False, ()), (5, "mean", True, ()), (1, "mean", False, ()),
    (4, "sum", True, (2,)),  # a hash table beside a group: per table
])
def test_without_segment_ids_each_key_is_its_own_row(count, combiner, weighted, hashed):
    keyed, given = make_pair("rows_%d_%s_%d" % (count, combiner, len(hashed)), count,
                             hashed=hashed)
    rng = np.random.default_rng([17, RANK])
    for step in range(3):
        lengths = np.array([2 + (t + step) % 3 for t in range(count)])
        keys = rng.integers(0, CAPACITY * SIZE, size=int(lengths.sum()))
        weights = rng.random(keys.shape[0]).astype(np.float32) if weighted else None
        if weighted:
            weights[0] = 0.0  # a mean over a zero weight gives zeros, as with segment ids
        ids = np.concatenate([np.arange(n) for n in lengths])
        tops = rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)
        results = []
        # an op each: with SOK1X_PEER_CAPACITY=1 on several ranks an op's first step goes by
        # its counts and sets its caps, and (with SOK1X_BOUNDED_STEP=1) the steps sized by them
        # hand back a padded gradient, so each op must be at the same step
        for names, segment_ids, op in ((keyed, None, "rows"), (given, ids, "rows_given")):
            item = KeyedInput(keys, lengths, segment_ids, lengths, weights, combiner)
            out, token = api.keyed_lookup(names, op + "_fwd", item, True)
            values, rows, counts = api.keyed_lookup_grad(names, op + "_bwd", token, tops)
            api.apply_keyed_update(names, "adagrad", "Adagrad", {}, HYPER["adagrad"][1], values,
                                   rows, counts)
            results.append([np.asarray(a) for a in (out, values, rows, counts)])
        for a, b in zip(*results):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(keyed, given):
        np.testing.assert_allclose(api.shard(a).values, api.shard(b).values, rtol=1e-6,
                                   atol=1e-7)
    bad = KeyedInput(keys, lengths, None, lengths + (RANK == SIZE - 1), None, combiner)
    with pytest.raises(InvalidInputError, match="its own output row"):
        api.keyed_lookup(keyed, "rows_bad", bad, True)


def test_a_table_made_anew_is_looked_up_anew():
    keyed, _ = make_pair("anew", 3)
    rng = np.random.default_rng([15, RANK])
    inputs, tops = batch(rng, 3, 0, "sum", False, CAPACITY * SIZE)
    initial = [api.shard(name).values.copy() for name in keyed]
    for _ in range(2):  # the second step finds its tables and group as the first left them
        out, token = api.keyed_lookup(keyed, "anew_fwd", keyed_of(inputs), True)
        values, rows, counts = api.keyed_lookup_grad(keyed, "anew_bwd", token,
                                                     np.concatenate(tops))
        api.apply_keyed_update(keyed, "sgd", "SGD", {}, {"lr": 0.5}, values, rows, counts)
    group, trained = api.shard(keyed[0]).group, api.shard(keyed[0]).values.copy()
    api.create_table(keyed[1], DIM, CAPACITY + 4, False, SPEC, replace=True)  # its initializer
    out, token = api.keyed_lookup(keyed, "anew_fwd", keyed_of(inputs), True)
    assert api.shard(keyed[1]).group is api.shard(keyed[0]).group is not group
    np.testing.assert_array_equal(api.shard(keyed[1]).values, initial[1])
    np.testing.assert_array_equal(api.shard(keyed[0]).values, trained)
    values, rows, counts = api.keyed_lookup_grad(keyed, "anew_bwd", token, np.concatenate(tops))
    api.apply_keyed_update(keyed, "sgd", "SGD", {}, {"lr": 0.5}, values, rows, counts)
    assert not np.array_equal(api.shard(keyed[1]).values, initial[1])  # the new table trained


def test_a_dropped_table_is_freed_after_a_step():
    """What a step remembers of its tables lets go of a table the registry drops (a restore
    drops a hash table's old shard to make room for the new one, checkpoint_load.read_table)."""
    keyed, _ = make_pair("dropped", 3)
    rng = np.random.default_rng([17, RANK])
    inputs, tops = batch(rng, 3, 0, "sum", False, CAPACITY * SIZE)
    out, token = api.keyed_lookup(keyed, "dropped_fwd", keyed_of(inputs), True)
    values, rows, counts = api.keyed_lookup_grad(keyed, "dropped_bwd", token,
                                                 np.concatenate(tops))
    api.apply_keyed_update(keyed, "sgd", "SGD", {}, {"lr": 0.5}, values, rows, counts)
    group = weakref.ref(api.shard(keyed[0]).group)
    shards = [weakref.ref(api.shard(name)) for name in keyed]
    registry = runtime.get().tables
    for name in keyed:
        del registry[name]
    runtime.get().stash.clear()  # as the restore does: the step's saved state holds its tables
    del out, token, values, rows, counts
    gc.collect()
    assert [shard() for shard in shards] == [None] * 3 and group() is None


def test_a_keyed_steps_python_does_not_grow_with_the_tables():
    calls, seen = {}, [0]

    def counter(frame, event, arg):
        if event in ("call", "c_call"):
            seen[0] += 1
    for count in (2, 24):
        keyed, _ = make_pair("calls_%d" % count, count)
        rng = np.random.default_rng([16, RANK])
        item = keyed_of(batch(rng, count, 0, "sum", False, CAPACITY * SIZE)[0])
        for step in range(3):  # the last step counted: the first ones make groups and plans
            seen[0] = 0
            sys.setprofile(counter if step == 2 else None)
            try:
                out, token = api.keyed_lookup(keyed, "calls_fwd_%d" % count, item, True)
                values, rows, counts = api.keyed_lookup_grad(
                    keyed, "calls_bwd_%d" % count, token, np.ones_like(out))
                api.apply_keyed_update(keyed, "sgd", "SGD", {}, {"lr": 0.1}, values, rows,
                                       counts)
            finally:
                sys.setprofile(None)
        calls[count] = seen[0]
    # A few calls either way (a freed array's weak-reference callback); ~10 more per table
    # before the per-table lookups were made once per name list.
    assert calls[24] <= calls[2] + 10, calls


@pytest.mark.parametrize("what", ["key", "segment", "lengths"])
def test_bad_input_in_one_table_fails_every_rank_and_changes_no_table(what):
    keyed, _ = make_pair("bad_%s" % what, 5)
    rng = np.random.default_rng([14, RANK])
    inputs, tops = batch(rng, 5, 0, "sum", False, CAPACITY * SIZE)
    _, token = api.keyed_lookup(keyed, "bad_fwd_ok", keyed_of(inputs), True)
    values, rows, counts = api.keyed_lookup_grad(keyed, "bad_bwd_ok", token,
                                                 np.concatenate(tops))
    before = [api.shard(name).values.copy() for name in keyed]
    item = keyed_of(inputs)
    if RANK == SIZE - 1:
        position = int(np.sum([i.keys.shape[0] for i in inputs[:3]]))  # table 3's first key
        if what == "key":
            keys = item.keys.copy()
            keys[position] = -1
            item = item._replace(keys=keys)
        elif what == "segment":
            segments = item.segment_ids.copy()
            segments[position] = inputs[3].num_segments
            item = item._replace(segment_ids=segments)
        else:
            item = item._replace(lengths=item.lengths + 1)
    match = "keyed_bad_%s_3" % what if what != "lengths" else "lengths"
    with pytest.raises(InvalidInputError, match=match):
        api.keyed_lookup(keyed, "bad_fwd", item, True)
    _, token = api.keyed_lookup(keyed, "bad_fwd_2", keyed_of(inputs), True)
    wrong = np.concatenate(tops)
    if RANK == 0:
        wrong = wrong[1:]
    with pytest.raises(InvalidInputError):
        api.keyed_lookup_grad(keyed, "bad_bwd", token, wrong)
    for name, values_before in zip(keyed, before):
        np.testing.assert_array_equal(api.shard(name).values, values_before)
