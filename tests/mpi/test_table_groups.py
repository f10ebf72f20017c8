"""Table groups (DESIGN D13) on the cpu backend, at any number of ranks: a lookup of several
tables of one dim in one pass equals the same tables looked up one by one (forward, gradients,
updated rows and optimizer slots), whether the members share one pooling or are pooled apart;
bad input in one member fails the step on every rank and changes no table."""
import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import random_init
from sok1x.backend.cpu import random_rows as cpu_random
from sok1x.engine import api, runtime
from sok1x.engine.lookup import group_gradients
from sok1x.engine.op_keys import name_key
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=21)
DIM, CAPACITY, TABLES = 8, 40, 5


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


def make_pair(tag, placement):
    """Tables looked up together and copies looked up one by one, with the same rows."""
    together = ["group_%s_%d" % (tag, t) for t in range(TABLES)]
    alone = ["alone_%s_%d" % (tag, t) for t in range(TABLES)]
    for name in together + alone:
        api.create_table(name, DIM, CAPACITY + 8 * (name.endswith("_2")), False, SPEC,
                         replace=True, placement=placement)
    for a, b in zip(together, alone):
        api.shard(b).values[...] = api.shard(a).values
    return together, alone


def key_range(placement):
    return CAPACITY if placement != "mod" else CAPACITY * SIZE


def batch(rng, placement, step, mixed):
    inputs, tops = [], []
    for t in range(TABLES):
        rows = 3 + t
        nnz = 7 + 2 * t + step
        keys = rng.integers(0, key_range(placement), size=nnz)
        segments = np.sort(rng.integers(0, rows, size=nnz))
        weights, combiner = None, "sum"
        if mixed and t % 2:
            weights, combiner = rng.random(nnz).astype(np.float32), "mean"
        inputs.append(PooledInput(keys, segments, rows, weights, combiner))
        tops.append(rng.standard_normal((rows, DIM)).astype(np.float32))
    return inputs, tops


def dense(values, rows, count):
    out = np.zeros((count, DIM))
    np.add.at(out, np.asarray(rows), np.asarray(values, dtype=np.float64))
    return out


RULES = {"adagrad": ("Adagrad", {"lr": 0.1, "epsilon": 1e-7}, ("accumulator",)),
         "adam": ("Adam", {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
                  ("m", "v")),  # every row's state decays each step
         "ftrl": ("Ftrl", {"lr": 0.1, "lr_power": -0.5, "l1": 0.01, "l2": 0.01,
                           "l2_shrinkage": 0.0}, ("accumulator", "linear"))}


@pytest.mark.parametrize("mixed,placement,rule", [
    (False, "mod", "adagrad"), (True, "mod", "adam"), (False, ("rank", "last"), "ftrl"),
    (True, ("rank", "last"), "adagrad")])
def test_a_group_equals_its_tables_one_by_one(placement, mixed, rule):
    if placement != "mod":
        placement = ("rank", SIZE - 1)
    together, alone = make_pair("%s_%s_%s" % (placement[0], mixed, rule), placement)
    rng = np.random.default_rng([3, RANK])
    prefix, hyper, slots = RULES[rule]
    for step in range(2):
        inputs, tops = batch(rng, placement, step, mixed)
        outs, token = api.pooled_lookup(together, "group_fwd", inputs, True)
        grads = api.pooled_lookup_grad(together, "group_bwd", token, tops)
        tables = [api.shard(name) for name in together]
        assert tables[0].group is not None and tables[0].group.members == tables
        values, rows = [g[0] for g in grads], [g[1] for g in grads]
        (found,) = group_gradients.group_gradients(runtime.get().backend, tables, values, rows)
        assert found[1] is tables[0].group.last_gradient[0]  # the backward's own rows
        api.apply_optimizer_updates(together, rule, prefix, {}, hyper, values, rows)
        for t, name in enumerate(alone):
            (out,), one_token = api.pooled_lookup([name], "alone_fwd_%d" % t, [inputs[t]], True)
            (want_values, want_rows), = api.pooled_lookup_grad([name], "alone_bwd_%d" % t,
                                                                one_token, [tops[t]])
            np.testing.assert_allclose(outs[t], out, rtol=1e-5, atol=1e-6)
            held = api.shard(name).values.shape[0]
            np.testing.assert_allclose(dense(values[t], rows[t], held),
                                       dense(want_values, want_rows, held), rtol=1e-5, atol=1e-6)
            api.apply_optimizer_update(name, rule, prefix, {}, hyper, want_values, want_rows)
    for a, b in zip(together, alone):
        grouped, single = api.shard(a), api.shard(b)
        np.testing.assert_allclose(grouped.values, single.values, rtol=1e-5, atol=1e-6)
        for slot in slots:
            np.testing.assert_allclose(grouped.slots["%s/%s" % (prefix, slot)],
                                       single.slots["%s/%s" % (prefix, slot)], rtol=1e-5,
                                       atol=1e-6)


def test_per_table_updates_of_a_grouped_table_land_in_the_group():
    together, alone = make_pair("per_table", "mod")
    rng = np.random.default_rng([4, RANK])
    inputs, tops = batch(rng, "mod", 0, False)
    _, token = api.pooled_lookup(together, "split_fwd", inputs, True)
    grads = api.pooled_lookup_grad(together, "split_bwd", token, tops)
    hyper = {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
    for name, (values, rows) in zip(together, grads):  # as TensorFlow's optimizers do
        api.apply_optimizer_update(name, "lazy_adam", "Adam", {}, hyper, values, rows)
    group = api.shard(together[0]).group
    for t, name in enumerate(together):
        start, stop = group.row_starts[t], group.row_starts[t + 1]
        np.testing.assert_array_equal(group.values[start:stop], api.shard(name).values)
        np.testing.assert_array_equal(group.slots["Adam/m"][start:stop],
                                      api.shard(name).slots["Adam/m"])


def test_a_whole_group_update_takes_the_values_it_is_given():
    together, alone = make_pair("clipped", "mod")
    rng = np.random.default_rng([5, RANK])
    inputs, tops = batch(rng, "mod", 0, True)
    hyper = {"lr": 0.5}
    _, token = api.pooled_lookup(together, "clip_fwd", inputs, True)
    grads = api.pooled_lookup_grad(together, "clip_bwd", token, tops)
    clipped = [np.clip(values, -0.01, 0.01) for values, _ in grads]
    rows = [r for _, r in grads]
    backend = runtime.get().backend
    tables = [api.shard(name) for name in together]
    (found,) = group_gradients.group_gradients(backend, tables, clipped, rows)
    assert found[1] is tables[0].group.last_gradient[0]
    api.apply_optimizer_updates(together, "sgd", "SGD", {}, hyper, clipped, rows)
    for t, name in enumerate(alone):
        (_,), one = api.pooled_lookup([name], "clip_one_fwd_%d" % t, [inputs[t]], True)
        (values, own_rows), = api.pooled_lookup_grad([name], "clip_one_bwd_%d" % t, one,
                                                      [tops[t]])
        api.apply_optimizer_update(name, "sgd", "SGD", {}, hyper, np.clip(values, -0.01, 0.01),
                                   own_rows)
        np.testing.assert_allclose(api.shard(together[t]).values, api.shard(name).values,
                                   rtol=1e-6, atol=1e-7)


def test_a_group_update_of_other_rows_is_checked_and_summed():
    together, alone = make_pair("copied", "mod")
    rng = np.random.default_rng([7, RANK])
    inputs, _ = batch(rng, "mod", 0, False)
    api.pooled_lookup(together, "copied_fwd", inputs, False)  # makes the group
    assert api.shard(together[0]).group is not None
    hyper = {"lr": 0.5}
    values = [rng.standard_normal((5, DIM)).astype(np.float32) for _ in together]
    rows = [rng.integers(0, CAPACITY, size=5) for _ in together]  # repeats are summed
    rows[2][0] = CAPACITY + 7  # table 2 holds 8 more rows
    api.apply_optimizer_updates(together, "sgd", "SGD", {}, hyper, values, rows)
    for name, v, r in zip(alone, values, rows):
        api.apply_optimizer_update(name, "sgd", "SGD", {}, hyper, v, r)
    for a, b in zip(together, alone):
        np.testing.assert_allclose(api.shard(a).values, api.shard(b).values, rtol=1e-6,
                                   atol=1e-7)
    before = [api.shard(name).values.copy() for name in together]
    rows[4] = rows[4].copy()
    rows[4][1] = CAPACITY
    with pytest.raises(InvalidInputError, match="group_copied_4"):
        api.apply_optimizer_updates(together, "sgd", "SGD", {}, hyper, values, rows)
    for name, values_before in zip(together, before):
        np.testing.assert_array_equal(api.shard(name).values, values_before)


def test_members_stay_tables_of_their_own():
    together, _ = make_pair("own", "mod")
    rng = np.random.default_rng([8, RANK])
    inputs, _ = batch(rng, "mod", 0, False)
    inputs[1] = inputs[1]._replace(keys=inputs[1].keys.astype(np.int32),
                                   segment_ids=inputs[1].segment_ids.astype(np.int32))
    outs, _ = api.pooled_lookup(together, "own_fwd", inputs, False)
    group = api.shard(together[0]).group
    for t in (1, 3):  # a member looked up alone reads the group's rows
        (alone,), _ = api.pooled_lookup([together[t]], "own_one_%d" % t, [inputs[t]], False)
        np.testing.assert_allclose(alone, outs[t], rtol=1e-6, atol=1e-7)
    api.create_table(together[2], DIM, CAPACITY + 8, False, SPEC, replace=True)
    outs_again, _ = api.pooled_lookup(together, "own_fwd_again", inputs, False)
    assert api.shard(together[0]).group is not group  # a member was made anew: a new group
    for before, after in zip(outs, outs_again):
        np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-7)  # same initial rows


def test_tables_of_other_dims_form_their_own_groups_in_the_same_lookup():
    dims = (8, 8, 16, 16, 8, 4)
    together = ["dims_group_%d" % t for t in range(len(dims))]
    alone = ["dims_alone_%d" % t for t in range(len(dims))]
    for names in (together, alone):
        for name, dim in zip(names, dims):
            api.create_table(name, dim, CAPACITY, False, SPEC, replace=True)
    for a, b in zip(together, alone):
        api.shard(b).values[...] = api.shard(a).values
    rng = np.random.default_rng([9, RANK])
    inputs = [PooledInput(rng.integers(0, CAPACITY * SIZE, size=9), np.sort(
        rng.integers(0, 4, size=9)), 4, None, "sum") for _ in dims]
    tops = [rng.standard_normal((4, dim)).astype(np.float32) for dim in dims]
    outs, token = api.pooled_lookup(together, "dims_fwd", inputs, True)
    grads = api.pooled_lookup_grad(together, "dims_bwd", token, tops)
    groups = [api.shard(name).group for name in together]
    assert groups[0] is groups[1] is groups[4] and groups[2] is groups[3]
    assert groups[0] is not groups[2] and groups[5] is None
    hyper = {"lr": 0.3}
    api.apply_optimizer_updates(together, "sgd", "SGD", {}, hyper, [g[0] for g in grads],
                                [g[1] for g in grads])
    for t, name in enumerate(alone):
        (out,), one = api.pooled_lookup([name], "dims_one_fwd_%d" % t, [inputs[t]], True)
        (values, rows), = api.pooled_lookup_grad([name], "dims_one_bwd_%d" % t, one, [tops[t]])
        np.testing.assert_allclose(outs[t], out, rtol=1e-5, atol=1e-6)
        api.apply_optimizer_update(name, "sgd", "SGD", {}, hyper, values, rows)
        np.testing.assert_allclose(api.shard(together[t]).values, api.shard(name).values,
                                   rtol=1e-5, atol=1e-6)


def test_a_hash_table_shares_the_lookup_of_a_group():
    names = ["mixed_%d" % t for t in range(4)]
    for t, name in enumerate(names):
        api.create_table(name, DIM, CAPACITY * 4, t == 2, SPEC, replace=True)
    rng = np.random.default_rng([10, RANK])
    keys = [rng.integers(0, CAPACITY * SIZE, size=11) for _ in names]
    keys[2] = rng.integers(0, 2 ** 40, size=11)  # the hash table takes any key
    segments = np.sort(rng.integers(0, 5, size=11))
    inputs = [PooledInput(k, segments, 5, None, "sum") for k in keys]
    outs, _ = api.pooled_lookup(names, "mixed_fwd", inputs, True)
    assert api.shard(names[0]).group is api.shard(names[3]).group is not None
    assert api.shard(names[2]).group is None
    for name, k, out in zip(names, keys, outs):
        vectors = cpu_random.initial_values(SPEC, name_key("table:" + name), k, DIM)
        want = np.zeros((5, DIM))
        np.add.at(want, segments, vectors.astype(np.float64))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_bad_input_in_one_member_fails_every_rank_and_changes_no_table():
    together, _ = make_pair("bad", "mod")
    rng = np.random.default_rng([6, RANK])
    inputs, tops = batch(rng, "mod", 0, False)
    _, token = api.pooled_lookup(together, "bad_fwd_ok", inputs, True)
    api.pooled_lookup_grad(together, "bad_bwd_ok", token, tops)
    before = [api.shard(name).values.copy() for name in together]
    bad = list(inputs)
    if RANK == SIZE - 1:
        keys = bad[3].keys.copy()
        keys[-1] = key_range("mod") + 5
        bad[3] = bad[3]._replace(keys=keys)
    with pytest.raises(InvalidInputError, match="group_bad_3"):
        api.pooled_lookup(together, "bad_fwd", bad, True)
    _, token = api.pooled_lookup(together, "bad_fwd_2", inputs, True)
    wrong = list(tops)
    if RANK == 0:
        wrong[1] = np.zeros((tops[1].shape[0] + 1, DIM), np.float32)
    with pytest.raises(InvalidInputError):
        api.pooled_lookup_grad(together, "bad_bwd", token, wrong)
    for name, values in zip(together, before):
        np.testing.assert_array_equal(api.shard(name).values, values)
