"""The replayed step on several GPUs (engine/lookup/replayed_step.py with replayed_ranks.py,
SOK1X_BOUNDED_STEP=1 and SOK1X_PEER_CAPACITY=1): a keyed lookup of a table group and a dense
lookup of one table, their backward and update, recorded as CUDA graphs around each op header
(NCCL's exchanges inside the graphs) and replayed, equal the same steps run uncaptured on a copy
of the tables, bit for bit, over many steps with changing keys (no key repeats in the job, so
every sum has one addend); a step whose keys overflow a per-peer capacity goes the counted way on
every rank, still equal (a dense lookup's too, handing out what it computed), and the class is
recorded again; a bad key on one rank fails the step
on every rank and changes no table, and the replays go on; a hash group's steps replay their
inserts in the exchange half, agreeing key by key with uncaptured steps, an overflowing step
among them, and so do a hybrid group's, one owner's insert run uncaptured while its peers
replay, and a full hybrid group's evicting steps, the victims picked, erased and replaced in the
exchange half and the counts agreed on in the backward's op header. At one GPU the same steps
replay the one-rank way.

    mpiexec --allow-run-as-root -n 2 python3 -m pytest -q tests/gpu/test_replayed_ranks_cuda.py
"""
import numpy as np
import pytest
from mpi4py import MPI

pytest.importorskip("pycuda")

from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.lookup import (  # noqa: E402
    bounded_step,
    peer_capacity,
    replayed_ranks,
    replayed_step,
    table_group,
)
from sok1x.engine.lookup.keyed import KeyedInput  # noqa: E402
from sok1x.engine.tables.dynamic_table import make_dynamic  # noqa: E402
from sok1x.errors import InvalidInputError  # noqa: E402

pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.usefixtures("engine")]
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=53)
DIM = 64
ROWS = [20000, 5000, 12000, 9000]  # rows of each member's shard
LENGTHS = np.array([3000, 1500, 0, 2500])  # one member without keys


@pytest.fixture(autouse=True)
def sized(monkeypatch):
    monkeypatch.setenv(bounded_step.ENV, "1")
    monkeypatch.setenv(peer_capacity.ENV, "1")
    monkeypatch.delenv(replayed_step.ENV, raising=False)


def host(array):
    return runtime.get().backend.to_host(array)


def hyper(number):
    lr = 0.01 * np.sqrt(1 - 0.999 ** number) / (1 - 0.9 ** number)
    return {"lr_t": lr, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}


def make_pair(tag, rows_list=ROWS):
    """The same tables made twice: (replayed names, uncaptured names)."""
    backend = runtime.get().backend
    pair = [["%s_%s_%d" % (way, tag, t) for t in range(len(rows_list))]
            for way in ("replayed", "uncaptured")]
    for names in pair:
        for name, rows in zip(names, rows_list):
            api.create_table(name, DIM, rows, False, SPEC, replace=True)
            api.shard(name)
    for a, b, rows in zip(pair[0], pair[1], rows_list):
        backend.put_rows(api.shard(b).values, backend.asarray(np.arange(rows, dtype=np.int64)),
                         backend.asarray(host(api.shard(a).values)))
    return pair


def job_distinct_keys(seed, lengths=LENGTHS, even=False):
    """This rank's keys, no key of a member twice in the whole job (every rank draws the same
    permutation and takes its own slice); even: only even keys (one owner gets them all)."""
    rng = np.random.default_rng(seed)
    parts = []
    for rows, n in zip(ROWS, lengths):
        keys = rng.permutation(rows * SIZE)
        if even:
            keys = keys[keys % 2 == 0]
        parts.append(keys[RANK * n:(RANK + 1) * n])
    return np.concatenate(parts).astype(np.int64)


def keyed_step(names, keys, number, replay):
    """A keyed lookup, backward and keyed update of `names`: host (output, values, rows,
    counts)."""
    backend = runtime.get().backend
    with runtime.entered():
        item = KeyedInput(backend.asarray(keys), LENGTHS, None, LENGTHS, None, "sum")
        out, token = api.keyed_lookup(names, names[0] + "_fwd", item, True, checks="backward",
                                      replay=replay)
        copied = host(out)  # a replay rewrites it
        values, rows, counts = api.keyed_lookup_grad(names, names[0] + "_bwd", token, out)
        got = copied, host(values), host(rows), np.array(counts)
        api.apply_keyed_update(names, "lazy_adam", "Adam", {}, hyper(number), values, rows,
                               counts)
    return got


def tables(names):
    return [[host(api.shard(name).values)] + [host(api.shard(name).slots[slot])
                                              for slot in sorted(api.shard(name).slots)]
            for name in names]


def assert_same(got, want, pair):
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(tables(pair[0]), tables(pair[1])):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def cap_here(first_name):
    """This rank's cap in the per-peer capacities of the keyed lookup of `first_name`'s group."""
    with runtime.entered() as rt:
        plan = [p for (name, _, _), p in rt.capacities.items() if name == first_name + "_fwd"][0]
        return int(plan.caps[0, RANK])


def held():
    with runtime.entered() as rt:
        return replayed_step.classes_held(rt), replayed_step.updates_recorded(rt)


def fresh():
    with runtime.entered() as rt:
        replayed_step.free(rt)


def test_replayed_keyed_group_equals_uncaptured_bit_for_bit():
    fresh()
    pair = make_pair("exact")
    for number in range(1, 11):
        keys = job_distinct_keys(number)
        got = keyed_step(pair[0], keys, number, True)
        want = keyed_step(pair[1], keys, number, False)
        assert_same(got, want, pair)
        if SIZE > 1 and number > 1:  # each member's piece: every rank's keys of it, at most
            # its shard's rows and the keys this rank can receive (its cap from every rank)
            bound = np.minimum(np.minimum(LENGTHS * SIZE, ROWS), SIZE * cap_here(pair[0][0]))
            np.testing.assert_array_equal(got[3], -(-bound // 8) * 8)
    assert held() == (1, 1)


def dense_step(names, keys, number, replay):
    """A dense lookup of one table, its backward and update; returns host (output, values,
    rows)."""
    backend = runtime.get().backend
    with runtime.entered():
        name = names[0]
        out, token = api.dense_lookup(name, name + "_fwd", backend.asarray(keys), True,
                                      checks="backward", replay=replay)
        copied = host(out)
        values, rows = api.dense_lookup_grad(name, name + "_bwd", token, out)
        result = (copied, host(values), host(rows))
        api.apply_optimizer_updates([name], "lazy_adam", "Adam", {}, hyper(number), [values],
                                    [rows])
    return result


def dense_keys(number, even=False):
    """This rank's 4,096 keys of a 30,000-row shard, distinct in the job; even: one owner gets
    them all."""
    pool = np.random.default_rng(number).permutation(30000 * SIZE // (2 if even else 1))
    return (pool[RANK * 4096:(RANK + 1) * 4096] * (2 if even else 1)).reshape(64, 64).astype(
        np.int64)


def test_a_replayed_dense_lookup_equals_uncaptured():
    fresh()
    pair = make_pair("dense", [30000])
    for number in range(1, 9):
        keys = dense_keys(number)
        assert_same(dense_step(pair[0], keys, number, True),
                    dense_step(pair[1], keys, number, False), pair)
    assert held() == (1, 1)


def test_an_overflowing_dense_step_hands_out_what_it_computed():
    """A replayed dense class's step whose keys overflow its caps (all even: one owner gets
    them all) goes the counted way into arrays of its own, and hands those out, not the class's
    output of the step before: equal to the uncaptured step; the class is recorded again."""
    fresh()
    pair = make_pair("dense_overflow", [30000])
    for number in range(1, 10):
        keys = dense_keys(200 + number, even=number in (5, 6))
        assert_same(dense_step(pair[0], keys, number, True),
                    dense_step(pair[1], keys, number, False), pair)
    assert held() == (1, 1)


def test_an_overflowing_step_goes_the_counted_way_on_every_rank():
    """All keys of one step even: with keys % ranks placing them, one owner gets every key,
    past its cap; the step goes by its counts everywhere, equal, and its caps grow."""
    fresh()
    pair = make_pair("overflow")
    settled = []
    for number in range(1, 13):
        keys = job_distinct_keys(100 + number, even=number in (5, 6))
        got = keyed_step(pair[0], keys, number, True)
        want = keyed_step(pair[1], keys, number, False)
        assert_same(got, want, pair)
        settled.append(settles(pair[0][0] + "_fwd"))
    assert held() == (1, 1)  # recorded again with the grown caps
    if SIZE > 1:  # set by the first step, grown by the fifth
        assert settled == [1] * 4 + [2] * 8


def settles(op_name):
    """How many times the caps of lookup `op_name` were set (peer_capacity.Plan.settled)."""
    with runtime.entered() as rt:
        plans = [p for (name, _, _), p in rt.capacities.items() if name == op_name and p]
        return plans[0].settled if plans else 0


def test_a_bad_key_on_one_rank_fails_every_rank_and_changes_nothing():
    fresh()
    pair = make_pair("bad")
    for number in range(1, 5):
        keyed_step(pair[0], job_distinct_keys(200 + number), number, True)
    before = tables(pair[0])
    keys = job_distinct_keys(205)
    if RANK == SIZE - 1:
        keys[int(LENGTHS[0]) + 17] = ROWS[1] * SIZE + 3  # member 1's key past its table
    with pytest.raises(InvalidInputError, match=pair[0][1]):
        keyed_step(pair[0], keys, 5, True)
    for a, b in zip(before, tables(pair[0])):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    got = keyed_step(pair[0], job_distinct_keys(206), 5, True)  # replays go on
    assert held() == (1, 1) and got[0].shape == (int(LENGTHS.sum()), DIM)


def pooled_step(names, keys, segment_ids, number, replay):
    """keyed_step with the keys pooled by `segment_ids` (sum; rows of one to three keys)."""
    backend = runtime.get().backend
    segments = np.maximum(1, LENGTHS // 2)  # as many output rows each step: one class
    with runtime.entered():
        item = KeyedInput(backend.asarray(keys), LENGTHS, backend.asarray(segment_ids), segments,
                          None, "sum")
        out, token = api.keyed_lookup(names, names[0] + "_fwd", item, True, replay=replay)
        copied = host(out)
        values, rows, counts = api.keyed_lookup_grad(names, names[0] + "_bwd", token, out,
                                                     rows_per_table=True)
        got = copied, host(values), np.concatenate([host(r) for r in rows]), np.array(counts)
        api.apply_keyed_update(names, "lazy_adam", "Adam", {}, hyper(number), values, rows,
                               counts)
    return got


def test_pooled_keys_replay_on_every_rank():
    """Keys pooled by segment ids replay on several GPUs, the segment ids' checks in the op
    header's flag: outputs to rounding (the pooling's sums), rows and counts equal the
    uncaptured step's; a bad segment id on the last rank fails every rank, nothing changed."""
    fresh()
    pair = make_pair("pooled")
    rng = np.random.default_rng([61, RANK])
    for number in range(1, 9):
        keys = job_distinct_keys(300 + number)
        segment_ids = np.concatenate([np.sort(rng.integers(0, max(1, n // 2), size=n))
                                      for n in LENGTHS]).astype(np.int64)
        if number == 6:
            before = tables(pair[0])
            bad = segment_ids.copy()
            if RANK == SIZE - 1:
                bad[int(LENGTHS[0])] = 10 ** 6  # member 1's first key
            with pytest.raises(InvalidInputError, match="output row"):
                pooled_step(pair[0], keys, bad, number, True)
            for a, b in zip(before, tables(pair[0])):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y)
        got = pooled_step(pair[0], keys, segment_ids, number, True)
        want = pooled_step(pair[1], keys, segment_ids, number, False)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(got[2], want[2])
        np.testing.assert_array_equal(got[3], want[3])
        for a, b in zip(tables(pair[0]), tables(pair[1])):
            for x, y in zip(a, b):
                np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    assert held() == (1, 1)


HASH_ROWS = 40000  # each member's shard: room for every key its steps bring


def hash_job_keys(seed, even=False):
    """This rank's keys of a hash group's step, no key of a member twice in the job (each
    gradient row one key's), drawn from 30000 values a rank: new keys arrive at every step;
    even: only even keys (with keys % ranks placing them, one owner gets them all)."""
    rng = np.random.default_rng(seed)
    parts = []
    for n in LENGTHS:
        keys = rng.permutation(30000 * SIZE)
        if even:
            keys = keys[keys % 2 == 0]
        parts.append(keys[RANK * n:(RANK + 1) * n])
    return np.concatenate(parts).astype(np.int64)


def hash_run(steps, replay, dynamic=None, drop=False):
    """Keyed steps of a hash group (v1 hash tables, or DynamicVariables of `dynamic`'s settings,
    made anew under one set of names: a hash table's first values follow from its name; drop:
    they drop what they evict, no one reads it) on each keys of `steps`, the caps set anew by
    its first step. Returns (each step's host output and counts, the shards' sizes, the trained
    vector of every key this rank looked up, held(), how often the caps were set)."""
    with runtime.entered() as rt:
        replayed_step.free(rt)
        rt.capacities.clear()
    names = ["hash_ranks_%d" % t for t in range(len(LENGTHS))]
    for name in names:
        if drop:
            api.drop_evicted(name)
        api.create_table(name, DIM, HASH_ROWS if dynamic is None else dynamic.max_capacity,
                         True, SPEC, replace=True, dynamic=dynamic)
    results = []
    for number, keys in enumerate(steps, 1):
        got = keyed_step(names, keys, number, replay)
        results.append((got[0], got[3]))
    cuts = np.concatenate([[0], np.cumsum(LENGTHS)])
    seen = [np.unique(np.concatenate([keys[a:b] for keys in steps]))
            for a, b in zip(cuts[:-1], cuts[1:])]
    lengths = np.array([part.shape[0] for part in seen])
    backend = runtime.get().backend
    with runtime.entered():
        item = KeyedInput(backend.asarray(np.concatenate(seen).astype(np.int64)), lengths, None,
                          lengths, None, "sum")
        trained, _ = api.keyed_lookup(names, "hash_ranks_read", item, False)
        trained = host(trained)
    return (results, [api.shard(n).index.size for n in names], trained, held(),
            settles(names[0] + "_fwd"))


def assert_same_hash_runs(got, want):
    """hash_run's results of a replayed run (`got`) and an uncaptured one agree: each step's
    output and counts bit for bit, the sizes, every key's trained vector; only `got` held a
    class and its update."""
    for a, b in zip(got[0], want[0]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert got[1] == want[1]
    np.testing.assert_array_equal(got[2], want[2])
    assert got[3] == (1, 1) and want[3] == (0, 0)


def test_a_hash_group_replays_its_inserts_on_every_rank():
    """A hash group's keyed steps on several GPUs, its insert recorded in the exchange half
    (replayed_ranks.py, table_group.ReplayedInsert asked after the op header), against the same
    steps uncaptured: outputs and counts bit for bit, the shards' sizes, and the trained vector
    of every key (the two ways may hand out other rows: the insert's threads place keys in any
    order); a step whose keys all go to one owner overflows its cap on every rank, goes the
    counted way, equal, and the class is recorded again."""
    steps = [hash_job_keys(400 + number, even=number == 6) for number in range(1, 11)]
    got = hash_run(steps, True)
    want = hash_run(steps, False)
    assert_same_hash_runs(got, want)
    if SIZE > 1:  # set by the first step, grown by the sixth
        assert got[4] == want[4] == 2


def test_a_hybrid_group_replays_its_inserts_on_every_rank(monkeypatch):
    """Hybrid DynamicVariables with room (a hash group that counts its lookups in its rows'
    statistics and may evict) on several GPUs: their steps replay their insert; where rank 0's
    insert is refused by hand at two steps, it places its keys uncaptured inside the same
    exchanges (replayed_ranks.kept_half) while its peers replay. Outputs and counts bit for bit,
    the shards' sizes and every key's trained vector equal the uncaptured steps'."""
    if SIZE == 1:
        pytest.skip("one GPU replays a hybrid group the one-rank way (test_replayed_keyed_cuda)")
    ready, asked, kept = table_group.ReplayedInsert.ready, [], []
    kept_half = replayed_ranks.kept_half

    def refused_twice(insert, keys, *rest):
        asked.append(None)
        if RANK == 0 and len(asked) in (3, 6):
            return False
        return ready(insert, keys, *rest)
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", refused_twice)
    monkeypatch.setattr(replayed_ranks, "kept_half",
                        lambda *args: kept.append(None) or kept_half(*args))
    dynamic = make_dynamic("hybrid", HASH_ROWS, 2 * HASH_ROWS, "lru")
    steps = [hash_job_keys(500 + number) for number in range(1, 11)]
    got = hash_run(steps, True, dynamic)
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", ready)
    want = hash_run(steps, False, dynamic)
    assert_same_hash_runs(got, want)
    assert len(kept) == (2 if RANK == 0 else 0) and len(asked) > 6


def test_a_full_hybrid_group_replays_its_evicting_steps_on_every_rank(monkeypatch):
    """Hybrid DynamicVariables of 7000 rows a shard that never grow, full after a few steps,
    then evicting at every step on every owner: the evicting class records the pick, the erase
    and the insert into the victims' rows and the vectors' way back in one exchange half, its
    counts read and agreed on by every rank at the backward's op header
    (bounded_step.agreed_check); where rank 0's evicting insert is refused by
    hand at two steps, it evicts uncaptured inside the same exchanges (uncaptured_rest) while
    its peers replay. Outputs and counts bit for bit, the shards' sizes and every key's vector
    after (an evicted key's as a lookup finds it) equal the uncaptured steps'."""
    if SIZE == 1:
        pytest.skip("one GPU replays evicting steps the one-rank way (test_replayed_keyed_cuda)")
    ready, answers = table_group.ReplayedInsert.ready, []

    def refused_twice(insert, keys, *rest):
        if not insert.evicting:
            return ready(insert, keys, *rest)
        refused = RANK == 0 and len(answers) in (2, 4)
        answers.append(False if refused else ready(insert, keys, *rest))
        return answers[-1]
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", refused_twice)
    dynamic = make_dynamic("hybrid", 7000, 7000, "lru")
    steps = [hash_job_keys(600 + number) for number in range(1, 15)]
    got = hash_run(steps, True, dynamic, drop=True)
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", ready)
    want = hash_run(steps, False, dynamic, drop=True)
    for a, b in zip(got[0], want[0]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert got[1] == want[1] == [7000, 7000, 0, 7000]
    np.testing.assert_array_equal(got[2], want[2])
    assert sum(answers) >= 4, answers  # replayed evicting steps
