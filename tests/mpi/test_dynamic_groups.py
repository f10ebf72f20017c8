"""hbm DynamicVariables in hash groups (DESIGN D13, issue 17 item 1) on the cpu backend, at any
number of ranks: growing tables (tables/dynamic_table.py, var_type "hbm") of one dim, placement and
initializer looked up together pass as one HashGroup, which grows its members in place when a
step's new keys pass their capacity, and give what the same tables give looked up one by one
(forward, gradients, the keys each shard holds, their rows and slots, the capacities), beside a
hybrid DynamicVariable and an hbm one of another dim in the same lookup (units of their own). A
member past its max_capacity fails the step on every rank and changes no table; a growth that
fails leaves the group as it was; a failed later op takes the group's new keys out again; a
lookup whose gradient comes after a growth (a later lookup of the step, or an assign) updates the
rows of its own keys; a member's dump and load, both ways, put its rows back where they are; and
a step's host waits and backend calls do not grow with the number of tables; the keyed form
gives the same, a growth between its lookup and gradient included."""
import numpy as np
import pytest
from mpi4py import MPI

from checkpoint_reference import assert_same, every_row
from sok1x.backend import random_init
from sok1x.engine import api, checkpoint, runtime
from sok1x.engine.tables import assign_values
from sok1x.engine.lookup import table_group
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.engine.op_order import OpId
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError, TableFullError
from test_hash_groups import (
    _calls_of_a_step,
    assert_same_gradient,
    assert_same_state,
    batch,
    gradient_by_key,
    keyed_gradient_and_update,
    keyed_input,
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


@pytest.fixture(autouse=True, params=["copies", "in_place"])
def growth(request, monkeypatch):
    """Every test twice: groups that grow by laying their arrays out again, and groups whose
    rows grow in place (table_group.GROW_ENV; these tables are too small for it by default)."""
    monkeypatch.setenv(table_group.GROW_ENV, "1" if request.param == "in_place" else "0")
    return request.param


def make_tables(tag, init=INIT, most=MAX, layout=LAYOUT):
    """Creates the layout's tables anew (the same names give the same initial rows)."""
    names = ["%s_%s" % (tag, suffix) for suffix, _, _ in layout]
    for name, (_, dim, var_type) in zip(names, layout):
        api.create_table(name, dim, most, True, SPEC, replace=True,
                         dynamic=make_dynamic(var_type, init, most))
    return names


def capacities(names):
    return [api.shard(name).capacity for name in names]


def lookup(names, op, inputs, together):
    """A training lookup of `names`, all in one call or one call per table: (outputs, tokens)."""
    if together:
        outs, token = api.pooled_lookup(names, op, inputs, True)
        return outs, [token]
    outs, tokens = [], []
    for t, name in enumerate(names):
        (out,), token = api.pooled_lookup([name], "%s_%d" % (op, t), [inputs[t]], True)
        outs.append(out)
        tokens.append(token)
    return outs, tokens


ADAGRAD = ("adagrad", "Adagrad", HYPER)


def gradients_and_update(names, op, tokens, tops, rule=ADAGRAD):
    """The gradients of lookup's tokens and an update with them by `rule` (rule name, slot
    prefix, hyper-parameters; Adagrad by default), one call over all tables, or one per table;
    returns per table the gradient by key."""
    name_of_rule, prefix, hyper = rule
    if len(tokens) == 1:
        grads = api.pooled_lookup_grad(names, op, tokens[0], tops)
        by_key = [gradient_by_key(name, v, r) for name, (v, r) in zip(names, grads)]
        api.apply_optimizer_updates(names, name_of_rule, prefix, {}, hyper,
                                    [v for v, _ in grads], [r for _, r in grads])
        return by_key
    by_key = []
    for t, (name, token) in enumerate(zip(names, tokens)):
        (v, r), = api.pooled_lookup_grad([name], "%s_%d" % (op, t), token, [tops[t]])
        by_key.append(gradient_by_key(name, v, r))
        api.apply_optimizer_update(name, name_of_rule, prefix, {}, hyper, v, r)
    return by_key


def run_steps(names, together, steps=3, seed=3, tag="dg", rule=ADAGRAD):
    """Training steps of the layout's lookup (all tables in one lookup, or one per table).
    Returns per step the outputs, per table the gradient by key, and the capacities."""
    rng = np.random.default_rng([seed, RANK])
    record = []
    for step in range(steps):
        inputs, tops = batch(rng, step)
        outs, tokens = lookup(names, tag + "_fwd", inputs, together)
        by_key = gradients_and_update(names, tag + "_bwd", tokens, tops, rule)
        record.append(([np.array(out) for out in outs], by_key, capacities(names)))
    return record


def assert_same_steps(names, together, alone, grouped):
    """Steps of the tables looked up together equal those looked up one by one, and the
    shards after them (grouped: shard_state of each after the steps together) the ones now."""
    for got_step, want_step in zip(together, alone):
        for out, want in zip(got_step[0], want_step[0]):
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        for got, want in zip(got_step[1], want_step[1]):
            assert_same_gradient(got, want)
        assert got_step[2:] == want_step[2:]
    for name, got in zip(names, grouped):
        assert_same_state(got, shard_state(name))


def assert_unchanged(names, before):
    """Every table holds the keys, rows and slots of `before` (shard_state's)."""
    for name, state in zip(names, before):
        assert_same_state(shard_state(name), state)


def on_some_rank(flag):
    return COMM.allreduce(int(bool(flag)), op=MPI.SUM) > 0


def assert_a_group_of_views(group):
    """Every member's arrays are views of its rows in the group's flat arrays (rows split
    between device and host memory: on cpu, views of the one array holding the flat rows)."""
    # a member's rows: its capacity, and at max_capacity a hybrid member's spare rows
    rows = [m.capacity + (m.spare if m.capacity == m.max_capacity else 0) for m in group.members]
    assert list(group.held_rows) == rows
    reserved = [m.max_capacity + m.spare if group.reserved else r
                for m, r in zip(group.members, rows)]
    assert list(np.diff(group.row_starts)) == reserved  # in place: every row a member may hold
    assert list(group.capacities) == [m.capacity for m in group.members]
    for t, member in enumerate(group.members):
        assert member.values.shape[0] == rows[t] and member.index.capacity == rows[t]
        start = int(group.row_starts[t])
        for mine, flat in [(member.values, group.values), (member.times, group.times)] + [
                (member.slots[name], group.slots[name]) for name in group.slots]:
            mine, flat = (getattr(a, "whole", a) for a in (mine, flat))
            assert np.shares_memory(mine, flat)
            assert mine.__array_interface__["data"][0] == flat[start:].__array_interface__[
                "data"][0]


def test_an_hbm_group_that_grows_equals_its_tables_one_by_one(growth, monkeypatch):
    names = make_tables("dg")
    rng = np.random.default_rng([3, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_first", inputs, False)  # makes the shards and the group
    tables = [api.shard(name) for name in names]
    together = run_steps(names, True)
    group = tables[0].group
    assert isinstance(group, table_group.HashGroup)
    assert group.reserved == (growth == "in_place")
    assert group.members == [tables[t] for t in (0, 1, 3, 5)]
    assert tables[2].group is None  # hybrid
    if growth == "in_place":  # another dim, alone: a group of one, growing in place too
        assert tables[4].group.members == [tables[4]] and tables[4].group.reserved
        assert_a_group_of_views(tables[4].group)
    else:
        assert tables[4].group is None
    assert all(api.shard(name) is table for name, table in zip(names, tables))
    for member in group.members:
        assert on_some_rank(member.capacity > INIT)
        assert member.statistics is None and member._free.size == 0
    assert_a_group_of_views(group)
    grouped = [shard_state(name) for name in names]
    monkeypatch.setenv(table_group.GROW_ENV, "0")
    make_tables("dg")  # the same tables anew, each looked up alone, growing by copies
    alone = run_steps(names, False)
    assert all(api.shard(name).group is None for name in names)
    assert_same_steps(names, together, alone, grouped)


EVERY_ROW_RULES = {
    "adam": {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7},
    "keras_rmsprop": {"lr": 0.01, "rho": 0.9, "epsilon": 1e-7},
    "ftrl_all_rows": {"lr": 0.1, "lr_power": -0.5, "l1": 0.01, "l2": 0.01,
                      "l2_shrinkage": 0.01},
}


@pytest.mark.parametrize("rule", sorted(EVERY_ROW_RULES))
def test_a_rule_that_moves_every_row_trains_the_group_as_its_tables_alone(growth, rule):
    """Rules that move every row of a shard (Adam's, Keras RMSprop's, TF 2.11+ Keras Ftrl's)
    give a growing group what they give its tables one by one: grown in place, they run on each
    member's held rows (the flat arrays reserve rows no member holds), and rows a growth added
    start as a group growing by copies starts them (a row's vector zero until a key takes it)."""
    rule = (rule, rule.title().replace("_", ""), EVERY_ROW_RULES[rule])
    names = make_tables("dg_every_" + rule[0], most=1 << 14)
    together = run_steps(names, True, steps=4, tag="dg_every", rule=rule)
    group = api.shard(names[0]).group
    assert group.reserved == (growth == "in_place")
    assert on_some_rank(any(c > INIT for c in group.capacities))
    grouped = [shard_state(name) for name in names]
    make_tables("dg_every_" + rule[0], most=1 << 14)
    alone = run_steps(names, False, steps=4, tag="dg_every", rule=rule)
    assert_same_steps(names, together, alone, grouped)


def test_a_group_grown_in_place_keeps_its_arrays_and_backs_the_rows_held_only(growth):
    """Grown in place, a group keeps its flat arrays (the same memory, every row where it
    was) and has memory behind its members' rows held only, whole pages of them; grown by
    copies, its arrays are new ones of the rows held."""
    names = make_tables("dg_place", most=1 << 16)
    rng = np.random.default_rng([5, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_place_first", inputs, True)
    run_steps(names, True, steps=1, tag="dg_place_slots")  # Adagrad's slot made
    group = api.shard(names[0]).group
    arrays = [group.values, group.times] + [group.slots[name] for name in sorted(group.slots)]
    addresses = [a.__array_interface__["data"][0] for a in arrays]
    held = capacities(names)
    run_steps(names, True, steps=3, seed=11, tag="dg_place")
    assert on_some_rank(capacities(names) != held)
    after = [group.values, group.times] + [group.slots[name] for name in sorted(group.slots)]
    moved = [a.__array_interface__["data"][0] for a in after] != addresses
    assert on_some_rank(moved) if growth == "copies" else not moved
    assert_a_group_of_views(group)
    if growth == "copies":
        assert group.reserved_bytes() is None
        assert group.values.shape[0] == sum(capacities(names[i] for i in (0, 1, 3, 5)))
        return
    page, held = 4096, np.asarray(group.held_rows)
    assert group.values.shape[0] == len(group.members) * (1 << 16)
    ahead = [group._ahead[t][0] if t in group._ahead else n for t, n in enumerate(held)]
    held_bytes, most_bytes = (sum(int(np.sum(rows)) * a.nbytes // a.shape[0] for a in after)
                              for rows in (held, ahead))
    assert held_bytes <= group.reserved_bytes() <= most_bytes + 2 * page * held.size * len(after)


def test_a_member_near_its_capacity_has_its_next_rows_backed_before_it_grows(growth,
                                                                            monkeypatch):
    """In place, a member past 3/4 of its capacity gets memory behind the rows of its next
    doubling ahead of the step that grows it (table_group._AHEAD; on cuda on a helper thread),
    so that growth takes them as they are, asking the driver for nothing; by copies nothing
    is reserved."""
    names = make_tables("dg_ahead", init=1024, most=1 << 16)  # members of whole pages
    run_steps(names, True, steps=1, tag="dg_ahead")  # the group and Adagrad's slot made
    group = api.shard(names[0]).group
    if growth == "copies":
        assert group.reserved_bytes() is None and not group.reserved
        return
    held = group.capacities.copy()
    start, before = int(group.row_starts[0]), group.reserved_bytes()
    sizes = np.zeros_like(held)
    sizes[0] = held[0]  # member 0 full, the others empty
    group._back_ahead(sizes)
    assert list(group._ahead) == [0]
    grown = group.members[0].grown_capacity(2 * int(held[0]))
    arrays = [group.values, group.times] + list(group.slots.values())
    ahead = sum((grown - int(held[0])) * a.nbytes // a.shape[0] for a in arrays)
    margin = 2 * 4096 * len(arrays)  # a page at either end of each array's new rows
    assert ahead - margin <= group.reserved_bytes() - before <= ahead + margin
    calls, back_rows = [], group.backend.back_rows

    def counted(array, first, stop):
        pieces = back_rows(array, first, stop)
        calls.append((first, len(pieces)))
        return pieces
    monkeypatch.setattr(group.backend, "back_rows", counted)
    group.grow(np.where(np.arange(held.size) == 0, grown, held))
    monkeypatch.undo()
    assert group.capacities[0] == grown and not group._ahead
    mine = [pieces for first, pieces in calls if first == start + int(held[0])]
    assert not mine  # every array's rows backed and filled ahead: no driver call left
    assert_a_group_of_views(group)
    new = slice(int(held[0]), grown)  # filled ahead: each slot's initial value, times 0
    member = group.members[0]
    assert not member.times[new].any()
    for name, rows in member.slots.items():
        assert (rows[new] == np.float32(group.slot_initial[name])).all()


def test_gradient_rows_past_a_members_capacity_fail_and_change_nothing(growth):
    """An update of the group's members whose rows for one member pass its capacity (in place:
    rows its group reserved, with no memory behind them) fails naming that table, on every
    rank, and changes no table."""
    names = make_tables("dg_rows", most=1 << 16)
    rng = np.random.default_rng([4, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_rows_first", inputs, True)
    members = [names[t] for t in (0, 1, 3, 5)]
    before = [shard_state(name) for name in names]
    rows = [np.array([0], np.int64) for _ in members]
    rows[1] = np.array([api.shard(members[1]).capacity], np.int64)
    values = [np.ones((1, DIM), np.float32) for _ in members]
    with pytest.raises(InvalidInputError, match="_h1: gradient rows must be in"):
        api.apply_optimizer_updates(members, "adagrad", "Adagrad", {}, HYPER, values, rows)
    assert_unchanged(names, before)


def test_every_step_backs_ahead_for_members_past_three_quarters(growth):
    """A training step whose keys all fit (no count, no growth) still starts the backing
    ahead of every member that held more than 3/4 of its capacity when it began (its op
    header reads the sizes); by copies there is none."""
    names = make_tables("dg_quarters", init=256, most=1 << 16)
    run_steps(names, True, steps=1, tag="dg_quarters_first")
    group = api.shard(names[0]).group
    count, checked = 16, 0  # new keys a rank, table and step: most steps fit
    for step in range(16):
        sizes, held = group.sizes(), group.capacities.copy()
        first = 10 ** 12 + (step * SIZE + RANK) * count
        inputs = [PooledInput(np.arange(first, first + count, dtype=np.int64) + t * 10 ** 9,
                              None, count, None, "sum") for t in range(len(names))]
        api.pooled_lookup(names, "dg_quarters_%d" % step, inputs, True)
        near = (sizes > 0.75 * held) & (group.capacities == held)
        for t in np.flatnonzero(near).tolist():
            assert (t in group._ahead) == group.reserved, (step, t, sizes, held)
        checked += int(near.sum())
    assert on_some_rank(checked)


def crowded_member(inputs):
    """On the last rank, member h2 gets more new keys than its shards on all ranks hold at
    max_capacity; the other members get enough new keys to grow."""
    if RANK == SIZE - 1:
        keys = np.arange(64 * SIZE + 1, dtype=np.int64) * 7 + 10 ** 12
        inputs[3] = PooledInput(keys, None, keys.shape[0], None, "sum")
    return TableFullError, "_h2: the shard on rank .* max_capacity=64"


SOLO = [("s0", DIM, "hbm"), ("s1", DIM, "hbm")]


def _alone_then_together(tag):
    """Two training steps of table s0 looked up alone, then two of s0 and s1 in one lookup.
    Returns the names, per step the outputs, gradients by key and capacities, and s0's group
    after its steps alone."""
    names = make_tables(tag, layout=SOLO)
    rng = np.random.default_rng([41, RANK])
    record, alone_group = [], None
    for step in range(4):
        inputs, tops = batch(rng, step, layout=SOLO)
        looked = names[:1] if step < 2 else names
        op = "%s_%d" % (tag, len(looked))
        outs, tokens = lookup(looked, op + "_fwd", inputs[:len(looked)], True)
        by_key = gradients_and_update(looked, op + "_bwd", tokens, tops[:len(looked)])
        record.append(([np.array(out) for out in outs], by_key, capacities(names)))
        if step == 1:
            alone_group = api.shard(names[0]).group
    return names, record, alone_group


def test_a_dynamic_variable_looked_up_alone_grows_in_place_as_a_group_of_one(growth,
                                                                            monkeypatch):
    """An hbm DynamicVariable looked up alone whose rows may grow in place is a hash group of
    one (table_group._grows_in_place_alone): it grows copying nothing, and gives what the same
    table growing by copies gives. Looked up with another table later, it leaves its group of
    one for their group. By copies it stays a table of its own."""
    names, got, alone_group = _alone_then_together("dg_solo")
    tables = [api.shard(name) for name in names]
    if growth == "in_place":
        assert alone_group.members == [tables[0]] and alone_group.reserved
        assert on_some_rank(got[1][2][0] > INIT)  # grown while alone
        assert alone_group.live_at is None and tables[0].group is not alone_group
        assert tables[0].group.members == tables and tables[0].group.reserved
        assert_a_group_of_views(tables[0].group)
    else:
        assert alone_group is None
    after = [shard_state(name) for name in names]
    monkeypatch.setenv(table_group.GROW_ENV, "0")
    _, want, none = _alone_then_together("dg_solo")
    assert none is None
    assert_same_steps(names, got, want, after)


def test_a_table_alone_named_with_a_grouped_table_keeps_its_group_of_one(growth, monkeypatch):
    """Lookups of [U, W], [T] and [T, U] in each step: [T, U] can form no group (U is in
    [U, W]'s), so T keeps its group of one there (looked up as a unit of its own) and no group
    is made again after the first step."""
    made = []
    made_as = table_group.HashGroup.__init__

    def counted(group, rt, members):
        made.append([member.name for member in members])
        made_as(group, rt, members)
    monkeypatch.setattr(table_group.HashGroup, "__init__", counted)
    names = make_tables("dg_keep", layout=[("t", DIM, "hbm"), ("u", DIM, "hbm"),
                                            ("w", DIM, "hbm")])
    t, u, w = names
    keys = np.arange(RANK, 40, SIZE, dtype=np.int64)
    item = PooledInput(keys, np.zeros(keys.size, np.int64), 1, None, "sum")
    for step in range(3):
        before = len(made)
        for looked in ([u, w], [t], [t, u]):
            api.pooled_lookup(looked, "dg_keep_" + "_".join(looked), [item] * len(looked),
                              True)
        if step:
            assert made[before:] == [], made
    alone = api.shard(t).group
    assert (alone is None) == (growth == "copies")
    assert alone is None or alone.members == [api.shard(t)]


def test_by_default_only_a_large_dynamic_variable_alone_is_a_group_of_one(monkeypatch):
    """Without SOK1X_GROW_IN_PLACE, a table alone grows in place by HashGroup._reserved_rows'
    rule: 64 MiB of values held (a granule per array at most an eighth of them) and a reserve
    at most 64x the rows held. A small table, or one that cannot grow, stays a table of its
    own."""
    monkeypatch.delenv(table_group.GROW_ENV)
    dim, held = 128, 1 << 17  # 64 MiB of float32 values
    cases = {"large": (held, 4 * held), "small": (INIT, MAX), "fixed": (held, held),
             "wide": (held, 128 * held)}
    for case, (init, most) in cases.items():
        name = "dg_default_" + case
        api.create_table(name, dim, most, True, SPEC, replace=True,
                         dynamic=make_dynamic("hbm", init, most))
        keys = np.arange(RANK, 40, SIZE, dtype=np.int64)
        api.pooled_lookup([name], name, [PooledInput(keys, np.zeros(keys.size, np.int64), 1,
                                                     None, "sum")], False)
        group = api.shard(name).group
        assert (group is not None) == (case == "large"), case


def test_a_member_past_max_capacity_fails_every_rank_and_changes_no_table():
    names = make_tables("dg_full", most=64)
    rng = np.random.default_rng([6, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_full_ok", inputs, True)
    before, held = [shard_state(name) for name in names], capacities(names)
    group = api.shard(names[0]).group
    starts = group.row_starts
    spoilt, _ = batch(rng, 1)  # new keys: the members would grow
    error, match = crowded_member(spoilt)
    with pytest.raises(error, match=match):
        api.pooled_lookup(names, "dg_full_bad", spoilt, True)
    assert capacities(names) == held and group.row_starts is starts
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


def test_a_growth_that_fails_leaves_the_group_as_it_was_and_keeps_no_key(monkeypatch):
    """A growth whose last part fails (here the grown index, out of memory on every rank),
    after the new flat arrays were made, takes none of them: every member keeps its capacity,
    rows, views and keys, no key of the step stays, and the group grows in a later step."""
    names = make_tables("dg_stop")
    rng = np.random.default_rng([7, RANK])
    inputs, _ = batch(rng, 0)
    api.pooled_lookup(names, "dg_stop_ok", inputs, True)
    group = api.shard(names[0]).group
    before, held, starts = [shard_state(name) for name in names], capacities(names), \
        group.row_starts
    backed = group.reserved_bytes()  # in place: the memory behind the rows held
    crowded = list(inputs)
    keys = np.arange(4 * api.shard(names[0]).capacity * SIZE, dtype=np.int64) + 10 ** 13
    crowded[0] = PooledInput(keys, None, keys.shape[0], None, "sum")  # every rank grows h0
    made = []

    def out_of_memory(backend, indexes, capacities):
        made.extend(capacities)
        raise MemoryError("no room for indexes of %s rows" % list(capacities))
    monkeypatch.setattr(table_group, "rebuilt_indexes", out_of_memory)
    with pytest.raises(MemoryError):
        api.pooled_lookup(names, "dg_stop_bad", crowded, True)
    monkeypatch.undo()
    assert made and capacities(names) == held and group.row_starts is starts
    assert group.reserved_bytes() == backed  # what the failed growth backed, given back
    assert_a_group_of_views(group)
    assert_unchanged(names, before)
    api.pooled_lookup(names, "dg_stop_again", crowded, True)
    assert api.shard(names[0]).capacity > held[0] and api.shard(names[0]).group is group
    assert_a_group_of_views(group)


def grow_between(names, together, way, seed=9):
    """A training lookup of the layout, then (before its gradient) a growth of member h0 — a
    second lookup with many new keys of h0 (way "lookup", its gradient applied too) or an
    assign of new keys to h0 (way "assign") — then the first lookup's gradient and update.
    Returns the first lookup's gradients by key and every table's state."""
    rng = np.random.default_rng([seed, RANK])
    inputs, tops = batch(rng, 0)
    lookup(names, "gb_warm", inputs, together)
    first, first_tops = batch(rng, 1)
    _, tokens = lookup(names, "gb_first", first, together)
    held = capacities(names)
    new = np.arange(3 * held[0] * SIZE, dtype=np.int64) * 11 + 10 ** 13
    if way == "lookup":
        more = list(first)
        more[0] = PooledInput(new, None, new.shape[0], None, "sum")
        _, later = lookup(names, "gb_second", more, together)
        gradients_and_update(names, "gb_second_bwd", later,
                             [np.ones((new.size, DIM), np.float32)] + list(first_tops[1:]))
    else:
        values = np.arange(new.size * DIM, dtype=np.float32).reshape(new.size, DIM) / 1e3
        assign_values.assign_values(names[0], new, values, where="grow_between")
    assert on_some_rank(capacities(names)[0] > held[0])
    by_key = gradients_and_update(names, "gb_first_bwd", tokens, first_tops)
    return by_key, [shard_state(name) for name in names]


@pytest.mark.parametrize("way", ["lookup", "assign"])
def test_a_lookups_gradient_after_a_growth_of_its_group_updates_its_own_keys(way):
    """Growing member h0 moves the flat rows of h1..h3; a lookup routed before the growth (its
    gradient comes after it, as in eager mode or with an assign between) splits its gradient by
    the rows it routed with, and updates the keys it looked up: the same as the tables one by
    one."""
    names = make_tables("dg_between_" + way)
    got, got_state = grow_between(names, True, way)
    group = api.shard(names[0]).group
    assert isinstance(group, table_group.HashGroup)
    assert_a_group_of_views(group)
    names = make_tables("dg_between_" + way)
    want, want_state = grow_between(names, False, way)
    for g, w in zip(got, want):
        assert_same_gradient(g, w)
    for g, w in zip(got_state, want_state):
        assert_same_state(g, w)


def _keyed_steps(names, layout, keyed, grow_between, steps=3):
    """Training steps of hbm tables `names` (INIT rows: they grow) as one keyed lookup each, or
    one pooled lookup per table, with (grow_between) an assign of 32 new keys a rank to the first
    table between each lookup and its gradient. Returns per step (outputs joined, per table the
    gradient by key), and the tables' states."""
    rng = np.random.default_rng([12, RANK])
    record = []
    for step in range(steps):
        inputs, tops = batch(rng, step, layout)
        inputs = [i._replace(weights=None, combiner="sum") for i in inputs]
        if keyed:
            out, token = api.keyed_lookup(names, "dgk_fwd", keyed_input(inputs), True)
        else:
            outs, tokens = lookup(names, "dgk_one_fwd", inputs, False)
            out = np.concatenate(outs)
        if grow_between:
            new = np.arange(32 * SIZE, dtype=np.int64) + 10 ** 13 + step * 10 ** 9
            assign_values.assign_values(names[0], new, np.full((new.size, DIM), 0.5, np.float32),
                                        where="dgk_between")
        if keyed:
            by_key = keyed_gradient_and_update(names, "dgk_bwd", token, tops)
        else:
            by_key = gradients_and_update(names, "dgk_one_bwd", tokens, tops)
        record.append((np.array(out), by_key))
    return record, [shard_state(name) for name in names]


@pytest.mark.parametrize("grow_between", [False, True])
def test_a_keyed_lookup_of_an_hbm_group_equals_its_tables_one_by_one(grow_between):
    """The keyed form (all tables' keys in one array, engine/lookup/keyed.py) of a growing hbm
    group, also with a growth between each lookup and its gradient."""
    layout = [entry for entry in LAYOUT if entry[2] == "hbm" and entry[1] == DIM]
    tag = "dg_keyed_%d" % grow_between
    names = make_tables(tag, layout=layout)
    together, grouped = _keyed_steps(names, layout, True, grow_between)
    group = api.shard(names[0]).group
    assert isinstance(group, table_group.HashGroup)
    assert_a_group_of_views(group)
    assert on_some_rank(api.shard(names[0]).capacity > INIT)
    make_tables(tag, layout=layout)
    alone, want = _keyed_steps(names, layout, False, grow_between)
    for (out, grads), (want_out, want_grads) in zip(together, alone):
        np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
        for got, expected in zip(grads, want_grads):
            assert_same_gradient(got, expected)
    for got, expected in zip(grouped, want):
        assert_same_state(got, expected)


@pytest.mark.parametrize("way", ["staged", "two-pass"])
def test_an_hbm_groups_members_dump_and_load_where_they_are(shared_dir, monkeypatch, way):
    """Both ways a load takes put every row and slot back into the members where they are
    (they stay in their group, views of its arrays): into the grown group, and into a group of
    the same tables made anew, which grows (through the group, once) to hold them."""
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
        assert_a_group_of_views(group)
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
    v1 = v1_hash_tables("dg_count_v1", capacity=1024, layout=[(s, d, True) for s, d, _ in layout])
    counts["v1"] = _calls_of_a_step(v1, summed_batches(np.random.default_rng([10, RANK]),
                                                       layout))
    if RANK == 0:
        print("\nper training step, 2 hbm tables: %s; %d: %s; %d v1 hash tables: %s"
              % (counts[2], count, counts[count], count, counts["v1"]))
    assert counts[count] == counts[2] == counts["v1"], counts


def _graph_program(together, inter_op_threads, steps=3, var_type="hbm", most=1024):
    """A TF1 program of four sok1x.DynamicVariables of var_type (init_capacity 4: they grow;
    max_capacity `most`) looked up by sok1x.lookup_sparse, all in one call or one call each,
    trained with Adagrad in a Session of `inter_op_threads` inter-op threads. Returns the
    losses, every variable's exported rows by key, the kind of group of the first, its capacity
    on this rank and how many keys it evicted there."""
    import sok1x
    from tf_support import session, tf1
    graph = tf1.Graph()
    rng = np.random.default_rng([16, RANK])
    feeds = [[rng.integers(0, 2 ** 40, size=(6, 3)) % (60 * (step + 1)) for _ in range(4)]
             for step in range(steps)]
    with graph.as_default():
        variables = [sok1x.DynamicVariable(dimension=DIM, initializer="uniform",
                                           var_type=var_type, init_capacity=4, max_capacity=most,
                                           name="dg_graph_%d" % t) for t in range(4)]
        holders = [tf1.placeholder(tf1.int64, [6, 3]) for _ in variables]
        ids = [tf1.RaggedTensor.from_tensor(holder) for holder in holders]
        if together:
            pooled = sok1x.lookup_sparse(variables, ids, combiners=["sum"] * 4)
        else:
            pooled = [sok1x.lookup_sparse([v], [i], combiners=["sum"])[0]
                      for v, i in zip(variables, ids)]
        weights = [np.random.default_rng([17, t]).standard_normal((6, DIM)).astype(np.float32)
                   for t in range(4)]
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
        table = api.shard(variables[0]._sok1x_table.name)
    return losses, rows, type(table.group).__name__, table.capacity, table.evicted_keys


@pytest.mark.parametrize("inter_op_threads", [1, 8])
def test_a_program_looking_up_hbm_dynamic_variables_together_trains_as_one_looking_them_up_apart(
        inter_op_threads, monkeypatch):
    losses, rows, kind, capacity, _ = _graph_program(True, inter_op_threads)
    monkeypatch.setenv(table_group.GROW_ENV, "0")  # apart: tables of their own, by copies
    want_losses, want_rows, alone, want_capacity, _ = _graph_program(False, inter_op_threads)
    assert kind == "HashGroup" and alone == "NoneType"
    assert capacity == want_capacity and on_some_rank(capacity > 4)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-5)
    for got, want in zip(rows, want_rows):
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("spare_rows")
@pytest.mark.parametrize("inter_op_threads", [1, 8])
def test_hybrid_dynamic_variables_looked_up_together_in_a_program_train_as_apart(
        inter_op_threads):
    """The same program on hybrid DynamicVariables small enough to evict (max_capacity 36 a
    rank, each step bringing 18 keys a rank and variable from a span that grows): one HashGroup
    that evicts, the same losses and rows as the variables looked up one by one (with 8
    inter-op threads, in whatever order the Session runs the lookups apart)."""
    losses, rows, kind, capacity, evicted = _graph_program(True, inter_op_threads, 4, "hybrid",
                                                           36)
    want_losses, want_rows, alone, want_capacity, _ = _graph_program(False, inter_op_threads, 4,
                                                                     "hybrid", 36)
    assert kind == "HashGroup" and alone == "NoneType" and capacity == want_capacity
    assert on_some_rank(evicted)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-5)
    for got, want in zip(rows, want_rows):
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
