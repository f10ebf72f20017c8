"""Growing and evicting hash tables (sok1x.DynamicVariable's engine side, issue 11 item 2) on the
cpu engine, driven through sok1x.engine.api at any number of ranks.

Every rank looks up the same keys, so each key reaches its owner (scramble(key) % size, D6) once
from every rank. The expected shard contents come from a small model of one shard written here
(held keys with their last step and lookup count; LRU/LFU as DESIGN states them) and the expected
vectors from the initializer recipe (D10).
"""
import numpy as np
import pytest

from sok1x.backend import cpu, random_init
from sok1x.backend.cpu import random_rows as cpu_random
from sok1x.backend.owner_rules import OWNER_HASH
from sok1x.engine import api, runtime
from sok1x.engine.tables import hybrid_rows
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.engine.op_keys import name_key
from sok1x.errors import InvalidInputError, TableFullError

SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=5)
DIM = 3
ADAGRAD = {"lr": 0.5, "epsilon": 1e-7}


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    runtime.init(backend="cpu")


def initial(name, keys):
    return cpu_random.initial_values(SPEC, name_key("table:" + name), np.asarray(keys), DIM)


def owned(keys):
    rt = runtime.get()
    keys = np.asarray(keys, dtype=np.int64)
    return keys[cpu.owners_of(keys, rt.size, OWNER_HASH) == rt.rank]


def keys_per_rank(start, count):
    """Returns `count` keys owned by each rank (the same list on every rank), from `start` on."""
    size = runtime.get().size
    candidates = np.arange(start, start + 50 * count * size + 100, dtype=np.int64)
    owners = cpu.owners_of(candidates, size, OWNER_HASH)
    return np.concatenate([candidates[owners == r][:count] for r in range(size)])


def shard_state(name):
    """This rank's shard by key: {key: (vector, {slot: row})}, from the index and the arrays."""
    table = api.shard(name)
    keys, rows = table.index.export()
    backend = runtime.get().backend
    values = hybrid_rows.gather_rows(backend, table.values, rows)
    slots = {n: hybrid_rows.gather_rows(backend, s, rows) for n, s in table.slots.items()}
    return {int(k): (values[i].copy(), {n: s[i].copy() for n, s in slots.items()})
            for i, k in enumerate(keys)}


def assert_same_state(got, expected):
    assert sorted(got) == sorted(expected)
    for key, (vector, slots) in expected.items():
        np.testing.assert_array_equal(got[key][0], vector)
        assert sorted(got[key][1]) == sorted(slots)
        for name, row in slots.items():
            np.testing.assert_array_equal(got[key][1][name], row)


def train_step(name, op, keys, update=True):
    """A training lookup of `keys` and, with update, Adagrad on the gradient of sum(vectors)."""
    vectors, token = api.dense_lookup(name, op, np.asarray(keys, np.int64), True)
    if update:
        values, rows = api.dense_lookup_grad(name, op, token, np.ones_like(vectors))
        api.apply_optimizer_update(name, "adagrad", "opt", {}, ADAGRAD, values, rows)
    return vectors


class ShardModel:
    """One shard as DESIGN describes it: held keys with (last step, lookups); evicts by LRU
    (least recent, then smaller key) or LFU (fewest lookups, then least recent, then smaller
    key), never a key of the current step."""

    def __init__(self, max_capacity, strategy, size):
        self.max_capacity, self.strategy, self.size = max_capacity, strategy, size
        self.held, self.step = {}, 0

    def lookup(self, keys):
        """Returns the keys evicted, in order, when every rank looks up `keys`."""
        self.step += 1
        mine = set(owned(np.unique(keys)).tolist())
        new = [k for k in mine if k not in self.held]
        excess = len(self.held) + len(new) - self.max_capacity
        evicted = []
        if excess > 0:
            candidates = [k for k in self.held if k not in mine]
            if self.strategy == "lru":
                candidates.sort(key=lambda k: (self.held[k][0], k))
            else:
                candidates.sort(key=lambda k: (self.held[k][1], self.held[k][0], k))
            evicted = candidates[:excess]
            for k in evicted:
                del self.held[k]
        for k in mine:
            self.held[k] = (self.step, self.held.get(k, (0, 0))[1] + self.size)
        return evicted


def test_growth_keeps_every_key_vector_and_slots(world):
    rank, size = world
    name = "dyn_grow"
    api.create_table(name, DIM, 64, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hbm", 2, 64))
    first = np.arange(0, 6 * size, dtype=np.int64)
    train_step(name, "grow_0", first)
    before = shard_state(name)
    assert len(before) == len(owned(first))
    capacity_before = api.shard(name).capacity
    for step in range(1, 4):  # more keys than init_capacity on every rank: the shard doubles
        train_step(name, "grow_%d" % step, np.arange(0, 6 * size * (step + 1), dtype=np.int64),
                   update=False)
    after = shard_state(name)
    table = api.shard(name)
    held = len(owned(np.arange(0, 24 * size)))
    assert table.index.size == held and table.capacity >= held
    assert table.capacity > capacity_before or held <= capacity_before
    assert_same_state({k: after[k] for k in before}, before)
    fresh = sorted(set(after) - set(before))
    np.testing.assert_array_equal(np.array([after[k][0] for k in fresh]).reshape(-1, DIM),
                                  initial(name, fresh).reshape(-1, DIM))
    # The grown Adagrad slot keeps its initial value (0.1) on rows that had no update yet.
    for key in fresh:
        np.testing.assert_allclose(after[key][1]["opt/accumulator"], 0.1)
    # Every key reads back through the exchange as the owners hold it.
    keys = np.arange(0, 24 * size, dtype=np.int64)
    read = api.read_rows(name, "grow_read", keys)
    expected = initial(name, keys)
    trained = np.isin(keys, first)
    np.testing.assert_array_equal(read[~trained], expected[~trained])
    assert not np.allclose(read[trained], expected[trained])


@pytest.mark.parametrize("strategy", ["lru", "lfu"])
def test_eviction_at_max_capacity(world, strategy):
    rank, size = world
    name = "dyn_evict_" + strategy
    capacity = 6
    api.create_table(name, DIM, capacity, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hybrid", 2, capacity, strategy))
    model = ShardModel(capacity, strategy, size)
    rng = np.random.default_rng(11)
    hot = keys_per_rank(0, 4).reshape(size, 4)  # looked up often: LFU keeps them
    evicted_seen = []
    for step in range(12):  # at most 5 keys per rank and step, 6 rows per rank
        cold = keys_per_rank(int(rng.integers(10 ** 5, 10 ** 6)), 3)
        half = hot[:, step % 2::2].reshape(-1)
        keys = np.concatenate([half, cold]) if step % 3 else cold
        train_step(name, "evict_%d" % step, keys, update=False)
        expected = model.lookup(keys)
        got_keys, got_values = api.pop_evicted(name)
        assert got_keys.tolist() == expected, "step %d" % step
        np.testing.assert_array_equal(got_values.reshape(-1, DIM),
                                      initial(name, got_keys).reshape(-1, DIM))
        assert sorted(shard_state(name)) == sorted(model.held)
        evicted_seen += got_keys.tolist()
    assert len(api.pop_evicted(name)[0]) == 0  # handed out once
    assert api.shard(name).index.size == min(capacity, len(model.held))
    total = runtime.get().host.all_gather_object(len(evicted_seen))
    assert sum(total) > 0
    # An evicted key looked up again starts from its initial value, its slots from theirs.
    if evicted_seen:
        again = shard_state(name)
        for key in set(evicted_seen) & set(again):
            np.testing.assert_array_equal(again[key][0], initial(name, [key])[0])


def test_reused_rows_get_initial_slots(world):
    rank, size = world
    name = "dyn_reuse"
    api.create_table(name, DIM, 2, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hybrid", 2, 2, "lru"))
    for step in range(6):  # every step's keys evict the last step's, which had an update
        keys = keys_per_rank(10 ** 4 * (step + 1), 2)
        train_step(name, "reuse_%d" % step, keys)
        assert len(api.pop_evicted(name)[0]) == (2 if step else 0)
    state = shard_state(name)
    vectors = api.read_rows(name, "reuse_read", keys)
    expected = initial(name, keys)
    # One Adagrad step from the initial value and accumulator 0.1 with gradient 1 per rank.
    accumulator = 0.1 + size ** 2
    np.testing.assert_allclose(vectors, expected - 0.5 * size / np.sqrt(accumulator), rtol=1e-5)
    for _, slots in state.values():
        np.testing.assert_allclose(slots["opt/accumulator"], accumulator, rtol=1e-6)


def test_full_hbm_table_fails_the_step_on_every_rank(world):
    rank, size = world
    name = "dyn_full"
    api.create_table(name, DIM, 4, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hbm", 2, 4))
    train_step(name, "full_0", np.arange(3, dtype=np.int64))
    before = shard_state(name)
    many = np.arange(0, 200 * size, dtype=np.int64)
    with pytest.raises(TableFullError, match=r"dyn_full: the shard on rank \d+ is full: .* "
                                             r"max_capacity=4"):
        train_step(name, "full_1", many)
    assert_same_state(shard_state(name), before)


def test_failed_step_rolls_back_every_table(world):
    """Three lookups in one step (one tower): a fixed-capacity hash table, then a full hybrid
    table (it evicts), then bad input on the last rank. Every rank raises, and every table,
    slot and index is as before the step; the next good step goes on as if it never ran."""
    from sok1x.engine.op_order import OpId
    rank, size = world
    fixed, dynamic = "step_fixed", "step_dynamic"
    api.create_table(fixed, DIM, 64, True, SPEC, replace=True)
    api.create_table(dynamic, DIM, 4, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hybrid", 4, 4, "lru"))
    train_step(fixed, "warm_fixed", np.arange(0, 4 * size))
    train_step(dynamic, "warm_dynamic_0", keys_per_rank(0, 2))
    train_step(dynamic, "warm_dynamic_1", keys_per_rank(1000, 2))
    api.pop_evicted(dynamic)
    before = {name: shard_state(name) for name in (fixed, dynamic)}
    table = api.shard(dynamic)
    free_before = (table.free_rows(), table._high_water)

    def step(bad_rank):
        tower = "rollback_tower"
        api.dense_lookup(fixed, OpId("f", tower, 0), np.arange(50, 50 + 3 * size), True)
        api.dense_lookup(dynamic, OpId("d", tower, 1), keys_per_rank(500, 3), True)
        third = keys_per_rank(500, 1)
        third[-1] = -1 if rank == bad_rank else third[-1]
        api.dense_lookup(dynamic, OpId("bad", tower, 2), third, True)

    with pytest.raises(InvalidInputError, match="rank %d: step_dynamic: key -1" % (size - 1)):
        step(size - 1)
    for name in (fixed, dynamic):
        assert_same_state(shard_state(name), before[name])
    assert api.shard(fixed).index.size == len(before[fixed])
    assert table.free_rows().tolist() == free_before[0].tolist()
    assert table._high_water == free_before[1]
    assert len(api.pop_evicted(dynamic)[0]) == 0
    step(-1)  # the same step, good now: it evicts what it would have evicted
    evicted, _ = api.pop_evicted(dynamic)
    assert set(evicted.tolist()) <= set(before[dynamic])
    assert set(shard_state(dynamic)) == (set(before[dynamic]) - set(evicted.tolist())) | set(
        owned(keys_per_rank(500, 3)).tolist())


def _host_waits_of(name, op, keys):
    waits = runtime.get().stats()["host_waits"]
    train_step(name, op, keys)
    return runtime.get().stats()["host_waits"] - waits


def test_a_step_that_evicts_waits_for_its_keys_and_victims_only(world):
    """A full shard whose step looks up few of its keys knows from host counts alone that it
    can evict enough (the held rows less the keys the step looked up, every rank's copy
    counted, cover the new keys): the step waits on the host twice more than a step of held
    keys alone (which counts its new keys alike), for the step's keys and for the lowest row
    the device chose for the victims (one number, never the shard); deciding that it may evict
    reads nothing."""
    name = "dyn_evict_waits"
    api.create_table(name, DIM, 64, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hybrid", 64, 64, "lru"))
    train_step(name, "waits_fill", keys_per_rank(0, 64))
    room = _host_waits_of(name, "waits_room", keys_per_rank(0, 3))  # held keys: no new one
    evicting = _host_waits_of(name, "waits_evict", keys_per_rank(10 ** 4, 3))
    assert len(api.pop_evicted(name)[0]) == 3  # this shard's: each rank owns three new keys
    assert evicting - room <= 2, (room, evicting)


@pytest.mark.parametrize("new", [5, 6, 7])
def test_a_step_whose_earlier_lookup_touched_held_keys_counts_them_exactly(world, new):
    """Two lookups of one full shard in one step: the first looks up two held keys, the second
    the same two and `new` new keys. The host counts alone cannot show that the six keys the
    step did not look up cover five or six new ones (the first lookup's two may be among the
    second's); the statistics do: five and six evict (never a key of this step), seven cannot
    and fail the step on every rank, changing nothing."""
    from sok1x.engine.op_order import OpId
    rank, size = world
    name = "dyn_exact_%d" % new
    api.create_table(name, DIM, 8, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hybrid", 8, 8, "lru"))
    held = keys_per_rank(0, 8).reshape(size, 8)
    train_step(name, "exact_fill", held.reshape(-1))
    before = shard_state(name)
    looked = held[:, :2].reshape(-1)
    fresh = keys_per_rank(10 ** 4, new)

    def step():
        tower = "exact_tower_%d" % new
        api.dense_lookup(name, OpId("a", tower, 0), looked, True)
        api.dense_lookup(name, OpId("b", tower, 1), np.concatenate([looked, fresh]), True)

    if new > 6:
        with pytest.raises(TableFullError, match=r"%s: the shard on rank \d+ is full: 8 keys "
                                                 r"held of max_capacity=8, 7 new keys arrived "
                                                 r"and 6 held keys may be evicted" % name):
            step()
        assert_same_state(shard_state(name), before)
        assert len(api.pop_evicted(name)[0]) == 0
        return
    step()
    evicted = api.pop_evicted(name)[0]
    assert len(evicted) == new
    assert set(evicted.tolist()) <= set(owned(held[:, 2:].reshape(-1)).tolist())
    assert set(shard_state(name)) == (set(before) - set(evicted.tolist())) | set(
        owned(fresh).tolist())


@pytest.mark.parametrize("strategy", ["lru", "lfu"])
def test_lru_evicts_the_stale_lfu_the_rare(world, strategy):
    """Hot keys looked up four times, then not; then two rounds of new keys into a full shard:
    LRU evicts the hot keys (looked up longest ago), LFU the first new ones (looked up once)."""
    rank, size = world
    name = "dyn_which_" + strategy
    api.create_table(name, DIM, 4, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hybrid", 4, 4, strategy))
    hot, first, second = (keys_per_rank(start, 2) for start in (0, 10 ** 5, 2 * 10 ** 5))
    for step in range(4):
        train_step(name, "which_hot_%d" % step, hot, update=False)
    train_step(name, "which_first", first, update=False)
    assert len(api.pop_evicted(name)[0]) == 0
    train_step(name, "which_second", second, update=False)
    evicted, _ = api.pop_evicted(name)
    expected = hot if strategy == "lru" else first
    assert sorted(evicted.tolist()) == sorted(owned(expected).tolist())
    assert sorted(shard_state(name)) == sorted(owned(np.concatenate(
        [first if strategy == "lru" else hot, second])).tolist())


def run_steps(name, dynamic, rule, steps=6):
    """Creates `name` anew with `dynamic` settings and trains it (optimizer `rule`, gradient of
    sum(vectors)) on a fixed key stream; returns (lookups, evicted keys, shard state)."""
    hyper = {"adagrad": ADAGRAD,
             "adam": {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}}[rule]
    api.create_table(name, DIM, dynamic.max_capacity, True, SPEC, replace=True,
                     placement="hash", dynamic=dynamic)
    lookups, evicted = [], []
    for step in range(steps):
        keys = np.concatenate([keys_per_rank(0, 1), keys_per_rank(10 ** 4 * (step + 1), 3)])
        vectors, token = api.dense_lookup(name, "split_%d" % step, keys, True)
        values, rows = api.dense_lookup_grad(name, "split_%d" % step, token,
                                             np.ones_like(vectors))
        api.apply_optimizer_update(name, rule, "opt", {}, hyper, values, rows)
        lookups.append(vectors)
        evicted.append(api.pop_evicted(name))
    return lookups, evicted, shard_state(name)


@pytest.mark.parametrize("rule", ["adagrad", "adam"])
@pytest.mark.parametrize("max_capacity", [64, 12])
def test_hybrid_with_rows_in_host_memory_equals_hbm(world, rule, max_capacity):
    """Vectors beyond max_hbm_for_vectors (here 6 rows' worth) in host memory: lookups,
    updates (Adam decays every row of both parts), growth (from 4 rows, all in device memory,
    to a split table) and eviction (max_capacity 12) give what the same table entirely in
    device memory gives."""
    from sok1x.engine.tables.hybrid_rows import SplitRows
    name = "dyn_split"
    six_rows = 6 * 4 * DIM / 2 ** 30
    strategy = "hybrid" if max_capacity == 12 else "hbm"
    expected = run_steps(name, make_dynamic(strategy, 4, max_capacity), rule)
    got = run_steps(name, make_dynamic("hybrid", 4, max_capacity, "lru", six_rows), rule)
    table = api.shard(name)
    assert isinstance(table.values, SplitRows) and table.values.hbm_rows == 6
    assert all(isinstance(s, SplitRows) for s in table.slots.values())
    assert table._high_water > 6  # rows in the host part are in use
    if max_capacity == 12:
        assert sum(len(keys) for keys, _ in got[1]) > 0
    for a, b in zip(got[0], expected[0]):
        np.testing.assert_array_equal(a, b)
    for (keys_a, values_a), (keys_b, values_b) in zip(got[1], expected[1]):
        np.testing.assert_array_equal(keys_a, keys_b)
        np.testing.assert_array_equal(values_a, values_b)
    assert_same_state(shard_state(name), expected[2])


def test_hash_erase_and_row_pool():
    """Erasing keys from the middle of probe chains (a small, crowded index) keeps every other
    key findable; erased keys come back on the rows a pool names; a rebuilt index agrees."""
    from sok1x.backend.cpu.hash import HashIndex
    from sok1x.engine.tables.table import rebuilt_index
    rng = np.random.default_rng(3)
    keys = rng.choice(2 ** 40, size=500, replace=False).astype(np.int64)
    index = HashIndex(512)
    index.find_or_insert(keys)
    before = dict(zip(keys.tolist(), index.find(keys).tolist()))
    gone = keys[rng.random(500) < 0.4]
    rows_gone = index.find(gone)
    np.testing.assert_array_equal(index.erase(np.concatenate([gone, [2 ** 41]])),
                                  np.concatenate([rows_gone, [-1]]))
    assert index.size == 500 - len(gone) and index.tombstones == len(gone)
    kept = keys[~np.isin(keys, gone)]
    assert (index.find(gone) == -1).all()
    np.testing.assert_array_equal(index.find(kept), [before[k] for k in kept.tolist()])
    pool = rows_gone[::-1].copy()
    rows, new_keys, new_rows = index.find_or_insert(np.concatenate([kept[:7], gone]),
                                                    row_pool=pool)
    assert sorted(new_keys.tolist()) == sorted(gone.tolist())
    assert sorted(new_rows.tolist()) == sorted(pool.tolist())
    assert index.size == 500
    fresh = rebuilt_index(cpu, index, 512)
    assert fresh.tombstones == 0
    np.testing.assert_array_equal(fresh.find(keys), index.find(keys))


def test_a_groups_count_of_new_keys_per_member_is_numpys_count_of_distinct_pairs():
    """backend count_new_keys (cpu), the hash group's exact count of new keys per member near
    full, against np.unique over (tag, key) pairs: repeated keys, a key in several tags, tags
    with none, held keys (found >= 0) left out of the first row and counted in the second."""
    rng = np.random.default_rng(24)
    for _ in range(200):
        n, count = int(rng.integers(0, 300)), int(rng.integers(1, 9))
        keys = rng.integers(-5, int(rng.integers(1, 50)), n).astype(np.int64)
        tags = rng.integers(0, count, n).astype(np.int64)
        found = np.where(rng.random(n) < 0.2, 7, -1)
        new = found < 0
        want = np.zeros(count, np.int64)
        if new.any():  # (NumPy 1.x's unique takes no empty array with an axis)
            pairs = np.unique(np.stack([tags[new], keys[new]], axis=1), axis=0)
            want = np.bincount(pairs[:, 0], minlength=count)
        got = cpu.count_new_keys(count, keys, tags, found)
        np.testing.assert_array_equal(got[0], want)
        np.testing.assert_array_equal(got[1], np.bincount(tags, minlength=count))


def test_an_eviction_that_fails_leaves_a_table_alone_as_it_was(world, monkeypatch):
    """A full hybrid table alone whose eviction fails after its victims left the index (the
    device memory to join them to its free list, say): the step fails and the table's keys,
    vectors, free list and high water are as before; the next step evicts and goes on. One
    rank: the failure is this rank's alone."""
    from sok1x.engine.tables import dynamic_table
    rank, size = world
    if size > 1:
        pytest.skip("a failure of one rank's memory: run at one rank")
    name = "dyn_evict_fails"
    api.create_table(name, DIM, 8, True, SPEC, replace=True, placement="hash",
                     dynamic=make_dynamic("hybrid", 8, 8, "lru"))
    train_step(name, "fails_fill", keys_per_rank(0, 8))
    table = api.shard(name)
    before = (shard_state(name), table.free_rows().tolist(), table._high_water)

    def no_memory(self, backend, rows):
        raise MemoryError("no device memory to join the victims' rows")
    monkeypatch.setattr(dynamic_table.FreeRows, "joined", no_memory)
    with pytest.raises(MemoryError):
        train_step(name, "fails_evict", keys_per_rank(100, 3))
    monkeypatch.undo()
    assert_same_state(shard_state(name), before[0])
    assert (table.free_rows().tolist(), table._high_water) == before[1:]
    train_step(name, "fails_then", keys_per_rank(100, 3))
    assert len(api.pop_evicted(name)[0]) == 3


def test_a_copy_to_the_host_that_cannot_be_queued_leaves_the_reads_to_pop_evicted(
        world, monkeypatch):
    """Where the copy of the victims to the host cannot be queued at eviction (an error of the
    backend), the step goes on and pop_evicted reads them itself: the same keys and vectors."""
    runs = []
    for failing in (False, True):
        name = "dyn_no_prefetch"
        api.create_table(name, DIM, 8, True, SPEC, replace=True, placement="hash",
                         dynamic=make_dynamic("hybrid", 8, 8, "lru"))
        api.drop_evicted(name, False)
        train_step(name, "no_prefetch_fill", keys_per_rank(0, 8))
        if failing:
            def refuse(arrays):
                raise RuntimeError("no stream for the copy")
            monkeypatch.setattr(runtime.get().backend, "download_staged_later", refuse)
        train_step(name, "no_prefetch_evict", keys_per_rank(100, 3))
        monkeypatch.undo()
        runs.append(api.pop_evicted(name))
    (keys, values), (got_keys, got_values) = runs
    assert len(keys) == 3 and got_keys.tolist() == keys.tolist()
    assert np.array_equal(got_values, values)
