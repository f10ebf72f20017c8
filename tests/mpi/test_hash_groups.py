"""Hash tables in table groups (DESIGN D13, issue 17 item 1) on the cpu backend, at any number of
ranks: v1 hash tables (use_hashtable=True) of one dim, placement and initializer looked up together
pass as one HashGroup, and give what the same tables give looked up one by one (forward,
gradients, the keys each shard holds, their rows and optimizer slots), beside a hash table of
another dim and a dense table in the same lookup; a full shard or a bad key in one member fails
the step on every rank and changes no table; a failed later op of the step takes the group's new
keys out again; and the step's host waits and backend calls do not grow with the number of hash
tables."""
import os

import numpy as np
import pytest
from mpi4py import MPI

from checkpoint_reference import assert_same, every_row
from sok1x.backend import cpu, random_init
from sok1x.backend.cpu import random_rows as cpu_random
from sok1x.engine import api, checkpoint, runtime
from sok1x.engine.checkpoint import join as checkpoint_join
from sok1x.engine.checkpoint import manifest as checkpoint_manifest
from sok1x.engine.lookup import bounded_step, peer_capacity, table_group
from sok1x.engine.lookup.keyed import KeyedInput
from sok1x.engine.op_keys import name_key
from sok1x.engine.op_order import OpId
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError, TableFullError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=31)
DIM, CAPACITY = 8, 300
KEY_SPAN = 2 ** 45  # hash tables take any non-negative key
# name suffix, dim, hash table?: four hash tables of DIM (one group), one of another dim (alone),
# one dense table (alone)
LAYOUT = [("h0", DIM, True), ("h1", DIM, True), ("d0", DIM, False), ("h2", DIM, True),
          ("w0", 4, True), ("h3", DIM, True)]
HYPER = {"lr": 0.1, "epsilon": 1e-7}


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


def make_tables(tag, capacity=CAPACITY, layout=LAYOUT):
    """Creates the layout's tables anew (the same names give the same initial rows)."""
    names = ["%s_%s" % (tag, suffix) for suffix, _, _ in layout]
    for name, (_, dim, hashed) in zip(names, layout):
        api.create_table(name, dim, capacity if hashed else CAPACITY, hashed, SPEC, replace=True)
    return names


def batch(rng, step, layout=LAYOUT, draw=None):
    """Per table a PooledInput (keys shared between ranks, repeated in a batch; or those of
    draw(rng, t, step)) and a top gradient."""
    inputs, tops = [], []
    pool = rng.integers(0, KEY_SPAN, size=40)
    for t, (_, dim, hashed) in enumerate(row[:3] for row in layout):
        nnz, rows = 9 + 3 * t + step, 4 + t % 3
        if draw is not None:
            keys = draw(rng, t, step)
            nnz = keys.shape[0]
        else:
            keys = rng.choice(pool, size=nnz) if hashed else rng.integers(0, CAPACITY * SIZE,
                                                                          nnz)
        segments = np.sort(rng.integers(0, rows, size=nnz))
        weights = rng.random(nnz).astype(np.float32) if t % 2 else None
        inputs.append(PooledInput(keys, segments, rows, weights, "mean" if t % 2 else "sum"))
        tops.append(rng.standard_normal((rows, dim)).astype(np.float32))
    return inputs, tops


def shard_state(name):
    """This rank's shard of `name` by key: {key: (vector, {slot: row})} and its index size; a
    dense table's rows as they are."""
    table = api.shard(name)
    if not table.use_hashtable:
        return table.values.copy(), {n: s.copy() for n, s in table.slots.items()}
    keys, rows = table.index.export()
    return {int(k): (table.values[r].copy(), {n: s[r].copy() for n, s in table.slots.items()})
            for k, r in zip(keys, rows)}, table.index.size


def assert_same_state(got, want):
    if isinstance(got[0], np.ndarray):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        for slot in want[1]:
            np.testing.assert_allclose(got[1][slot], want[1][slot], rtol=1e-5, atol=1e-6)
        return
    assert got[1] == want[1] and sorted(got[0]) == sorted(want[0])
    for key, (vector, slots) in want[0].items():
        np.testing.assert_allclose(got[0][key][0], vector, rtol=1e-5, atol=1e-6)
        for slot, row in slots.items():
            np.testing.assert_allclose(got[0][key][1][slot], row, rtol=1e-5, atol=1e-6)


def gradient_by_key(name, values, rows):
    """{key: summed gradient} of a hash table's gradient rows (a dense table's by row)."""
    table = api.shard(name)
    if table.use_hashtable:
        keys, held = table.index.export()
        key_of_row = dict(zip(held.tolist(), keys.tolist()))
    out = {}
    for row, value in zip(np.asarray(rows).tolist(), np.asarray(values, dtype=np.float64)):
        if row < 0:  # a bounded step's padding (SOK1X_BOUNDED_STEP=1): no gradient
            assert not value.any()
            continue
        key = key_of_row[row] if table.use_hashtable else row
        out[key] = out.get(key, 0.0) + value
    return out


def assert_same_gradient(got, want):
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def run_steps(names, together, steps=2, seed=3, update_together=None):
    """Steps of the layout's lookup (all tables in one lookup, or one lookup per table), each
    with an Adagrad update (one call over all tables, or one per table, as TensorFlow's
    optimizers do; update_together None: as the lookup). Returns per step the outputs and per
    table the gradient by key."""
    update_together = together if update_together is None else update_together
    rng = np.random.default_rng([seed, RANK])
    record = []
    for step in range(steps):
        inputs, tops = batch(rng, step)
        if together:
            outs, token = api.pooled_lookup(names, "hg_fwd", inputs, True)
            grads = api.pooled_lookup_grad(names, "hg_bwd", token, tops)
        else:
            outs, grads = [], []
            for t, name in enumerate(names):
                (out,), token = api.pooled_lookup([name], "hg_one_fwd_%d" % t, [inputs[t]], True)
                grads += api.pooled_lookup_grad([name], "hg_one_bwd_%d" % t, token, [tops[t]])
                outs.append(out)
        by_key = [gradient_by_key(name, v, r) for name, (v, r) in zip(names, grads)]
        if update_together:
            api.apply_optimizer_updates(names, "adagrad", "Adagrad", {}, HYPER,
                                        [v for v, _ in grads], [r for _, r in grads])
        else:
            for name, (values, rows) in zip(names, grads):
                api.apply_optimizer_update(name, "adagrad", "Adagrad", {}, HYPER, values, rows)
        record.append(([np.array(out) for out in outs], by_key))
    return record


@pytest.mark.parametrize("update_together", [True, False])
def test_a_hash_group_equals_its_tables_one_by_one(update_together):
    names = make_tables("hg")
    together = run_steps(names, True, update_together=update_together)
    tables = [api.shard(name) for name in names]
    group = tables[0].group
    assert isinstance(group, table_group.HashGroup)
    assert group.members == [tables[t] for t in (0, 1, 3, 5)]
    assert tables[2].group is None and tables[4].group is None  # a dense table, another dim
    grouped = [shard_state(name) for name in names]
    make_tables("hg")  # the same tables anew, each looked up alone
    alone = run_steps(names, False)
    assert all(api.shard(name).group is None for name in names)
    for (outs, grads), (want_outs, want_grads) in zip(together, alone):
        for out, want in zip(outs, want_outs):
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        for got, want in zip(grads, want_grads):
            assert_same_gradient(got, want)
    for name, got in zip(names, grouped):
        assert_same_state(got, shard_state(name))


def test_a_hash_group_reads_each_members_own_initial_rows():
    names = make_tables("hg_init")
    rng = np.random.default_rng([4, RANK])
    inputs, _ = batch(rng, 0)
    outs, _ = api.pooled_lookup(names, "hg_init_fwd", inputs, True)
    for name, (_, dim, hashed), item, out in zip(names, LAYOUT, inputs, outs):
        if not hashed:
            continue
        vectors = cpu_random.initial_values(SPEC, name_key("table:" + name), item.keys, dim)
        weights = np.ones(item.keys.shape[0]) if item.weights is None else item.weights
        want = np.zeros((item.num_segments, dim))
        np.add.at(want, item.segment_ids, vectors * weights[:, None])
        if item.combiner == "mean":
            total = np.bincount(item.segment_ids, weights, minlength=item.num_segments)
            want /= np.where(total == 0, 1, total)[:, None]
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    # a lookup without insert finds the keys (flat rows) and gives zeros for others
    unseen = [item._replace(keys=item.keys + KEY_SPAN if hashed else item.keys)
              for item, (_, _, hashed) in zip(inputs, LAYOUT)]
    found, _ = api.pooled_lookup(names, "hg_init_find", inputs, False)
    missed, _ = api.pooled_lookup(names, "hg_init_miss", unseen, False)
    for out, again, miss, (_, _, hashed) in zip(outs, found, missed, LAYOUT):
        np.testing.assert_allclose(again, out, rtol=1e-6, atol=1e-7)
        if hashed:
            np.testing.assert_array_equal(miss, 0.0)


def test_the_gradient_of_a_lookup_without_insert_holds_the_found_keys_alone():
    names = make_tables("hg_infer")
    rng = np.random.default_rng([10, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "hg_infer_train", inputs, True)  # some keys held
    probe, tops = batch(rng, 1)  # some held, some not
    outs, token = api.pooled_lookup(names, "hg_infer_fwd", probe, False)
    grads = api.pooled_lookup_grad(names, "hg_infer_bwd", token, tops)
    assert isinstance(api.shard(names[0]).group, table_group.HashGroup)
    for t, name in enumerate(names):
        (out,), one = api.pooled_lookup([name], "hg_infer_one_fwd", [probe[t]], False)
        (values, rows), = api.pooled_lookup_grad([name], "hg_infer_one_bwd", one, [tops[t]])
        np.testing.assert_allclose(outs[t], out, rtol=1e-6, atol=1e-7)
        assert_same_gradient(gradient_by_key(name, *grads[t]),
                             gradient_by_key(name, values, rows))


@pytest.mark.parametrize("way", ["staged", "two-pass"])
def test_a_hash_groups_members_dump_and_load_each_on_its_own(shared_dir, monkeypatch, way):
    """Both ways a load takes (engine/checkpoint/load.py) put every row and slot back, and a
    member is loaded where it is: it stays in its group, its rows views of the group's (a new
    shard beside the group's arrays would hold the table's memory twice)."""
    monkeypatch.setenv("SOK1X_CHECKPOINT_LOAD", way)
    names = make_tables("hg_ckpt_" + way.replace("-", "_"))
    run_steps(names, True, seed=11)
    group = api.shard(names[0]).group
    assert isinstance(group, table_group.HashGroup)
    saved = {name: every_row(name, slots=None) for name in names}
    checkpoint.dump_tables(shared_dir, names)
    rng = np.random.default_rng([12, RANK])
    probe, _ = batch(rng, 0)
    before, _ = api.pooled_lookup(names, "hg_ckpt_probe", probe, False)
    run_steps(names, True, seed=13)  # new keys, changed rows and slots
    checkpoint.load_tables(shared_dir, names)
    for name in names:
        assert_same(every_row(name, slots=None), saved[name])
    for member in group.members:
        assert api.shard(member.name) is member and member.group is group
        assert np.shares_memory(member.values, group.values)
    after, _ = api.pooled_lookup(names, "hg_ckpt_probe_again", probe, False)
    for got, want in zip(after, before):
        np.testing.assert_array_equal(got, want)
    run_steps(names, True, seed=14)  # the group trains on from the loaded rows
    assert api.shard(names[0]).group is group


def test_a_two_pass_load_of_a_large_grouped_member_adds_far_less_than_the_member(
        shared_dir, monkeypatch):
    """The load taken where memory is short (two-pass) of a grouped member holding 40,000 rows
    of dim 64 with an Adagrad slot (about 20 MB) adds, at its peak, less than half the member's
    own arrays (traced by tracemalloc, which sees NumPy's buffers): it is loaded in place, in
    1 MB chunks, beside an index of its own, never as a second shard."""
    import tracemalloc
    monkeypatch.setenv("SOK1X_CHECKPOINT_LOAD", "two-pass")
    monkeypatch.setenv("SOK1X_CHECKPOINT_CHUNK_MB", "1")
    capacity, dim = 40000, 64
    layout = [("big%d" % t, dim, True) for t in range(3)]
    names = make_tables("hg_mem", capacity=capacity, layout=layout)
    keys = np.arange(int(0.9 * capacity) * SIZE, dtype=np.int64) * 7919  # spread, any owner
    mine = keys[RANK::SIZE]  # every rank looks up its share: the shards fill to about 90%
    inputs = [PooledInput(mine, None, mine.shape[0], None, "sum") for _ in names]
    tops = [np.ones((mine.shape[0], dim), np.float32) for _ in names]
    _, token = api.pooled_lookup(names, "hg_mem_fwd", inputs, True)
    grads = api.pooled_lookup_grad(names, "hg_mem_bwd", token, tops)
    api.apply_optimizer_updates(names, "adagrad", "Adagrad", {}, HYPER,
                                [g[0] for g in grads], [g[1] for g in grads])
    member = api.shard(names[0])
    assert isinstance(member.group, table_group.HashGroup)
    member_bytes = member.values.nbytes + member.times.nbytes + sum(
        slot.nbytes for slot in member.slots.values())
    saved = every_row(names[0], slots=None)
    checkpoint.dump_tables(shared_dir, names)
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        checkpoint.load_tables(shared_dir, [names[0]])
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert_same(every_row(names[0], slots=None), saved)
    assert api.shard(names[0]).group is member.group
    assert peak < member_bytes // 2, (peak, member_bytes)


def keyed_steps(names, inputs, tops, keyed):
    """One training step of `names` (adagrad) as one keyed lookup, or one pooled lookup per
    table: returns (outputs joined, per table the gradient by key)."""
    if not keyed:
        outs, by_key = [], []
        for t, name in enumerate(names):
            (out,), one = api.pooled_lookup([name], "hg_keyed_one_fwd", [inputs[t]], True)
            (v, r), = api.pooled_lookup_grad([name], "hg_keyed_one_bwd", one, [tops[t]])
            by_key.append(gradient_by_key(name, v, r))
            api.apply_optimizer_update(name, "adagrad", "Adagrad", {}, HYPER, v, r)
            outs.append(out)
        return np.concatenate(outs), by_key
    out, token = api.keyed_lookup(names, "hg_keyed_fwd", keyed_input(inputs), True)
    assert isinstance(api.shard(names[0]).group, table_group.HashGroup)
    return np.array(out), keyed_gradient_and_update(names, "hg_keyed_bwd", token, tops)


def keyed_input(inputs):
    """The KeyedInput of per-table PooledInputs (sum pooling, no weights)."""
    return KeyedInput(np.concatenate([i.keys for i in inputs]), [i.keys.shape[0] for i in inputs],
                      np.concatenate([i.segment_ids for i in inputs]),
                      [i.num_segments for i in inputs], None, "sum")


def keyed_gradient_and_update(names, op, token, tops):
    """The keyed gradient of a keyed lookup's token and an Adagrad update with it; returns per
    table the gradient by key."""
    values, rows, counts = api.keyed_lookup_grad(names, op, token, np.concatenate(tops))
    cuts = np.concatenate([[0], np.cumsum(counts)])
    by_key = [gradient_by_key(name, np.asarray(values)[a:b], np.asarray(rows)[a:b])
              for name, a, b in zip(names, cuts[:-1], cuts[1:])]
    api.apply_keyed_update(names, "adagrad", "Adagrad", {}, HYPER, values, rows, counts)
    return by_key


def test_a_keyed_lookup_of_a_hash_group_equals_its_tables_one_by_one():
    layout = [(s, d, h) for s, d, h in LAYOUT if h and d == DIM]
    names = make_tables("hg_keyed", layout=layout)
    rng = np.random.default_rng([5, RANK])
    steps = []
    for step in range(2):
        inputs, tops = batch(rng, step, layout)
        steps.append(([i._replace(weights=None, combiner="sum") for i in inputs], tops))
    together = [keyed_steps(names, inputs, tops, True) for inputs, tops in steps]
    grouped = [shard_state(name) for name in names]
    make_tables("hg_keyed", layout=layout)
    alone = [keyed_steps(names, inputs, tops, False) for inputs, tops in steps]
    for (out, grads), (want, want_grads) in zip(together, alone):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        for got, expected in zip(grads, want_grads):
            assert_same_gradient(got, expected)
    for name, state in zip(names, grouped):
        assert_same_state(state, shard_state(name))


def crowded_member(inputs):
    """On the last rank, member h2 gets more new keys than its shards on all ranks hold."""
    if RANK == SIZE - 1:
        keys = np.arange(40 * SIZE + 1, dtype=np.int64) * 7 + 10 ** 12
        inputs[3] = PooledInput(keys, None, keys.shape[0], None, "sum")
    return TableFullError, "_h2: the shard on rank"


def bad_key_in_member(inputs):
    """On rank 0, member h3 gets a negative key."""
    if RANK == 0:
        keys = inputs[5].keys.copy()
        keys[1] = -3
        inputs[5] = inputs[5]._replace(keys=keys)
    return InvalidInputError, "_h3"


@pytest.mark.parametrize("spoil", [crowded_member, bad_key_in_member])
def test_a_full_shard_or_bad_key_in_one_member_fails_every_rank_and_changes_no_table(spoil):
    tag = "hg_fail_%s" % spoil.__name__
    names = make_tables(tag, capacity=40)
    rng = np.random.default_rng([6, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, tag + "_ok", inputs, True)
    before = [shard_state(name) for name in names]
    spoilt = list(inputs)
    error, match = spoil(spoilt)
    with pytest.raises(error, match=tag + match):
        api.pooled_lookup(names, tag + "_bad", spoilt, True)
    for name, state in zip(names, before):
        assert_same_state(shard_state(name), state)
    api.pooled_lookup(names, tag + "_again", inputs, True)  # the group goes on
    for name, state in zip(names, before):
        assert_same_state(shard_state(name), state)


def test_a_failed_later_op_of_the_step_takes_the_groups_new_keys_out():
    names = make_tables("hg_undo")
    rng = np.random.default_rng([8, RANK])
    inputs, tops = batch(rng, 0)
    api.pooled_lookup(names, "hg_undo_ok", inputs, True)
    before = [shard_state(name) for name in names]
    fresh, _ = batch(rng, 1)  # mostly new keys
    _, token = api.pooled_lookup(names, OpId("hg_undo_fwd", "hg_undo", 0), fresh, True)
    assert any(shard_state(n)[1] != b[1] for n, b in zip(names, before)
               if api.shard(n).use_hashtable)
    wrong = list(tops)
    if RANK == SIZE - 1:
        wrong[1] = np.zeros((tops[1].shape[0] + 2, DIM), np.float32)
    with pytest.raises(InvalidInputError):
        api.pooled_lookup_grad(names, OpId("hg_undo_bwd", "hg_undo", 1), token, wrong)
    for name, state in zip(names, before):
        assert_same_state(shard_state(name), state)


def test_a_step_stopped_between_a_groups_insert_and_its_count_keeps_no_key(monkeypatch):
    """Anything that stops a training lookup after a hash group queued its insert (here the
    second group's insert runs out of memory, on every rank) erases the keys the first placed:
    no table changes, and the groups go on."""
    layout = [("a0", DIM, True), ("a1", DIM, True), ("b0", 4, True), ("b1", 4, True)]
    names = make_tables("hg_stop", layout=layout)
    rng = np.random.default_rng([9, RANK])
    inputs, _ = batch(rng, 0, layout)
    api.pooled_lookup(names, "hg_stop_ok", inputs, True)
    before = [shard_state(name) for name in names]
    fresh, _ = batch(rng, 1, layout)  # mostly new keys
    started = table_group.HashGroup.insert_start

    def out_of_memory(group, keys, tags):
        if group.dim == 4:
            raise MemoryError("no room for the second group's rows")
        return started(group, keys, tags)
    monkeypatch.setattr(table_group.HashGroup, "insert_start", out_of_memory)
    with pytest.raises(MemoryError):
        api.pooled_lookup(names, "hg_stop_bad", fresh, True)
    monkeypatch.undo()
    for name, state in zip(names, before):
        assert_same_state(shard_state(name), state)
    api.pooled_lookup(names, "hg_stop_again", fresh, True)


# Backend ops that launch nothing on cuda: views, arrays already on the device, allocations,
# host bookkeeping; to_host_many is the host wait (counted as such).
NO_LAUNCH = ("asarray", "row_view", "row_views", "reshape", "device_context", "counts", "empty",
             "to_host_many", "hash_insert_many_done")
INDEX_OPS = ("find", "count_missing", "find_or_insert", "find_or_insert_values", "erase")


def _calls_of_a_step(names, step_inputs):
    """Host waits and the cpu backend ops the engine calls (those that launch work on cuda,
    HashIndex methods included; not the ones an op calls inside itself) in one training step of
    `names`, after a warm-up step that makes the group; its exchanges go by their counts (with
    SOK1X_PEER_CAPACITY=1, whether a step fits the caps its warm-up set depends on how its keys
    spread over the owners: test_peer_capacity.py checks that way)."""
    capacities = os.environ.pop(peer_capacity.ENV, None)
    try:
        return _counted_calls_of_a_step(names, step_inputs)
    finally:
        if capacities is not None:
            os.environ[peer_capacity.ENV] = capacities


def _counted_calls_of_a_step(names, step_inputs):
    counted = [(cpu, name, getattr(cpu, name)) for name in dir(cpu)
               if callable(getattr(cpu, name)) and not name.startswith("_")
               and not isinstance(getattr(cpu, name), type) and name not in NO_LAUNCH
               and getattr(getattr(cpu, name), "__module__", "").startswith("sok1x.backend")]
    counted += [(cpu.HashIndex, name, getattr(cpu.HashIndex, name)) for name in INDEX_OPS]
    calls, depth = [0], [0]

    def counting(function):
        def call(*args, **kwargs):
            calls[0] += depth[0] == 0
            depth[0] += 1
            try:
                return function(*args, **kwargs)
            finally:
                depth[0] -= 1
        return call
    out = None
    for step, (inputs, tops) in enumerate(step_inputs):
        waits = cpu.COUNTS["host_waits"]
        if step:
            for owner, name, function in counted:
                setattr(owner, name, counting(function))
        try:
            _, token = api.pooled_lookup(names, "hg_count_fwd", inputs, True)
            grads = api.pooled_lookup_grad(names, "hg_count_bwd", token, tops)
            api.apply_optimizer_updates(names, "adagrad", "Adagrad", {}, HYPER,
                                        [v for v, _ in grads], [r for _, r in grads])
        finally:
            for owner, name, function in counted:
                setattr(owner, name, function)
        out = {"host_waits": cpu.COUNTS["host_waits"] - waits, "backend_calls": calls[0]}
    return out


def summed_batches(rng, layout):
    """Two steps' batches with one combiner and no weights (a group pools in one pass)."""
    steps = []
    for step in range(2):
        inputs, tops = batch(rng, step, layout)
        steps.append(([i._replace(weights=None, combiner="sum") for i in inputs], tops))
    return steps


@pytest.mark.parametrize("count", [5, 26])
def test_host_waits_and_backend_calls_do_not_grow_with_the_hash_tables(count):
    rng = np.random.default_rng([9, RANK])
    counts = {}
    for tables in (2, count):
        layout = [("c%d" % t, DIM, True) for t in range(tables)]
        # room in every shard for every rank's keys of a member (up to 85 a rank) beside the 40
        # it may hold: a group skips its placed-count check alike at any count (fitting_units)
        names = make_tables("hg_count_%d" % tables, capacity=100 * SIZE + 40, layout=layout)
        counts[tables] = _calls_of_a_step(names, summed_batches(rng, layout))
    one_layout = [("c0", DIM, True)]
    one = make_tables("hg_count_one", layout=one_layout)
    counts[1] = _calls_of_a_step(one, summed_batches(rng, one_layout))
    if RANK == 0:
        print("\nper training step, 1 hash table: %s; 2: %s; %d: %s"
              % (counts[1], counts[2], count, counts[count]))
    assert counts[count] == counts[2], counts  # nothing grows with the tables
    # a group waits once for its members' placed counts; a hash table alone waits twice (its
    # count of new keys, then of placed keys); a group's few more ops (its keys' tags, the
    # joins and splits of its members' pieces) are a fixed cost, as a dense group's are
    assert counts[count]["host_waits"] <= counts[1]["host_waits"], counts


def _roomy_step_stats(names, seed):
    """The runtime's stats of one Adagrad training step of hash tables `names` (a hash group)
    looked up together, 50 keys each per rank from a pool of 40, after a warm-up step."""
    rng = np.random.default_rng([seed, RANK])
    pool = np.random.default_rng(seed).integers(0, KEY_SPAN, size=40)
    stats = None
    for _ in range(2):
        inputs = [PooledInput(rng.choice(pool, size=50), None, 50, None, "sum") for _ in names]
        tops = [rng.standard_normal((50, DIM)).astype(np.float32) for _ in names]
        before = runtime.get().stats()
        _, token = api.pooled_lookup(names, "hg_room_fwd", inputs, True)
        grads = api.pooled_lookup_grad(names, "hg_room_bwd", token, tops)
        api.apply_optimizer_updates(names, "adagrad", "Adagrad", {}, HYPER,
                                    [v for v, _ in grads], [r for _, r in grads])
        after = runtime.get().stats()
        stats = {key: after[key] - before[key] for key in after}
    return stats


@pytest.mark.parametrize("tables, checked_waits", [(4, 1), (1, 2)])
def test_hash_tables_with_room_for_every_ranks_keys_wait_twice_a_step_and_make_no_mpi_call(
        tables, checked_waits):
    """The op header tells every rank each rank's keys and room per hash table (per member of a
    hash group), so while no shard can fill up in a lookup (every rank's keys of a table would
    fit any owner's room), every rank skips the check of placed keys alike: a training step
    waits twice and makes no MPI call, for a group as for a table alone. Near full (here the
    bound, 50 keys a rank, passes a room of 45, though at most the pool's 40 keys arrive), the
    step reads the counts and the ranks agree on them (a group: one wait more for its placed
    counts; a table alone: two, its count of new keys and of the keys it placed), and the
    step trains as well."""
    layout = [("r%d" % t, DIM, True) for t in range(tables)]
    roomy = _roomy_step_stats(make_tables("hg_roomy%d" % tables, 50 * SIZE + 40, layout), 41)
    tight_names = make_tables("hg_tight%d" % tables, capacity=45, layout=layout)
    tight = _roomy_step_stats(tight_names, 41)
    if tables > 1 and bounded_step.enabled(runtime.get()):
        # a bounded one-rank step (SOK1X_BOUNDED_STEP=1): the group's backward counts no rows,
        # so the roomy step reads its placed counts in the backward's header, the tight one in
        # its forward, and neither waits more than the other
        checked_waits = 0
    assert roomy["host_waits"] <= 2 and roomy["host_collectives"] == 0, roomy
    assert tight["host_waits"] == roomy["host_waits"] + checked_waits, (roomy, tight)
    assert tight["host_collectives"] == (1 if SIZE > 1 else 0), tight
    assert all(api.shard(name).index.size <= 40 for name in tight_names)


@pytest.mark.parametrize("capacity, fits", [(30, False), (80, True)])
def test_a_hash_table_named_twice_in_a_lookup_counts_both_its_key_sets_against_its_room(
        capacity, fits):
    """Shared columns name one table at two positions of a lookup. Each position's keys fit
    its shards' room alone; together (20 new keys per position, all owned by rank 0) they do
    not at capacity 30: every rank raises TableFullError and the table is unchanged; at 80 the
    step inserts both sets, as one position holding all the keys does."""
    name, = make_tables("hg_twice%d" % capacity, capacity, [("t", DIM, True)])
    first = (np.arange(20, dtype=np.int64) + 10 ** 6) * SIZE  # rank 0 owns every key
    second = first + 1000 * SIZE
    inputs = [PooledInput(keys, None, 20, None, "sum") for keys in (first, second)]
    before = shard_state(name)
    if not fits:
        with pytest.raises(TableFullError, match="hg_twice30_t: the shard on rank 0"):
            api.pooled_lookup([name, name], "hg_twice_bad", inputs, True)
        assert_same_state(shard_state(name), before)
        return
    api.pooled_lookup([name, name], "hg_twice_ok", inputs, True)
    held = api.shard(name).index.size
    assert held == (40 if RANK == 0 else 0)


@pytest.mark.skipif(SIZE < 2, reason="rank 0 restores while another rank looks up")
def test_a_restore_joined_inside_a_lookups_header_makes_the_header_tell_the_restored_room(
        shared_dir):
    """Rank 0 restores a hash group's tables alone (the Horovod idiom) while the last rank is in
    a training lookup's op header: the header, repeated after the restore, tells the rooms of
    the restored shards (45 of 50 rows used), so 20 new keys fail the step with TableFullError
    on every rank, and the restored shards keep none of them."""
    names = make_tables("hg_restore", 50, [("a", DIM, True), ("b", DIM, True)])
    last = SIZE - 1
    owned = (np.arange(45, dtype=np.int64) + 10 ** 6) * SIZE + last  # the last rank's keys

    def lookup(op, keys):
        inputs = [PooledInput(k, None, len(k), None, "sum") for k in (keys, keys[:0])]
        return api.pooled_lookup(names, op, inputs, True)
    none = owned[:0]
    lookup("hg_restore_fill", owned if RANK == last else none)
    manifest = checkpoint.save_shards(shared_dir, "hg_restore", names)
    data = checkpoint_manifest.encode(checkpoint_manifest.make(
        manifest["world_size"], {n: manifest["tables"][n] for n in names}))
    make_tables("hg_restore", 50, [("a", DIM, True), ("b", DIM, True)])  # empty again
    lookup("hg_restore_empty", none)
    COMM.Barrier()
    fresh = (np.arange(20, dtype=np.int64) + 2 * 10 ** 6) * SIZE + last
    if RANK == 0:
        description, _ = checkpoint_join.open_checkpoint(runtime.get(), {
            "kind": "restore", "names": names, "directory": shared_dir, "manifests": [data],
            "where": "test_hash_groups"})
        checkpoint_join.perform(description)
    with pytest.raises(TableFullError, match="hg_restore_a: the shard on rank %d" % last):
        lookup("hg_restore_more", fresh if RANK == last else none)
    index = api.shard(names[0]).index
    assert index.size == (45 if RANK == last else 0)
    assert not (np.asarray(index.find(fresh)) >= 0).any()


GRAPH_DIMS = (DIM, DIM, 4, DIM, DIM)  # four layers of DIM (a hash group), one of another dim


def _graph_program(together, inter_op_threads, steps=3):
    """A TF1 program of five v1 hash-table layers (DistributedEmbedding, use_hashtable; dims
    GRAPH_DIMS) looked up by sok1x.lookup_sparse, all in one call or one call each, trained
    with Adagrad in a Session of `inter_op_threads` inter-op threads. Returns the losses, every
    layer's exported rows by key, and the kind of group of the first table."""
    import sok1x
    from tf_support import session, tf1
    graph = tf1.Graph()
    rng = np.random.default_rng([15, RANK])
    pool = np.random.default_rng(16).integers(0, KEY_SPAN, size=30)
    feeds = [[pool[rng.integers(0, 30, size=(6, 3))] for _ in GRAPH_DIMS] for _ in range(steps)]
    with graph.as_default():
        layers = [sok1x.DistributedEmbedding("sum", 64, dim, 1, 3, use_hashtable=True,
                                             name="hg_graph_%d" % t)
                  for t, dim in enumerate(GRAPH_DIMS)]
        variables = [layer.var for layer in layers]
        holders = [tf1.placeholder(tf1.int64, [6, 3]) for _ in layers]
        ids = [tf1.RaggedTensor.from_tensor(holder) for holder in holders]
        if together:
            pooled = sok1x.lookup_sparse(variables, ids, combiners=["sum"] * len(layers))
        else:
            pooled = [sok1x.lookup_sparse([v], [i], combiners=["sum"])[0]
                      for v, i in zip(variables, ids)]
        weights = [np.random.default_rng([17, t]).standard_normal((6, dim)).astype(np.float32)
                   for t, dim in enumerate(GRAPH_DIMS)]
        loss = tf1.add_n([tf1.reduce_sum(p * w) for p, w in zip(pooled, weights)])
        grads = tf1.gradients(loss, variables)
        train = sok1x.OptimizerWrapper(tf1.train.AdagradOptimizer(0.1)).apply_gradients(
            zip(grads, variables))
        exports = [sok1x.export(v) for v in variables]
    with session(graph, inter_op_threads) as sess:
        sess.run(sok1x.Init(backend="cpu"))
        sess.run(tf1.global_variables_initializer())
        losses = [sess.run([loss, train], dict(zip(holders, feed)))[0] for feed in feeds]
        rows = [dict(zip(keys.tolist(), values)) for keys, values in sess.run(exports)]
        group = api.shard(variables[0]._sok1x_table.name).group
    return losses, rows, type(group).__name__


@pytest.mark.parametrize("inter_op_threads", [1, 8])
def test_a_program_looking_up_v1_hash_layers_together_trains_as_one_looking_them_up_apart(
        inter_op_threads):
    losses, rows, kind = _graph_program(True, inter_op_threads)
    want_losses, want_rows, alone = _graph_program(False, inter_op_threads)
    assert kind == "HashGroup" and alone == "NoneType"
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-5)
    for got, want in zip(rows, want_rows):
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
