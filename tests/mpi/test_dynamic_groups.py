"""hbm DynamicVariables in hash groups (DESIGN D13, issue 17 item 1) on the cpu backend, at any
number of ranks: growing tables (engine/dynamic_table.py, var_type "hbm") of one dim, placement and
initializer looked up together pass as one HashGroup, which grows a member in place when a step's
new keys pass its capacity, and give what the same tables give looked up one by one (forward,
gradients, the keys each shard holds, their rows and slots, the capacities), beside a hybrid
DynamicVariable and an hbm one of another dim in the same lookup (units of their own); a member
past its max_capacity fails the step on every rank and changes no table; a failed later op takes
the group's new keys out again; a member's dump and load, both ways, put its rows back where they
are; and a step's host waits and backend calls do not grow with the number of tables."""
import numpy as np
import pytest
from mpi4py import MPI

from checkpoint_reference import assert_same, every_row
from sok1x.backend import random_init
from sok1x.engine import api, checkpoint, runtime, table_group
from sok1x.engine.dynamic_table import make_dynamic
from sok1x.engine.op_order import OpId
from sok1x.engine.pooled_lookup import PooledInput
from sok1x.errors import InvalidInputError, TableFullError
from test_hash_groups import (
    _calls_of_a_step,
    assert_same_programs,
    assert_same_state,
    assert_same_steps,
    batch,
    gradient_by_key,
    graph_program,
    shard_state,
    summed_batches,
)
from test_hash_groups import make_tables as v1_hash_tables

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=37)
DIM, INIT, MAX = 8, 2, 256
# name suffix, dim, var_type: four hbm tables of DIM (one group), a hybrid one of DIM and an hbm
# one of another dim (units of their own)
LAYOUT = [("h0", DIM, "hbm"), ("h1", DIM, "hbm"), ("y0", DIM, "hybrid"), ("h2", DIM, "hbm"),
          ("w0", 4, "hbm"), ("h3", DIM, "hbm")]
HYPER = {"lr": 0.1, "epsilon": 1e-7}


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


def make_tables(tag, init=INIT, most=MAX, layout=LAYOUT):
    """Creates the layout's tables anew (the same names give the same initial rows)."""
    names = ["%s_%s" % (tag, suffix) for suffix, _, _ in layout]
    for name, (_, dim, var_type) in zip(names, layout):
        api.create_table(name, dim, most, True, SPEC, replace=True,
                         dynamic=make_dynamic(var_type, init, most))
    return names


def capacities(names):
    return [api.shard(name).capacity for name in names]


def run_steps(names, together, steps=3, seed=3, tag="dg"):
    """Training steps of the layout's lookup (all tables in one lookup, or one per table), each
    with an Adagrad update over all tables (or one per table). Returns per step the outputs, per
    table the gradient by key, and the capacities after the step."""
    rng = np.random.default_rng([seed, RANK])
    record = []
    for step in range(steps):
        inputs, tops = batch(rng, step)
        if together:
            outs, token = api.pooled_lookup(names, tag + "_fwd", inputs, True)
            grads = api.pooled_lookup_grad(names, tag + "_bwd", token, tops)
            by_key = [gradient_by_key(name, v, r) for name, (v, r) in zip(names, grads)]
            api.apply_optimizer_updates(names, "adagrad", "Adagrad", {}, HYPER,
                                        [v for v, _ in grads], [r for _, r in grads])
        else:
            outs, by_key = [], []
            for t, name in enumerate(names):
                (out,), token = api.pooled_lookup([name], tag + "_one_fwd", [inputs[t]], True)
                (v, r), = api.pooled_lookup_grad([name], tag + "_one_bwd", token, [tops[t]])
                by_key.append(gradient_by_key(name, v, r))
                api.apply_optimizer_update(name, "adagrad", "Adagrad", {}, HYPER, v, r)
                outs.append(out)
        record.append(([np.array(out) for out in outs], by_key, capacities(names)))
    return record


def assert_unchanged(names, before):
    """Every table holds the keys, rows and slots of `before` (shard_state's)."""
    for name, state in zip(names, before):
        assert_same_state(shard_state(name), state)


def on_some_rank(flag):
    return COMM.allreduce(int(bool(flag)), op=MPI.SUM) > 0


def test_an_hbm_group_that_grows_equals_its_tables_one_by_one():
    names = make_tables("dg")
    rng = np.random.default_rng([3, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_first", inputs, False)  # makes the shards and the group
    tables = [api.shard(name) for name in names]
    together = run_steps(names, True)
    group = tables[0].group
    assert isinstance(group, table_group.HashGroup)
    assert group.members == [tables[t] for t in (0, 1, 3, 5)]
    assert tables[2].group is None and tables[4].group is None  # hybrid, another dim
    assert all(api.shard(name) is table for name, table in zip(names, tables))
    for t, member in enumerate(group.members):  # grown in place, views of the group's arrays
        assert on_some_rank(member.capacity > INIT)
        assert member.values.shape[0] == member.capacity == group.capacities[t]
        assert np.shares_memory(member.values, group.values)
        assert member._high_water == member.index.size and member._free.size == 0
        assert member.statistics is None
    assert list(np.diff(group.row_starts)) == [m.capacity for m in group.members]
    grouped = [shard_state(name) for name in names]
    make_tables("dg")  # the same tables anew, each looked up alone
    alone = run_steps(names, False)
    assert all(api.shard(name).group is None for name in names)
    assert [step[2] for step in together] == [step[2] for step in alone]  # capacities
    assert_same_steps(names, together, alone, grouped)


def crowded_member(inputs):
    """On the last rank, member h2 gets more new keys than its shards on all ranks hold at
    max_capacity; the other members get enough new keys to grow."""
    if RANK == SIZE - 1:
        keys = np.arange(64 * SIZE + 1, dtype=np.int64) * 7 + 10 ** 12
        inputs[3] = PooledInput(keys, None, keys.shape[0], None, "sum")
    return TableFullError, "_h2: the shard on rank .* max_capacity=64"


def test_a_member_past_max_capacity_fails_every_rank_and_changes_no_table():
    names = make_tables("dg_full", most=64)
    rng = np.random.default_rng([6, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_full_ok", inputs, True)
    before, held = [shard_state(name) for name in names], capacities(names)
    group = api.shard(names[0]).group
    spoilt, _ = batch(rng, 1)  # new keys: the members would grow
    error, match = crowded_member(spoilt)
    with pytest.raises(error, match=match):
        api.pooled_lookup(names, "dg_full_bad", spoilt, True)
    assert capacities(names) == held
    assert_unchanged(names, before)
    api.pooled_lookup(names, "dg_full_again", inputs, True)  # the group goes on
    assert api.shard(names[0]).group is group
    assert_unchanged(names, before)


def test_a_failed_later_op_of_a_step_that_grew_takes_the_groups_new_keys_out():
    names = make_tables("dg_undo")
    rng = np.random.default_rng([8, RANK])
    inputs, tops = batch(rng, 0)
    api.pooled_lookup(names, "dg_undo_ok", inputs, True)
    before = [shard_state(name) for name in names]
    fresh, _ = batch(rng, 2)  # mostly new keys: members grow
    held = capacities(names)
    _, token = api.pooled_lookup(names, OpId("dg_undo_fwd", "dg_undo", 0), fresh, True)
    assert on_some_rank(capacities(names) != held)
    wrong = list(tops)
    if RANK == SIZE - 1:
        wrong[1] = np.zeros((tops[1].shape[0] + 2, DIM), np.float32)
    with pytest.raises(InvalidInputError):
        api.pooled_lookup_grad(names, OpId("dg_undo_bwd", "dg_undo", 1), token, wrong)
    assert_unchanged(names, before)
    run_steps(names, True, steps=1, tag="dg_undo_on")  # the group trains on


def test_a_step_stopped_while_a_member_grows_keeps_no_key(monkeypatch):
    """Anything that stops the growth (here memory runs out, on every rank) leaves every table
    with the keys it held, and the group goes on."""
    names = make_tables("dg_stop")
    rng = np.random.default_rng([7, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_stop_ok", inputs, True)
    before = [shard_state(name) for name in names]
    crowded = list(inputs)
    keys = np.arange(4 * api.shard(names[0]).capacity * SIZE, dtype=np.int64) + 10 ** 13
    crowded[0] = PooledInput(keys, None, keys.shape[0], None, "sum")  # every rank grows h0

    def out_of_memory(group, table, needed):
        raise MemoryError("no room for %s's %d rows" % (table.name, needed))
    monkeypatch.setattr(table_group.HashGroup, "grow", out_of_memory)
    with pytest.raises(MemoryError):
        api.pooled_lookup(names, "dg_stop_bad", crowded, True)
    monkeypatch.undo()
    assert_unchanged(names, before)
    api.pooled_lookup(names, "dg_stop_again", crowded, True)


@pytest.mark.parametrize("again", ["group", "member"])
def test_growing_a_group_looked_up_earlier_in_the_step_fails_every_rank_changing_nothing(again):
    """Growth moves the flat rows of the members after the grown one, which an earlier lookup
    of the step handed out: a later lookup of the group, or of a member alone, that must grow
    fails on every rank, and the step is rolled back."""
    names = make_tables("dg_twice_" + again)
    rng = np.random.default_rng([9, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_twice_ok", inputs, True)
    before, held = [shard_state(name) for name in names], capacities(names)
    api.pooled_lookup(names, OpId("dg_twice_a", "dg_twice", 0), inputs, True)  # no new key
    crowded = list(inputs)
    if RANK == 0:
        keys = np.arange(3 * held[0] * SIZE, dtype=np.int64) * 5 + 10 ** 13
        crowded[0] = PooledInput(keys, None, keys.shape[0], None, "sum")
    looked_up = names if again == "group" else names[:1]
    with pytest.raises(InvalidInputError, match="once per step"):
        api.pooled_lookup(looked_up, OpId("dg_twice_b", "dg_twice", 1),
                          crowded[:len(looked_up)], True)
    assert capacities(names) == held
    assert_unchanged(names, before)
    api.pooled_lookup(names, "dg_twice_alone", crowded, True)  # a step of its own grows


@pytest.mark.parametrize("way", ["staged", "two-pass"])
def test_an_hbm_groups_members_dump_and_load_where_they_are(shared_dir, monkeypatch, way):
    """Both ways a load takes put every row and slot back into the members where they are
    (they stay in their group, views of its arrays): into the grown group, and into a group of
    the same tables made anew, which grows (through the group) to hold them."""
    monkeypatch.setenv("SOK1X_CHECKPOINT_LOAD", way)
    tag = "dg_ckpt_" + way.replace("-", "_")
    names = make_tables(tag)
    run_steps(names, True, steps=2, seed=11, tag=tag)
    saved = {name: every_row(name, slots=None) for name in names}
    checkpoint.dump_tables(shared_dir, names)
    run_steps(names, True, steps=2, seed=13, tag=tag)  # new keys, grown, changed rows
    for anew in (False, True):
        if anew:
            names = make_tables(tag)
            run_steps(names, True, steps=1, seed=14, tag=tag)  # a small group again
        group = api.shard(names[0]).group
        assert isinstance(group, table_group.HashGroup)
        checkpoint.load_tables(shared_dir, names)
        for name in names:
            assert_same(every_row(name, slots=None), saved[name])
        for member in group.members:
            assert api.shard(member.name) is member and member.group is group
            assert np.shares_memory(member.values, group.values)
            assert member._high_water == member.index.size
        run_steps(names, True, steps=2, seed=15, tag=tag)  # trains on, growing
        assert api.shard(names[0]).group is group


@pytest.mark.parametrize("count", [5, 16])
def test_host_waits_and_backend_calls_do_not_grow_with_the_hbm_tables(count):
    """In a step where no member grows: as many as for 2 tables, and as for a group of as many
    v1 hash tables."""
    counts = {}
    for tables in (2, count):
        layout = [("c%d" % t, DIM, "hbm") for t in range(tables)]
        names = make_tables("dg_count_%d" % tables, init=1024, most=1024, layout=layout)
        rng = np.random.default_rng([10, RANK])
        counts[tables] = _calls_of_a_step(names, summed_batches(rng, layout))
        assert isinstance(api.shard(names[0]).group, table_group.HashGroup)
    v1 = v1_hash_tables("dg_count_v1", capacity=1024, layout=layout)
    counts["v1"] = _calls_of_a_step(v1, summed_batches(np.random.default_rng([10, RANK]),
                                                       layout))
    if RANK == 0:
        print("\nper training step, 2 hbm tables: %s; %d: %s; %d v1 hash tables: %s"
              % (counts[2], count, counts[count], count, counts["v1"]))
    assert counts[count] == counts[2] == counts["v1"], counts


def test_a_program_looking_up_hbm_dynamic_variables_together_trains_as_one_looking_them_up_apart():
    """Four hbm sok1x.DynamicVariables (init_capacity 4: they grow) in a TF1 program."""
    import sok1x
    rng = np.random.default_rng([16, RANK])
    feeds = [[rng.integers(0, 2 ** 40, size=(6, 3)) % (60 * (step + 1)) for _ in range(4)]
             for step in range(3)]

    def make_variables():
        return [sok1x.DynamicVariable(DIM, initializer="uniform", var_type="hbm", init_capacity=4,
                                      max_capacity=1024, name="dg_graph_%d" % t)
                for t in range(4)]
    together = graph_program(True, feeds, make_variables)
    apart = graph_program(False, feeds, make_variables)
    assert together[2] == "HashGroup" and apart[2] == "NoneType"
    assert together[3].capacity == apart[3].capacity and on_some_rank(together[3].capacity > 4)
    assert_same_programs(together, apart)
