"""Lookups sized by per-peer capacities (engine/lookup/peer_capacity.py, DESIGN D14) on the cpu
backend, at any number of ranks: every step equals the same step exchanged by its counts, bit for
bit (outputs, gradient values and rows), over many steps with changing keys; a step whose keys
overflow a cap runs by its counts and the caps grow; ranks with different numbers of keys; bad
input fails every rank; a hash group's training lookups, sized where no shard of it can fill up
(or where its full shards evict every new key in place: a full hybrid group) and by their counts
where one might, equal the counted ones (outputs, gradients and every shard's keys, rows and
slots after an update); and the backend's pieces against NumPy."""
import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import cpu, random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup import peer_capacity, table_group
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.errors import InitError, InvalidInputError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=4)
VOCAB = 1024 * SIZE


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


@pytest.fixture(autouse=True)
def capacities_on(monkeypatch):
    monkeypatch.setenv(peer_capacity.ENV, "1")


def make_tables(tag, dims, placement="mod"):
    names = ["capacity_%s_%d" % (tag, t) for t in range(len(dims))]
    for name, dim in zip(names, dims):
        api.create_table(name, dim, VOCAB // SIZE, False, SPEC, replace=True,
                         placement=placement)
    return names


def inputs_for(rng, sizes, skew=False, vocab=VOCAB):
    """Per table a PooledInput of `sizes[t]` keys below `vocab` (repeats among them); skew: every
    key owned by rank 0, distinct ones, so that a cap set from uniform keys overflows."""
    out = []
    for n in sizes:
        if skew:
            keys = rng.permutation(VOCAB // SIZE)[:n] * SIZE
        else:
            keys = rng.integers(0, vocab, size=n)
        segments = np.sort(rng.integers(0, max(n // 3, 1), size=n))
        out.append(PooledInput(keys, segments, max(n // 3, 1), None, "sum"))
    return out


def run_step(names, op, inputs, tops, counted, monkeypatch):
    """One forward and backward of `names` under op names op_fwd / op_bwd: (outputs, per table
    (values, rows) ordered by row). counted: the op's exchanges go by their counts."""
    monkeypatch.setenv(peer_capacity.ENV, "0" if counted else "1")
    outputs, token = api.pooled_lookup(names, op + "_fwd", inputs, True)
    grads = api.pooled_lookup_grad(names, op + "_bwd", token, tops)
    ordered = []
    for values, rows in grads:
        order = np.argsort(rows, kind="stable")
        ordered.append((np.asarray(values)[order], np.asarray(rows)[order]))
    return outputs, ordered


def plan(op):
    """The Plan of forward op `op` (None: its exchanges go by their counts)."""
    plans = [p for key, p in runtime.get().capacities.items() if key[0] == op + "_fwd"]
    assert len(plans) == (SIZE > 1), plans  # alone, the lookup makes none
    return plans[0] if plans else None


def assert_same(got, want):
    (outputs, grads), (want_outputs, want_grads) = got, want
    for a, b in zip(outputs, want_outputs):
        np.testing.assert_array_equal(a, b)
    for (values, rows), (want_values, want_rows) in zip(grads, want_grads):
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_array_equal(values, want_values)


@pytest.mark.parametrize("dims", [(8, 8, 8), (4, 16)], ids=["one group", "two dims"])
def test_sized_steps_equal_counted_steps_bit_for_bit(dims, monkeypatch):
    names = make_tables("same%d" % len(dims), dims)
    rng = np.random.default_rng([11, RANK])
    for step in range(12):
        sizes = [40 + 7 * t + step % 5 for t in range(len(dims))]
        inputs = inputs_for(rng, sizes)
        tops = [rng.standard_normal((item.num_segments, dim)).astype(np.float32)
                for item, dim in zip(inputs, dims)]
        want = run_step(names, "counted_same%d" % len(dims), inputs, tops, True, monkeypatch)
        got = run_step(names, "sized_same%d" % len(dims), inputs, tops, False, monkeypatch)
        assert_same(got, want)
    sized = plan("sized_same%d" % len(dims))
    assert plan("counted_same%d" % len(dims)) is None
    if SIZE == 1:
        assert sized is None  # alone, nothing crosses a network: nothing to size
        return
    assert sized.caps is not None and sized.sized + sized.settled == 12
    assert sized.sized >= 9, (sized.sized, sized.settled)


def test_a_step_that_overflows_goes_by_its_counts_and_the_caps_grow(monkeypatch):
    names = make_tables("skew", (8,))
    rng = np.random.default_rng([12, RANK])
    kinds = [False, False, True, True, False]  # uniform, uniform, skewed twice, uniform
    caps = []
    for skew in kinds:
        inputs = inputs_for(rng, [256], skew)
        tops = [rng.standard_normal((inputs[0].num_segments, 8)).astype(np.float32)]
        want = run_step(names, "counted_skew", inputs, tops, True, monkeypatch)
        got = run_step(names, "sized_skew", inputs, tops, False, monkeypatch)
        assert_same(got, want)
        if SIZE > 1:  # table 0's cap for owner 0, which the skewed keys all go to
            caps.append((int(plan("sized_skew").caps[0, 0]), plan("sized_skew").settled))
    if SIZE == 1:
        return
    # set at the first step; the first skewed step overflows (256 distinct keys to rank 0) and
    # sets them again; from then on every step fits (no rank has more than 256 keys)
    assert caps[0][1] == 1 and caps[1][0] < 256
    assert caps[2][1] == caps[1][1] + 1 and caps[2][0] >= 256
    assert caps[3] == caps[2] and caps[4] == caps[2]  # caps only grow
    assert plan("sized_skew").sized == 5 - caps[4][1]


def test_a_table_on_one_rank_sends_the_other_ranks_no_padding(monkeypatch):
    names = make_tables("onerank", (8, 8), placement=("rank", SIZE - 1))
    rng = np.random.default_rng([15, RANK])
    for _ in range(5):
        inputs = inputs_for(rng, [50, 20], vocab=VOCAB // SIZE)
        tops = [rng.standard_normal((item.num_segments, 8)).astype(np.float32)
                for item in inputs]
        want = run_step(names, "counted_onerank", inputs, tops, True, monkeypatch)
        got = run_step(names, "sized_onerank", inputs, tops, False, monkeypatch)
        assert_same(got, want)
    if SIZE > 1:  # one slot for each rank that owns nothing of the tables
        caps = plan("sized_onerank").caps
        np.testing.assert_array_equal(caps[:, :SIZE - 1], 1)
        assert (caps[:, SIZE - 1] >= 20).all() and plan("sized_onerank").sized == 4


def test_ranks_that_size_lookups_differently_fail_every_rank(monkeypatch):
    names = make_tables("mixed", (8,))
    rng = np.random.default_rng([16, RANK])
    inputs = inputs_for(rng, [30])
    monkeypatch.setenv(peer_capacity.ENV, "1" if RANK == 0 else "0")
    if SIZE == 1:
        api.pooled_lookup(names, "mixed_fwd", inputs, True)
        return
    for _ in range(2):  # every call of the op, not the first alone
        with pytest.raises(InitError, match="SOK1X_PEER_CAPACITY"):
            api.pooled_lookup(names, "mixed_fwd", inputs, True)


def test_ranks_with_different_numbers_of_keys_or_none(monkeypatch):
    names = make_tables("uneven", (8, 8))
    rng = np.random.default_rng([13, RANK])
    for step in range(6):
        sizes = [5 + 30 * RANK + step, 9 * ((RANK + step) % 3)]  # none at times
        inputs = inputs_for(rng, sizes)
        tops = [rng.standard_normal((item.num_segments, 8)).astype(np.float32)
                for item in inputs]
        want = run_step(names, "counted_uneven", inputs, tops, True, monkeypatch)
        got = run_step(names, "sized_uneven", inputs, tops, False, monkeypatch)
        assert_same(got, want)


def test_bad_input_in_a_sized_step_fails_every_rank(monkeypatch):
    names = make_tables("bad", (8,))
    rng = np.random.default_rng([14, RANK])
    good = inputs_for(rng, [30])
    tops = [np.ones((good[0].num_segments, 8), np.float32)]
    run_step(names, "sized_bad", good, tops, False, monkeypatch)
    run_step(names, "sized_bad", good, tops, False, monkeypatch)
    bad = [good[0]._replace(keys=np.where(np.arange(30) == 3, -5, good[0].keys))]
    if RANK != SIZE - 1:
        bad = good
    with pytest.raises(InvalidInputError, match="negative|outside|-5"):
        run_step(names, "sized_bad", bad, tops, False, monkeypatch)
    want = run_step(names, "counted_bad", good, tops, True, monkeypatch)
    assert_same(run_step(names, "sized_bad", good, tops, False, monkeypatch), want)


HASH_DIM, HASH_KEYS = 8, 20  # a hash group's dim, and each rank's keys per table and step
HASH_LAYOUT = [("h0", True), ("h1", True), ("d0", False), ("h2", True)]  # one group, one dense


def make_hash_tables(tag, capacity, hybrid=False):
    """The layout's tables anew: three hash tables of `capacity` rows a shard (one HashGroup in
    a lookup; hybrid: DynamicVariables that hold `capacity` keys a shard at most, from 8, and
    evict by LRU past it), a dense table beside them."""
    names = ["capacity_%s_%s" % (tag, suffix) for suffix, _ in HASH_LAYOUT]
    for name, (_, hashed) in zip(names, HASH_LAYOUT):
        dynamic = make_dynamic("hybrid", 8, capacity, "lru") if hybrid and hashed else None
        api.create_table(name, HASH_DIM, capacity if hashed else VOCAB // SIZE, hashed, SPEC,
                         replace=True, dynamic=dynamic)
    return names


def hash_step(names, op, inputs, tops, counted, monkeypatch):
    """One forward, backward and Adagrad update of `names`: (outputs, per table its gradient
    {key (a hash table's) or row: summed values})."""
    monkeypatch.setenv(peer_capacity.ENV, "0" if counted else "1")
    outputs, token = api.pooled_lookup(names, op + "_fwd", inputs, True)
    grads = api.pooled_lookup_grad(names, op + "_bwd", token, tops)
    by_key = []
    for name, (values, rows) in zip(names, grads):
        table = api.shard(name)
        key_of = (dict(zip(table.index.export()[1].tolist(), table.index.export()[0].tolist()))
                  if table.use_hashtable else None)
        kept = {}
        for row, value in zip(np.asarray(rows).tolist(), np.asarray(values)):
            if row >= 0:
                kept[row if key_of is None else key_of[row]] = value.copy()
        by_key.append(kept)
    api.apply_optimizer_updates(names, "adagrad", "Adagrad", {}, {"lr": 0.1, "epsilon": 1e-7},
                                [v for v, _ in grads], [r for _, r in grads])
    return [np.array(out) for out in outputs], by_key


def hash_shard(name):
    """This rank's shard of hash table `name` by key: {key: (vector, {slot: row})}."""
    table = api.shard(name)
    keys, rows = table.index.export()
    return {int(k): (np.array(table.values[r]), {n: np.array(s[r])
                                                 for n, s in table.slots.items()})
            for k, r in zip(keys, rows)}


def hash_run(names, op, room, counted, monkeypatch, steps):
    """`steps` steps of the layout's tables (made anew: the same initial rows for either way)
    on every rank's own keys from one pool; returns per step (outputs, gradients by key) and
    per table this rank's shard afterwards (a hash table's by key)."""
    shared = np.random.default_rng(21)  # the same draws on every rank: a key pool
    pool = shared.integers(0, 2 ** 40, size=(3 * SIZE if room else 1) * HASH_KEYS)
    rng = np.random.default_rng([22, RANK])
    record = []
    for step in range(steps):
        inputs = []
        for _, hashed in HASH_LAYOUT:
            n = HASH_KEYS + step % 3
            drawn = pool[:(step + 1) * HASH_KEYS * SIZE // 2 + HASH_KEYS] if room else pool
            keys = rng.choice(drawn, size=n) if hashed else rng.integers(0, VOCAB, n)
            segments = np.sort(rng.integers(0, 6, size=n))
            inputs.append(PooledInput(keys, segments, 6, None, "sum"))
        tops = [rng.standard_normal((6, HASH_DIM)).astype(np.float32) for _ in HASH_LAYOUT]
        record.append(hash_step(names, op, inputs, tops, counted, monkeypatch))
    shards = [hash_shard(name) if hashed else api.shard(name).values.copy()
              for name, (_, hashed) in zip(names, HASH_LAYOUT)]
    return record, shards


def assert_same_hash_runs(got, want):
    """Two hash_runs' steps (outputs, gradients by key) and shards afterwards agree bit for
    bit."""
    for (outputs, grads), (want_outputs, want_grads) in zip(got[0], want[0]):
        for a, b in zip(outputs, want_outputs):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(grads, want_grads):
            assert sorted(a) == sorted(b)
            for key in b:
                np.testing.assert_array_equal(a[key], b[key])
    for shard, want_shard in zip(got[1], want[1]):
        if isinstance(want_shard, np.ndarray):
            np.testing.assert_array_equal(shard, want_shard)
            continue
        assert sorted(shard) == sorted(want_shard)
        for key, (vector, slots) in want_shard.items():
            np.testing.assert_array_equal(shard[key][0], vector)
            for slot, row in slots.items():
                np.testing.assert_array_equal(shard[key][1][slot], row)


@pytest.mark.parametrize("room", [True, False], ids=["room", "tight"])
def test_a_hash_groups_sized_steps_equal_its_counted_steps(room, monkeypatch):
    """room: every shard has room for every rank's keys, so the group's steps after the first
    go by the caps, their padded keys passed by its insert; tight: a shard might fill up (every
    rank's keys of a member exceed its room) though none does, so every step goes by its
    counts, the caps set at the first and left as they are (no MPI call). Either way, each
    step's outputs and gradients and each shard afterwards equal those of the same tables
    exchanged by their counts, bit for bit."""
    steps = 8
    # tight: the job's keys of a member, all to one owner, exceed a shard, whose room holds
    # every distinct key the job draws (HASH_KEYS a member)
    capacity = 12 * SIZE * HASH_KEYS if room else max(SIZE * HASH_KEYS - 1, HASH_KEYS)
    tag = "room" if room else "tight"
    names = make_hash_tables(tag, capacity)
    want, want_shards = hash_run(names, "counted_" + tag, room, True, monkeypatch, steps)
    names = make_hash_tables(tag, capacity)
    got = hash_run(names, "sized_" + tag, room, False, monkeypatch, steps)
    assert_same_hash_runs(got, (want, want_shards))
    sized_plan = plan("sized_" + tag)
    if SIZE == 1:
        return
    # the first step sets the caps; every later one fits them (room) or goes by its counts
    assert (sized_plan.settled, sized_plan.sized) == (1, steps - 1 if room else 0)


def test_a_full_hybrid_groups_evicting_steps_go_sized_and_equal_its_counted_steps(monkeypatch):
    """A group of hybrid DynamicVariables whose shards fill up, then evict at every step: once
    every shard of it is full, each rank's header tells that its full shards evict every new
    key in place, so the steps go by the caps, their padded keys (-1) passed by the eviction
    and the insert on each owner. Every step's outputs and gradients and every shard afterwards
    (keys, vectors, slots) equal those of the same tables exchanged by their counts, bit for
    bit, and no shard holds more keys than its max_capacity."""
    steps, capacity = 14, 2 * HASH_KEYS  # a shard fills up within six steps
    names = make_hash_tables("full", capacity, hybrid=True)
    want = hash_run(names, "counted_full", True, True, monkeypatch, steps)
    padded = []  # per eviction in place on this rank: whether its owned keys had padded slots
    make_room = table_group.HashGroup.make_room_in_place

    def spied(group, bounds, keys, tags):
        padded.append(bool((np.asarray(keys) < 0).any()))
        return make_room(group, bounds, keys, tags)
    monkeypatch.setattr(table_group.HashGroup, "make_room_in_place", spied)
    names = make_hash_tables("full", capacity, hybrid=True)
    got = hash_run(names, "sized_full", True, False, monkeypatch, steps)
    assert_same_hash_runs(got, want)
    assert all(len(shard) <= capacity for shard in got[1] if isinstance(shard, dict))
    # every step evicts once the shards are full: within ten steps at 1 to 4 ranks (at 3 ranks
    # the keys reach each shard slower, and the last four steps evict)
    assert len(padded) >= 3
    if SIZE == 1:
        return
    # once every shard of the group is full, every step goes sized and evicts on every owner
    # (before, a shard full on one rank evicts the counted way while another's has room): the
    # sized steps are the last ones, one eviction in place each, the last step among them (how
    # soon every shard fills up depends on how the keys fall on the ranks' shards)
    sized = plan("sized_full").sized
    assert sized >= 1 and sum(padded) == sized and all(padded[-sized:]), padded


def test_an_op_name_used_again_for_a_hash_table_alone_goes_by_its_counts(monkeypatch):
    """A program may name a lookup of a hash group and one of a hash table alone alike (two
    graphs, one op name): the second goes by its counts (its insert would take a padded key),
    and so do its steps afterwards, equal to the same lookups of a job without capacities."""
    rng = np.random.default_rng([23, RANK])
    names = make_hash_tables("again", 12 * SIZE * HASH_KEYS)
    keys = [rng.integers(0, 2 ** 40, size=HASH_KEYS) for _ in range(3)]
    for capacity, op in (("0", "again_counted"), ("1", "again_sized")):
        monkeypatch.setenv(peer_capacity.ENV, capacity)
        names = make_hash_tables("again", 12 * SIZE * HASH_KEYS)
        group = [PooledInput(k, np.arange(HASH_KEYS) % 4, 4, None, "sum") for k in keys]
        api.pooled_lookup([names[0], names[1], names[3]], op + "_fwd", group, True)
        alone = [api.pooled_lookup([names[0]], op + "_fwd", group[:1], True)[0][0]
                 for _ in range(2)]
        if capacity == "0":
            want = alone
    for got, expected in zip(alone, want):
        np.testing.assert_array_equal(got, expected)
    kinds = {key[2]: p for key, p in runtime.get().capacities.items()
             if key[0] == "again_sized_fwd"}
    if SIZE == 1:  # alone, nothing crosses a network: nothing to size
        assert not kinds
        return
    assert kinds[("hash table",)] is None and kinds[("hash group",)] is not None


def test_peer_slots_place_each_owners_keys_in_its_block():
    counts = np.array([[2, 0, 3], [1, 1, 1]], np.int64)
    caps = np.array([[2, 2, 2], [4, 4, 4]], np.int64)
    slots, flag = cpu.peer_slots_many(counts, caps, [6, 3], None, 4)
    # table 0: owner 0's keys at 0, 1; owner 2's first two at 4, 5, its third past the cap
    np.testing.assert_array_equal(slots[0], [0, 1, 4, 5, -1, -1])
    np.testing.assert_array_equal(slots[1], [0, 4, 8])
    assert flag[0] == 4
    caps = np.array([[1, 0, 4], [1, 2, 1]], np.int64)  # each owner's block as long as its cap
    slots, flag = cpu.peer_slots_many(counts, caps, [6, 3], np.array([1], np.int64), 4)
    np.testing.assert_array_equal(slots[0], [0, -1, 1, 2, 3, -1])
    np.testing.assert_array_equal(slots[1], [0, 1, 3])
    assert flag[0] == 5  # owner 0 of table 0 overflows; the input flag kept
    _, flag = cpu.peer_slots_many(counts, counts + 1, [6, 3], np.array([1], np.int64), 4)
    assert flag[0] == 1  # no count over its cap: the input flag alone


def test_a_hash_groups_insert_and_find_pass_a_padded_slot_by():
    """A per-peer capacity's padded slot of a hash group (key -1, tag -1) places nothing and
    finds nothing: row -1, the members' indexes as the keys alone leave them."""
    keys = np.array([-1, 7, 9, -1, 7, 12], np.int64)
    tags = np.array([-1, 0, 1, -1, 1, 0], np.int64)
    starts = np.array([0, 10, 20], np.int64)
    indexes = [cpu.HashIndex(10) for _ in range(2)]
    out = cpu.hash_insert_many(indexes, keys, tags, starts)
    cpu.hash_insert_many_done(indexes, out, out[5], True)
    rows = np.asarray(out[0])
    np.testing.assert_array_equal(rows[keys < 0], -1)
    np.testing.assert_array_equal(np.asarray(out[5]), [2, 2])  # placed per member
    np.testing.assert_array_equal(cpu.hash_find_many(indexes, keys, tags, starts), rows)


def test_move_rows_skips_negative_indices_and_padded_rows_sum_to_nothing():
    src = np.arange(12, dtype=np.float32).reshape(6, 2)
    dst = np.full((4, 2), -7, np.float32)
    cpu.move_rows(src, np.array([5, 0, -1, 2]), dst, np.array([1, -1, 3, 0]))
    np.testing.assert_array_equal(dst, [[4, 5], [10, 11], [-7, -7], [-7, -7]])
    rows = np.array([4, -1, 2, 4, -1], np.int64)
    (distinct, inverse, ranks), = cpu.distinct_rows_many_start([(rows, 8, [8])])[0]
    np.testing.assert_array_equal(distinct, [2, 4])
    np.testing.assert_array_equal(inverse, [1, -1, 0, 1, -1])
    np.testing.assert_array_equal(ranks, [2])
    summed = cpu.segment_sum(np.ones((5, 3), np.float32), inverse, 2)
    np.testing.assert_array_equal(summed, [[1, 1, 1], [2, 2, 2]])
