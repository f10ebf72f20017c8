"""The bounded one-rank step (engine/lookup/bounded_step.py, SOK1X_BOUNDED_STEP=1) on the cuda
engine at one GPU: the kernels lay the distinct rows out in pieces exactly as the cpu backend
does (rows out of range included), a gather gives zeros past the table, and over many steps a
bounded step equals the counted one (outputs bit for bit; gradients once the padding is
dropped, and the tables after the updates, up to the order of atomic additions), for one table
looked up dense and a group looked up keyed and pooled, and a hash group looked up keyed (its
rows as its insert hands them out), waiting on the host once a step instead of twice; bad keys
fail in the backward and change no table.

    mpiexec --allow-run-as-root -n 1 python3 -m pytest -q tests/gpu/test_bounded_step_cuda.py
"""
import numpy as np
import pytest

pytest.importorskip("pycuda")

from sok1x.backend import cpu, random_init  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.lookup import bounded_step  # noqa: E402
from sok1x.engine.lookup.keyed import KeyedInput  # noqa: E402
from sok1x.engine.lookup.pooled import PooledInput  # noqa: E402
from sok1x.errors import InvalidInputError  # noqa: E402

pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.usefixtures("engine")]
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=41)
DIM, ROWS = 16, 5000
HYPER = {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}


def host(array):
    return runtime.get().backend.to_host(array)


def make_pair(tag, count):
    """`count` tables made twice with the same rows: (bounded names, counted names)."""
    backend = runtime.get().backend
    pair = []
    for way in ("bounded", "counted"):
        names = ["%s_%s_%d" % (way, tag, t) for t in range(count)]
        for t, name in enumerate(names):
            api.create_table(name, DIM, ROWS + 64 * t, False, SPEC, replace=True)
            api.shard(name)
        pair.append(names)
    for a, b in zip(*pair):
        shard = api.shard(b)
        rows = backend.asarray(np.arange(shard.values.shape[0], dtype=np.int64))
        backend.put_rows(shard.values, rows, backend.asarray(host(api.shard(a).values)))
    return pair


@pytest.mark.parametrize("seed", range(5))
def test_padded_layout_equals_cpu(seed):
    backend = runtime.get().backend
    rng = np.random.default_rng(seed)
    members = 1 + seed
    row_starts = np.concatenate([[0], np.cumsum(rng.integers(0, 3000, size=members))])
    lengths = rng.integers(0, 4000, size=members)
    pieces = bounded_step.piece_starts(np.concatenate([[0], np.cumsum(lengths)]))
    bound = int(row_starts[-1])
    rows = rng.integers(-3, bound + 50, size=int(lengths.sum()))
    got = backend.distinct_rows_padded(backend.asarray(rows), bound, row_starts, pieces)
    for a, b in zip(got, cpu.distinct_rows_padded(rows, bound, row_starts, pieces)):
        np.testing.assert_array_equal(host(a), b)


@pytest.mark.parametrize("bound", [64, 5000, 1 << 22])
def test_padded_layout_of_dense_and_sparse_bitmaps_equals_cpu(bound):
    """Bitmap words with many marked rows and with few (table_groups.cu's for_each_marked_row
    takes them two ways) give the cpu's padded layout, rows past a piece's end included."""
    backend = runtime.get().backend
    rng = np.random.default_rng(bound)
    rows = rng.integers(-2, bound + 5, size=6000)
    rows[:100] = np.arange(100) % bound  # a run of neighbours: some dense words at any bound
    row_starts = np.array([0, bound // 3, bound], np.int64)
    pieces = bounded_step.piece_starts(np.array([0, 40, 6000], np.int64))
    got = backend.distinct_rows_padded(backend.asarray(rows), bound, row_starts, pieces)
    for a, b in zip(got, cpu.distinct_rows_padded(rows, bound, row_starts, pieces)):
        np.testing.assert_array_equal(host(a), b)


@pytest.mark.parametrize("members", [26, 256, 257, 300])
def test_padded_layout_of_many_members_equals_cpu(members):
    """A group's dense bitmap (most rows of each member looked up, as a full group's step looks
    them up) laid out by members whose bounds emit_padded_rows reads from shared memory (up to
    256) or from global memory (more), some members empty, some pieces too short: the cpu's
    padded layout."""
    backend = runtime.get().backend
    rng = np.random.default_rng(members)
    sizes = rng.integers(0, 200, size=members)
    sizes[::7] = 0
    row_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    bound = int(row_starts[-1])
    rows = np.concatenate([rng.permutation(bound)[:bound * 9 // 10],
                           rng.integers(-2, bound + 5, size=bound // 3)])
    tags = np.searchsorted(row_starts, np.clip(rows, 0, bound - 1), side="right") - 1
    lengths = np.bincount(tags, minlength=members)
    lengths[::5] = lengths[::5] // 2  # pieces shorter than their rows: those have no place
    pieces = bounded_step.piece_starts(np.concatenate([[0], np.cumsum(lengths)]))
    got = backend.distinct_rows_padded(backend.asarray(rows), bound, row_starts, pieces)
    for a, b in zip(got, cpu.distinct_rows_padded(rows, bound, row_starts, pieces)):
        np.testing.assert_array_equal(host(a), b)


@pytest.mark.parametrize("seed", range(3))
def test_the_places_counted_where_they_are_found_sum_as_counted_apart(seed):
    """distinct_rows_padded(counted=True) counts the rows of each place as it finds it: the
    layout is the uncounted one's, the counts are the inverse's bincount, and the bounded
    backward's sums over them (segment_sum with those counts: its sorted path, 2^14 ids and
    more) equal the sums that count the ids themselves, bit for bit on integer-valued
    gradients."""
    backend = runtime.get().backend
    rng = np.random.default_rng(100 + seed)
    row_starts = np.array([0, 3000, 7000, 20000], np.int64)
    lengths = np.array([9000, 12000, 3000 * (seed + 1)])
    pieces = bounded_step.piece_starts(np.concatenate([[0], np.cumsum(lengths)]))
    bound = int(row_starts[-1])
    rows = rng.integers(-2, bound + 30, size=int(lengths.sum()))
    rows[:4000] = rng.integers(0, 50, size=4000)  # hot rows: places of many keys
    plain = backend.distinct_rows_padded(backend.asarray(rows), bound, row_starts, pieces)
    *layout, counts = backend.distinct_rows_padded(backend.asarray(rows), bound, row_starts,
                                                   pieces, counted=True)
    for a, b in zip(layout, plain):
        np.testing.assert_array_equal(host(a), host(b))
    inverse = host(layout[2])
    places = int(pieces[-1])
    want_counts = np.bincount(inverse[inverse >= 0], minlength=places)
    np.testing.assert_array_equal(host(counts[0]), want_counts)
    grads = rng.integers(-8, 9, size=(rows.shape[0], 64)).astype(np.float32)
    summed = backend.segment_sum(backend.asarray(grads), layout[2], places, counts)
    np.testing.assert_array_equal(host(summed),
                                  host(backend.segment_sum(backend.asarray(grads), layout[2],
                                                           places)))
    want = np.zeros((places, 64), np.float32)
    np.add.at(want, inverse[inverse >= 0], grads[inverse >= 0])
    np.testing.assert_array_equal(host(summed), want)


def test_gather_past_the_table_gives_zeros():
    backend = runtime.get().backend
    table = backend.asarray(np.arange(40, dtype=np.float32).reshape(10, 4) + 1)
    rows = np.array([0, 9, 10, -1, 12345, 3])
    got = host(backend.gather_rows(table, backend.asarray(rows)))
    want = cpu.gather_rows(host(table), rows)
    np.testing.assert_array_equal(got, want)
    assert not want[[2, 3, 4]].any()


def assert_tables_close(bounded, counted):
    for a, b in zip(bounded, counted):
        np.testing.assert_allclose(host(api.shard(a).values), host(api.shard(b).values),
                                   rtol=1e-5, atol=1e-6)
        for slot in ("Adam/m", "Adam/v"):
            np.testing.assert_allclose(host(api.shard(a).slots[slot]),
                                       host(api.shard(b).slots[slot]), rtol=1e-5, atol=1e-7)


def assert_gradient_matches(values, rows, want_values, want_rows):
    """A bounded backward's (values, rows) against the counted one's: padding rows -1 carry
    zeros; the other rows are the counted rows, each with its values (up to the order of
    atomic additions)."""
    kept = rows >= 0
    assert not values[~kept].any()
    order = np.argsort(want_rows)
    np.testing.assert_array_equal(rows[kept], want_rows[order])
    np.testing.assert_allclose(values[kept], want_values[order], rtol=1e-5, atol=1e-6)


def dense_step(name, keys, bounded, monkeypatch, checks="backward"):
    monkeypatch.setenv(bounded_step.ENV, "1" if bounded else "0")
    backend = runtime.get().backend
    out, token = api.dense_lookup(name, name + "_fwd", backend.asarray(keys), True,
                                  checks=checks)
    values, rows = api.dense_lookup_grad(name, name + "_bwd", token, out)
    api.apply_optimizer_updates([name], "lazy_adam", "Adam", {}, HYPER, [values], [rows])
    return host(out), host(values), host(rows)


def test_dense_steps_equal_counted(monkeypatch):
    (bounded,), (counted,) = make_pair("dense", 1)
    rng = np.random.default_rng(3)
    for step in range(8):
        keys = rng.integers(0, ROWS, size=(2048 + 64 * step, 2))
        got, want = dense_step(bounded, keys, True, monkeypatch), dense_step(
            counted, keys, False, monkeypatch)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[2].shape[0] == -(-keys.size // 8) * 8
        assert_gradient_matches(got[1], got[2], want[1], want[2])
        assert_tables_close([bounded], [counted])


def test_keyed_group_steps_equal_counted(monkeypatch):
    count = 6
    bounded, counted = make_pair("keyed", count)
    backend = runtime.get().backend
    rng = np.random.default_rng(5)
    for step in range(6):
        lengths = np.array([512 + 97 * ((t + step) % 4) for t in range(count)])
        keys = np.concatenate([rng.integers(0, ROWS + 64 * t, size=n)
                               for t, n in enumerate(lengths)])
        results = []
        for names, on in ((bounded, True), (counted, False)):
            monkeypatch.setenv(bounded_step.ENV, "1" if on else "0")
            item = KeyedInput(backend.asarray(keys), lengths, None, lengths, None, "sum")
            out, token = api.keyed_lookup(names, names[0] + "_fwd", item, True,
                                          checks="backward")
            values, rows, counts = api.keyed_lookup_grad(names, names[0] + "_bwd", token, out)
            api.apply_keyed_update(names, "lazy_adam", "Adam", {}, HYPER, values, rows, counts)
            results.append((host(out), host(values), host(rows), counts))
        got, want = results
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[3], -(-lengths // 8) * 8)
        got_cuts, want_cuts = np.cumsum([0] + list(got[3])), np.cumsum([0] + list(want[3]))
        for t in range(count):
            mine, theirs = slice(got_cuts[t], got_cuts[t + 1]), slice(want_cuts[t],
                                                                      want_cuts[t + 1])
            assert_gradient_matches(got[1][mine], got[2][mine], want[1][theirs],
                                    want[2][theirs])
        assert_tables_close(bounded, counted)


def test_pooled_group_steps_equal_counted(monkeypatch):
    count = 5
    bounded, counted = make_pair("pooled", count)
    backend = runtime.get().backend
    rng = np.random.default_rng(11)
    for step in range(5):
        inputs, tops = [], []
        for t in range(count):
            n, rows = 700 + 131 * ((t + step) % 3), 256
            keys = rng.integers(0, ROWS + 64 * t, size=n)
            segments = np.sort(rng.integers(0, rows, size=n))
            inputs.append(PooledInput(backend.asarray(keys), backend.asarray(segments), rows,
                                      None, "mean" if t % 2 else "sum"))
            tops.append(backend.asarray(rng.standard_normal((rows, DIM)).astype(np.float32)))
        results = []
        for names, on in ((bounded, True), (counted, False)):
            monkeypatch.setenv(bounded_step.ENV, "1" if on else "0")
            outs, token = api.pooled_lookup(names, names[0] + "_fwd", inputs, True)
            grads = api.pooled_lookup_grad(names, names[0] + "_bwd", token, tops)
            api.apply_optimizer_updates(names, "lazy_adam", "Adam", {}, HYPER,
                                        [v for v, _ in grads], [r for _, r in grads])
            results.append(([host(o) for o in outs], [(host(v), host(r)) for v, r in grads]))
        for a, b in zip(results[0][0], results[1][0]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        for t, ((values, rows), (want_values, want_rows)) in enumerate(
                zip(results[0][1], results[1][1])):
            assert rows.shape[0] == -(-inputs[t].keys.shape[0] // 8) * 8
            assert_gradient_matches(values, rows, want_values, want_rows)
        assert_tables_close(bounded, counted)


def test_keyed_hash_group_steps_equal_counted(monkeypatch):
    """A hash group's keyed training steps, bounded (each member's rows in a piece of its own,
    padded to its keys) and counted, each on tables of the same names made anew (a hash table's
    first values follow from its name and the key; its rows are handed out as the insert's
    threads place keys, so the two ways' rows may differ): outputs, each member's rows and
    gradient sums per step, and the trained vectors of every key agree."""
    count = 4
    names = ["bounded_hash_%d" % t for t in range(count)]
    backend = runtime.get().backend
    rng = np.random.default_rng(17)
    steps = []
    for step in range(5):
        lengths = np.array([700 + 113 * ((t + step) % 3) for t in range(count)])
        steps.append((lengths, rng.integers(0, 3 * ROWS, size=int(lengths.sum()))))
    ways = []
    for on in (True, False):
        monkeypatch.setenv(bounded_step.ENV, "1" if on else "0")
        for name in names:
            api.create_table(name, DIM, 4 * ROWS, True, SPEC, replace=True)
        results = []
        for lengths, keys in steps:
            item = KeyedInput(backend.asarray(keys), lengths, None, lengths, None, "sum")
            out, token = api.keyed_lookup(names, "bounded_hash_fwd", item, True,
                                          checks="backward")
            values, rows, counts = api.keyed_lookup_grad(names, "bounded_hash_bwd", token, out)
            api.apply_keyed_update(names, "lazy_adam", "Adam", {}, HYPER, values, rows, counts)
            values, rows = host(values), host(rows)
            cuts = np.concatenate([[0], np.cumsum(counts)])
            pieces = [(int((rows[a:b] >= 0).sum()), values[a:b][rows[a:b] >= 0].sum(axis=0))
                      for a, b in zip(cuts[:-1], cuts[1:])]
            if on:
                np.testing.assert_array_equal(counts, -(-lengths // 8) * 8)
                assert not values[rows < 0].any()
            results.append((host(out), pieces))
        every = np.unique(np.concatenate([keys for _, keys in steps]))
        lengths = np.full(count, every.shape[0])
        item = KeyedInput(backend.asarray(np.tile(every, count)), lengths, None, lengths, None,
                          "sum")
        trained, _ = api.keyed_lookup(names, "bounded_hash_read", item, False)
        ways.append((results, host(trained)))
    for (got, got_pieces), (want, want_pieces) in zip(ways[0][0], ways[1][0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for (rows, sums), (want_rows, want_sums) in zip(got_pieces, want_pieces):
            assert rows == want_rows
            np.testing.assert_allclose(sums, want_sums, rtol=1e-4, atol=1e-4)  # (sums of ~0)
    np.testing.assert_allclose(ways[0][1], ways[1][1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("checks", ["end", "backward"])
def test_a_bounded_step_waits_once(checks, monkeypatch):
    (bounded,), (counted,) = make_pair("waits_" + checks, 1)
    keys = np.random.default_rng(8).integers(0, ROWS, size=(4096,))
    waits = {}
    for name, on in ((bounded, True), (counted, False)):
        dense_step(name, keys, on, monkeypatch, checks)
        before = runtime.get().stats()["host_waits"]
        dense_step(name, keys, on, monkeypatch, checks)
        waits[on] = runtime.get().stats()["host_waits"] - before
    # host() reads the three results: three waits each, beside the step's own
    assert waits == {True: 3 + 1, False: 3 + 2}


def test_bad_keys_fail_in_the_backward(monkeypatch):
    (bounded,), _ = make_pair("bad", 1)
    monkeypatch.setenv(bounded_step.ENV, "1")
    backend = runtime.get().backend
    before = host(api.shard(bounded).values)
    keys = backend.asarray(np.array([3, ROWS + 7, 5, -2]))
    out, token = api.dense_lookup(bounded, bounded + "_fwd", keys, True, checks="backward")
    with pytest.raises(InvalidInputError, match=bounded):
        api.dense_lookup_grad(bounded, bounded + "_bwd", token, out)
    assert not host(out)[[1, 3]].any()
    np.testing.assert_array_equal(host(api.shard(bounded).values), before)
    with pytest.raises(InvalidInputError, match=bounded):  # the forward reads them itself
        api.dense_lookup(bounded, bounded + "_fwd", keys, True)
