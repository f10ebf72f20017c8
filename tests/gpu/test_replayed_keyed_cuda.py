"""The replayed keyed step (engine/lookup/replayed_step.py through engine/lookup/keyed.py,
SOK1X_CAPTURE) on the cuda engine at one GPU: a keyed lookup of a table group (each key its own
output row), its backward and its keyed update, recorded as CUDA graphs and replayed, equal the
same step run uncaptured on a copy of the tables over many steps with changing keys (bit for bit
where no key repeats in a member, so no addition's order matters; outputs, rows and counts bit for
bit and sums to rounding otherwise), with an empty member, for few keys and for more than
segment_rows.SORTED_MIN (the backward's sums then sorted by row, in the graph too); the replayed
forward and backward queue no kernel of their own and the update two (its hyper-parameters' write
and the time stamp); a bad key of one member fails the step naming it and changes no table;
a hash group's steps replay their inserts as well, agreeing key by key with uncaptured steps,
and so do a hybrid group's steps with room and, once its members are full, its evicting steps.

    mpiexec --allow-run-as-root -n 1 python3 -m pytest -q tests/gpu/test_replayed_keyed_cuda.py
"""
import numpy as np
import pytest

pytest.importorskip("pycuda")

from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.lookup import bounded_step, replayed_step  # noqa: E402
from sok1x.engine.lookup.keyed import KeyedInput  # noqa: E402
from sok1x.engine.op_order import OpId  # noqa: E402
from sok1x.errors import InvalidInputError  # noqa: E402

pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.usefixtures("engine")]
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=47)
DIM = 64  # segment_rows.MIN_WIDTH: MANY keys' backward sums are sorted by row
ROWS = [20000, 5000, 12000, 9000]
LENGTHS = np.array([3000, 1500, 0, 2500])  # one member without keys
MANY = np.array([20000, 0, 9000, 5000])  # past segment_rows.SORTED_MIN: sums by sorting
RULES = {"lazy_adam": "Adam", "adagrad": "Adagrad"}


@pytest.fixture(autouse=True)
def bounded(monkeypatch):
    monkeypatch.setenv(bounded_step.ENV, "1")
    monkeypatch.delenv(replayed_step.ENV, raising=False)


def host(array):
    return runtime.get().backend.to_host(array)


def hyper(rule, step):
    if rule == "adagrad":
        return {"lr": 0.1, "epsilon": 1e-7}
    lr = 0.01 * np.sqrt(1 - 0.999 ** step) / (1 - 0.9 ** step)
    return {"lr_t": lr, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}


def make_pair(tag):
    """The same tables made twice: (replayed names, uncaptured names)."""
    backend = runtime.get().backend
    pair = [["%s_%s_%d" % (way, tag, t) for t in range(len(ROWS))]
            for way in ("replayed", "uncaptured")]
    for names in pair:
        for name, rows in zip(names, ROWS):
            api.create_table(name, DIM, rows, False, SPEC, replace=True)
            api.shard(name)
    for a, b, rows in zip(pair[0], pair[1], ROWS):
        backend.put_rows(api.shard(b).values, backend.asarray(np.arange(rows, dtype=np.int64)),
                         backend.asarray(host(api.shard(a).values)))
    return pair


def distinct_keys(rng, lengths=LENGTHS):
    """Each member's keys distinct: every sum of the backward has one addend."""
    return np.concatenate([rng.permutation(rows)[:n] for rows, n in zip(ROWS, lengths)])


def step(names, keys, rule, number, replay, scale=None, lengths=LENGTHS, tower=False):
    """A keyed lookup, backward and keyed update of `names`: host (output, values, rows,
    counts). tower: the lookup and its backward are a tower's first two ops (a graph's way: the
    backward opens no step, and reads the forward's checks once its work is queued), not two
    ops named alone."""
    backend = runtime.get().backend
    ops = [names[0] + "_fwd", names[0] + "_bwd"]
    if tower:
        ops = [OpId(op, names[0], place) for place, op in enumerate(ops)]
    with runtime.entered():
        item = KeyedInput(backend.asarray(keys), lengths, None, lengths, None, "sum")
        out, token = api.keyed_lookup(names, ops[0], item, True, checks="backward",
                                      replay=replay)
        copied = host(out)  # a replay rewrites it
        grads = out if scale is None else backend.scale_rows(
            out, backend.asarray(np.full(out.shape[0], scale, np.float32)))
        values, rows, counts = api.keyed_lookup_grad(names, ops[1], token, grads)
        got = copied, host(values), host(rows), np.array(counts)
        api.apply_keyed_update(names, rule, RULES[rule], {}, hyper(rule, number), values, rows,
                               counts)
    return got


def tables(names):
    """Per table of `names`, host copies of its rows and every slot (by name)."""
    return [[host(api.shard(name).values)] + [host(api.shard(name).slots[slot])
                                              for slot in sorted(api.shard(name).slots)]
            for name in names]


def held():
    with runtime.entered() as rt:
        return replayed_step.classes_held(rt), replayed_step.updates_recorded(rt)


def fresh():
    with runtime.entered() as rt:
        replayed_step.free(rt)


@pytest.mark.parametrize("rule", ["lazy_adam", "adagrad"])
@pytest.mark.parametrize("lengths", [LENGTHS, MANY], ids=["few", "many"])
def test_replayed_keyed_group_equals_uncaptured_bit_for_bit(rule, lengths):
    fresh()
    pair = make_pair("exact_" + rule)
    rng = np.random.default_rng(3)
    for number in range(1, 11):
        keys = distinct_keys(rng, lengths)
        got = step(pair[0], keys, rule, number, True, lengths=lengths)
        want = step(pair[1], keys, rule, number, False, lengths=lengths)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(got[3], -(-lengths // 8) * 8)  # pieces of 8 rows
        for a, b in zip(tables(pair[0]), tables(pair[1])):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    assert held() == (1, 1)


@pytest.mark.parametrize("lengths", [LENGTHS, MANY], ids=["few", "many"])
def test_repeated_keys_and_a_scaled_gradient(lengths):
    fresh()
    pair = make_pair("repeats")
    rng = np.random.default_rng(5)
    for number in range(1, 9):
        keys = np.concatenate([rng.integers(0, rows // 4, size=n)
                               for rows, n in zip(ROWS, lengths)])
        got = step(pair[0], keys, "lazy_adam", number, True, 0.5 + number, lengths)
        want = step(pair[1], keys, "lazy_adam", number, False, 0.5 + number, lengths)
        for index in (0, 2, 3):
            np.testing.assert_array_equal(got[index], want[index])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
        for a, b in zip(tables(pair[0]), tables(pair[1])):
            for x, y in zip(a, b):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    assert held() == (1, 1)


def test_a_replayed_keyed_step_launches_graphs():
    fresh()
    pair = make_pair("launches")
    rng = np.random.default_rng(7)
    backend = runtime.get().backend
    found = {}
    for replay in (True, False):
        for number in range(1, 6):
            keys = backend.asarray(distinct_keys(rng))
            before = backend.counts()
            with runtime.entered():
                item = KeyedInput(keys, LENGTHS, None, LENGTHS, None, "sum")
                out, token = api.keyed_lookup(pair[0], "launch_fwd", item, True,
                                              checks="backward", replay=replay)
                values, rows, counts = api.keyed_lookup_grad(pair[0], "launch_bwd", token, out)
                between = backend.counts()
                api.apply_keyed_update(pair[0], "lazy_adam", "Adam", {},
                                       hyper("lazy_adam", number), values, rows, counts)
            after = backend.counts()
        found[replay] = (between["launches"] - before["launches"],
                         after["launches"] - between["launches"],
                         after["copies"] - between["copies"])
    print("launches of a keyed forward and backward, of its update, and the update's copies: "
          "replayed %s, uncaptured %s" % (found[True], found[False]))
    assert found[True][0] == 0 < found[False][0]
    # the update: one launch writes its hyper-parameters and its stamp's time; no upload; one
    # copy, the flag of the step's key checks its backward left to it (read once its work,
    # predicated on that flag on the device, is queued)
    assert found[True][1:] == (1, 1)


def test_a_bad_key_of_one_member_fails_and_changes_nothing():
    fresh()
    pair = make_pair("bad")
    rng = np.random.default_rng(9)
    for number in range(1, 5):
        step(pair[0], distinct_keys(rng), "adagrad", number, True)
    before = tables(pair[0])
    for member, bad in ((3, ROWS[3] + 5), (1, -1)):
        keys = distinct_keys(rng)
        keys[int(np.sum(LENGTHS[:member])) + 17] = bad
        with pytest.raises(InvalidInputError, match=pair[0][member]):
            step(pair[0], keys, "adagrad", 5, True)
        for a, b in zip(before, tables(pair[0])):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    got = step(pair[0], distinct_keys(rng), "adagrad", 5, True)  # replays go on
    assert held() == (1, 1) and got[0].shape == (int(LENGTHS.sum()), DIM)


HASH_LENGTHS = np.array([3000, 1500, 0, 2500])


def hash_run(steps, replay, bad_step=None, tower=False):
    """Keyed steps of a hash group (v1 hash tables, made anew under one set of names: a hash
    table's first values follow from its name) for each keys of `steps`; bad_step: a step whose
    member 1 gets a negative key, which must fail naming it and change no size. Returns (each
    step's host output and counts, or None, the sizes, the trained vectors of every key seen,
    held(), launches of the last replayed forward and backward); tower: as step()'s."""
    fresh()
    names = ["hash_replay_%d" % t for t in range(len(HASH_LENGTHS))]
    for name in names:
        api.create_table(name, DIM, 40000, True, SPEC, replace=True)
    backend = runtime.get().backend
    results, launches = [], None
    for number, keys in enumerate(steps, 1):
        if number - 1 == bad_step:
            keys = keys.copy()
            keys[int(HASH_LENGTHS[0]) + 11] = -3
            sizes = [api.shard(n).index.size for n in names]
            with pytest.raises(InvalidInputError, match=names[1]):
                step(names, keys, "lazy_adam", number, replay, lengths=HASH_LENGTHS,
                     tower=tower)
            assert [api.shard(n).index.size for n in names] == sizes
            results.append(None)
            continue
        before = backend.counts()["launches"]
        got = step(names, keys, "lazy_adam", number, replay, lengths=HASH_LENGTHS, tower=tower)
        results.append((got[0], got[3]))
        launches = backend.counts()["launches"] - before
    every = np.unique(np.concatenate(steps))
    lengths = np.full(len(names), every.shape[0])
    with runtime.entered():
        item = KeyedInput(backend.asarray(np.tile(every, len(names))), lengths, None, lengths,
                          None, "sum")
        trained, _ = api.keyed_lookup(names, "hash_replay_read", item, False)
        trained = host(trained)
    return (results, [api.shard(n).index.size for n in names], trained, held(), launches)


def hash_keys(seed, count):
    """Each step's keys, distinct within a member (each gradient row its key's alone), drawn
    from 30000 values: new keys arrive at every step."""
    rng = np.random.default_rng(seed)
    return [np.concatenate([rng.permutation(30000)[:n] for n in HASH_LENGTHS])
            for _ in range(count)]


@pytest.mark.parametrize("tower", [False, True], ids=["alone", "tower"])
@pytest.mark.parametrize("bad_step", [None, 5], ids=["steps", "a_negative_key"])
def test_a_hash_group_replays_its_inserts(bad_step, tower):
    """A hash group's keyed steps with their inserts replayed (table_group.ReplayedInsert)
    against the same steps uncaptured: outputs and counts bit for bit, the sizes, and the
    trained vector of every key (the two ways may hand out other rows: the insert's threads
    place keys in any order); a replayed step's forward and backward launch one kernel of their
    own (the clock's write) beside their graphs; a negative key fails its step, naming its
    member, with no size changed, and the replays go on; in a tower (tower) the forward
    leaves its checks to its backward, which fails the step and undoes the insert."""
    steps = hash_keys(13, 10)
    got = hash_run(steps, True, bad_step, tower)
    want = hash_run(steps, False, bad_step, tower)
    for a, b in zip(got[0], want[0]):
        assert (a is None) == (b is None)
        for x, y in zip(a or (), b or ()):
            np.testing.assert_array_equal(x, y)
    assert got[1] == want[1]
    np.testing.assert_array_equal(got[2], want[2])
    assert got[3] == (1, 1) and want[3] == (0, 0)
    print("launches of a replayed hash step (forward, backward, update): %d, uncaptured %d"
          % (got[4], want[4]))
    assert got[4] == 1 + 1  # the clock's write; the update's write of its hyper-parameters


def pooled_step(names, keys, segment_ids, weights, combiner, number, replay):
    """A pooled keyed lookup (segment ids, weights or None, combiner), its backward with each
    table's rows apart (as TensorFlow's keyed op asks) and the keyed update of those: host
    (output, values, rows joined, counts)."""
    backend = runtime.get().backend
    segments = np.maximum(1, LENGTHS // 2)  # as many output rows each step: one class
    with runtime.entered():
        item = KeyedInput(backend.asarray(keys), LENGTHS, backend.asarray(segment_ids), segments,
                          None if weights is None else backend.asarray(weights), combiner)
        out, token = api.keyed_lookup(names, names[0] + "_fwd", item, True, replay=replay)
        copied = host(out)
        values, rows, counts = api.keyed_lookup_grad(names, names[0] + "_bwd", token, out,
                                                     rows_per_table=True)
        got = copied, host(values), np.concatenate([host(r) for r in rows]), np.array(counts)
        api.apply_keyed_update(names, "lazy_adam", "Adam", {}, hyper("lazy_adam", number),
                               values, rows, counts)
    return got


@pytest.mark.parametrize("combiner, weighted", [("sum", False), ("mean", False),
                                                ("sum", True)])
def test_pooled_keys_replay_and_agree(combiner, weighted):
    """Pooled keys (segment ids of rows of 1 to 3 keys, shuffled each step) and weighted ones
    replay on one GPU, their pooling after the replay and the update taking the backward's
    rows per table: outputs, rows and counts equal the uncaptured step's, sums to rounding."""
    fresh()
    pair = make_pair("pooled_%s_%d" % (combiner, weighted))
    rng = np.random.default_rng(11)
    replayed = []
    for number in range(1, 9):
        keys = distinct_keys(rng)
        segment_ids = np.concatenate([np.sort(rng.integers(0, max(1, n // 2), size=n))
                                      for n in LENGTHS]).astype(np.int64)
        weights = rng.random(keys.size).astype(np.float32) if weighted else None
        got = pooled_step(pair[0], keys, segment_ids, weights, combiner, number, True)
        want = pooled_step(pair[1], keys, segment_ids, weights, combiner, number, False)
        # (an output of sums drawn from the updated rows: one element of 224,064 differed by
        # 2.2e-5 relative at rtol 1e-5 on one H200, 2026-11-27, f9abdf4)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(got[2], want[2])
        np.testing.assert_array_equal(got[3], want[3])
        for a, b in zip(tables(pair[0]), tables(pair[1])):
            for x, y in zip(a, b):
                np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
        replayed.append(held())
    assert replayed[-1] == (1, 1)  # the class and its update recorded, replayed since


def test_a_replayed_inserts_member_list_from_its_sizes_equals_the_list_read_whole():
    """hash_insert_members given the sizes a replayed step just read (filled into the list kept
    per layout of the indexes) writes, for every member, what the list read from the indexes
    whole holds: slots, slot count, first new row, room and row start, no pool."""
    from sok1x.backend.cuda import hash as cuda_hash
    backend = runtime.get().backend
    with runtime.entered():
        indexes = [cuda_hash.HashIndex(capacity) for capacity in (100, 7, 3000)]
        starts = np.array([0, 100, 107, 3107], dtype=np.int64)
        for step, sizes in enumerate(([0, 0, 0], [5, 7, 1200], [99, 3, 2999])):
            for index, size in zip(indexes, sizes):
                index.size = size
            whole = host(backend.hash_insert_members(indexes, starts))
            into = backend.empty((len(indexes) * 7,), np.int64)
            given = backend.hash_insert_members(indexes, starts, into,
                                                np.array(sizes, dtype=np.int64))
            assert given is into
            np.testing.assert_array_equal(host(given), whole, err_msg="step %d" % step)


def hybrid_run(steps, replay, bad_step, monkeypatch, full=False, rows=8192, tower=False,
               split=False):
    """Keyed steps of a hybrid group (hybrid DynamicVariables whose rows stay in GPU memory, 4096
    rows a member growing to 6144, LRU; made anew under one set of names) for each keys of
    `steps`; bad_step: a step whose member 1 gets a negative key, which must fail naming it.
    full: members of `rows` rows that never grow and drop what they evict (drop_evicted), whose
    steps evict in place once they are full. Returns (each step's host output and counts, or
    None, per member {key: (vector, its lookup count, its last step counted back from the
    journal's step)} of every key it holds, the keys it evicted (full: their count), held(),
    [(replayed, keys evicted so far, evicting)] of each ReplayedInsert.ready); tower: as
    step()'s; split: half of each member's first rows in GPU memory, the rest in host memory
    (max_hbm_for_vectors), its group's rows a GroupedRows."""
    from sok1x.engine.lookup import table_group
    from sok1x.engine.tables import hybrid_rows
    from sok1x.engine.tables.dynamic_table import make_dynamic
    fresh()
    ready, readies = table_group.ReplayedInsert.ready, []

    def noted(insert, keys, *opens):
        evicted = sum(member._evicted_keys for member in insert.group.members)
        readies.append((ready(insert, keys, *opens), evicted, insert.evicting))
        return readies[-1][0]
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", noted)
    names = ["hybrid_%s_%d" % ("full" if full else "replay", t) for t in range(len(HASH_LENGTHS))]
    first = rows if full else 4096
    for name in names:
        api.drop_evicted(name, full)
        api.create_table(name, DIM, rows if full else 6144, True, SPEC, replace=True,
                         dynamic=make_dynamic("hybrid", first, rows if full else 6144, "lru",
                                              first // 2 * 4 * DIM / 2 ** 30 if split else 0.0))
    results = []
    for number, keys in enumerate(steps, 1):
        if number - 1 == bad_step:
            keys = keys.copy()
            keys[int(HASH_LENGTHS[0]) + 11] = -3
            with pytest.raises(InvalidInputError, match=names[1]):
                step(names, keys, "lazy_adam", number, replay, lengths=HASH_LENGTHS,
                     tower=tower)
            results.append(None)
            continue
        got = step(names, keys, "lazy_adam", number, replay, lengths=HASH_LENGTHS, tower=tower)
        results.append((got[0], got[3]))
    states, evicted = [], []
    with runtime.entered():
        for name in names:
            shard = api.shard(name)
            keys, rows = (host(a) for a in shard.index.export())
            backend = shard.backend
            values = host(hybrid_rows.gather_rows(backend, shard.values, backend.asarray(rows)))
            statistics = host(shard.statistics)
            step_now = shard.journal.step
            states.append({int(k): (values[i], int(statistics[r, 1]),
                                    int(statistics[r, 0]) - step_now)
                           for i, (k, r) in enumerate(zip(keys, rows))})
            evicted.append(np.array([shard.evicted_keys]) if full else
                           np.sort(api.pop_evicted(name)[0]))
    return results, states, evicted, held(), readies


def assert_same_hybrid_runs(got, want):
    """hybrid_run's results agree: each step's output and counts, each member's keys held with
    their vectors, lookup counts and last steps, and what each member evicted."""
    for a, b in zip(got[0], want[0]):
        assert (a is None) == (b is None)
        for x, y in zip(a or (), b or ()):
            np.testing.assert_array_equal(x, y)
    for mine, theirs in zip(got[1], want[1]):
        assert sorted(mine) == sorted(theirs)
        for key, (vector, count, last) in theirs.items():
            np.testing.assert_array_equal(mine[key][0], vector)
            assert mine[key][1:] == (count, last), key
    for mine, theirs in zip(got[2], want[2]):
        np.testing.assert_array_equal(mine, theirs)


def hybrid_keys(seed):
    """Four steps whose keys fit (from 4000 values a member), then twice a step of new keys
    from a million values (members grow, then evict) followed by three steps of its keys."""
    rng = np.random.default_rng(seed)

    def drawn(span):
        return np.concatenate([rng.permutation(span)[:n] for n in HASH_LENGTHS])
    steps = [drawn(4000) for _ in range(4)]
    for _ in range(2):
        wide = drawn(10 ** 6)
        steps += [wide] * 4
    return steps


@pytest.mark.parametrize("split", [False, True], ids=["in_gpu_memory", "split"])
@pytest.mark.parametrize("tower", [False, True], ids=["alone", "tower"])
@pytest.mark.parametrize("bad_step", [None, 6], ids=["steps", "a_negative_key"])
def test_a_hybrid_group_replays_its_steps_with_room(bad_step, tower, split, monkeypatch):
    """A hybrid group's keyed steps whose new keys fit replay their insert, and count their
    lookup in the rows' statistics after the checks (table_group.ReplayedInsert); steps that
    grow or evict run uncaptured, and the steps after them replay again. Against the same steps
    uncaptured: outputs and counts bit for bit, and per member the keys held, each one's
    trained vector, lookup count and last step, and the keys evicted (rows may differ: the
    insert's threads place keys in any order); a negative key in a replayed step fails it,
    naming its member, and counts nothing; in a tower (tower) the backward reads the checks
    and counts the lookup once its own work is queued. split: the members' rows partly in host
    memory, their ordered walks recorded too."""
    steps = hybrid_keys(17)
    got = hybrid_run(steps, True, bad_step, monkeypatch, tower=tower, split=split)
    want = hybrid_run(steps, False, bad_step, monkeypatch, tower=tower, split=split)
    assert_same_hybrid_runs(got, want)
    assert sum(len(e) for e in got[2]) > 0
    assert got[3] == (1, 1) and want[3] == (0, 0)
    replayed = [ok for ok, _, _ in got[4]]
    assert any(ok and count for ok, count, _ in got[4]) and not all(replayed), got[4]


def crowded_keys(rng, count):
    """Each step's keys: per member, 45% of its length fresh values, each at least once, the
    rest repeats of them (more keys than a 2048-row shard's empty slots, fewer new ones)."""
    steps = []
    for _ in range(count):
        parts = []
        for n in HASH_LENGTHS:
            values = rng.permutation(10 ** 6)[:int(0.45 * n)]
            parts.append(np.concatenate([values, rng.choice(values, size=n - values.size)])
                         if n else values)
        steps.append(np.concatenate(parts).astype(np.int64))
    return steps


@pytest.mark.parametrize("bad_step, crowded, tower, split", [
    (None, False, False, False), (12, False, False, False), (None, "before", False, False),
    (None, "inside", False, False), (12, False, True, False), (12, "inside", True, False),
    (None, False, False, True), (12, "inside", True, True)],
    ids=["steps", "a_negative_key", "crowded", "crowded_rebuilt_inside", "a_negative_key_tower",
         "crowded_rebuilt_inside_a_negative_key_tower", "split",
         "split_crowded_rebuilt_inside_a_negative_key_tower"])
def test_a_full_hybrid_group_replays_its_evicting_steps(bad_step, crowded, tower, split,
                                                        monkeypatch):
    """Hybrid members of 8192 rows that drop what they evict, new keys at every step: once the
    members with keys are full, every step evicts in place, and those steps are a class of their
    own, recorded with the pick, the erase and the insert into the victims' rows
    (table_group.ReplayedInsert, evicting; the step number read from its clock when the graph
    runs) and replayed. Against the same steps uncaptured: outputs and counts bit for bit, and
    per member the keys held (the same victims chosen), each one's trained vector, lookup count
    and last step, and the count of keys evicted; a negative key in a replayed evicting step
    fails it, naming its member, and changes nothing. crowded: shards of 2048 rows whose steps
    bring more keys than their indexes' empty slots (repeats of fewer new ones): "before"
    (table_group.REBUILD_INSIDE_BYTES 0), ready() rebuilds a short index before the replay and
    runs the step uncaptured where even that falls short, so nothing is said of how many
    replay; "inside" (the default), the recorded work rebuilds an index whose empty slots are
    fewer than its new keys between its erase and its insert, as the uncaptured step rebuilds a
    worn one, so these steps replay too. tower: the backward, a tower's second op, reads the
    forward's checks and the eviction's counts once its own work is queued; a step that fails
    there is undone with its counts handed over first, so that the host's tombstones still
    equal the slots' where its graph rebuilt an index. split: half of each member's rows in
    host memory."""
    from sok1x.engine.lookup import table_group
    monkeypatch.setattr(table_group, "REBUILD_INSIDE_BYTES",
                        (256 << 20) if crowded == "inside" else 0)
    rng = np.random.default_rng(19)
    steps = crowded_keys(rng, 16) if crowded else [
        np.concatenate([rng.permutation(10 ** 6)[:n] for n in HASH_LENGTHS]) for _ in range(16)]
    rows = 2048 if crowded else 8192
    got = hybrid_run(steps, True, bad_step, monkeypatch, full=True, rows=rows, tower=tower,
                     split=split)
    with runtime.entered():
        for t in range(len(HASH_LENGTHS)):
            index = api.shard("hybrid_full_%d" % t).index
            assert index.tombstones == slot_tombstones(index), t
    want = hybrid_run(steps, False, bad_step, monkeypatch, full=True, rows=rows, tower=tower,
                      split=split)
    assert_same_hybrid_runs(got, want)
    assert sum(int(e[0]) for e in got[2]) > 0
    evicting = [ok for ok, _, evicts in got[4] if evicts]
    if crowded != "before":
        assert sum(evicting) >= 6, (got[4], replayed_step.last_refusal())


def shifting_keys(rng, shares, count):
    """Each step's keys, distinct within a member: per member, shares[step] of its length fresh
    values and the rest its last step's keys (held), so that the steps' new keys change share."""
    steps, last = [], [np.zeros(0, np.int64) for _ in HASH_LENGTHS]
    for step in range(count):
        parts = []
        for t, n in enumerate(HASH_LENGTHS):
            new = n if not last[t].size else int(shares[step % len(shares)] * n)
            fresh = rng.permutation(10 ** 6)[:new] + 10 ** 6 * (step + 1)
            parts.append(np.concatenate([fresh, rng.permutation(last[t])[:n - new]]))
            last[t] = parts[-1]
        steps.append(np.concatenate(parts).astype(np.int64))
    return steps


def slot_tombstones(index):
    """The tombstones an index's slots hold (a download)."""
    return int(np.count_nonzero(host(index._slots).reshape(-1, 2)[:, 0] == -2))


@pytest.mark.parametrize("inside", [False, True], ids=["rebuilt_before", "rebuilt_inside"])
def test_tombstones_stay_counted_across_a_rebuild_with_counts_pending(inside, monkeypatch):
    """Full hybrid members of 4096 rows whose steps bring 60%, 60%, 10%, 45% then 70% new keys:
    an uncaptured eviction counts its erased keys by a bound and corrects that when its count
    is read, and a rebuild between (a worn index) must drop the correction too, or the host
    counts fewer tombstones than the slots hold and a replay, trusting the empty slots it
    counts, places keys where none are left (rows -1: zero outputs, a member short of its
    rows for good). The host's tombstones equal the slots' after every run, and the replayed
    steps equal the uncaptured ones key by key."""
    from sok1x.engine.lookup import table_group
    monkeypatch.setattr(table_group, "REBUILD_INSIDE_BYTES", (256 << 20) if inside else 0)
    steps = shifting_keys(np.random.default_rng(23), [0.6, 0.6, 0.1, 0.45, 0.7], 14)
    got = hybrid_run(steps, True, None, monkeypatch, full=True, rows=4096)
    with runtime.entered():
        for t in range(len(HASH_LENGTHS)):
            index = api.shard("hybrid_full_%d" % t).index
            assert index.tombstones == slot_tombstones(index), t
            assert index.size == 4096 or not HASH_LENGTHS[t], (t, index.size)
    want = hybrid_run(steps, False, None, monkeypatch, full=True, rows=4096)
    assert_same_hybrid_runs(got, want)
    assert sum(ok for ok, _, evicts in got[4] if evicts) >= 3, got[4]
