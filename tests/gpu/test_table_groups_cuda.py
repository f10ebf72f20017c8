"""Table groups (DESIGN D13) on the cuda engine, at any number of GPUs: a lookup of several
tables of one dim in one pass equals the same tables looked up one by one (forward, gradients,
updated rows and optimizer slots), and costs the kernel launches and host waits of one table,
v1 hash tables (a HashGroup) as dense ones, hbm DynamicVariables, whose group grows its
members in place, as v1 hash tables, and hybrid ones, whose group also evicts, as each alone;
bad input in one member fails the step on every rank and changes no table. The keyed lookup
(all tables' keys in one array, engine/lookup/keyed.py) gives the same, and its backend ops the
cpu backend's.

    mpiexec --allow-run-as-root -n 2 python3 -m pytest -q tests/gpu/test_table_groups_cuda.py
"""
import numpy as np
import pytest

pytest.importorskip("pycuda")

from mpi4py import MPI  # noqa: E402

from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.lookup import group_gradients, table_group  # noqa: E402
from sok1x.engine.lookup.keyed import KeyedInput  # noqa: E402
from sok1x.engine.lookup.pooled import PooledInput  # noqa: E402
from sok1x.errors import InvalidInputError  # noqa: E402

pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.usefixtures("engine")]
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=17)
DIM, CAPACITY = 16, 3000


def host(array):
    return runtime.get().backend.to_host(array)


def make_tables(prefix, count, capacity=CAPACITY):
    names = ["%s_%d" % (prefix, t) for t in range(count)]
    for name in names:
        api.create_table(name, DIM, capacity, False, SPEC, replace=True)
        api.shard(name)
    return names


def copy_rows(source, target):
    backend = runtime.get().backend
    shard = api.shard(target)
    rows = backend.asarray(np.arange(shard.values.shape[0], dtype=np.int64))
    backend.put_rows(shard.values, rows, backend.asarray(host(api.shard(source).values)))


HYPER = {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}  # LazyAdam's


def paired_tables(prefix, copy_prefix, count=6):
    """Tables looked up together and copies looked up one by one, with the same rows."""
    together, alone = make_tables(prefix, count), make_tables(copy_prefix, count)
    for a, b in zip(together, alone):
        copy_rows(a, b)
    return together, alone


def step_alone_and_compare(name, tag, item, top, out, values, rows):
    """Looks table `name` up alone (item, top gradient), checks the grouped lookup's output and
    gradient (values, rows) against it, and applies its own LazyAdam update."""
    (want,), one = api.pooled_lookup([name], tag + "_fwd", [item], True)
    (want_values, want_rows), = api.pooled_lookup_grad([name], tag + "_bwd", one, [top])
    np.testing.assert_allclose(host(out), host(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dense(values, rows), dense(want_values, want_rows), rtol=1e-5,
                               atol=1e-5)
    api.apply_optimizer_update(name, "lazy_adam", "Adam", {}, HYPER, want_values, want_rows)


def assert_same_tables(together, alone):
    """The grouped tables' rows and LazyAdam slots equal their copies'."""
    for a, b in zip(together, alone):
        np.testing.assert_allclose(host(api.shard(a).values), host(api.shard(b).values),
                                   rtol=1e-5, atol=1e-6)
        for slot in ("Adam/m", "Adam/v"):
            np.testing.assert_allclose(host(api.shard(a).slots[slot]),
                                       host(api.shard(b).slots[slot]), rtol=1e-5, atol=1e-7)


def batch(rng, count, mixed):
    inputs, tops = [], []
    for t in range(count):
        rows = 64 + t
        nnz = 500 + 37 * t
        keys = rng.integers(0, CAPACITY * SIZE, size=nnz)
        segments = np.sort(rng.integers(0, rows, size=nnz))
        weights, combiner = None, "sum"
        if mixed and t % 2:
            weights, combiner = rng.random(nnz).astype(np.float32), "mean"
        inputs.append(PooledInput(keys, segments, rows, weights, combiner))
        tops.append(rng.standard_normal((rows, DIM)).astype(np.float32))
    return inputs, tops


def dense(values, rows):
    out = np.zeros((CAPACITY, DIM))
    np.add.at(out, host(rows), host(values).astype(np.float64))
    return out


@pytest.mark.parametrize("mixed", [False, True])
def test_a_group_equals_its_tables_one_by_one(mixed):
    together, alone = paired_tables("cuda_group_%s" % mixed, "cuda_alone_%s" % mixed)
    rng = np.random.default_rng([11, RANK])
    for _ in range(2):
        inputs, tops = batch(rng, len(together), mixed)
        outs, token = api.pooled_lookup(together, "cg_fwd", inputs, True)
        grads = api.pooled_lookup_grad(together, "cg_bwd", token, tops)
        values, rows = [g[0] for g in grads], [g[1] for g in grads]
        tables = [api.shard(name) for name in together]
        (found,) = group_gradients.group_gradients(runtime.get().backend, tables, values, rows)
        assert found[1] is tables[0].group.last_gradient[0]  # the backward's own rows
        api.apply_optimizer_updates(together, "lazy_adam", "Adam", {}, HYPER, values, rows)
        for t, name in enumerate(alone):
            step_alone_and_compare(name, "ca_%d" % t, inputs[t], tops[t], outs[t], values[t],
                                   rows[t])
    assert_same_tables(together, alone)


def test_launches_and_waits_do_not_grow_with_the_tables():
    from sok1x.backend.cuda.kernel_launch import COUNTS
    rng = np.random.default_rng([12, RANK])
    hyper = {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
    counts = {}
    for count in (2, 26):
        names = make_tables("cuda_count_%d" % count, count)
        for _ in range(2):  # the first step makes the group
            inputs, tops = batch(rng, count, False)
            before = dict(COUNTS)
            _, token = api.pooled_lookup(names, "cc_fwd_%d" % count, inputs, True)
            grads = api.pooled_lookup_grad(names, "cc_bwd_%d" % count, token, tops)
            api.apply_optimizer_updates(names, "lazy_adam", "Adam", {}, hyper,
                                        [g[0] for g in grads], [g[1] for g in grads])
            counts[count] = {k: COUNTS[k] - before.get(k, 0) for k in ("launches", "host_waits")}
    print("\nper step, 2 tables: %s; 26 tables: %s" % (counts[2], counts[26]))
    assert counts[26]["launches"] <= 1.25 * counts[2]["launches"]
    assert counts[26]["host_waits"] == counts[2]["host_waits"]


def test_bad_input_in_one_member_fails_every_rank_and_changes_no_table():
    names = make_tables("cuda_bad", 4)
    rng = np.random.default_rng([13, RANK])
    inputs, tops = batch(rng, len(names), False)
    _, token = api.pooled_lookup(names, "cb_fwd_ok", inputs, True)
    api.pooled_lookup_grad(names, "cb_bwd_ok", token, tops)
    before = [host(api.shard(name).values).copy() for name in names]
    bad = list(inputs)
    if RANK == SIZE - 1:
        keys = bad[2].keys.copy()
        keys[0] = -4
        bad[2] = bad[2]._replace(keys=keys)
    with pytest.raises(InvalidInputError, match="cuda_bad_2"):
        api.pooled_lookup(names, "cb_fwd", bad, True)
    for name, values in zip(names, before):
        np.testing.assert_array_equal(host(api.shard(name).values), values)


def keyed_of(inputs):
    """The KeyedInput of per-table PooledInputs (one combiner and weighting)."""
    weights = None if inputs[0].weights is None else np.concatenate([i.weights for i in inputs])
    return KeyedInput(np.concatenate([i.keys for i in inputs]),
                      [i.keys.shape[0] for i in inputs],
                      np.concatenate([i.segment_ids for i in inputs]),
                      [i.num_segments for i in inputs], weights, inputs[0].combiner)


def test_part_ops_equal_the_cpu_backend():
    from sok1x.backend import cpu
    rng = np.random.default_rng([15, RANK])
    cuts = np.array([0, 0, 7, 7, 20, 21, 21], np.int64)  # empty parts among them
    keys = rng.integers(-50, 50, size=21)
    offsets = rng.integers(0, 1000, size=6)
    with runtime.entered() as rt:
        _compare_part_ops(rt.backend, cpu, keys, cuts, offsets)


def test_bounds_of_many_large_parts():
    """part_bounds over 30 parts of about 700k keys in all (blocks sharing each part, each
    reducing over its warps before its atomics), empty parts among them and each part's
    extremes at random places, against cpu."""
    from sok1x.backend import cpu
    rng = np.random.default_rng(16)
    sizes = rng.integers(0, 47000, size=30)
    sizes[[3, 17]] = 0
    cuts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    keys = rng.integers(-(1 << 40), 1 << 40, size=int(cuts[-1]))
    spots = cuts[:-1] + (rng.random(30) * np.maximum(sizes, 1)).astype(np.int64)
    keys[spots[sizes > 0]] = np.int64(1) << 62  # a part's high, somewhere inside it
    with runtime.entered() as rt:
        cuda = rt.backend
        arrays = [keys, keys[::-1].copy()]
        np.testing.assert_array_equal(cuda.part_bounds([cuda.asarray(a) for a in arrays], cuts),
                                      cpu.part_bounds(arrays, cuts))


def test_rotated_lists_equal_the_cpu_backend():
    """backend.rotate_parts (a full group's spare-row lists after an eviction in place): each
    part less its first counts[t] rows, then as many of its part of `back`, with counts from 0
    to past the part's length and below 0 (clamped), empty parts among them, on cuda as on
    cpu."""
    from sok1x.backend import cpu
    rng = np.random.default_rng(46)
    sizes = rng.integers(0, 5000, size=26)
    sizes[[2, 9]] = 0
    cuts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    back_sizes = sizes + rng.integers(0, 3, size=26)
    back_cuts = np.concatenate([[0], np.cumsum(back_sizes)]).astype(np.int64)
    before = rng.integers(0, 1 << 40, size=int(cuts[-1]))
    back = rng.integers(-1, 1 << 40, size=int(back_cuts[-1]))
    counts = (rng.random(26) * (sizes + 2)).astype(np.int64)
    counts[[0, 5]] = [-3, 0]
    counts[7] = sizes[7] + 10
    expected = np.full(int(cuts[-1]), -7, np.int64)
    cpu.rotate_parts(expected, before, cuts, back, back_cuts, counts)
    for t in (1, 7):  # one rotated by its count, one by its whole length
        start, stop, k = cuts[t], cuts[t + 1], min(max(counts[t], 0), sizes[t])
        np.testing.assert_array_equal(expected[start:stop], np.concatenate(
            [before[start + k:stop], back[back_cuts[t]:back_cuts[t] + k]]))
    with runtime.entered() as rt:
        cuda = rt.backend
        out = cuda.asarray(np.full(int(cuts[-1]), -7, np.int64))
        cuda.rotate_parts(out, cuda.asarray(before), cuts, cuda.asarray(back), back_cuts,
                          cuda.asarray(counts))
        np.testing.assert_array_equal(cuda.to_host(out), expected)
        for first, stop in ((5, 70000), (3, 3)):  # a shard's rows never handed out, listed
            np.testing.assert_array_equal(cuda.to_host(cuda.row_sequence(first, stop)),
                                          cpu.row_sequence(first, stop))


def _compare_part_ops(cuda, cpu, keys, cuts, offsets):
    for array in (keys, keys.astype(np.int32)):
        np.testing.assert_array_equal(
            cuda.to_host(cuda.offset_parts(cuda.asarray(array), cuts, offsets)),
            cpu.offset_parts(array, cuts, offsets))
        second = array[::-1].copy()
        together = cuda.offset_parts_many([cuda.asarray(array), cuda.asarray(second)], cuts,
                                          [offsets, offsets[::-1]])
        expected = cpu.offset_parts_many([array, second], cuts, [offsets, offsets[::-1]])
        for got, want in zip(together, expected):
            np.testing.assert_array_equal(cuda.to_host(got), want)
        both = [cuda.asarray(array), cuda.asarray(array[::-1].copy())]
        np.testing.assert_array_equal(cuda.part_bounds(both, cuts),
                                      cpu.part_bounds([array, array[::-1].copy()], cuts))


@pytest.mark.parametrize("combiner,weighted", [("sum", False), ("mean", True)])
def test_a_keyed_lookup_equals_the_tables_one_by_one(combiner, weighted):
    together, alone = paired_tables("cuda_keyed_%s" % combiner, "cuda_keyed_alone_%s" % combiner)
    rng = np.random.default_rng([14, RANK])
    for _ in range(2):
        inputs, tops = batch(rng, len(together), False)
        if weighted:
            inputs = [i._replace(weights=rng.random(i.keys.shape[0]).astype(np.float32),
                                 combiner=combiner) for i in inputs]
        out, token = api.keyed_lookup(together, "ck_fwd", keyed_of(inputs), True)
        values, rows, counts = api.keyed_lookup_grad(together, "ck_bwd", token,
                                                     np.concatenate(tops))
        cuts = np.concatenate([[0], np.cumsum(counts)])
        segment_cuts = np.concatenate([[0], np.cumsum([i.num_segments for i in inputs])])
        out_host, values_host, rows_host = host(out), host(values), host(rows)
        api.apply_keyed_update(together, "lazy_adam", "Adam", {}, HYPER, values, rows, counts)
        for t, name in enumerate(alone):
            step_alone_and_compare(name, "cka_%d" % t, inputs[t], tops[t],
                                   out_host[segment_cuts[t]:segment_cuts[t + 1]],
                                   values_host[cuts[t]:cuts[t + 1]],
                                   rows_host[cuts[t]:cuts[t + 1]])
    assert_same_tables(together, alone)


def test_a_keyed_step_launches_and_waits_as_for_one_table():
    """26 tables cost at most 1.25 times the launches of one table holding as many rows (a
    distinct pass over more rows takes more scan launches, whatever the tables)."""
    from sok1x.backend.cuda.kernel_launch import COUNTS
    rng = np.random.default_rng([16, RANK])
    counts = {}
    for count in (1, 26):
        names = make_tables("cuda_keyed_count_%d" % count, count, CAPACITY * (27 - count))
        for _ in range(2):  # the first step makes the group
            inputs, tops = batch(rng, count, False)
            item, grads = keyed_of(inputs), np.concatenate(tops)
            before = dict(COUNTS)
            _, token = api.keyed_lookup(names, "ckc_fwd_%d" % count, item, True)
            values, rows, per_table = api.keyed_lookup_grad(names, "ckc_bwd_%d" % count, token,
                                                            grads)
            api.apply_keyed_update(names, "sgd", "SGD", {}, {"lr": 0.1}, values, rows,
                                   per_table)
            counts[count] = {k: COUNTS[k] - before.get(k, 0) for k in ("launches", "host_waits")}
    print("\nper keyed step, 1 table: %s; 26 tables: %s" % (counts[1], counts[26]))
    assert counts[26]["launches"] <= 1.25 * counts[1]["launches"]
    assert counts[26]["host_waits"] == counts[1]["host_waits"]


# -- hash groups: v1 hash tables of one dim, placement and initializer (lookup/table_group.py) --

HASH_SPAN = 2 ** 50  # a hash table takes any non-negative key


def make_hash_tables(prefix, count, capacity=CAPACITY):
    names = ["%s_%d" % (prefix, t) for t in range(count)]
    for name in names:
        api.create_table(name, DIM, capacity, True, SPEC, replace=True)
    return names


def hash_batch(rng, count, step):
    """Per table a PooledInput of keys drawn from a pool shared by the ranks, and a top
    gradient."""
    pool = np.random.default_rng([99, step]).integers(0, HASH_SPAN, size=4000)
    inputs, tops = batch(rng, count, False)
    inputs = [i._replace(keys=pool[rng.integers(0, pool.shape[0], size=i.keys.shape[0])])
              for i in inputs]
    return inputs, tops


def hash_state(name):
    """This rank's shard of a hash table by key: ({key: (vector, Adam m)}, index size); rows
    read through the row kernels (rows split into host memory too)."""
    table = api.shard(name)
    backend = table.backend
    keys, rows = table.index.export()
    values, m = (host(backend.gather_rows(array, rows))
                 for array in (table.values, table.slots["Adam/m"]))
    return {int(k): (values[i], m[i]) for i, k in enumerate(host(keys))}, table.index.size


def held_keys(name):
    """The keys this rank's shard of a hash table holds (sorted) and its index size."""
    index = api.shard(name).index
    return sorted(host(index.export()[0]).tolist()), index.size


def hash_gradient(name, values, rows):
    """{key: summed gradient} of a hash table's gradient rows."""
    keys, held = (host(a) for a in api.shard(name).index.export())
    key_of_row = dict(zip(held.tolist(), keys.tolist()))
    out = {}
    for row, value in zip(host(rows).tolist(), host(values).astype(np.float64)):
        if row < 0:  # a bounded step's padding (both switches on several ranks): no gradient
            assert not value.any()
            continue
        out[key_of_row[row]] = out.get(key_of_row[row], 0.0) + value
    return out


def hash_steps(names, together, steps=2, seed=(21,), first=0, rule="lazy_adam"):
    """LazyAdam (or Adam: `rule`) steps of the hash tables looked up together or one by one
    (steps first, first + 1, ...: each draws from its own pool of keys): per step the outputs
    and per table the gradient by key."""
    rng = np.random.default_rng(list(seed) + [RANK])
    record = []
    for step in range(first, first + steps):
        inputs, tops = hash_batch(rng, len(names), step)
        if together:
            outs, token = api.pooled_lookup(names, "hg_fwd", inputs, True)
            grads = api.pooled_lookup_grad(names, "hg_bwd", token, tops)
        else:
            outs, grads = [], []
            for t, name in enumerate(names):
                (out,), one = api.pooled_lookup([name], "hg_one_fwd", [inputs[t]], True)
                grads += api.pooled_lookup_grad([name], "hg_one_bwd", one, [tops[t]])
                outs.append(out)
        record.append(([host(o) for o in outs],
                       [hash_gradient(n, v, r) for n, (v, r) in zip(names, grads)]))
        if together:
            api.apply_optimizer_updates(names, rule, "Adam", {}, HYPER,
                                        [v for v, _ in grads], [r for _, r in grads])
        else:
            for name, (values, rows) in zip(names, grads):
                api.apply_optimizer_update(name, rule, "Adam", {}, HYPER, values, rows)
    return record


def test_a_hash_group_equals_its_tables_one_by_one():
    names = make_hash_tables("cuda_hash_group", 5)
    together = hash_steps(names, True)
    assert isinstance(api.shard(names[0]).group, table_group.HashGroup)
    grouped = [hash_state(name) for name in names]
    make_hash_tables("cuda_hash_group", 5)  # the same tables anew (same initial rows)
    alone = hash_steps(names, False)
    assert_same_hash_steps(names, together, alone, grouped)


def assert_same_hash_steps(names, together, alone, grouped):
    """Steps of hash tables looked up together (per step outputs and gradients by key) equal
    those one by one, and the shards after them (grouped: hash_state's) the ones now."""
    for (outs, grads), (want_outs, want_grads) in zip(together, alone):
        for out, want in zip(outs, want_outs):
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        for got, want in zip(grads, want_grads):
            assert sorted(got) == sorted(want)
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)
    for name, (state, size) in zip(names, grouped):
        want, want_size = hash_state(name)
        assert size == want_size and sorted(state) == sorted(want)
        for key, (vector, m) in want.items():
            np.testing.assert_allclose(state[key][0], vector, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(state[key][1], m, rtol=1e-5, atol=1e-7)


def launches_and_waits(make_names, tag, seed):
    """{tables: {"launches", "host_waits"}} of the second LazyAdam step (the first makes the
    group) of 1, 2 and 26 hash tables made by make_names(tables), looked up together; the
    figures printed with `tag`."""
    from sok1x.backend.cuda.kernel_launch import COUNTS
    rng = np.random.default_rng([seed, RANK])
    counts = {}
    for count in (1, 2, 26):
        names = make_names(count)
        for step in range(2):
            inputs, tops = hash_batch(rng, count, step)
            before = dict(COUNTS)
            _, token = api.pooled_lookup(names, "%s_fwd_%d" % (tag, count), inputs, True)
            grads = api.pooled_lookup_grad(names, "%s_bwd_%d" % (tag, count), token, tops)
            api.apply_optimizer_updates(names, "lazy_adam", "Adam", {}, HYPER,
                                        [g[0] for g in grads], [g[1] for g in grads])
            counts[count] = {k: COUNTS[k] - before.get(k, 0) for k in ("launches", "host_waits")}
    print("\nper %s step, 1 table: %s; 2 tables: %s; 26 tables: %s"
          % (tag, counts[1], counts[2], counts[26]))
    assert counts[26]["launches"] <= 1.25 * counts[2]["launches"]
    assert counts[26]["host_waits"] == counts[2]["host_waits"] <= counts[1]["host_waits"]
    return counts


def test_hash_group_launches_and_waits_do_not_grow_with_the_tables():
    # room in any shard for every rank's keys of a member (up to 1,425 a rank) beside the
    # pool's 4,000: a group skips its placed-count check alike at any count (fitting_units)
    counts = launches_and_waits(
        lambda count: make_hash_tables("cuda_hash_count_%d" % count, count, 1500 * SIZE + 4000),
        "hash", 22)
    # the shards have room for every rank's keys: the placed counts are read in the backward's
    # header wait (key_exchange.fitting_units), so a step waits twice (issue 17 item 2), a group's
    # as a hash table's alone
    assert counts[26]["host_waits"] <= 2 and counts[1]["host_waits"] <= 2


def test_a_hash_groups_placed_keys_are_counted_when_no_header_read_them():
    """A training lookup of a group (or of a hash table alone) with room leaves its placed
    counts on the device for the next op header; a size read before any header (here two
    forwards with no backward, then the index itself) waits for them and counts them, as a
    checked lookup would have."""
    names = make_hash_tables("cuda_hash_later", 3)
    alone, = make_hash_tables("cuda_hash_later_alone", 1)  # a hash table looked up alone
    rng = np.random.default_rng([25, RANK])
    for step in range(2):
        inputs, _ = hash_batch(rng, len(names), step)
        api.pooled_lookup(names, "hl_fwd_%d" % step, inputs, True)
        api.pooled_lookup([alone], "hl_alone_fwd_%d" % step, inputs[:1], True)
    for name in names + [alone]:
        keys, size = held_keys(name)
        assert size == len(keys) > 0
    index = api.shard(names[0]).index
    with runtime.entered() as rt:
        counts = rt.backend.asarray(np.array([3, 4], np.int64))
        before = index.size
        index.add_size_later(counts, 1)
        index.settle_size(counts, np.array([3, 4], np.int64))
        assert index.size == before + 4
        index.add_size_later(counts, 0)
        assert index.size == before + 7  # read by the property itself


def test_a_group_insert_counted_later_gives_the_sizes_the_cpu_backend_counts():
    """A replayed insert's placed counts, left on the device (hash_insert_many_done with a
    read_later function): hash_sizes reads them once for every index; hash_settle_sizes hands
    a copy read since to them all; either way the sizes are the cpu backend's."""
    from sok1x.backend import cpu
    rng = np.random.default_rng([26, RANK])
    row_starts = np.array([0, 100, 200, 300, 400], np.int64)
    batches = []
    for _ in range(3):
        tags = np.sort(rng.integers(0, 4, size=200))
        batches.append((rng.integers(0, 40, size=200), tags))
    with runtime.entered() as rt:
        cuda = rt.backend
        want = [cpu.HashIndex(60) for _ in range(4)]
        got = [cuda.HashIndex(60) for _ in range(4)]
        for step, (keys, tags) in enumerate(batches):
            out = cpu.hash_insert_many(want, keys, tags, row_starts)
            cpu.hash_insert_many_done(want, out, out[5], True)
            found = cuda.hash_insert_many(got, cuda.asarray(keys), cuda.asarray(tags),
                                          row_starts)
            placed = cuda.read_later(found[5])
            cuda.hash_insert_many_done(got, found, placed, True)
            if step == 1:  # handed over, as an op header's read hands it
                cuda.hash_settle_sizes(got, placed, placed())
                assert not any(index.has_pending_counts() for index in got)
            sizes = cuda.hash_sizes(got)
            assert sizes.tolist() == cpu.hash_sizes(want).tolist() == [
                index.size for index in want]
            assert [index.size for index in got] == sizes.tolist()
        keys, tags = batches[-1]
        found = cuda.hash_insert_many(got, cuda.asarray(keys), cuda.asarray(tags), row_starts)
        placed = cuda.read_later(found[5])  # (nothing new: every key is held)
        cuda.hash_insert_many_done(got, found, placed, True)
        mixed = cuda.asarray(np.array([1, 2, 3, 4], np.int64))
        got[2].add_size_later(mixed, 2)  # two counts pending on one index: each its own
        sizes = cuda.hash_sizes(got)
        assert sizes.tolist() == (cpu.hash_sizes(want) + np.array([0, 0, 3, 0])).tolist()
        got[2].size -= 3
        # an erase counted later, as a padded eviction's: each member erases a few held keys
        # in places of a bound (-1 in the rest); its count reaches sizes and tombstones when
        # hash_settle_sizes hands the copy over, as Evicted.settle does
        erase_keys, erase_tags, bounds, erased = [], [], [], []
        for t in range(4):
            held = np.unique(keys[tags == t])[:t + 1]
            erase_keys += held.tolist() + [-1, -1]
            erase_tags += [t] * (held.shape[0] + 2)
            bounds.append(held.shape[0] + 2)
            erased.append(held.shape[0])
        erase_keys, erase_tags = np.array(erase_keys), np.array(erase_tags)
        device_erased = cuda.asarray(np.array(erased, np.int64))
        cuda.hash_erase_many(got, cuda.asarray(erase_keys), cuda.asarray(erase_tags), bounds,
                             device_erased)
        cpu.hash_erase_many(want, erase_keys, erase_tags, bounds, np.array(erased))
        cuda.hash_settle_sizes(got, device_erased, host(device_erased))
        assert not any(index.has_pending_counts() for index in got)
        assert cuda.hash_sizes(got).tolist() == cpu.hash_sizes(want).tolist()
        assert [index.tombstones for index in got] == [index.tombstones for index in want]


def test_a_member_list_moved_past_its_keys_is_the_list_of_the_sizes_after():
    """hash_members_advance after an insert that read a member list: the list then holds what
    hash_insert_members writes for the sizes after the insert, and the next insert through it
    hands out the rows the cpu backend hands out."""
    from sok1x.backend import cpu
    rng = np.random.default_rng([27, RANK])
    row_starts = np.array([0, 100, 200, 300, 400], np.int64)
    with runtime.entered() as rt:
        cuda = rt.backend
        got, want = [cuda.HashIndex(60) for _ in range(4)], [cpu.HashIndex(60) for _ in range(4)]
        members = cuda.hash_insert_members(got, row_starts, None, cuda.hash_sizes(got))
        for _ in range(3):
            tags = np.sort(rng.integers(0, 4, size=150))
            keys = rng.integers(0, 45, size=150)
            found = cuda.hash_insert_many(got, cuda.asarray(keys), cuda.asarray(tags),
                                          row_starts, members=members)
            cuda.hash_members_advance(members, found[5])
            cuda.hash_insert_many_done(got, found, cuda.read_later(found[5]), True)
            out = cpu.hash_insert_many(want, keys, tags, row_starts)
            cpu.hash_insert_many_done(want, out, out[5], True)
            sizes = cuda.hash_sizes(got)
            assert sizes.tolist() == cpu.hash_sizes(want).tolist()
            fresh = cuda.hash_insert_members(got, row_starts, None, sizes)
            np.testing.assert_array_equal(host(members), host(fresh))
            new = host(found[2])[:int(host(found[4])[0])]  # rows follow the sizes before
            assert sorted(new.tolist()) == sorted(out[2][:int(out[4][0])].tolist())


def test_a_full_shard_in_a_hash_group_fails_every_rank_and_changes_no_table():
    names = make_hash_tables("cuda_hash_full", 4, capacity=1000)
    rng = np.random.default_rng([23, RANK])
    inputs, _ = hash_batch(rng, len(names), 0)
    api.pooled_lookup(names, "hf_ok", inputs, True)
    before = [held_keys(name) for name in names]
    crowded = list(inputs)
    if RANK == SIZE - 1:
        keys = np.arange(1000 * SIZE + 1, dtype=np.int64) * 7 + 10 ** 12
        crowded[2] = PooledInput(keys, None, keys.shape[0], None, "sum")
    from sok1x.errors import TableFullError
    with pytest.raises(TableFullError, match="cuda_hash_full_2: the shard on rank"):
        api.pooled_lookup(names, "hf_bad", crowded, True)
    assert [held_keys(name) for name in names] == before
    api.pooled_lookup(names, "hf_again", inputs, True)  # no new keys: found again
    assert [held_keys(name) for name in names] == before


def test_hash_group_ops_equal_the_cpu_backend():
    from sok1x.backend import cpu
    rng = np.random.default_rng([24, RANK])
    keys = rng.integers(0, 50, size=300)  # repeats within a member and across members
    tags = np.sort(rng.integers(0, 4, size=300))
    with runtime.entered() as rt:
        cuda = rt.backend
        cuts = np.searchsorted(tags, np.arange(5))
        np.testing.assert_array_equal(host(cuda.part_tags(cuts)), cpu.part_tags(cuts))
        started, counts = cuda.unique_many_start([cuda.asarray(keys)], tags_list=[tags])
        (distinct, inverse), = cuda.unique_many_finish(started, host(counts))
        pairs = set(zip(tags.tolist(), keys.tolist()))
        assert host(distinct).shape[0] == len(pairs)
        np.testing.assert_array_equal(host(distinct)[host(inverse)], keys)
        row_starts = np.array([0, 100, 200, 300, 400], np.int64)
        found = {}
        for name, backend in (("cuda", cuda), ("cpu", cpu)):
            indexes = [backend.HashIndex(60) for _ in range(4)]
            out = backend.hash_insert_many(indexes, backend.asarray(keys), backend.asarray(tags),
                                           row_starts)
            placed = host(out[5])
            backend.hash_insert_many_done(indexes, out, placed, True)
            flat = host(out[0])
            table = backend.zeros((400, DIM), np.float32)
            count = int(host(out[4])[0])
            backend.init_rows_tagged(table, out[2], out[1], out[3], SPEC,
                                     np.array([11, 12, 13, 14], np.uint64), out[4])
            again = host(backend.hash_find_many(indexes, backend.asarray(keys),
                                                backend.asarray(tags), row_starts))
            # a per-peer capacity's padded slots (key -1, tag -1) are no keys: row -1
            padded = host(backend.hash_find_many(
                indexes, backend.asarray(np.concatenate([[-1], keys, [-1, -1]])),
                backend.asarray(np.concatenate([[-1], tags, [-1, -1]])), row_starts))
            np.testing.assert_array_equal(padded, np.concatenate([[-1], again, [-1, -1]]))
            found[name] = (placed, flat, count, host(table), again, indexes)
        got, want = found["cuda"], found["cpu"]
        np.testing.assert_array_equal(got[0], want[0])  # keys placed per member
        assert got[2] == want[2] == len(pairs)
        np.testing.assert_array_equal(got[1], got[4])  # found where inserted
        # rows differ (arrival order), the vector of each (member, key) does not
        for t, key, row in zip(tags, keys, got[1]):
            cpu_row = want[1][np.flatnonzero((tags == t) & (keys == key))[0]]
            assert row_starts[t] <= row < row_starts[t] + 60
            np.testing.assert_allclose(got[3][row], want[3][cpu_row], rtol=1e-6)


# -- hbm DynamicVariables in hash groups: members grow in place (lookup/table_group.py) ----------

def make_hbm_tables(prefix, count, init=8, most=8192):
    from sok1x.engine.tables.dynamic_table import make_dynamic
    names = ["%s_%d" % (prefix, t) for t in range(count)]
    for name in names:
        api.create_table(name, DIM, most, True, SPEC, replace=True,
                         dynamic=make_dynamic("hbm", init, most))
    return names


@pytest.mark.parametrize("rule", ["lazy_adam", "adam"])
@pytest.mark.parametrize("growth", ["copies", "in_place"])
def test_an_hbm_group_that_grows_equals_its_tables_one_by_one(growth, rule, monkeypatch):
    """Members of 8 rows get hundreds of new keys a step (far more than a full index's slots):
    the group counts them exactly and grows each member in one step, as each grows alone;
    whether the group lays its arrays out again or grows its rows in place (device memory
    mapped behind them, backend/cuda/reserved_rows.py), and with Adam, which moves every row
    (in place: each member's held rows in turn)."""
    monkeypatch.setenv(table_group.GROW_ENV, "1" if growth == "in_place" else "0")
    names = make_hbm_tables("cuda_hbm_group", 5)
    together = hash_steps(names, True, steps=3, rule=rule)
    tables = [api.shard(name) for name in names]
    group = tables[0].group
    assert isinstance(group, table_group.HashGroup) and group.members == tables
    assert group.reserved == (growth == "in_place")
    grown = [table.capacity for table in tables]
    assert all(capacity > 8 for capacity in grown)
    assert list(group.held_rows) == grown
    assert list(np.diff(group.row_starts)) == (
        [8192] * len(tables) if group.reserved else grown)
    if group.reserved:  # memory behind the rows held (or backed ahead) only, whole granules
        backed, granule = group.reserved_bytes(), 2 << 20
        arrays = [group.values, group.times] + list(group.slots.values())
        ahead = [group._ahead[t][0] if t in group._ahead else n for t, n in enumerate(grown)]
        held, most = (sum(sum(rows) * a.nbytes // a.shape[0] for a in arrays)
                      for rows in (grown, ahead))
        assert held <= backed <= most + 2 * granule * len(tables) * len(arrays)
    assert all(table.index.size <= table.capacity for table in tables)
    grouped = [hash_state(name) for name in names]
    monkeypatch.undo()
    make_hbm_tables("cuda_hbm_group", 5)  # the same tables anew (same initial rows)
    alone = hash_steps(names, False, steps=3, rule=rule)
    assert [api.shard(name).capacity for name in names] == grown
    assert_same_hash_steps(names, together, alone, grouped)


@pytest.mark.parametrize("rule", ["lazy_adam", "adam"])
def test_an_hbm_table_alone_grows_in_place_as_a_group_of_one(rule, monkeypatch):
    """A DynamicVariable looked up alone whose rows may grow in place (forced here) is a hash
    group of one (table_group._grows_in_place_alone): its rows grow in device memory mapped
    behind them, and its steps, rows and slots equal the same table's growing by copies."""
    monkeypatch.setenv(table_group.GROW_ENV, "1")
    names = make_hbm_tables("cuda_hbm_alone", 1)
    got = hash_steps(names, True, steps=3, rule=rule)
    table = api.shard(names[0])
    assert table.group.members == [table] and table.group.reserved and table.capacity > 8
    in_place = [hash_state(names[0])]
    monkeypatch.setenv(table_group.GROW_ENV, "0")
    make_hbm_tables("cuda_hbm_alone", 1)  # the same table anew (same initial rows)
    want = hash_steps(names, True, steps=3, rule=rule)
    assert api.shard(names[0]).group is None
    assert_same_hash_steps(names, got, want, in_place)


def test_an_hbm_member_past_max_capacity_fails_every_rank_and_nothing_grows():
    from sok1x.errors import TableFullError
    names = make_hbm_tables("cuda_hbm_full", 4, init=64, most=4096)
    rng = np.random.default_rng([25, RANK])
    inputs, _ = hash_batch(rng, len(names), 0)
    api.pooled_lookup(names, "hbm_full_ok", inputs, True)
    before = [held_keys(name) for name in names]
    held = [api.shard(name).capacity for name in names]
    crowded, _ = hash_batch(rng, len(names), 1)  # new keys: the other members would grow
    if RANK == SIZE - 1:
        keys = np.arange(4096 * SIZE + 1, dtype=np.int64) * 7 + 10 ** 12
        crowded[2] = PooledInput(keys, None, keys.shape[0], None, "sum")
    with pytest.raises(TableFullError, match="cuda_hbm_full_2: the shard on rank"):
        api.pooled_lookup(names, "hbm_full_bad", crowded, True)
    assert [held_keys(name) for name in names] == before
    assert [api.shard(name).capacity for name in names] == held
    api.pooled_lookup(names, "hbm_full_again", inputs, True)  # no new keys: found again
    assert [held_keys(name) for name in names] == before


def _gradient_after_growth(names, together):
    """A lookup of the tables, a second lookup that grows member 0 (moving the others' flat
    rows), then the first lookup's gradient and update: the first's gradients by key and the
    tables' states."""
    rng = np.random.default_rng([26, RANK])
    inputs, tops = hash_batch(rng, len(names), 0)

    def looked_up(items, op):
        if together:
            return [api.pooled_lookup(names, op, items, True)[1]]
        return [api.pooled_lookup([n], "%s_%d" % (op, t), [i], True)[1]
                for t, (n, i) in enumerate(zip(names, items))]
    tokens = looked_up(inputs, "hbm_first")
    more = list(inputs)
    new = np.arange(4 * api.shard(names[0]).capacity * SIZE, dtype=np.int64) * 13 + 10 ** 13
    more[0] = PooledInput(new, None, new.shape[0], None, "sum")
    held = api.shard(names[0]).capacity
    looked_up(more, "hbm_second")  # no gradient: its routing is dropped
    assert api.shard(names[0]).capacity > held
    if together:
        grads = api.pooled_lookup_grad(names, "hbm_first_bwd", tokens[0], tops)
    else:
        grads = [api.pooled_lookup_grad([n], "hbm_first_bwd_%d" % t, k, [top])[0]
                 for t, (n, k, top) in enumerate(zip(names, tokens, tops))]
    by_key = [hash_gradient(n, v, r) for n, (v, r) in zip(names, grads)]
    for name, (values, rows) in zip(names, grads):
        api.apply_optimizer_update(name, "lazy_adam", "Adam", {}, HYPER, values, rows)
    return by_key, [hash_state(name) for name in names]


def test_a_lookups_gradient_after_its_group_grew_updates_its_own_keys():
    names = make_hbm_tables("cuda_hbm_between", 4, init=512)
    got, got_state = _gradient_after_growth(names, True)
    assert isinstance(api.shard(names[0]).group, table_group.HashGroup)
    names = make_hbm_tables("cuda_hbm_between", 4, init=512)
    want, want_state = _gradient_after_growth(names, False)
    assert_same_hash_steps(names, [([], got)], [([], want)], got_state)


# -- hybrid DynamicVariables in hash groups: members grow, then evict (lookup/table_group.py) ---

# Rows of each member in device memory where members split (the rest in host memory): all, a
# split past the first growths, one row, about half, never split.
SPLIT_ROWS = [None, 600, 1, 100, 1024]


def make_hybrid_tables(prefix, count, init=8, most=1024, split=False):
    """split: member t keeps SPLIT_ROWS[t] rows in device memory (max_hbm_for_vectors)."""
    from sok1x.engine.tables.dynamic_table import make_dynamic
    names = ["%s_%d" % (prefix, t) for t in range(count)]
    for t, name in enumerate(names):
        rows = SPLIT_ROWS[t % len(SPLIT_ROWS)] if split else None
        gib = 0.0 if rows is None else (rows * 4 * DIM + 2) / 2 ** 30
        api.create_table(name, DIM, most, True, SPEC, replace=True, dynamic=make_dynamic(
            "hybrid", init, most, ("lru", "lfu")[t % 2], gib))
    return names


def hybrid_state(name):
    """hash_state with each key's lookup count, and the keys evicted since the last call with
    their vectors (read once)."""
    from sok1x.engine.tables.dynamic_table import COUNT
    table = api.shard(name)
    keys, rows = (host(a) for a in table.index.export())
    counts = host(table.statistics)[rows, COUNT]
    evicted_keys, evicted_values = table.pop_evicted()
    return (hash_state(name), dict(zip(keys.tolist(), counts.tolist())),
            dict(zip(evicted_keys.tolist(), evicted_values)))


def assert_alone_as_together(names, together, states, seed):
    """The tables `names`, made anew, stepped one by one as they were together (hash_steps of
    seed (seed, step)) give per step the lookup counts and evicted keys of `states` (per step
    hybrid_state of each), and the outputs, gradients and shards of `together`."""
    alone = []
    for step in range(len(states)):
        alone += hash_steps(names, False, steps=1, seed=(seed, step), first=step)
        want = [hybrid_state(name) for name in names]
        for (_, got_counts, got_evicted), (_, want_counts, want_evicted) in zip(states[step],
                                                                                  want):
            assert got_counts == want_counts and sorted(got_evicted) == sorted(want_evicted)
            for key, vector in want_evicted.items():
                np.testing.assert_allclose(got_evicted[key], vector, rtol=1e-5, atol=1e-6)
    assert_same_hash_steps(names, together, alone, [s[0] for s in states[-1]])


@pytest.mark.parametrize("split, growth", [(False, "copies"), (True, "copies"),
                                           (False, "in_place")])
def test_a_hybrid_group_that_grows_and_evicts_equals_its_tables_one_by_one(split, growth,
                                                                          monkeypatch):
    """Members of 8 rows (at most 1,024) get hundreds of new keys a step: the group grows them,
    then evicts from each the keys it needs freed and hands their rows to the new keys, as
    each table does alone (the same keys held, vectors, slots, lookup counts, evicted keys).
    split: members whose rows split between device and host memory (SPLIT_ROWS), the group's
    rows then split per member (hybrid_rows.GroupedRows). in_place: the group's rows and
    statistics grow in device memory mapped behind them (SOK1X_GROW_IN_PLACE=1), and its
    eviction runs over the reserve."""
    from sok1x.engine.tables import hybrid_rows
    monkeypatch.setenv(table_group.GROW_ENV, "1" if growth == "in_place" else "0")
    names = make_hybrid_tables("cuda_hybrid_group", 5, split=split)
    together, states = [], []
    for step in range(3):
        together += hash_steps(names, True, steps=1, seed=(27, step), first=step)
        states.append([hybrid_state(name) for name in names])
    tables = [api.shard(name) for name in names]
    group = tables[0].group
    assert isinstance(group, table_group.HashGroup) and group.members == tables and group.evicts
    assert all(table.capacity == 1024 for table in tables)
    assert isinstance(group.values, hybrid_rows.GroupedRows) == split
    if split:
        # the rows in device memory: all of member 0's (its spare rows, 1/16 of its
        # max_capacity by default, among them), the first SPLIT_ROWS[t] of the others' (the
        # spare rows in host memory)
        spare = tables[0].spare
        assert list(group.hbm) == [1024 + spare, 600, 1, 100, 1024]
    assert group.reserved == (growth == "in_place")
    assert COMM.allreduce(sum(len(s[2]) for s in states[-1]), op=MPI.SUM) > 0  # evicted
    monkeypatch.setenv(table_group.GROW_ENV, "0")
    make_hybrid_tables("cuda_hybrid_group", 5, split=split)  # anew (same initial rows)
    assert_alone_as_together(names, together, states, 27)


@pytest.mark.parametrize("split", [False, True])
def test_a_reader_on_the_device_takes_what_a_host_reader_takes(split):
    """pop_evicted(on_device=True) hands out GPUArrays equal to what a reader on the host gets
    from the same steps, with no copy to the host queued for its evictions once it reads so.
    The two readers' steps are two runs: on several ranks an owner adds the ranks' gradient sums
    of a row in whatever order they land, so the vectors agree to float rounding, not bit for
    bit (seen on two H100s, 2026-11-27)."""
    from sok1x.engine.tables import eviction
    popped = {}
    for on_device in (False, True):
        names = make_hybrid_tables("cuda_device_reader", 5, split=split)
        steps = []
        for step in range(3):
            hash_steps(names, True, steps=1, seed=(31, step), first=step)
            if on_device and step:
                assert not any(kept.host_readers or kept in eviction.prefetched()
                               for name in names for kept, _ in api.shard(name)._evicted)
            got = [api.pop_evicted(name, on_device=on_device) for name in names]
            if on_device:
                assert all(runtime.get().backend.is_device_array(a) for pair in got for a in pair)
            steps.append([[host(a) for a in pair] for pair in got])
        popped[on_device] = steps
    assert COMM.allreduce(sum(len(k) for k, _ in popped[True][-1]), op=MPI.SUM) > 0
    for want_step, got_step in zip(popped[False], popped[True]):
        for (keys, vectors), (got_keys, got_vectors) in zip(want_step, got_step):
            assert got_keys.tolist() == keys.tolist()
            np.testing.assert_allclose(got_vectors.reshape(-1, DIM), vectors.reshape(-1, DIM),
                                       rtol=1e-5, atol=1e-6)


def test_hybrid_group_launches_and_waits_do_not_grow_with_the_tables():
    """In a step where nothing grows or evicts: the launches of 2 tables (at most 1.25 times)
    and their host waits, two: the op headers (the members hand rows out by placed counts read
    in the next header's wait, as an hbm group's indexes count theirs)."""
    counts = launches_and_waits(
        lambda count: make_hybrid_tables("cuda_hybrid_count_%d" % count, count, init=8192,
                                         most=8192), "hybrid", 28)
    assert counts[26]["host_waits"] <= 2 and counts[1]["host_waits"] <= 3


def test_a_step_whose_members_evict_in_place_waits_once_more_than_one_with_room():
    """Full hybrid members evict in place (HashGroup.make_room_in_place): on cuda, where an
    index counts the victims it erased on the device (HashIndex.add_size_later), nothing reads
    a size between the eviction and the insert; the step waits once more than a step with room
    (the eviction's counts, read with the placed ones), whatever the members, and on one rank
    the same as on the cpu backend (tests/mpi/test_hybrid_groups.py)."""
    waits = {}
    for count in (2, 5):
        names = make_hybrid_tables("cuda_in_place_%d" % count, count, init=64, most=64)
        per_step = []
        for step in range(6):
            keys = [np.arange(step * 16, step * 16 + 16, dtype=np.int64) + 1000 * t
                    + 10 ** 5 * RANK for t in range(count)]
            inputs = [PooledInput(k, np.arange(16, dtype=np.int64), 16, None, "sum")
                      for k in keys]
            before = runtime.get().stats()["host_waits"]
            outs, token = api.pooled_lookup(names, "in_place_fwd", inputs, True)
            grads = api.pooled_lookup_grad(names, "in_place_bwd", token, outs)
            api.apply_optimizer_updates(names, "lazy_adam", "Adam", {}, HYPER,
                                        [v for v, _ in grads], [r for _, r in grads])
            per_step.append(runtime.get().stats()["host_waits"] - before)
        assert api.shard(names[0]).evicted_keys > 0
        waits[count] = per_step
    assert waits[5][-1] == waits[2][-1] <= 3, waits
    if SIZE == 1:
        assert waits[2][-1] == waits[2][1] + 1, waits


@pytest.mark.parametrize("split", [False, True])
def test_a_hybrid_group_evicting_in_place_equals_its_tables_one_by_one(split, monkeypatch):
    """Members full from the third step on (1,024 rows, never growing) evict in place (their
    victims chosen and counted on the device with nothing read first, their new keys in the
    victims' rows: HashGroup.make_room_in_place) in most steps: the same keys held, vectors,
    slots, lookup counts and evicted keys as each table alone, which counts first."""
    calls = []
    in_place = table_group.HashGroup.make_room_in_place
    monkeypatch.setattr(table_group.HashGroup, "make_room_in_place",
                        lambda *a, **k: calls.append(1) or in_place(*a, **k))
    names = make_hybrid_tables("cuda_in_place_group", 5, init=1024, most=1024, split=split)
    together, states = [], []
    for step in range(6):
        together += hash_steps(names, True, steps=1, seed=(29, step), first=step)
        states.append([hybrid_state(name) for name in names])
    assert len(calls) >= 3, calls
    assert COMM.allreduce(sum(len(s[2]) for s in states[-1]), op=MPI.SUM) > 0  # evicted
    make_hybrid_tables("cuda_in_place_group", 5, init=1024, most=1024, split=split)
    assert_alone_as_together(names, together, states, 29)
