"""hybrid DynamicVariables in hash groups (DESIGN D13, issue 17 item 1) on the cpu backend, at any
number of ranks: growing and evicting tables (tables/dynamic_table.py, var_type "hybrid") of one
dim, placement and initializer looked up together pass as one HashGroup, which grows its members
and, at max_capacity, evicts from each the keys it needs freed, handing the freed rows to the
new keys; they give what the same tables give looked up one by one (forward, gradients, the keys
each shard holds with their vectors, slots and lookup counts, the evicted keys and their
vectors, the capacities), with a member whose rows split into host memory, beside an hbm
DynamicVariable (a unit of its own) and two hybrid ones of another dim (a second group). A member
whose step's own keys pass max_capacity fails the step on every rank and changes no table, as
does another table's failure after the group's insert (no lookup counted); a failed later op of
a step that evicted puts the evicted keys back; a member's dump and load put its rows back where
they are; a step's host waits and backend calls do not grow with the number of tables; and the
members whose evicted keys are read take them in one read for the group."""
import numpy as np
import pytest
from mpi4py import MPI

from checkpoint_reference import assert_same, every_row
from sok1x.backend import random_init
from sok1x.engine import api, checkpoint, runtime
from sok1x.engine.tables import dynamic_table, hybrid_rows
from sok1x.engine.lookup import bounded_step, table_group
from sok1x.engine.tables.dynamic_table import COUNT, make_dynamic
from sok1x.engine.op_order import OpId
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError, TableFullError
from test_dynamic_groups import assert_a_group_of_views, gradients_and_update, lookup
from test_hash_groups import _calls_of_a_step, assert_same_gradient, assert_same_state
from test_hash_groups import batch as hash_batch


# Every test twice: with the default spare rows and with SOK1X_SPARE_ROWS=1 (conftest.py).
pytestmark = pytest.mark.usefixtures("spare_rows")


COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=41)
DIM, INIT = 8, 2
WINDOW, SHIFT = 24, 16  # a step's keys of a table: WINDOW consecutive ints, SHIFT on per step
MAX = 32 // SIZE  # a shard's rows: a step's keys fit (WINDOW / SIZE), five steps' do not
# name suffix, dim, var_type, GiB of vectors in GPU memory: five hybrid tables of DIM (one
# group; s0's rows split once it holds more than 3), an hbm one of DIM (a unit of its own), and
# two hybrid tables of another dim (a second group)
LAYOUT = [("y0", DIM, "hybrid", 0.0), ("y1", DIM, "hybrid", 0.0), ("h0", DIM, "hbm", 0.0),
          ("y2", DIM, "hybrid", 0.0), ("s0", DIM, "hybrid", 1e-7), ("y3", DIM, "hybrid", 0.0),
          ("z0", 4, "hybrid", 0.0), ("z1", 4, "hybrid", 0.0)]
GROUPED = (0, 1, 3, 4, 5, 6, 7)  # the layout's tables in a group (the first five, the last two)


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


def make_tables(tag, most=MAX, layout=LAYOUT, strategy=("lru", "lfu"), init=INIT):
    """Creates the layout's tables anew (the same names give the same initial rows); hybrid
    tables of `most` rows alternate the eviction strategies, hbm ones hold 8 times more."""
    names = ["%s_%s" % (tag, row[0]) for row in layout]
    for t, (name, (_, dim, var_type, hbm_gib)) in enumerate(zip(names, layout)):
        rows = most if var_type == "hybrid" else 8 * most  # an hbm table never evicts
        api.create_table(name, dim, rows, True, SPEC, replace=True, dynamic=make_dynamic(
            var_type, init, rows, strategy[t % len(strategy)], hbm_gib))
    return names


def window_keys(rng, t, step):
    """Table t's keys of a step: drawn from its window (a key seen in an earlier step comes
    back now and then, so eviction has both kinds to choose from)."""
    low = step * SHIFT + 1000 * t
    return rng.integers(low, low + WINDOW, size=20 + 2 * t)


def batch(rng, step, layout=LAYOUT):
    return hash_batch(rng, step, layout, window_keys)


def shard_state(name):
    """This rank's shard by key: {key: (vector, {slot: row})} and its index size (rows split
    into host memory read through the one array both parts view, on cpu)."""
    table = api.shard(name)
    keys, rows = table.index.export()

    def whole(array):
        return array.whole if hybrid_rows.is_split(array) else array
    return {int(k): (whole(table.values)[r].copy(),
                     {n: whole(s)[r].copy() for n, s in table.slots.items()})
            for k, r in zip(keys, rows)}, table.index.size


def full_state(name):
    """shard_state with each key's lookup count, and the keys evicted since the last call with
    their vectors (pop_evicted: read once)."""
    table = api.shard(name)
    counts = {}
    if table.statistics is not None:
        keys, rows = table.index.export()
        counts = dict(zip(keys.tolist(), np.asarray(table.statistics)[rows, COUNT].tolist()))
    evicted_keys, evicted_values = table.pop_evicted()
    return shard_state(name), counts, dict(zip(evicted_keys.tolist(), evicted_values))


def assert_same_full_state(got, want):
    assert_same_state(got[0], want[0])
    assert got[1] == want[1]
    assert sorted(got[2]) == sorted(want[2])
    for key, vector in want[2].items():
        np.testing.assert_allclose(got[2][key], vector, rtol=1e-5, atol=1e-6)


def assert_same_steps(together, alone):
    """Steps of run_steps (tables looked up together, then alone) agree: outputs, gradients by
    key, capacities and every table's full_state."""
    for got_step, want_step in zip(together, alone):
        for out, want in zip(got_step[0], want_step[0]):
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        for got, want in zip(got_step[1], want_step[1]):
            assert_same_gradient(got, want)
        assert got_step[2] == want_step[2]
        for got, want in zip(got_step[3], want_step[3]):
            assert_same_full_state(got, want)


def run_steps(names, together, steps=5, seed=3, tag="yg", layout=LAYOUT):
    """Training steps (all tables in one lookup, or one per table); returns per step the
    outputs, the gradients by key, the capacities and every table's full_state."""
    rng = np.random.default_rng([seed, RANK])
    record = []
    for step in range(steps):
        inputs, tops = batch(rng, step, layout)
        outs, tokens = lookup(names, tag + "_fwd", inputs, together)
        by_key = gradients_and_update(names, tag + "_bwd", tokens, tops)
        record.append(([np.array(out) for out in outs], by_key,
                       [api.shard(name).capacity for name in names],
                       [full_state(name) for name in names]))
    return record


def on_some_rank(flag):
    return COMM.allreduce(int(bool(flag)), op=MPI.SUM) > 0


@pytest.mark.parametrize("room", [False, True])
def test_a_hybrid_group_that_grows_and_evicts_equals_its_tables_one_by_one(room):
    """room=False: members of INIT rows that grow to MAX and then evict every step (their
    counts read in the lookup); room=True: members with room for every rank's keys, whose counts
    the next op header reads (the rows handed out by counts no host has read yet)."""
    most, init = (64 * 16, 64 * 16) if room else (MAX, INIT)
    names = make_tables("yg", most=most, init=init)
    together = run_steps(names, True)
    tables = [api.shard(name) for name in names]
    group = tables[0].group
    assert isinstance(group, table_group.HashGroup) and group.evicts
    assert group.members == [tables[t] for t in (0, 1, 3, 4, 5)]
    other = tables[6].group  # another dim: a group of its own
    assert isinstance(other, table_group.HashGroup) and other.evicts and other is not group
    assert other.members == tables[6:8] and other.dim == 4 and group.dim == DIM
    assert tables[2].group is None  # hbm
    assert isinstance(group.values, hybrid_rows.GroupedRows)  # s0's rows split
    assert hybrid_rows.is_split(tables[4].values) and group.hbm[3] == 3
    for each in (group, other):
        assert_a_group_of_views(each)
        for t, member in enumerate(each.members):
            assert member.capacity == most
            start = int(each.row_starts[t])
            assert np.shares_memory(member.statistics, each.statistics)
            assert member.statistics.__array_interface__["data"][0] == each.statistics[
                start:].__array_interface__["data"][0]
    for step in together[-2:]:  # every member evicted in each of the last steps, on some rank
        assert all(on_some_rank(step[3][t][2]) != room for t in GROUPED)
    make_tables("yg", most=most, init=init)  # the same tables anew, each looked up alone
    alone = run_steps(names, False)
    assert all(api.shard(name).group is None for name in names)
    assert_same_steps(together, alone)


IN_PLACE_LAYOUT = [("y0", DIM, "hybrid", 0.0), ("y1", DIM, "hybrid", 0.0),
                   ("y2", DIM, "hybrid", 0.0)]


@pytest.mark.parametrize("growth", ["copies", "in_place"])
def test_a_hybrid_group_growing_in_place_then_evicting_equals_its_tables_one_by_one(
        growth, monkeypatch):
    """Hybrid members whose rows stay in device memory grow in place when asked
    (SOK1X_GROW_IN_PLACE=1: their values, times, slots and access statistics reserve
    max_capacity rows each, memory behind the rows held), then evict at max_capacity: steps,
    states, counts and evicted keys equal the same tables' looked up one by one, growing by
    copies."""
    monkeypatch.setenv(table_group.GROW_ENV, "1" if growth == "in_place" else "0")
    names = make_tables("yg_in_place", layout=IN_PLACE_LAYOUT)
    together = run_steps(names, True, tag="yg_in_place", layout=IN_PLACE_LAYOUT)
    tables = [api.shard(name) for name in names]
    group = tables[0].group
    assert group.members == tables and group.evicts
    assert group.reserved == (growth == "in_place")
    if group.reserved:
        # max_capacity rows reserved, and the spare rows a member holds there
        assert list(np.diff(group.row_starts)) == [MAX + tables[0].spare] * len(tables)
        for t, member in enumerate(tables):
            start = int(group.row_starts[t])
            assert member.statistics.shape[0] == member.rows_for(member.capacity)
            assert member.statistics.__array_interface__["data"][0] == group.statistics[
                start:].__array_interface__["data"][0]
    assert all(on_some_rank(step[3][t][2]) for step in together[-1:] for t in range(3))
    monkeypatch.setenv(table_group.GROW_ENV, "0")
    make_tables("yg_in_place", layout=IN_PLACE_LAYOUT)  # the same tables anew, one by one
    alone = run_steps(names, False, tag="yg_in_place", layout=IN_PLACE_LAYOUT)
    assert all(api.shard(name).group is None for name in names)
    assert_same_steps(together, alone)


def test_by_default_a_large_hybrid_group_grows_in_place_and_a_split_one_by_copies(
        monkeypatch):
    """Without SOK1X_GROW_IN_PLACE, hybrid members whose rows stay in device memory grow in
    place by the hbm groups' rule (64 MiB of values a member), smaller ones by copies; =1: any
    size in place, but never members whose rows split into host memory; =0: all by copies."""
    monkeypatch.delenv(table_group.GROW_ENV, raising=False)
    held = 1 << 17  # 64 MiB of float32 values of dim 128 a member
    groups = {}
    for case, (init, hbm_gib) in {"large": (held, 0.0), "small": (INIT, 0.0),
                                  "split": (INIT, 1e-7)}.items():
        groups[case] = []
        for t in range(2):
            name = "yg_default_%s_%d" % (case, t)
            api.create_table(name, 128, 4 * init, True, SPEC, replace=True,
                             dynamic=make_dynamic("hybrid", init, 4 * init, "lru", hbm_gib))
            groups[case].append(api.shard(name))

    def reserve(case):  # max_capacity rows, and the spare rows a member holds there
        return [4 * (held if case == "large" else INIT) + groups[case][0].spare] * 2
    assert list(table_group.HashGroup._reserved_rows(groups["large"])) == reserve("large")
    assert table_group.HashGroup._reserved_rows(groups["small"]) is None
    monkeypatch.setenv(table_group.GROW_ENV, "1")
    assert list(table_group.HashGroup._reserved_rows(groups["small"])) == reserve("small")
    assert table_group.HashGroup._reserved_rows(groups["split"]) is None
    monkeypatch.setenv(table_group.GROW_ENV, "0")
    assert table_group.HashGroup._reserved_rows(groups["large"]) is None


def test_rows_handed_out_by_counts_no_header_read_yet_are_counted_first():
    """Two training lookups of a group with room and no op header between their inserts' counts
    and a read (here the free list and high water, then a third lookup): each member counts its
    placed keys once, in order."""
    names = make_tables("yg_later", most=64 * 16, init=64 * 16)
    rng = np.random.default_rng([4, RANK])
    for step in range(2):
        inputs, _ = batch(rng, step)
        api.pooled_lookup(names, "yg_later_fwd_%d" % step, inputs, True)
    for name in names:
        table = api.shard(name)
        assert table._high_water == table.index.size and table._free.size == 0
    inputs, _ = batch(rng, 2)
    api.pooled_lookup(names, "yg_later_fwd_2", inputs, True)
    for name in names:
        table = api.shard(name)
        keys, rows = table.index.export()
        assert sorted(rows.tolist()) == list(range(table.index.size))  # rows 0.. once each
        assert table._high_water == table.index.size


def held_state(names):
    """Every table's keys, rows, slots and lookup counts, its free list and high water, its
    capacity and how many keys it has evicted."""
    out = []
    for name in names:
        table = api.shard(name)
        out.append((full_state(name)[:2], table.free_rows().tolist(), table._high_water,
                    table.capacity, getattr(table, "evicted_keys", 0)))
    return out


def assert_unchanged(names, before, capacities=True):
    """Every table as held_state found it (capacities=False: but for its capacity, as a failed
    step leaves a growth: engine/lookup/step_journal.py)."""
    for got, want in zip(held_state(names), before):
        assert_same_state(got[0][0], want[0][0])
        assert got[0][1] == want[0][1] and got[1:3] == want[1:3]
        assert got[3] == want[3] or not capacities
        assert got[4] == want[4]  # a failed step's victims are no evicted keys


def test_a_member_whose_own_keys_pass_max_capacity_fails_every_rank_and_changes_no_table():
    names = make_tables("yg_full")
    run_steps(names, True, steps=4, tag="yg_full")  # full members with keys to evict
    before = held_state(names)
    inputs, _ = batch(np.random.default_rng([5, RANK]), 9)
    if RANK == SIZE - 1:  # more keys of y2 in one step than its shards hold: none evictable
        keys = np.arange(MAX * SIZE + SIZE, dtype=np.int64) + 10 ** 12
        inputs[3] = PooledInput(keys, None, keys.shape[0], None, "sum")
    with pytest.raises(TableFullError, match="_y2: the shard on rank .* max_capacity=%d" % MAX):
        api.pooled_lookup(names, "yg_full_bad", inputs, True)
    assert_unchanged(names, before)
    run_steps(names, True, steps=1, seed=6, tag="yg_full_on")  # the group goes on


@pytest.mark.parametrize("room", [False, True])
def test_a_step_another_table_fails_counts_no_lookup_in_the_group(room):
    """The hbm table's keys pass its max_capacity on one rank, and the step fails at the
    lookup's agreement, after the group inserted its keys: room=False, the group's keys are all
    held but its shards are full (the op header cannot tell they fit: the group inserts and
    waits for its counts); room=True, its shards have room (it inserts without reading the
    counts, before the agreement). The members' lookup counts stay as they were, as the tables'
    own do when looked up one by one (a table alone counts its lookup once the step goes on)."""
    most, init = (64 * 16, 64 * 16) if room else (MAX, INIT)
    names = make_tables("yg_other", most=most, init=init)
    run_steps(names, True, steps=4, tag="yg_other")
    before = held_state(names)
    inputs, _ = batch(np.random.default_rng([5, RANK]), 9)
    for t, (_, _, var_type, hbm_gib) in enumerate(LAYOUT):
        if var_type == "hybrid" and not hbm_gib:  # every key a member's shards hold
            held = np.concatenate(COMM.allgather(api.shard(names[t]).index.export()[0]))
            inputs[t] = PooledInput(held, None, held.shape[0], None, "sum")
    assert api.shard(names[0]).group is not None
    assert (api.shard(names[0]).index.size == MAX) != room
    if RANK == SIZE - 1:  # more keys of the hbm table in one step than its shards hold
        keys = np.arange(8 * most * SIZE + SIZE, dtype=np.int64) + 10 ** 12
        inputs[2] = PooledInput(keys, None, keys.shape[0], None, "sum")
    with pytest.raises(TableFullError,
                       match="_h0: the shard on rank .* max_capacity=%d" % (8 * most)):
        api.pooled_lookup(names, "yg_other_bad", inputs, True)
    assert_unchanged(names, before)
    run_steps(names, True, steps=1, seed=6, tag="yg_other_on")  # the group goes on


def test_a_failed_later_op_of_a_step_that_evicted_puts_the_evicted_keys_back():
    names = make_tables("yg_undo")
    run_steps(names, True, steps=3, tag="yg_undo")
    before = held_state(names)
    rng = np.random.default_rng([8, RANK])
    fresh, tops = batch(rng, 7)  # new keys only: full members evict
    _, token = api.pooled_lookup(names, OpId("yg_undo_fwd", "yg_undo", 0), fresh, True)
    assert on_some_rank(any(api.shard(name)._evicted for name in names))
    undone = {id(kept) for name in names for kept, _ in api.shard(name)._evicted}
    wrong = list(tops)
    if RANK == SIZE - 1:
        wrong[1] = np.zeros((tops[1].shape[0] + 2, DIM), np.float32)
    with pytest.raises(InvalidInputError):
        api.pooled_lookup_grad(names, OpId("yg_undo_bwd", "yg_undo", 1), token, wrong)
    assert_unchanged(names, before, capacities=False)
    # no copy of the undone victims is kept for a reader
    from sok1x.engine.tables import eviction
    assert not undone & {id(kept) for kept in eviction.prefetched()}
    assert all(full_state(name)[2] == {} for name in names)  # nothing left to hand out
    run_steps(names, True, steps=1, seed=9, tag="yg_undo_on")  # the group trains on


def _records(names):
    """Every table's statistics records by key: {key: (last step, count)} (hbm: none)."""
    out = []
    for name in names:
        table = api.shard(name)
        if table.statistics is None:
            out.append({})
            continue
        keys, rows = table.index.export()
        out.append({int(k): tuple(np.asarray(table.statistics)[r].tolist())
                    for k, r in zip(keys, rows)})
    return out


def test_an_eviction_that_fails_midway_changes_no_member(monkeypatch):
    """The members of a group evict together. Where a member fails to take its victims out (its
    host memory, say) after an earlier member took its own, the step fails and every member is
    as before it: keys, vectors, slots, statistics records, free lists, high water; the group
    then trains on. One rank: the failure is this rank's alone."""
    if SIZE > 1:
        pytest.skip("a failure of one rank's memory: run at one rank")
    names = make_tables("yg_midway")
    run_steps(names, True, steps=3, tag="yg_midway")
    before, records = held_state(names), _records(names)
    calls = []
    take = dynamic_table.DynamicTable.take_victims

    def short_of_memory(table, victims, t):  # each evicting member takes its victims
        calls.append(t)
        if len(calls) == 2:
            raise MemoryError("no memory for the free list")
        return take(table, victims, t)
    monkeypatch.setattr(dynamic_table.DynamicTable, "take_victims", short_of_memory)
    fresh, _ = batch(np.random.default_rng([8, RANK]), 7)  # new keys only: full members evict
    with pytest.raises(MemoryError, match="free list"):
        api.pooled_lookup(names, OpId("yg_midway_fwd", "yg_midway", 0), fresh, True)
    monkeypatch.undo()
    assert len(calls) == 2
    assert_unchanged(names, before, capacities=False)
    assert _records(names) == records
    assert all(full_state(name)[2] == {} for name in names)  # nothing evicted to hand out
    run_steps(names, True, steps=1, seed=9, tag="yg_midway_on")


@pytest.mark.parametrize("way", ["staged", "two-pass"])
def test_a_hybrid_groups_members_dump_and_load_where_they_are(shared_dir, monkeypatch, way):
    """A load puts every row and slot back into the members where they are (in their group,
    views of its arrays), after they evicted and took freed rows; a member then holds no freed
    row and no lookup count, and the group trains on, evicting again; s0's rows split between
    the group's device and host blocks."""
    monkeypatch.setenv("SOK1X_CHECKPOINT_LOAD", way)
    tag = "yg_ckpt_" + way.replace("-", "_")
    names = make_tables(tag)
    run_steps(names, True, steps=4, seed=11, tag=tag)
    saved = {name: every_row(name, slots=None) for name in names}
    checkpoint.dump_tables(shared_dir, names)
    run_steps(names, True, steps=2, seed=13, tag=tag)
    group = api.shard(names[0]).group
    checkpoint.load_tables(shared_dir, names)
    for name in names:
        assert_same(every_row(name, slots=None), saved[name])
    for member in group.members:
        assert api.shard(member.name) is member and member.group is group
        assert member._free.size == 0 and member._high_water == member.index.size
        assert not np.asarray(member.statistics).any()
    assert_a_group_of_views(group)
    assert api.shard(names[4]).group is group and hybrid_rows.is_split(api.shard(names[4]).values)
    run_steps(names, True, steps=3, seed=15, tag=tag)
    assert api.shard(names[0]).group is group


@pytest.mark.parametrize("count", [5, 16])
def test_host_waits_and_backend_calls_do_not_grow_with_the_hybrid_tables(count):
    """In a step where no member grows or evicts: as many as for 2 tables (the group's keys
    are more than a member holds, each member's are not: the op header's bound per member
    spares the exact count of new keys)."""
    counts = {}
    for tables in (2, count):
        layout = [("c%d" % t, DIM, "hybrid", 0.0) for t in range(tables)]
        names = make_tables("yg_count_%d" % tables, most=128 * SIZE, layout=layout,
                            init=128 * SIZE)
        rng = np.random.default_rng([10, RANK])
        steps = []
        for step in range(2):
            inputs, tops = batch(rng, step, layout)
            steps.append(([i._replace(weights=None, combiner="sum") for i in inputs], tops))
        counts[tables] = _calls_of_a_step(names, steps)
        assert api.shard(names[0]).group.evicts
    if RANK == 0:
        print("\nper training step, 2 hybrid tables: %s; %d: %s" % (counts[2], count,
                                                                  counts[count]))
    assert counts[count] == counts[2], counts
    assert counts[count]["host_waits"] <= 2  # the op headers: the placed counts ride in them


def _waits_of_an_evicting_step(tables):
    """Host waits of a training step in which each of `tables` full hybrid members (one group)
    evicts, and of the second step, with room for every rank's keys: every rank's 16 new keys a
    table into shards of 64 rows a rank, after four steps that fill them."""
    names = make_tables("yg_evict_waits_%d" % tables, most=64,
                        layout=[("e%d" % t, DIM, "hybrid", 0.0) for t in range(tables)],
                        init=64)
    waits = []
    for step in range(5):
        inputs = [PooledInput(np.arange(step * 16, step * 16 + 16, dtype=np.int64) + 1000 * t
                              + 10 ** 5 * RANK, np.arange(16, dtype=np.int64), 16, None, "sum")
                  for t in range(tables)]
        before = runtime.get().stats()["host_waits"]
        outs, token = api.pooled_lookup(names, "yg_evict_waits_fwd", inputs, True)
        gradients_and_update(names, "yg_evict_waits_bwd", [token], outs)
        waits.append(runtime.get().stats()["host_waits"] - before)
    assert api.shard(names[0]).group is not None
    assert api.shard(names[-1]).evicted_keys > 0
    return waits[1], waits[-1]


def test_a_step_in_which_every_member_evicts_waits_once_more_whatever_the_members():
    """Full members evict in place (HashGroup.make_room_in_place): every new key of each evicts,
    its victims chosen and counted on the device with nothing read first, into the rows its
    victims leave, and the host reads what the eviction counted (victims, places without one,
    placed keys) in one wait, once everything is queued: one wait more than a step with room on
    one rank, never a read of the victims or the shard (it was three more: the count of new
    keys, each member's lowest victim row, the placed counts)."""
    two, five = _waits_of_an_evicting_step(2), _waits_of_an_evicting_step(5)
    assert five[1] == two[1] <= 3, (two, five)  # the two op headers' waits, and the one read
    if bounded_step.enabled(runtime.get()):  # a bounded one-rank step's backward counts no
        # rows: the step with room reads its placed counts in that header, the evicting one in
        # its forward, and neither waits more than the other
        assert two[1] == two[0] == 2, two
    elif SIZE == 1:  # (with room on several ranks the group may count first: its keys' bound)
        assert two[1] == two[0] + 1, two


def test_evicting_in_place_can_be_turned_off(monkeypatch):
    """SOK1X_EVICT_IN_PLACE=0: full members count their new keys before they evict (the
    counted way: two waits more than the step in place)."""
    in_place = _waits_of_an_evicting_step(2)
    monkeypatch.setenv(table_group.IN_PLACE_ENV, "0")
    counted = _waits_of_an_evicting_step(2)
    assert counted[1] == in_place[1] + 2, (in_place, counted)


def train_steps(names, tag, layout, seed, steps, together=True, after_step=None):
    """`steps` training steps of `names` on batch()'s keys of `layout` (drawn from seed), looked
    up together or one by one; after_step(step), where given, runs after each."""
    rng = np.random.default_rng([seed, RANK])
    for step in range(steps):
        inputs, tops = batch(rng, step, layout)
        _, tokens = lookup(names, tag + "_fwd", inputs, together)
        gradients_and_update(names, tag + "_bwd", tokens, tops)
        if after_step is not None:
            after_step(step)


def test_a_groups_readers_take_their_victims_in_one_read_and_a_dropped_member_none():
    """Five members that evict once full, two of them with evicted keys no one reads
    (drop_evicted): the first pop_evicted after a step reads the victims of every reader at
    once (one host wait for the group), the dropped members hand out nothing, and every member
    hands out what it hands out looked up alone."""
    layout = [("r%d" % t, DIM, "hybrid", 0.0) for t in range(5)]
    readers = (0, 2, 4)
    runs = {}
    for together in (True, False):
        names = make_tables("yg_readers", layout=layout)
        for t in range(5):
            if t not in readers:
                api.drop_evicted(names[t])
        popped, waits = [], []

        def read(step, names=names, popped=popped, waits=waits):
            before = runtime.get().stats()["host_waits"]
            popped.append([api.pop_evicted(name) for name in names])
            waits.append(runtime.get().stats()["host_waits"] - before)
        train_steps(names, "yg_readers", layout, 12, 5, together, read)
        assert (api.shard(names[0]).group is not None) == together
        runs[together] = popped, waits
    (group, group_waits), (alone, _) = runs[True], runs[False]
    assert on_some_rank(any(len(step[t][0]) for step in group for t in readers))
    for step, (got, want) in enumerate(zip(group, alone)):
        read = any(len(got[t][0]) for t in readers)
        assert group_waits[step] == int(read), (step, group_waits)
        for t in range(5):
            if t not in readers:
                assert len(got[t][0]) == len(want[t][0]) == 0
                continue
            assert got[t][0].tolist() == want[t][0].tolist()
            np.testing.assert_allclose(got[t][1], want[t][1], rtol=1e-5, atol=1e-6)
            assert got[t][1].shape == (len(got[t][0]), DIM)


def test_evictions_no_one_has_read_yet_hold_their_keys_and_vectors_alone():
    """A group whose evicted keys are kept for a reader who has not read them yet: what each
    eviction keeps for it is its keys and vectors (eviction.KeptVictims), while the record that
    undoes it (with the victims' slots and statistics) lives no longer than its step."""
    import gc
    from sok1x.engine.tables import eviction
    layout = [("k%d" % t, DIM, "hybrid", 0.0) for t in range(3)]
    names = make_tables("yg_kept", layout=layout)
    train_steps(names, "yg_kept", layout, 13, 6)
    gc.collect()
    records = [o for o in gc.get_objects() if isinstance(o, eviction.Victims)]
    kept = {id(e[0]) for name in names for e in api.shard(name)._evicted}
    assert on_some_rank(len(kept) >= 2)  # evictions of several steps wait for their reader
    assert len(records) <= 1, len(records)  # the last step's undo record at most
    for name in names:
        for entry in api.shard(name)._evicted:
            assert isinstance(entry[0], eviction.KeptVictims)
            assert not hasattr(entry[0], "slots") and not hasattr(entry[0], "records")
    for name in names:
        api.pop_evicted(name)


def test_evictions_read_late_hand_out_what_they_evicted_past_the_kept_copies():
    """Twelve steps that evict before anyone reads: the host copies queued at eviction are kept
    for the last eviction.PREFETCHED evictions only, the reads at the end wait once for each of
    those and once per member for all the others (not once per eviction), and they hand out,
    for every member, what the same tables looked up one by one hand out."""
    from sok1x.engine.tables import eviction
    layout = [("l%d" % t, DIM, "hybrid", 0.0) for t in range(3)]
    popped = {}
    for together in (True, False):
        names = make_tables("yg_late", layout=layout)
        train_steps(names, "yg_late", layout, 14, 12, together)
        evictions = {id(e[0]) for name in names for e in api.shard(name)._evicted}
        before = runtime.get().stats()["host_waits"]
        popped[together] = [api.pop_evicted(name) for name in names]
        if together:  # the copies kept, one each, then a read per member for the others
            waits = runtime.get().stats()["host_waits"] - before
            assert waits <= eviction.PREFETCHED + len(names) < len(evictions), (
                waits, len(evictions))
    assert on_some_rank(sum(len(keys) for keys, _ in popped[True]) > 0)
    for (keys, vectors), (want_keys, want_vectors) in zip(popped[True], popped[False]):
        assert keys.tolist() == want_keys.tolist()
        np.testing.assert_allclose(vectors, want_vectors, rtol=1e-5, atol=1e-6)


def test_a_reader_on_the_device_takes_what_a_host_reader_takes_and_no_host_copy():
    """pop_evicted(on_device=True) hands out backend arrays equal to what a reader on the host
    gets, step by step; once a member reads on the device, its later evictions queue no copy to
    the host for it."""
    from sok1x.engine.tables import eviction
    layout = [("d%d" % t, DIM, "hybrid", 0.0) for t in range(3)]
    runs = {}
    for on_device in (False, True):
        names = make_tables("yg_device_reader", layout=layout)
        popped = []

        def read(step, names=names, popped=popped, on_device=on_device):
            if on_device and step:
                for name in names:
                    for kept, _ in api.shard(name)._evicted:
                        assert not kept.host_readers and kept not in eviction.prefetched()
            got = [api.pop_evicted(name, on_device=on_device) for name in names]
            popped.append([tuple(np.array(a) for a in pair) for pair in got])
        train_steps(names, "yg_device_reader", layout, 15, 6, after_step=read)
        runs[on_device] = popped
    assert on_some_rank(any(len(k) for step in runs[True] for k, _ in step))
    for host_step, device_step in zip(runs[False], runs[True]):
        for (keys, vectors), (got_keys, got_vectors) in zip(host_step, device_step):
            assert got_keys.tolist() == keys.tolist()
            assert np.array_equal(got_vectors.reshape(-1, DIM), vectors)
