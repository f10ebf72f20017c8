"""Growing, evicting and hybrid tables (tables/dynamic_table.py) on the cuda backend against the
same tables on the cpu backend, the reference, fed the same keys.

    python3 -m pytest -q tests/gpu/test_dynamic_cuda.py                 (one GPU: the shard)
    mpiexec -n 2 python3 -m pytest -q tests/gpu/test_dynamic_cuda.py    (and the exchange)

A shard-level test drives one cuda DynamicTable and one cpu DynamicTable with the same stream of
keys and updates, step by step, and compares per key: vectors, optimizer slots, held keys,
evicted keys (order and vectors), and the state after a rolled-back step. Rows may differ (cuda
hands out rows in arrival order), so nothing compares rows. The job-level test looks keys up
through sok1x.engine.api (placement "hash") and checks each owner's shard against a cpu table
fed that owner's keys.
"""
import types

import numpy as np
import pytest

pytest.importorskip("pycuda")

from mpi4py import MPI  # noqa: E402

from sok1x.backend import cpu, random_init  # noqa: E402
from sok1x.backend.owner_rules import OWNER_HASH  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.tables import hybrid_rows  # noqa: E402
from sok1x.engine.tables.dynamic_table import DynamicTable, make_dynamic  # noqa: E402
from sok1x.engine.lookup.step_journal import StepJournal  # noqa: E402

pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.usefixtures("engine")]
COMM = MPI.COMM_WORLD
SPEC = random_init.make_spec("normal", 0.0, 0.5, seed=9)
DIM = 8
HYPER = {"adagrad": {"lr": 0.3, "epsilon": 1e-7},
         "adam": {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7},
         "lazy_adam": {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7},
         "ftrl": {"lr": 0.1, "lr_power": -0.5, "l1": 0.01, "l2": 0.01, "l2_shrinkage": 0.0},
         "rmsprop": {"lr": 0.01, "rho": 0.9, "momentum": 0.5, "epsilon": 1e-7},
         "keras_rmsprop": {"lr": 0.01, "rho": 0.9, "epsilon": 1e-7},
         "sgd": {"lr": 0.1}}


def lone_table(backend, name, dynamic):
    """A DynamicTable on `backend` as rank 0 of 1, with its own step journal."""
    place = types.SimpleNamespace(backend=backend, rank=0, size=1, journal=StepJournal())
    with backend.device_context():
        return DynamicTable(place, name, DIM, SPEC, "hash", dynamic)


def state(table):
    """{key: (vector, {slot: row})} of a table, on the host."""
    backend = table.backend
    with backend.device_context():
        keys, rows = table.index.export()
        values = backend.to_host(hybrid_rows.gather_rows(backend, table.values, rows))
        slots = {n: backend.to_host(hybrid_rows.gather_rows(backend, s, rows))
                 for n, s in table.slots.items()}
        keys = backend.to_host(keys)
    return {int(k): (values[i], {n: s[i] for n, s in slots.items()}) for i, k in enumerate(keys)}


def assert_states_close(got, want):
    assert sorted(got) == sorted(want)
    for key, (vector, slots) in want.items():
        np.testing.assert_allclose(got[key][0], vector, rtol=1e-5, atol=1e-6)
        for name, row in slots.items():
            np.testing.assert_allclose(got[key][1][name], row, rtol=1e-5, atol=1e-6)


def step(table, keys, rule, grads):
    """One training step on a lone table: lookup with insert, then `rule` on the distinct
    rows' gradients. Returns the host vectors of `keys`."""
    backend = table.backend
    with backend.device_context():
        table.journal.begin_step()
        device_keys = backend.asarray(keys)
        assert table.capacity_error(device_keys) is None
        rows = table.rows_of(device_keys, True)
        vectors = backend.to_host(table.gather(rows))
        from sok1x.engine.tables import optimizer_updates
        optimizer_updates.apply_update(backend, table, rule, "opt", {}, HYPER[rule],
                                       backend.asarray(grads), rows)
    return vectors


SETTINGS = {
    "hbm_grows": make_dynamic("hbm", 64, 4096),
    "hybrid_lru": make_dynamic("hybrid", 64, 512, "lru"),
    "hybrid_lfu": make_dynamic("hybrid", 64, 512, "lfu"),
    "hybrid_host_rows": make_dynamic("hybrid", 64, 512, "lru", 100 * 4 * DIM / 2 ** 30),
    "hybrid_host_rows_lfu": make_dynamic("hybrid", 64, 512, "lfu", 100 * 4 * DIM / 2 ** 30),
}


@pytest.mark.parametrize("rule", ["adagrad", "adam"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_shard_on_cuda_equals_cpu(setting, rule):
    from sok1x.backend import cuda
    dynamic = SETTINGS[setting]
    tables = [lone_table(cuda, "dyn_" + setting, dynamic), lone_table(cpu, "dyn_" + setting,
                                                                        dynamic)]
    rng = np.random.default_rng(5)
    hot = rng.integers(0, 2 ** 40, size=100)
    for _ in range(12):
        keys = np.concatenate([rng.choice(hot, 60), rng.integers(0, 2 ** 40, size=200)])
        keys = np.unique(keys)  # one owner's received keys are distinct per rank
        rng.shuffle(keys)
        grads = rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)
        got, want = (step(t, keys, rule, grads) for t in tables)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        (got_keys, got_values), (want_keys, want_values) = (t.pop_evicted() for t in tables)
        np.testing.assert_array_equal(got_keys, want_keys)
        np.testing.assert_allclose(got_values, want_values, rtol=1e-5, atol=1e-6)
        assert_states_close(state(tables[0]), state(tables[1]))
    assert tables[0].capacity == tables[1].capacity > 64
    # A step rolled back leaves both as they were.
    before = state(tables[0])
    keys = rng.integers(0, 2 ** 40, size=300)
    for table in tables:
        with table.backend.device_context():
            table.journal.begin_step()
            if table.capacity_error(table.backend.asarray(keys)) is None:
                table.rows_of(table.backend.asarray(keys), True)
            table.journal.rollback()
    assert_states_close(state(tables[0]), before)
    assert_states_close(state(tables[1]), before)


def drive(tables, rule, steps, new_keys, seed):
    """Feeds `tables` the same steps (hot keys and `new_keys` fresh ones per step) and checks
    after each that outputs, evictions (order, vectors) and per-key states agree with tables[0]
    exactly; returns the last states."""
    rng = np.random.default_rng(seed)
    hot = rng.integers(0, 2 ** 40, size=100)
    for _ in range(steps):
        keys = np.unique(np.concatenate([rng.choice(hot, 60),
                                         rng.integers(0, 2 ** 40, size=new_keys)]))
        rng.shuffle(keys)
        grads = rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)
        outs = [step(t, keys, rule, grads) for t in tables]
        evicted = [t.pop_evicted() for t in tables]
        states = [state(t) for t in tables]
        for out, (keys_out, values_out), held in zip(outs[1:], evicted[1:], states[1:]):
            np.testing.assert_array_equal(out, outs[0])
            np.testing.assert_array_equal(keys_out, evicted[0][0])
            np.testing.assert_array_equal(values_out, evicted[0][1])
            assert sorted(held) == sorted(states[0])
            for key, (vector, slots) in states[0].items():
                np.testing.assert_array_equal(held[key][0], vector)
                for name, row in slots.items():
                    np.testing.assert_array_equal(held[key][1][name], row)
    return states


@pytest.mark.parametrize("rule", sorted(HYPER))
@pytest.mark.parametrize("strategy", ["lru", "lfu"])
def test_hybrid_host_rows_equal_hbm_rows(rule, strategy):
    """The same kernels on rows in host memory give bit-equal results: a hybrid table with most
    rows in host memory against the same table all in GPU memory (evicting alike), and against
    var_type "hbm" while nothing is evicted; and against the cpu backend."""
    from sok1x.backend import cuda
    host_gib = 50 * 4 * DIM / 2 ** 30
    evicting = [lone_table(cuda, "dyn_eq", make_dynamic("hybrid", 64, 256, strategy)),
                lone_table(cuda, "dyn_eq", make_dynamic("hybrid", 64, 256, strategy, host_gib))]
    states = drive(evicting, rule, 8, 120, seed=11)
    assert isinstance(evicting[1].values, hybrid_rows.SplitRows)
    assert evicting[1].capacity == 256 and len(states[1]) <= 256
    growing = [lone_table(cuda, "dyn_eq", make_dynamic("hbm", 64, 2048)),
               lone_table(cuda, "dyn_eq", make_dynamic("hybrid", 64, 2048, strategy, host_gib))]
    drive(growing, rule, 6, 150, seed=12)
    assert growing[1].capacity > 64
    twin = [lone_table(cuda, "dyn_eq_cpu", make_dynamic("hybrid", 64, 256, strategy, host_gib)),
            lone_table(cpu, "dyn_eq_cpu", make_dynamic("hybrid", 64, 256, strategy, host_gib))]
    rng = np.random.default_rng(13)
    hot = rng.integers(0, 2 ** 40, size=100)
    for _ in range(8):
        keys = np.unique(np.concatenate([rng.choice(hot, 60), rng.integers(0, 2 ** 40, 120)]))
        grads = rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)
        got, want = (step(t, keys, rule, grads) for t in twin)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        (got_keys, got_values), (want_keys, want_values) = (t.pop_evicted() for t in twin)
        np.testing.assert_array_equal(got_keys, want_keys)
        np.testing.assert_allclose(got_values, want_values, rtol=1e-5, atol=1e-6)
        assert_states_close(state(twin[0]), state(twin[1]))


def test_host_rows_are_host_memory():
    from sok1x.backend import cuda
    table = lone_table(cuda, "dyn_host_memory", SETTINGS["hybrid_host_rows"])
    # 64 rows at first, all in GPU memory; growing to 512 puts rows 100.. in host memory.
    step(table, np.arange(300, dtype=np.int64), "adagrad", np.ones((300, DIM), np.float32))
    assert isinstance(table.values, hybrid_rows.SplitRows)
    host_part = table.values.parts[1]
    assert host_part.sok1x_host_memory.shape == host_part.shape  # page-locked NumPy memory
    held = state(table)
    # Rows past the first 100 are read straight from the host buffer, no copy.
    keys, rows = (cuda.to_host(a) for a in table.index.export())
    in_host = rows >= 100
    assert in_host.any()
    for key, row in zip(keys[in_host], rows[in_host]):
        np.testing.assert_array_equal(host_part.sok1x_host_memory[row - 100], held[int(key)][0])


# A table group's flat rows split per member (hybrid_rows.GroupedRows): one member all in device
# memory, split ones, one with a single device row, an empty one.
GROUP_ROWS, GROUP_HBM = [50, 300, 0, 200, 64], [50, 120, 0, 1, 64]


def grouped(backend, data, initial=0.0, split=True, dim=DIM):
    """The flat rows of GROUP_ROWS holding `data` (host [rows, dim]), or `initial` everywhere:
    a GroupedRows, or with split=False one device array."""
    if split:
        array = hybrid_rows.GroupedRows(backend, GROUP_ROWS, GROUP_HBM, (dim,), np.float32,
                                        initial)
    else:
        array = backend.zeros((sum(GROUP_ROWS), dim), np.float32)
        backend.fill_value(array, initial)
    if data is not None:
        every = backend.asarray(np.arange(data.shape[0], dtype=np.int64))
        backend.put_rows(array, every, backend.asarray(data))
    return array


def flat_rows(backend, array):
    """Every flat row of an array (split or not), on the host, read through the row kernels."""
    every = backend.asarray(np.arange(array.shape[0], dtype=np.int64))
    return np.array(backend.to_host(backend.gather_rows(array, every)))


def group_ops(backend, rule, split, seed=31):
    """The row kernels and `rule`'s update on flat rows of GROUP_ROWS (grouped()'s): [a gather
    of random rows and -1, the rows after init_rows and init_rows_tagged, each member's rows
    through its own view], [the rows and every slot after the update], and the values array."""
    from sok1x.engine.tables import optimizer_updates
    total = sum(GROUP_ROWS)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((total, DIM)).astype(np.float32)
    picked = rng.permutation(total)[:300].astype(np.int64)
    keys = rng.integers(0, 2 ** 40, size=picked.shape[0]).astype(np.int64)
    tags = np.searchsorted(np.cumsum(GROUP_ROWS), picked, side="right").astype(np.int64)
    read = np.concatenate([rng.integers(0, total, size=500), [-1, 0, total - 1]]).astype(np.int64)
    grads = rng.standard_normal((120, DIM)).astype(np.float32)
    updated = np.sort(rng.permutation(total)[:120]).astype(np.int64)
    rule_spec = optimizer_updates.RULES[rule]
    var = grouped(backend, data, split=split)
    moved = [np.array(backend.to_host(backend.gather_rows(var, backend.asarray(read))))]
    backend.init_rows(var, backend.asarray(picked[:100]), backend.asarray(keys[:100]), SPEC, 7)
    backend.init_rows_tagged(var, backend.asarray(picked[100:]), backend.asarray(keys[100:]),
                             backend.asarray(tags[100:]), SPEC, np.arange(3, 8, dtype=np.uint64))
    moved.append(flat_rows(backend, var))
    if split:
        moved += [flat_rows(backend, var.member(backend, t)) for t in range(len(GROUP_ROWS))]
    slots = {name: grouped(backend, None, initial, split) for name, initial in
             rule_spec.slots({})}
    rule_spec.update(backend, var, slots, backend.asarray(updated), backend.asarray(grads),
                     HYPER[rule], {})
    updated_rows = [flat_rows(backend, var)] + [flat_rows(backend, s) for _, s in
                                                sorted(slots.items())]
    return moved, updated_rows, var


@pytest.mark.parametrize("rule", ["lazy_adam", "adagrad", "adam", "ftrl"])
def test_grouped_split_rows_equal_cpu_and_unsplit_rows(rule):
    """A table group's rows split per member through the row kernels equal the cpu backend's
    flat rows bit for bit: a gather (rows -1 give zeros), put, init_rows, init_rows_tagged, each
    member's own view. An optimizer update on them (its slots split alike) equals the same
    update on one device array bit for bit, and the cpu's to rounding. The rows lie in the
    device block up to each member's split, then in the host block (page-locked memory), member
    after member; run_all.sh has every split array's batch walked in host_order's order."""
    from sok1x.backend import cuda
    with cuda.device_context():
        moved, updated, var = group_ops(cuda, rule, True)
        _, unsplit, _ = group_ops(cuda, rule, False)
    want_moved, want_updated, _ = group_ops(cpu, rule, True)
    assert len(moved) == len(want_moved) == 2 + len(GROUP_ROWS)
    for got, want in zip(moved, want_moved):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(moved[0][-3], 0.0)  # row -1
    for got, same, close in zip(updated, unsplit, want_updated):
        np.testing.assert_array_equal(got, same)
        np.testing.assert_allclose(got, close, rtol=1e-5, atol=1e-6)
    starts = np.concatenate([[0], np.cumsum(GROUP_ROWS)])
    final = updated[0]
    on_device = np.concatenate([final[s:s + h] for s, h in zip(starts, GROUP_HBM)])
    in_host = np.concatenate([final[s + h:s + n] for s, n, h in
                              zip(starts, GROUP_ROWS, GROUP_HBM)])
    device_block, host_block = var.parts
    np.testing.assert_array_equal(cuda.to_host(device_block), on_device)
    np.testing.assert_array_equal(host_block.sok1x_host_memory, in_host)  # page-locked memory
    for t, rows in enumerate(GROUP_ROWS):
        view = var.member(cuda, t)
        assert view.shape[0] == rows and hybrid_rows.is_split(view) == (GROUP_HBM[t] < rows)


def tagged_inits(backend, slot_count, split, dim=DIM, seed=37):
    """init_rows_tagged over GROUP_ROWS' flat rows of `dim` (random rows, some -1, the first
    `count` of them by a device count) with slot_count slots reset in it (values 0, 0.1, -2.5,
    7): the values and every slot's flat rows after it."""
    rng = np.random.default_rng(seed)
    total = sum(GROUP_ROWS)
    rows = rng.permutation(total)[:260].astype(np.int64)
    rows[::9] = -1
    keys = rng.integers(0, 2 ** 40, size=rows.shape[0]).astype(np.int64)
    tags = np.searchsorted(np.cumsum(GROUP_ROWS), np.maximum(rows, 0), side="right")
    values = grouped(backend, rng.standard_normal((total, dim)).astype(np.float32), split=split,
                     dim=dim)
    slots = [(grouped(backend, rng.standard_normal((total, dim)).astype(np.float32),
                      split=split, dim=dim), value) for value in (0.0, 0.1, -2.5, 7.0)[:slot_count]]
    count = backend.asarray(np.array([230], dtype=np.uint64))
    backend.init_rows_tagged(values, backend.asarray(rows), backend.asarray(keys),
                             backend.asarray(tags.astype(np.int64)), SPEC,
                             np.arange(3, 8, dtype=np.uint64), count, slots)
    return [flat_rows(backend, values)] + [flat_rows(backend, slot) for slot, _ in slots]


@pytest.mark.parametrize("dim", [DIM, 20, 128])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("slot_count", [0, 1, 2, 3])
def test_init_rows_tagged_resets_slots_as_cpu_does(slot_count, split, dim):
    """A group's new rows' vectors and their slots' reset (rows an eviction freed): one launch
    for up to two unsplit slots (random_rows.SLOT_RESETS), the vectors' launch and init_rows'
    own for each otherwise, at dims of one, several and many columns a thread (a row takes at
    most 8 threads); every array equals the cpu backend's bit for bit, the rows past the count
    and the rows -1 left as they were."""
    from sok1x.backend import cuda
    with cuda.device_context():
        got = tagged_inits(cuda, slot_count, split, dim)
    want = tagged_inits(cpu, slot_count, split, dim)
    assert len(got) == len(want) == 1 + slot_count
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    for (g, value) in zip(got[1:], (0.0, 0.1, -2.5, 7.0)):
        assert (g == np.float32(value)).all(axis=1).sum() >= 200  # 230 counted, less the -1


def test_job_lookup_with_hash_owners_equals_cpu_shards():
    rt = runtime.get()
    name = "dyn_job"
    dynamic = make_dynamic("hybrid", 16, 128, "lru", 40 * 4 * DIM / 2 ** 30)
    api.create_table(name, DIM, 128, True, SPEC, replace=True, placement="hash", dynamic=dynamic)
    twin = lone_table(cpu, name, dynamic)
    rng = np.random.default_rng(77)  # the same keys on every rank: each owner gets each once
    for s in range(10):
        keys = rng.integers(0, 2 ** 40, size=int(60 * rt.size))
        keys = np.unique(keys)
        vectors, _ = api.dense_lookup(name, "job_%d" % s, keys, True)
        mine = keys[cpu.owners_of(keys, rt.size, OWNER_HASH) == rt.rank]
        twin.journal.begin_step()
        twin.rows_of(np.tile(mine, rt.size), True)
        evicted = api.pop_evicted(name)
        want = twin.pop_evicted()
        np.testing.assert_array_equal(evicted[0], want[0])
        np.testing.assert_allclose(evicted[1], want[1], rtol=1e-6)
        assert_states_close(state(api.shard(name)), state(twin))
        got = COMM.allgather(rt.backend.to_host(vectors))
        for other in got:
            np.testing.assert_array_equal(other, got[0])


def test_hash_erase_and_row_pool_equal_cpu():
    from sok1x.backend import cuda
    rng = np.random.default_rng(4)
    keys = rng.choice(2 ** 50, size=40000, replace=False).astype(np.int64)
    gone = keys[rng.random(keys.shape[0]) < 0.4]
    pool = rng.permutation(40000)[:gone.shape[0]].astype(np.int64) + 40000
    found = []
    for backend in (cuda, cpu):
        with backend.device_context():
            index = backend.HashIndex(80000)
            index.assign(backend.asarray(keys), backend.asarray(np.arange(40000)))
            erased = backend.to_host(index.erase(backend.asarray(gone)))
            np.testing.assert_array_equal(np.sort(erased), np.sort(
                np.flatnonzero(np.isin(keys, gone))))
            assert index.size == 40000 - gone.shape[0] and index.tombstones == gone.shape[0]
            after = backend.to_host(index.find(backend.asarray(keys)))
            _, new_keys, new_rows = index.find_or_insert(backend.asarray(gone),
                                                         backend.asarray(pool))
            placed = dict(zip(backend.to_host(new_keys).tolist(),
                              backend.to_host(new_rows).tolist()))
            found.append((after, sorted(placed), sorted(placed.values()), index.size))
    np.testing.assert_array_equal(found[0][0], found[1][0])
    assert found[0][1:] == found[1][1:]


def distinct_shards(rng, capacities):
    """Per capacity a host int64 array of that many distinct random keys."""
    return [np.unique(rng.integers(0, 2 ** 40, capacity + 64))[:capacity]
            for capacity in capacities]


def shard_indexes(backend, shards):
    """A full HashIndex on `backend` per host int64 array of keys in `shards`, key i at row i."""
    indexes = []
    for held in shards:
        index = backend.HashIndex(held.shape[0])
        index.assign(backend.asarray(held), backend.asarray(np.arange(held.shape[0])))
        indexes.append(index)
    return indexes


@pytest.mark.parametrize("lfu", [False, True])
@pytest.mark.parametrize("touched", [0.0, 0.9])
@pytest.mark.parametrize("per_block", [None, 1, 3, 32])
def test_device_victims_equal_cpu(lfu, touched, per_block, monkeypatch):
    """pick_victims (cuda_kernels/eviction.cu) against the cpu twin on a group of eleven shards
    at once: 2^16 keys (1024 buckets), 2^12 keys (64 buckets), 100 keys (one bucket) and 2^10
    keys all held in one of its 16 buckets (more evictable keys than the 256 a block ranks in
    shared memory: that bucket is picked key by key), with many tied records,
    their new keys interleaved, repeated and mixed with held ones, one member (2^10 keys)
    evicting nothing, 2^14 keys whose 300 new keys all fall in one bucket (the rest, ranked
    by a block where the member has few evictable keys left, else key by key), and two shards
    of 200 keys all in one bucket, so that a block's threads rank or select among more keys
    than it has threads (100 and 60 new keys in that bucket, of which 70 and 25 evict), and
    2^15 keys (512 buckets) with 600 new ones, a key or two in most buckets, and two shards of
    200 and 400 keys all in one bucket that 10 new keys meet (none of their rows touched: more
    evictable keys than a warp's pool holds, so the block picks the first, and the second, past
    the block's pool too, goes key by key). The same victims, records and statistics after,
    also where the pick takes the segments count_new_keys_segmented counted the new keys in.
    touched: the share of keys the step already looked up, so buckets run out and the
    member-wide second pass serves the rest.
    per_block: the buckets each block of the first pass takes (None: as pick_victims decides,
    four at these sizes; 1: a block a bucket, a full group's way where its buckets meet many
    keys; 3: a block's buckets cross from member to member; 32: a block passes over the
    buckets no new key meets); where it takes several, a bucket of at most 32 new keys and 128
    evictable ones is a warp's, picked in the warp's pool, and the others the block's."""
    from sok1x.backend import cuda
    from sok1x.backend.cuda import eviction as cuda_eviction
    if per_block is not None:
        monkeypatch.setattr(cuda_eviction, "_buckets_a_block", lambda buckets, keys: per_block)
    from sok1x.backend.cpu.eviction import bucket_of
    from sok1x.engine.tables.eviction import bucket_bits
    rng = np.random.default_rng(38)
    capacities, step_now = [1 << 16, 1 << 12, 100, 1 << 10, 1 << 10, 1 << 14, 200, 200,
                            1 << 15, 200, 400], 9
    row_starts = np.concatenate([[0], np.cumsum(capacities)]).astype(np.int64)
    shards, keys, tags, found, counts = [], [], [], [], []
    for t, capacity in enumerate(capacities):
        held = np.unique(rng.integers(0, 2 ** 40, size=capacity + 64))[:capacity]
        if t in (4, 6, 7, 9, 10):  # every held key in bucket 0
            held = np.unique(rng.integers(0, 2 ** 40, size=1 << 16))
            held = held[bucket_of(held, bucket_bits(capacity)) == 0][:capacity]
        rng.shuffle(held)
        shards.append(held)
        new = np.unique(rng.integers(2 ** 40, 2 ** 41, size=min(6000, capacity)))
        if t == 5:  # one crowded bucket
            new = np.unique(rng.integers(2 ** 40, 2 ** 41, size=1 << 20))
            new = new[bucket_of(new, bucket_bits(capacity)) == 0][:300]
        if t in (6, 7, 9, 10):  # a bucket's many keys ranked (6) or a few selected (7), or
            # a few new keys meeting more evictable keys than a warp ranks (9), or a block (10)
            new = np.unique(rng.integers(2 ** 40, 2 ** 41, size=1 << 12))
            new = new[bucket_of(new, bucket_bits(capacity)) == 0][:{6: 100, 7: 60}.get(t, 10)]
        if t == 8:  # a key or two in most of its 512 buckets (a warp's, where a block
            new = new[:600]  # takes several)
        looked = held[:50]
        keys += [new, new[:200], looked]
        tags.append(np.full(new.shape[0] + min(200, new.shape[0]) + looked.shape[0], t))
        found += [np.full(new.shape[0] + min(200, new.shape[0]), -1),
                  row_starts[t] + np.arange(looked.shape[0])]
        counts.append(0 if t == 3 else new.shape[0] - (2 if t >= 9 else 5 * t))
    keys, tags, found = (np.concatenate(a).astype(np.int64) for a in (keys, tags, found))
    order = rng.permutation(keys.shape[0])
    keys, tags, found = keys[order], tags[order], found[order]
    statistics = np.stack([rng.integers(0, step_now, row_starts[-1]),
                           rng.integers(0, 4, row_starts[-1])], axis=1).astype(np.int64)
    touch = rng.random(row_starts[-1]) < touched
    touch[row_starts[9]:] = False  # the crowded buckets of members 9 and 10 stay crowded
    statistics[touch, 0] = step_now
    bits = [bucket_bits(c) for c in capacities]
    results = []
    for backend, segmented in ((cuda, False), (cuda, True), (cpu, False)):
        with backend.device_context():
            indexes = shard_indexes(backend, shards)
            stats = backend.asarray(statistics.copy())
            arrays = [backend.asarray(a) for a in (keys, tags, found)]
            backend.stamp_last_step(stats, arrays[2], step_now)
            segments = None
            if segmented:  # the pick takes count_new_keys_segmented's segments
                counted, segments = backend.count_new_keys_segmented(len(capacities), *arrays,
                                                                     bits)
                assert segments.serve(*arrays, counts, bits)
                np.testing.assert_array_equal(backend.to_host(counted),
                                              cpu.count_new_keys(len(capacities), keys, tags,
                                                                 found))
            picked = backend.pick_victims(indexes, stats, row_starts, *arrays, counts, bits,
                                          step_now,
                                          [lfu, not lfu, lfu, lfu, lfu, lfu, lfu, not lfu,
                                           lfu, lfu, not lfu],
                                          segments)
            results.append([backend.to_host(a) for a in picked] + [backend.to_host(stats)])
    for got, segmented, want in zip(*results):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(segmented, want)
    results = [results[0], results[2]]
    victims, rows = results[1][0], results[1][1]
    assert victims.shape[0] == sum(counts)
    assert len(set(victims[victims >= 0].tolist())) == int((victims >= 0).sum())
    stamped = statistics.copy()
    cpu.stamp_last_step(stamped, found, step_now)
    for t in range(len(capacities)):  # as many as it may evict, each in its own rows
        mine = rows[sum(counts[:t]):sum(counts[:t + 1])]
        evictable = int((stamped[row_starts[t]:row_starts[t + 1], 0] < step_now).sum())
        assert (mine >= 0).sum() == min(counts[t], evictable)
        mine = mine[mine >= 0]
        assert ((mine >= row_starts[t]) & (mine < row_starts[t + 1])).all()
    stamped[rows[rows >= 0]] = (step_now, 0)  # a victim's record: chosen, its count gone
    np.testing.assert_array_equal(results[1][-1], stamped)


def test_first_pass_takes_a_bucket_a_block_where_buckets_meet_many_keys():
    """evict_pick's first pass: a block a bucket where the keys are 16 times the buckets or
    more (a full group's, dlrm26_full's 1,664 buckets of about 84 new keys); else a multiple of
    the block's four warps, a warp a bucket: 32 a block for a full table alone's 2^20 in a call
    of 2^20 or 2^21 keys, four for few buckets, and between them as many as leave 16 blocks for
    each the GPU holds at once, rounded up to four."""
    from sok1x.backend import cuda
    from sok1x.backend.cuda import eviction as cuda_eviction
    with cuda.device_context():
        slots = cuda_eviction._pick_slots()
        assert slots >= cuda.context.multiprocessor_count()
        assert cuda_eviction._buckets_a_block(1664, 1664 * 84) == 1
        assert cuda_eviction._buckets_a_block(1664, 1000) == 4
        assert cuda_eviction._buckets_a_block(1 << 20, 1 << 20) == 32
        assert cuda_eviction._buckets_a_block(1 << 20, 1 << 21) == 32
        assert cuda_eviction._buckets_a_block(1 << 20, 1 << 24) == 1
        assert cuda_eviction._buckets_a_block(16 * slots * 5 + 7, 1000) == 8


@pytest.mark.parametrize("lfu", [False, True])
def test_device_victims_left_over_by_buckets_equal_cpu(lfu):
    """pick_victims' second pass (eviction.cu's evict_pick_rest) against the cpu twin where
    many new keys fall in one bucket of a shard, so that thousands wait for the member's
    lowest keys left over: 3,000 in a shard of 2^14 (three lots of RANK_CAP places, each lot's
    last victim found by select_rank among some 13,000 keys left), 1,500 in a shard of 2,000
    (a lot by selection, then the last one ranked whole) and 300 in a shard of 2^16 (more keys
    left than REST_CAP: key by key), with records of few distinct values (ties broken by the
    key) and a tenth of the keys looked up this step. The same victims, records and statistics
    after, bit for bit."""
    from sok1x.backend import cuda
    from sok1x.backend.cpu.eviction import bucket_of
    from sok1x.engine.tables.eviction import bucket_bits
    rng = np.random.default_rng(47)
    capacities, crowded, step_now = [1 << 14, 2000, 1 << 16], [3000, 1500, 300], 9
    row_starts = np.concatenate([[0], np.cumsum(capacities)]).astype(np.int64)
    shards, keys, tags, counts = [], [], [], []
    for t, (capacity, many) in enumerate(zip(capacities, crowded)):
        shards.append(np.unique(rng.integers(0, 2 ** 40, size=capacity + 64))[:capacity])
        rng.shuffle(shards[-1])
        new = np.unique(rng.integers(2 ** 40, 2 ** 41, size=1 << 22))
        new = new[bucket_of(new, bucket_bits(capacity)) == 0][:many]
        assert new.shape[0] == many
        keys.append(new)
        tags.append(np.full(many, t))
        counts.append(many)
    keys, tags = (np.concatenate(a).astype(np.int64) for a in (keys, tags))
    found = np.full(keys.shape[0], -1, dtype=np.int64)
    statistics = np.stack([rng.integers(0, 3, row_starts[-1]),
                           rng.integers(0, 3, row_starts[-1])], axis=1).astype(np.int64)
    statistics[rng.random(row_starts[-1]) < 0.1, 0] = step_now
    bits = [bucket_bits(c) for c in capacities]
    results = []
    for backend in (cuda, cpu):
        with backend.device_context():
            indexes = shard_indexes(backend, shards)
            stats = backend.asarray(statistics.copy())
            arrays = [backend.asarray(a) for a in (keys, tags, found)]
            picked = backend.pick_victims(indexes, stats, row_starts, *arrays, counts, bits,
                                          step_now, [lfu] * len(capacities))
            results.append([backend.to_host(a) for a in picked] + [backend.to_host(stats)])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)
    rows = results[1][1]
    assert (rows >= 0).all()  # every shard had keys enough
    for t in range(len(capacities)):
        mine = rows[sum(counts[:t]):sum(counts[:t + 1])]
        assert ((mine >= row_starts[t]) & (mine < row_starts[t + 1])).all()


def test_device_count_of_new_keys_equals_cpu():
    """count_new_keys (cuda_kernels/eviction.cu's segments of about 32 keys) against the cpu
    twin: a hash group's 300,000 keys over 26 members, most repeated, some held, one member
    with no key, one with every key."""
    from sok1x.backend import cuda
    rng = np.random.default_rng(46)
    for members, n in ((26, 300000), (3, 1000), (1, 5)):
        keys = rng.integers(0, n // 3 + 1, n).astype(np.int64)
        tags = rng.integers(0, max(1, members - 1), n).astype(np.int64)  # the last: no key
        found = np.where(rng.random(n) < 0.3, 5, -1).astype(np.int64)
        got = []
        for backend in (cuda, cpu):
            with backend.device_context():
                counted = backend.count_new_keys(members, backend.asarray(keys),
                                                 backend.asarray(tags), backend.asarray(found))
                got.append(backend.to_host(counted))
        np.testing.assert_array_equal(got[0], got[1])
        assert got[1][1].sum() == n


def test_device_count_of_evictable_keys_and_rehash_equal_cpu():
    """hash_erase_many (hash_erase_tagged) takes a third of a group of three shards' keys out in
    one launch; count_evictable (eviction.cu) against the cpu twin with those tombstones and
    looked-up rows; then hash_rehash_many (two shards at once) and HashIndex.rehashed (the
    third; both in place on cuda: hash_take_slots_many, hash_reinsert_many) hold the same keys at
    the same rows with no tombstone, on both backends."""
    from sok1x.backend import cuda
    rng = np.random.default_rng(47)
    capacities, step_now = [1 << 15, 3000, 64], 7
    row_starts = np.concatenate([[0], np.cumsum(capacities)]).astype(np.int64)
    statistics = np.stack([rng.integers(0, step_now + 1, row_starts[-1]),
                           rng.integers(0, 4, row_starts[-1])], axis=1).astype(np.int64)
    found = rng.integers(-1, row_starts[-1], 5000).astype(np.int64)
    shards = distinct_shards(rng, capacities)
    got = []
    for backend in (cuda, cpu):
        with backend.device_context():
            indexes = shard_indexes(backend, shards)
            erased = [held[::3] for held in shards]
            tags = np.repeat(np.arange(len(shards)), [e.shape[0] for e in erased])
            backend.hash_erase_many(indexes, backend.asarray(np.concatenate(erased)),
                                    backend.asarray(tags), [e.shape[0] for e in erased])
            assert [index.tombstones for index in indexes] == [e.shape[0] for e in erased]
            counted = backend.count_evictable(indexes, backend.asarray(statistics), row_starts,
                                              backend.asarray(found), step_now)
            fresh = (backend.hash_rehash_many(indexes[:2])
                     + [indexes[2].rehashed(indexes[2].capacity)])
            rows = [backend.to_host(index.find(backend.asarray(held)))
                    for index, held in zip(fresh, shards)]
            got.append((backend.to_host(counted), rows,
                        [(index.size, index.tombstones) for index in fresh]))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    for mine, theirs, held in zip(got[0][1], got[1][1], shards):
        np.testing.assert_array_equal(mine, theirs)
        want = np.arange(held.shape[0])
        want[::3] = -1
        np.testing.assert_array_equal(mine, want)
    assert got[0][2] == got[1][2] == [(c - len(range(0, c, 3)), 0) for c in capacities]


def test_indexes_grown_at_once_hold_every_key_at_its_row_as_on_cpu():
    """hash_rehash_many with capacities (a group's growth: hash_reinsert_into_many, one launch
    for all) makes new indexes of those capacities holding each old index's keys at their rows,
    tombstones dropped, the old ones left as they were; as the cpu twin. Three shards, one with
    a third of its keys erased, grown 2x, 4x and 1x (same capacity, a new index too); a size
    past a capacity raises OverflowError on both. On cuda the new indexes' slots lie back to
    back in one allocation, and each new index filled to its capacity leaves the others' keys
    where they were."""
    from sok1x.backend import cuda
    rng = np.random.default_rng(59)
    capacities, grown = [3000, 1 << 12, 64], [6000, 1 << 14, 64]
    shards = distinct_shards(rng, capacities)
    got, filled = [], []
    for backend in (cuda, cpu):
        with backend.device_context():
            indexes = shard_indexes(backend, shards)
            erased = shards[0][::3]
            backend.hash_erase_many(indexes, backend.asarray(erased),
                                    backend.asarray(np.zeros(erased.shape[0], np.int64)),
                                    [erased.shape[0], 0, 0])
            fresh = backend.hash_rehash_many(indexes, grown)
            assert all(new is not old for new, old in zip(fresh, indexes))
            found = [backend.to_host(index.find(backend.asarray(held)))
                     for index in (fresh, indexes) for index, held in zip(index, shards)]
            got.append((found, [(index.capacity, index.size, index.tombstones)
                                for index in fresh]))
            with pytest.raises(OverflowError):
                backend.hash_rehash_many(indexes[1:], [100, 64])
            if backend is cuda:
                ends = [index.slots_address + 16 * index.slot_count for index in fresh]
                assert [index.slots_address for index in fresh[1:]] == ends[:-1]
            for t, index in enumerate(fresh):  # each filled up: new keys past its last row
                more = np.unique(rng.integers(2 ** 41, 2 ** 42, 2 * grown[t]))
                more = more[:grown[t] - index.size]
                index.find_or_insert(backend.asarray(more))
            assert [index.size for index in fresh] == grown
            filled.append([backend.to_host(index.find(backend.asarray(held)))
                           for index, held in zip(fresh, shards)])
    for mine, theirs in zip(got[0][0], got[1][0]):
        np.testing.assert_array_equal(mine, theirs)
    want = [np.arange(capacity) for capacity in capacities]
    want[0][::3] = -1
    for mine, expected in zip(got[0][0][:3] + got[0][0][3:], want + want):  # new, then old
        np.testing.assert_array_equal(mine, expected)
    assert got[0][1] == got[1][1] == [(6000, 2000, 0), (1 << 14, 1 << 12, 0), (64, 64, 0)]
    for mine, expected in zip(filled[0] + filled[1], want + want):  # filled up, each backend
        np.testing.assert_array_equal(mine, expected)


@pytest.mark.parametrize("lfu", [False, True])
def test_padded_victims_equal_cpu_and_the_counted_pick(lfu):
    """pick_victims with padded=True (each member's count a bound on its new keys, none read
    first) against the cpu twin, bit for bit: victims, records, statistics after, each member's
    places (totals: one per distinct new key), those left without a victim (unserved) and its
    victims (served). Four shards: 2^14 keys with
    3000 new ones in a bound of 9000, 2^10 keys evicting nothing (bound 0), 600 keys whose 700
    new keys outnumber what it may evict (unserved 100 and more), and 2^12 keys with no new key
    (bound 50). Each member's places are the front of its part, the rest -1, and they hold the
    counted pick's victims (counts: the distinct new keys), in the same order."""
    from sok1x.backend import cuda
    from sok1x.engine.tables.eviction import bucket_bits
    rng = np.random.default_rng(53)
    capacities, step_now = [1 << 14, 1 << 10, 600, 1 << 12], 11
    row_starts = np.concatenate([[0], np.cumsum(capacities)]).astype(np.int64)
    new_counts, bounds = [3000, 40, 700, 0], [9000, 0, 800, 50]
    shards, keys, tags, found = [], [], [], []
    for t, (capacity, new_count) in enumerate(zip(capacities, new_counts)):
        held = np.unique(rng.integers(0, 2 ** 40, size=capacity + 64))[:capacity]
        rng.shuffle(held)
        shards.append(held)
        new = np.unique(rng.integers(2 ** 40, 2 ** 41, size=new_count))
        looked = held[:30]
        keys += [new, new[:100], looked]
        tags.append(np.full(new.shape[0] + min(100, new.shape[0]) + looked.shape[0], t))
        found += [np.full(new.shape[0] + min(100, new.shape[0]), -1),
                  row_starts[t] + np.arange(looked.shape[0])]
    keys, tags, found = (np.concatenate(a).astype(np.int64) for a in (keys, tags, found))
    order = rng.permutation(keys.shape[0])
    keys, tags, found = keys[order], tags[order], found[order]
    statistics = np.stack([rng.integers(0, step_now, row_starts[-1]),
                           rng.integers(0, 4, row_starts[-1])], axis=1).astype(np.int64)
    statistics[row_starts[2]:row_starts[3], 0] = step_now  # shard 2: most keys looked up now
    statistics[row_starts[2]:row_starts[2] + 600:2, 0] = 0
    bits = [bucket_bits(c) for c in capacities]
    distinct = [np.unique(keys[(tags == t) & (found < 0)]).shape[0]
                for t in range(len(capacities))]
    results = []
    for backend, padded in ((cuda, True), (cpu, True), (cpu, False)):
        with backend.device_context():
            indexes = shard_indexes(backend, shards)
            stats = backend.asarray(statistics.copy())
            arrays = [backend.asarray(a) for a in (keys, tags, found)]
            backend.stamp_last_step(stats, arrays[2], step_now)
            counts = bounds if padded else [d if b else 0 for d, b in zip(distinct, bounds)]
            picked = backend.pick_victims(indexes, stats, row_starts, *arrays, counts, bits,
                                          step_now, [lfu, not lfu, lfu, lfu], None, padded)
            results.append([backend.to_host(a) for a in picked] + [backend.to_host(stats)])
    for got, want in zip(results[0], results[1]):
        np.testing.assert_array_equal(got, want)
    victim_keys, victim_rows, _, totals, unserved, served, stats = results[1]
    np.testing.assert_array_equal(totals, [d if b else 0 for d, b in zip(distinct, bounds)])
    np.testing.assert_array_equal(served, totals - unserved)
    assert unserved[2] >= 100 and unserved[[0, 1, 3]].tolist() == [0, 0, 0]
    counted_keys, counted_rows = results[2][0], results[2][1]
    starts, counted_starts = np.cumsum([0] + bounds), np.cumsum([0] + list(totals))
    for t in range(len(capacities)):
        front = slice(starts[t], starts[t] + totals[t])
        np.testing.assert_array_equal(victim_keys[front],
                                      counted_keys[counted_starts[t]:counted_starts[t + 1]])
        np.testing.assert_array_equal(victim_rows[front],
                                      counted_rows[counted_starts[t]:counted_starts[t + 1]])
        assert (victim_rows[starts[t] + totals[t]:starts[t + 1]] == -1).all()
        assert int((victim_rows[front] < 0).sum()) == unserved[t]
    np.testing.assert_array_equal(stats, results[2][-1])


def test_padded_erase_and_victims_pool_equal_cpu():
    """A padded eviction's erase and insert on both backends: hash_erase_many of two members'
    victims padded with -1 (bounds above the victims; erased: the victims per member, served)
    takes only the victims out, and each index's size counts them once read; hash_insert_many
    with each member's victims' rows as its pool (row_pool, next_row, limit) places every new
    key, in its victim's row or, where the pool entry is -1 (no victim), with no row (-3: the
    step then fails and erases them), with repeats of those keys in the same launch (no thread
    waits on a row never written)."""
    from sok1x.backend import cuda
    rng = np.random.default_rng(54)
    capacity = 4096
    held = [np.unique(rng.integers(0, 2 ** 40, capacity + 64))[:capacity] for _ in range(2)]
    victims = [held[0][:300], held[1][:90]]  # member 1: 90 victims for 100 new keys
    bounds = [500, 200]
    padded_keys = np.concatenate([np.concatenate([v, np.full(b - v.shape[0], -1)])
                                  for v, b in zip(victims, bounds)]).astype(np.int64)
    pools = [np.concatenate([np.arange(300), np.full(200, -1)]),  # every new key served
             np.concatenate([np.arange(90), np.full(110, -1)])]  # 10 new keys are not
    new = [np.unique(rng.integers(2 ** 40, 2 ** 41, 300)), np.unique(rng.integers(2 ** 40,
                                                                                  2 ** 41, 100))]
    keys = np.concatenate([new[0], new[0][:50], held[0][300:400], new[1], new[1][:50]])
    tags = np.concatenate([np.zeros(new[0].shape[0] + 150), np.ones(new[1].shape[0] + 50)])
    tags = tags.astype(np.int64)
    got = []
    for backend in (cuda, cpu):
        with backend.device_context():
            indexes = shard_indexes(backend, held)
            erased = backend.asarray(np.array([300, 90], dtype=np.int64))
            backend.hash_erase_many(indexes, backend.asarray(padded_keys), backend.part_tags(
                np.array([0, 500, 700])), bounds, erased)
            sizes = [index.size for index in indexes]
            rows = [backend.to_host(index.find(backend.asarray(h))) for index, h in
                    zip(indexes, held)]
            found = backend.hash_insert_many(
                indexes, backend.asarray(keys), backend.asarray(tags), [0, capacity],
                [(backend.asarray(pools[0]), None, 500), (backend.asarray(pools[1]), None, 200)])
            flat = backend.to_host(found[0])
            got.append((sizes, rows, flat, backend.to_host(found[5])))
    for sizes, rows, _, _ in got:
        assert sizes == [capacity - 300, capacity - 90]
        for r, v in zip(rows, victims):
            assert (r[:v.shape[0]] == -1).all() and (r[v.shape[0]:] >= 0).all()
    for flat in (got[0][2], got[1][2]):  # member 0's new keys take its victims' rows
        first = flat[:new[0].shape[0]]
        assert sorted(first.tolist()) == list(range(300))
        np.testing.assert_array_equal(flat[300:350], first[:50])
    for flat in (got[0][2], got[1][2]):  # member 1: 90 keys take its victims' rows, 10 none
        placed = flat[450:]
        served = placed[:100]
        assert (served == -3).sum() == 10 and sorted(served[served >= 0] - capacity) == \
            list(range(90))
        np.testing.assert_array_equal(placed[100:], served[:50])
    assert got[0][3].tolist() == got[1][3].tolist() == [300, 100]
