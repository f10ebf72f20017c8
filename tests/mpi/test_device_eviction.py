"""A full DynamicVariable evicts per bucket by score (issue 38; engine/tables/eviction.py states
the policy), on the cpu engine at any number of ranks. Expected victims come from a reference
written here with Python integers and loops: the policy's sentences, one key at a time."""
import numpy as np
import pytest

from sok1x.backend import cpu
from sok1x.backend.cpu.hash import HashIndex
from sok1x.engine import api, runtime
from sok1x.engine.checkpoint.tables import dump_tables, load_tables
from sok1x.engine.op_order import OpId
from sok1x.engine.tables import dynamic_table, eviction
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.engine.tables.eviction import bucket_bits
from sok1x.errors import InvalidInputError

from test_dynamic_table import (  # noqa: F401  (sok1x_up: the module's cpu engine)
    DIM, assert_same_state, initial, keys_per_rank, owned, shard_state, sok1x_up, train_step)

MASK = 2 ** 64 - 1


def reference_hash(key):
    """MurmurHash3's 64-bit finaliser of `key`, in Python integers."""
    x = int(key)
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)


def reference_bucket(key, bits):
    """The top `bits` bits of the key's hash."""
    return reference_hash(key) >> (64 - bits) if bits else 0


def reference_victims(held, new_keys, count, bits, step, lfu, looked_up=()):
    """held: {key: (last step, count)}; returns the victims of the first `count` of `new_keys`
    in hash order, one per key: its bucket's lowest-score evictable key not taken yet, else the
    shard's; None where none is left."""
    def score(key):
        last, uses = held[key]
        return (uses, last, key) if lfu else (last, key)

    evictable = {k for k, (last, _) in held.items() if last < step and k not in looked_up}
    evicting = sorted(set(new_keys), key=reference_hash)[:count]
    victims = []
    for key in evicting:
        bucket = reference_bucket(key, bits)
        mine = [k for k in evictable if reference_bucket(k, bits) == bucket]
        victims.append(min(mine, key=score) if mine else "rest")
        evictable.discard(victims[-1])
    for i, victim in enumerate(victims):  # used-up buckets: the shard's lowest, in order
        if victim == "rest":
            victims[i] = min(evictable, key=score) if evictable else None
            evictable.discard(victims[i])
    return victims


def _random_shard(rng, capacity, step):
    """A HashIndex of `capacity` rows holding some random keys at rows 0.., and their records
    (many ties): (index, keys, records int64 [capacity, 2])."""
    index = HashIndex(capacity)
    keys = rng.choice(10 ** 6, size=int(rng.integers(1, capacity + 1)), replace=False)
    index.assign(keys, np.arange(keys.shape[0]))
    statistics = np.zeros((capacity, 2), np.int64)
    statistics[:keys.shape[0], 0] = rng.integers(0, step + 1, keys.shape[0])
    statistics[:keys.shape[0], 1] = rng.integers(0, 3, keys.shape[0])
    return index, keys, statistics


def test_the_backends_pick_is_the_stated_policy():
    """backend.cpu.pick_victims (the twin of eviction.cu) against reference_victims for a group
    of 1 to 4 shards at once: random shards with many ties, buckets of 1 to 8, buckets used up,
    too few evictable keys, members that evict nothing, new keys repeated, held keys looked up."""
    rng = np.random.default_rng(38)
    for trial in range(150):
        members, step = int(rng.integers(1, 5)), int(rng.integers(2, 6))
        shards = [_random_shard(rng, int(rng.integers(4, 300)), step) for _ in range(members)]
        capacities = [index.capacity for index, _, _ in shards]
        row_starts = np.concatenate([[0], np.cumsum(capacities)]).astype(np.int64)
        statistics = np.concatenate([records for _, _, records in shards])
        bits = [int(rng.integers(0, 4)) for _ in range(members)]
        lfu = [bool(rng.integers(0, 2)) for _ in range(members)]
        keys, tags, found, counts, wants = [], [], [], [], []
        for t, (index, held_keys, records) in enumerate(shards):
            new = rng.choice(np.arange(10 ** 6, 2 * 10 ** 6), size=int(rng.integers(1, 80)),
                             replace=False)
            looked = held_keys[:int(rng.integers(0, 3))]
            mine = np.concatenate([new, new[:3], looked])  # a key from two ranks, held ones
            keys.append(mine)
            tags.append(np.full(mine.shape, t))
            found.append(np.concatenate([np.full(new.shape[0] + min(3, new.shape[0]), -1),
                                         row_starts[t] + index.find(looked)]))
            count = int(rng.integers(0, new.shape[0] + 1))
            counts.append(count)
            held = {int(k): tuple(records[r]) for k, r in zip(held_keys,
                                                              range(held_keys.shape[0]))}
            after_looking = {k: ((step, c) if k in set(looked.tolist()) else (last, c))
                             for k, (last, c) in held.items()}
            wants.append(reference_victims(after_looking, new.tolist(), count, bits[t], step,
                                           lfu[t]))
        keys, tags, found = (np.concatenate(a).astype(np.int64) for a in (keys, tags, found))
        order = rng.permutation(keys.shape[0])  # the members' keys interleaved
        stamped = statistics.copy()
        cpu.stamp_last_step(stamped, found, step)
        got_keys, got_rows, records = cpu.pick_victims(
            [index for index, _, _ in shards], stamped, row_starts, keys[order], tags[order],
            found[order], counts, bits, step, lfu)
        at = 0
        for t, (index, _, _) in enumerate(shards):
            mine = slice(at, at + counts[t])
            at += counts[t]
            assert [None if k < 0 else int(k) for k in got_keys[mine]] == wants[t], trial
            for k, r, record in zip(got_keys[mine], got_rows[mine], records[mine]):
                if k >= 0:
                    assert int(index.find([k])[0]) + row_starts[t] == r
                    assert tuple(record) == tuple(statistics[r]) and stamped[r, 0] == step


def test_buckets_hold_about_64_keys():
    assert [bucket_bits(c) for c in (1, 127, 128, 255, 256, 2 ** 18)] == [0, 0, 1, 1, 2, 12]


def _shard_records(name):
    """{key: (last step, count)} of this rank's shard."""
    table = api.shard(name)
    keys, rows = table.index.export()
    return {int(k): tuple(int(v) for v in table.statistics[r]) for k, r in zip(keys, rows)}


@pytest.mark.parametrize("strategy", ["lru", "lfu"])
def test_a_full_shard_of_several_buckets_evicts_by_the_policy(world, strategy):
    """256 rows a rank (4 buckets); every step brings hot keys back and new ones, trained. Each
    step evicts the reference's victims in its order, with the vectors they were trained to;
    the shard never holds more than max_capacity; every key inserted is held or was evicted,
    once per time it was inserted; a key that comes back starts from its initial vector."""
    rank, size = world
    name = "evict_buckets_" + strategy
    capacity = 256
    api.create_table(name, DIM, capacity, True, initial.__globals__["SPEC"], replace=True,
                     placement="hash", dynamic=make_dynamic("hybrid", 64, capacity, strategy))
    api.pop_evicted(name)
    inserted, evicted_all = {}, {}
    hot = keys_per_rank(0, 40)
    for step in range(14):
        fresh = keys_per_rank(10 ** 5 * (step + 1), 60)
        came_back = np.array(sorted(evicted_all))[:5] if evicted_all else fresh[:0]
        keys = np.concatenate([hot[step % 3::3], fresh, came_back])
        mine = np.unique(owned(keys))
        before, records = shard_state(name), _shard_records(name)
        new = [int(k) for k in mine if int(k) not in before]
        count = len(before) + len(new) - capacity
        journal_step = api.shard(name).journal.step + 1
        want = reference_victims(records, new, max(count, 0), bucket_bits(capacity),
                                 journal_step, strategy == "lfu",
                                 looked_up={int(k) for k in mine}) if count > 0 else []
        vectors = train_step(name, "evict_buckets_%d" % step, keys)
        got_keys, got_values = api.pop_evicted(name)
        assert got_keys.tolist() == want, "step %d" % step
        for key, vector in zip(got_keys.tolist(), got_values):
            np.testing.assert_array_equal(vector, before[key][0])
            evicted_all[key] = evicted_all.get(key, 0) + 1
        for key in new:
            inserted[key] = inserted.get(key, 0) + 1
        back = np.isin(keys, came_back) & np.isin(keys, new)  # evicted, not held: back anew
        np.testing.assert_array_equal(vectors[back], initial(name, keys[back]))
        assert api.shard(name).index.size <= capacity
    held = set(shard_state(name))
    for key, times in inserted.items():
        assert times == evicted_all.get(key, 0) + (key in held), key
    assert sum(runtime.get().host.all_gather_object(len(evicted_all))) > 0


def test_a_failed_step_of_a_bucketed_shard_evicts_nothing(world):
    """An evicting lookup, then bad input on the last rank in the same step: every rank raises,
    and keys, vectors, slots and every row's statistics are as before the step."""
    rank, size = world
    name = "evict_buckets_fail"
    api.create_table(name, DIM, 256, True, initial.__globals__["SPEC"], replace=True,
                     placement="hash", dynamic=make_dynamic("hybrid", 256, 256, "lru"))
    train_step(name, "fail_fill", keys_per_rank(0, 256))
    api.pop_evicted(name)
    before, records = shard_state(name), _shard_records(name)
    tower = "evict_fail_tower"
    bad = keys_per_rank(10 ** 6, 1)
    bad[-1] = -1
    with pytest.raises(InvalidInputError, match="key -1"):
        api.dense_lookup(name, OpId("e", tower, 0), keys_per_rank(10 ** 5, 30), True)
        api.dense_lookup(name, OpId("b", tower, 1), bad, True)
    assert len(api.pop_evicted(name)[0]) == 0
    assert sorted(shard_state(name)) == sorted(before)
    assert _shard_records(name) == records


def test_a_checkpoint_of_a_full_shard_loads_and_trains_on(world, shared_dir, monkeypatch):
    """Dump a full, evicting shard, train on, load: the loaded shard is the dumped one, and its
    next evicting step evicts as the reference says (a loaded shard's statistics start at 0).
    The loaded shard keeps the spare rows it had, whatever SOK1X_SPARE_ROWS says by then."""
    rank, size = world
    name = "evict_buckets_ckpt"
    api.create_table(name, DIM, 128, True, initial.__globals__["SPEC"], replace=True,
                     placement="hash", dynamic=make_dynamic("hybrid", 128, 128, "lru"))
    train_step(name, "ckpt_0", keys_per_rank(0, 128))
    train_step(name, "ckpt_1", keys_per_rank(10 ** 5, 20))
    api.pop_evicted(name)
    dumped = shard_state(name)
    dump_tables(shared_dir + "/full", [name])
    train_step(name, "ckpt_2", keys_per_rank(2 * 10 ** 5, 20))
    spare = api.shard(name).spare
    monkeypatch.setenv(dynamic_table.SPARE_ENV, "0.5")
    load_tables(shared_dir + "/full", [name])
    assert api.shard(name).spare == spare and api.shard(name).values.shape[0] == 128 + spare
    state = shard_state(name)
    assert sorted(state) == sorted(dumped)
    for key, (vector, _) in dumped.items():
        np.testing.assert_array_equal(state[key][0], vector)
    records = _shard_records(name)
    keys = keys_per_rank(3 * 10 ** 5, 20)
    new = [int(k) for k in np.unique(owned(keys))]
    want = reference_victims(records, new, len(new), bucket_bits(128),
                             api.shard(name).journal.step + 1, False)
    train_step(name, "ckpt_3", keys)
    assert api.pop_evicted(name)[0].tolist() == want
    assert api.shard(name).index.size == 128


def test_a_groups_count_of_evictable_keys_is_the_policys():
    """backend.cpu.count_evictable, what each member of a group may evict in a lookup, against
    the policy's sentence: held keys whose last step is older than the step and that the
    lookup did not find. Random shards, some rows looked up (repeated), members alike."""
    rng = np.random.default_rng(46)
    for trial in range(60):
        members, step = int(rng.integers(1, 5)), int(rng.integers(2, 6))
        shards = [_random_shard(rng, int(rng.integers(4, 300)), step) for _ in range(members)]
        row_starts = np.concatenate([[0], np.cumsum([i.capacity for i, _, _ in shards])])
        statistics = np.concatenate([records for _, _, records in shards])
        found = rng.integers(-1, row_starts[-1], int(rng.integers(0, 50)))
        want = []
        for t, (index, keys, _) in enumerate(shards):
            want.append(sum(1 for key in keys.tolist()
                            for row in [int(index.find([key])[0]) + int(row_starts[t])]
                            if statistics[row, 0] < step and row not in set(found.tolist())))
        got = cpu.count_evictable([i for i, _, _ in shards], statistics, row_starts, found, step)
        assert got.tolist() == want, trial


@pytest.mark.parametrize("reader", [False, True])
def test_evicting_steps_whose_new_keys_fit_the_spare_rows_copy_no_slot_and_undo_exactly(
        world, reader, monkeypatch):
    """A full shard holds spare rows beyond max_capacity (1/16 of it: 16 here). A failed step
    whose new keys fit them copies no evicted slot aside (nor any vector, unless someone reads
    the evicted keys), and puts back every key, vector, slot and record; a step of two evicting
    lookups, the second's new keys more than the spare rows left, copies the second's victims
    alone and undoes exactly too; a step that goes on evicts the policy's victims."""
    rank, size = world
    monkeypatch.setenv(dynamic_table.SPARE_ENV, "0.0625")  # (the default, whatever the job's)
    name = "evict_spares_%s" % ("read" if reader else "dropped")
    api.create_table(name, DIM, 256, True, initial.__globals__["SPEC"], replace=True,
                     placement="hash", dynamic=make_dynamic("hybrid", 256, 256, "lru"))
    dynamic_table.drop_evicted(name, not reader)
    table = api.shard(name)
    assert table.spare == 16 and table.values.shape[0] == 256 + 16
    train_step(name, "spares_fill", keys_per_rank(0, 256))
    api.pop_evicted(name)
    copied = []  # the slots each eviction copied aside, where it copied anything
    real = eviction._gathered
    monkeypatch.setattr(eviction, "_gathered", lambda backend, values, slots, rows, fill: (
        copied.append(sorted(slots)) or real(backend, values, slots, rows, fill)))
    tower = "spares_fail_tower"
    bad = keys_per_rank(10 ** 6, 1)
    bad[-1] = -1
    for lookups in ([10], [10, 10]):  # new keys a rank: 10 fit the 16 spares, 20 do not
        before, records = shard_state(name), _shard_records(name)
        del copied[:]
        with pytest.raises(InvalidInputError, match="key -1"):
            for i, count in enumerate(lookups):
                api.dense_lookup(name, OpId("s%d" % i, tower, i),
                                 keys_per_rank(10 ** 5 * (i + 1), count), True)
            api.dense_lookup(name, OpId("b", tower, len(lookups)), bad, True)
        moved = [["opt/accumulator"]]  # the second lookup's victims, with their slots
        assert copied == ([[]] if reader else []) + (moved if len(lookups) == 2 else [])
        assert len(api.pop_evicted(name)[0]) == 0
        assert_same_state(shard_state(name), before)
        assert _shard_records(name) == records
    records = _shard_records(name)
    keys = keys_per_rank(3 * 10 ** 5, 10)
    new = [int(k) for k in np.unique(owned(keys))]
    want = reference_victims(records, new, len(new), bucket_bits(256),
                             api.shard(name).journal.step + 1, False)
    train_step(name, "spares_on", keys)
    assert sorted(shard_state(name)) == sorted(set(records) - set(want) | set(new))
    assert api.pop_evicted(name)[0].tolist() == (want if reader else [])
    assert api.shard(name).index.size == 256
