"""The bounded one-rank step (engine/lookup/bounded_step.py, SOK1X_BOUNDED_STEP=1, DESIGN D14)
on the cpu backend, at any number of ranks: over many steps with changing, repeated keys it
equals the counted step bit for bit (outputs, the gradient's rows and values once its padding
is dropped, and every table row and optimizer slot after the updates), for one table looked up
dense and for a table group (of dense or of hash tables) looked up keyed; on one rank its
backward hands back pieces sized
by the keys and the step waits on the host once instead of twice; bad keys fail the step with
today's error and change no table: in the forward, or in the backward where the caller promised
one (and, when it never comes, in the next collective op); the backend's padded layout against
a reference built row by row."""
import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import cpu, random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup import bounded_step, peer_capacity
from sok1x.engine.lookup.keyed import KeyedInput
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError
from step_rules import RULES, hyper

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=31)
DIM, ROWS = 8, 40


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


def make_tables(tag, count, hashed=False):
    """`count` tables made twice with the same rows: (bounded names, counted names); hashed:
    v1 hash tables (a hash group when looked up together)."""
    pair = []
    for way in ("bounded", "counted"):
        names = ["%s_%s_%d" % (way, tag, t) for t in range(count)]
        for t, name in enumerate(names):
            api.create_table(name, DIM, ROWS + 8 * t, hashed, SPEC, replace=True)
        pair.append(names)
    for a, b in zip(*pair):
        api.shard(b).values[...] = api.shard(a).values
    return pair


def dense_step(name, keys, top_scale, rule, step, bounded, monkeypatch, checks="backward"):
    """One dense lookup, backward and update of table `name`: (output, values, rows)."""
    monkeypatch.setenv(bounded_step.ENV, "1" if bounded else "0")
    out, token = api.dense_lookup(name, name + "_fwd", keys, True, checks=checks)
    values, rows = api.dense_lookup_grad(name, name + "_bwd", token, out * top_scale)
    prefix = RULES[rule][0]
    api.apply_optimizer_updates([name], rule, prefix, {}, hyper(rule, step), [values], [rows])
    return np.array(out), np.array(values), np.array(rows)


def keyed_step(names, keys, lengths, top_scale, rule, step, bounded, monkeypatch):
    """One keyed lookup (each key its own output row), backward and update of `names`."""
    monkeypatch.setenv(bounded_step.ENV, "1" if bounded else "0")
    item = KeyedInput(keys, lengths, None, lengths, None, "sum")
    out, token = api.keyed_lookup(names, names[0] + "_fwd", item, True, checks="backward")
    values, rows, counts = api.keyed_lookup_grad(names, names[0] + "_bwd", token,
                                                 out * top_scale)
    api.apply_keyed_update(names, rule, RULES[rule][0], {}, hyper(rule, step), values, rows,
                           counts)
    return np.array(out), np.array(values), np.array(rows), counts


def without_padding(values, rows):
    kept = rows >= 0
    return values[kept], rows[kept]


def assert_tables_equal(bounded, counted, rule):
    for a, b in zip(bounded, counted):
        np.testing.assert_array_equal(api.shard(a).values, api.shard(b).values)
        for slot in RULES[rule][1]:
            np.testing.assert_array_equal(api.shard(a).slot(slot), api.shard(b).slot(slot))


@pytest.mark.parametrize("sized", [False, True])
@pytest.mark.parametrize("rule", ["lazy_adam", "adagrad"])
def test_dense_step_equals_counted(rule, sized, monkeypatch):
    """sized: the lookups sized by per-peer capacities (SOK1X_PEER_CAPACITY=1), which on
    several ranks bounds the backward too (each owner's rows padded to every rank's keys)."""
    monkeypatch.setenv(peer_capacity.ENV, "1" if sized else "0")
    bounded, counted = make_tables("dense_%s_%d" % (rule, sized), 1)
    rng = np.random.default_rng([5, RANK])
    for step in range(1, 8):
        keys = rng.integers(0, ROWS * SIZE, size=(6 + step, 3))  # repeats among them
        scale = np.float32(0.5 + step)
        got = dense_step(bounded[0], keys, scale, rule, step, True, monkeypatch)
        want = dense_step(counted[0], keys, scale, rule, step, False, monkeypatch)
        np.testing.assert_array_equal(got[0], want[0])
        values, rows = without_padding(got[1], got[2])
        np.testing.assert_array_equal(rows, want[2])
        np.testing.assert_array_equal(values, want[1])
        if SIZE == 1:  # one place per key, rounded up to 8, the rest padding
            assert got[2].shape[0] == -(-keys.size // 8) * 8 > want[2].shape[0]
            assert not got[1][got[2] < 0].any()
        elif sized and step > 1:  # a place per key of every rank (at most the shard's rows)
            bound = min(keys.size * SIZE, ROWS, SIZE * caps_here(bounded[0] + "_fwd"))
            assert got[2].shape[0] == -(-bound // 8) * 8 >= want[2].shape[0]
            assert not got[1][got[2] < 0].any()
        else:  # counted: the first lookup of an op sets the caps, or no caps at all
            assert got[2].shape == want[2].shape
        assert_tables_equal(bounded, counted, rule)


def caps_here(op_name):
    """The cap of this rank in the per-peer capacities of one-table lookup `op_name`."""
    with runtime.entered() as rt:
        plan = [p for (name, _, _), p in rt.capacities.items() if name == op_name][0]
        return int(plan.caps[0, RANK])


@pytest.mark.parametrize("hashed, sized", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("rule", ["lazy_adam", "adagrad"])
def test_keyed_group_step_equals_counted(rule, hashed, sized, monkeypatch):
    """A keyed lookup of a group of tables (hashed: of v1 hash tables, a hash group, whose
    rows are handed out as keys arrive): on one rank the bounded backward lays each member's
    rows out in a piece of its own, padded; on any number of ranks the steps equal the counted
    ones. Each way trains tables of the same names made anew (a hash table's first values
    follow from its name and the key)."""
    monkeypatch.setenv(peer_capacity.ENV, "1" if sized else "0")
    count = 5
    names = ["keyed_%s_%d_%d_%d" % (rule, hashed, sized, t) for t in range(count)]
    rng = np.random.default_rng([9, RANK])
    steps = []
    for step in range(1, 7):
        lengths = np.array([(3 * t + step) % 7 + (t != 2) for t in range(count)])  # one empty
        steps.append((lengths, np.concatenate([rng.integers(0, (ROWS + 8 * t) * SIZE, size=n)
                                               for t, n in enumerate(lengths)])))
    ways = []
    for bounded in (True, False):
        for t, name in enumerate(names):
            api.create_table(name, DIM, ROWS + 8 * t, hashed, SPEC, replace=True)
        results = [keyed_step(names, keys, lengths, np.float32(1.5 - 0.1 * step), rule, step,
                              bounded, monkeypatch)
                   for step, (lengths, keys) in enumerate(steps, 1)]
        ways.append((results, [(np.array(api.shard(n).values),
                                [np.array(api.shard(n).slot(s)) for s in RULES[rule][1]])
                               for n in names]))
    for number, ((lengths, _), got, want) in enumerate(zip(steps, ways[0][0], ways[1][0]), 1):
        np.testing.assert_array_equal(got[0], want[0])
        got_cuts = np.concatenate([[0], np.cumsum(got[3])])
        want_cuts = np.concatenate([[0], np.cumsum(want[3])])
        for t in range(count):
            values, rows = without_padding(got[1][got_cuts[t]:got_cuts[t + 1]],
                                           got[2][got_cuts[t]:got_cuts[t + 1]])
            np.testing.assert_array_equal(rows, want[2][want_cuts[t]:want_cuts[t + 1]])
            np.testing.assert_array_equal(values, want[1][want_cuts[t]:want_cuts[t + 1]])
        if SIZE == 1:
            np.testing.assert_array_equal(got[3], -(-lengths // 8) * 8)
        elif sized and number > 1:  # each member's piece: every rank's keys of it
            told = np.sum(COMM.allgather(lengths), axis=0)
            shard_rows = np.array([ROWS + 8 * t for t in range(count)])
            np.testing.assert_array_equal(got[3], -(-np.minimum(told, shard_rows) // 8) * 8)
    for (values, slots), (want_values, want_slots) in zip(ways[0][1], ways[1][1]):
        np.testing.assert_array_equal(values, want_values)
        for slot, want_slot in zip(slots, want_slots):
            np.testing.assert_array_equal(slot, want_slot)


@pytest.mark.parametrize("rule", ["lazy_adam", "adagrad"])
def test_pooled_group_step_equals_counted(rule, monkeypatch):
    """A pooled lookup (segment ids, sum and mean) of a group: each table's gradient comes as
    its own piece, padded; the update takes the pieces as they are."""
    count = 4
    bounded, counted = make_tables("pooled_" + rule, count)
    rng = np.random.default_rng([13, RANK])
    for step in range(1, 6):
        inputs, tops = [], []
        for t in range(count):
            n, rows = 4 + (t + step) % 5, 3
            keys = rng.integers(0, (ROWS + 8 * t) * SIZE, size=n)
            segments = np.sort(rng.integers(0, rows, size=n))
            inputs.append(PooledInput(keys, segments, rows, None, "mean" if t % 2 else "sum"))
            tops.append(rng.standard_normal((rows, DIM)).astype(np.float32))
        results = []
        for names, on in ((bounded, True), (counted, False)):
            monkeypatch.setenv(bounded_step.ENV, "1" if on else "0")
            outs, token = api.pooled_lookup(names, names[0] + "_fwd", inputs, True)
            grads = api.pooled_lookup_grad(names, names[0] + "_bwd", token, tops)
            api.apply_optimizer_updates(names, rule, RULES[rule][0], {}, hyper(rule, step),
                                        [v for v, _ in grads], [r for _, r in grads])
            results.append(([np.array(o) for o in outs],
                            [(np.array(v), np.array(r)) for v, r in grads]))
        for a, b in zip(results[0][0], results[1][0]):
            np.testing.assert_array_equal(a, b)
        for t, ((values, rows), (want_values, want_rows)) in enumerate(zip(*[r[1] for r in
                                                                              results])):
            got_values, got_rows = without_padding(values, rows)
            order = np.argsort(want_rows, kind="stable")
            np.testing.assert_array_equal(got_rows, want_rows[order])
            np.testing.assert_array_equal(got_values, want_values[order])
            if SIZE == 1:
                assert rows.shape[0] == -(-inputs[t].keys.shape[0] // 8) * 8
        assert_tables_equal(bounded, counted, rule)


@pytest.mark.parametrize("checks", ["end", "backward"])
def test_one_rank_step_waits_once(checks, monkeypatch):
    """Counted, the forward waits for its checks and the backward for its rows' count. Bounded
    on one rank, the backward counts nothing, and the checks are read once the forward's gather
    is queued (checks="end") or once the backward's work is (checks="backward")."""
    bounded, counted = make_tables("waits_" + checks, 1)
    keys = np.arange(12) % (ROWS * SIZE)
    waits = {}
    for name, on in ((bounded[0], True), (counted[0], False)):
        dense_step(name, keys, np.float32(1), "adagrad", 1, on, monkeypatch, checks)  # warm
        before = runtime.get().stats()["host_waits"]
        dense_step(name, keys, np.float32(1), "adagrad", 2, on, monkeypatch, checks)
        waits[on] = runtime.get().stats()["host_waits"] - before
    assert waits[False] == 2
    assert waits[True] == (1 if SIZE == 1 else 2)


@pytest.mark.parametrize("checks", ["end", "backward"])
def test_bad_keys_fail_the_step_and_change_nothing(checks, monkeypatch):
    """checks="end": the forward fails, as counted; "backward": the backward fails (the forward
    gave zeros for the bad key, reading nothing out of place)."""
    bounded, _ = make_tables("bad_" + checks, 1)
    name = bounded[0]
    monkeypatch.setenv(bounded_step.ENV, "1")
    before = api.shard(name).values.copy()
    keys = np.array([1, 2, ROWS * SIZE + 5, 3])  # past the table
    failed_in = None
    with pytest.raises(InvalidInputError, match=name):
        failed_in = "forward"
        out, token = api.dense_lookup(name, name + "_fwd", keys, True, checks=checks)
        np.testing.assert_array_equal(np.asarray(out)[2], 0)
        failed_in = "backward"
        api.dense_lookup_grad(name, name + "_bwd", token, out)
    assert failed_in == ("backward" if checks == "backward" and SIZE == 1 else "forward")
    np.testing.assert_array_equal(api.shard(name).values, before)
    assert not runtime.get().unread_checks
    dense_step(name, keys[[0, 1, 3]], np.float32(1), "adagrad", 1, True, monkeypatch, checks)


def test_a_promised_backward_that_never_comes_fails_the_next_op(monkeypatch):
    bounded, _ = make_tables("lone", 1)
    name = bounded[0]
    monkeypatch.setenv(bounded_step.ENV, "1")
    with pytest.raises(InvalidInputError, match="no backward pass" if SIZE == 1 else name):
        api.dense_lookup(name, name + "_fwd", np.array([-3, 1]), True, checks="backward")
        api.dense_lookup(name, name + "_fwd", np.array([0, 1]), True)
    assert not runtime.get().unread_checks


def padded_reference(rows, bound, row_starts, piece_starts):
    """distinct_rows_padded built one range at a time."""
    flat = np.full(piece_starts[-1], -1)
    local, inverse = flat.copy(), np.full(len(rows), -1)
    for t in range(len(row_starts) - 1):
        low, high = row_starts[t], min(row_starts[t + 1], bound)
        mine = sorted({int(r) for r in rows if low <= r < high})
        room = piece_starts[t + 1] - piece_starts[t]
        for place, row in enumerate(mine[:room]):
            flat[piece_starts[t] + place] = row
            local[piece_starts[t] + place] = row - low
            inverse[np.asarray(rows) == row] = piece_starts[t] + place
    return flat, local, inverse


@pytest.mark.parametrize("seed", range(6))
def test_padded_layout(seed):
    rng = np.random.default_rng(seed)
    members = 1 + seed % 4
    row_starts = np.concatenate([[0], np.cumsum(rng.integers(0, 30, size=members))])
    lengths = rng.integers(0, 20, size=members)
    piece_starts = bounded_step.piece_starts(np.concatenate([[0], np.cumsum(lengths)]))
    bound = int(row_starts[-1])
    rows = rng.integers(-2, bound + 3, size=int(lengths.sum()) + seed)  # some out of range
    got = cpu.distinct_rows_padded(rows, bound, row_starts, piece_starts)
    for a, b in zip(got, padded_reference(rows, bound, row_starts, piece_starts)):
        np.testing.assert_array_equal(a, b)
    assert np.all(piece_starts % 8 == 0)


@pytest.mark.parametrize("grouped", [False, True])
def test_padded_rows_handed_back_as_copies_are_skipped(grouped, monkeypatch):
    """A framework may hand the update a copy of the backward's rows (not their memory): rows -1
    are padding there too, skipped, whether the update goes per table or through a group."""
    count = 3 if grouped else 1
    bounded, counted = make_tables("copies_%d" % grouped, count)
    rng = np.random.default_rng([21, RANK])
    values = [rng.standard_normal((10, DIM)).astype(np.float32) for _ in range(count)]
    rows = [np.unique(rng.integers(0, ROWS, size=7)) for _ in range(count)]
    padded_values = [np.concatenate([v[:len(r)], np.zeros((3, DIM), np.float32)])
                     for v, r in zip(values, rows)]
    padded_rows = [np.concatenate([r, [-1, -1, -1]]) for r in rows]
    api.apply_optimizer_updates(bounded, "adagrad", "Adagrad", {}, hyper("adagrad", 1),
                                padded_values, padded_rows)
    api.apply_optimizer_updates(counted, "adagrad", "Adagrad", {}, hyper("adagrad", 1),
                                [v[:len(r)] for v, r in zip(values, rows)], rows)
    assert_tables_equal(bounded, counted, "adagrad")
    if grouped:  # the keyed form's joined rows and counts
        counts = np.array([len(r) for r in padded_rows])
        api.apply_keyed_update(bounded, "adagrad", "Adagrad", {}, hyper("adagrad", 2),
                               np.concatenate(padded_values), np.concatenate(padded_rows), counts)
        api.apply_keyed_update(counted, "adagrad", "Adagrad", {}, hyper("adagrad", 2),
                               np.concatenate([v[:len(r)] for v, r in zip(values, rows)]),
                               np.concatenate(rows), np.array([len(r) for r in rows]))
        assert_tables_equal(bounded, counted, "adagrad")
