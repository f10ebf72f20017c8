"""The replayed keyed step (engine/lookup/replayed_step.py through engine/lookup/keyed.py,
SOK1X_CAPTURE, DESIGN D14) on the cpu backend, at any number of ranks: a keyed lookup of a table

group (each key its own output row), its backward and its keyed update, run with replay=True
under the bounded step, equal the same step run uncaptured on a copy of the tables bit for bit
(outputs, the padded gradient's values, rows and counts, every row and optimizer slot) over many
steps with changing keys, an empty member among them, with the top gradient the output itself
or another array, reading the checks in the backward or at the lookup's end; on one rank the
class is really recorded and replayed (held, its update counted); a keyed lookup of one table
replays as well; a new layout of the keys is a new shape class; a bad key of one member fails
the step naming that member, changes no table, and the replays go on after; every optimizer
rule is replayed with each step's hyper-parameters; changed (clipped) gradient values take the
uncaptured update and still agree; pooled keys (segment ids, sum and mean) and weighted ones
replay on one rank when the forward reads its checks at its end, and agree, a bad segment id
failing its replayed step; int32 keys are not replayed and agree; first sightings of layouts
are forgotten past a bound; a keyed group and a dense table of another dim replay in the
same steps; on several ranks the steps are sized by per-peer capacities (SOK1X_PEER_CAPACITY=1)
and replay the same way, hash groups too, a full hybrid group's evicting steps among them
(each owner's victims bounded by every rank's keys, its counts read and agreed on in the next
op header: a step whose new keys find no victim fails every rank): an owner whose
replayed insert is not ready runs it uncaptured while its peers replay, and a step whose keys
overflow a cap runs the counted way and the class is recorded again."""
import os

import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup import (bounded_step, key_exchange, keyed, peer_capacity,
                                 replayed_ranks, replayed_step, table_group)
from sok1x.engine.checkpoint import tables as checkpoint_tables
from sok1x.engine.lookup.keyed import KeyedInput
from sok1x.engine.op_order import OpId
from sok1x.engine.tables import dynamic_table, hybrid_rows, optimizer_updates
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.errors import InvalidInputError, TableFullError
from step_rules import RULES, every_rule_hyper, hyper  # noqa: F401


COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=43)
DIM, ROWS, MEMBERS = 8, 24, 4
LENGTHS = np.array([5, 3, 0, 7])  # one member without keys


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


@pytest.fixture(autouse=True)
def bounded(monkeypatch):
    monkeypatch.setenv(bounded_step.ENV, "1")
    monkeypatch.setenv(peer_capacity.ENV, "1")  # on several ranks: sized by per-peer caps
    monkeypatch.delenv(replayed_step.ENV, raising=False)


def member_rows(t):
    return ROWS + 8 * t


def make_tables(tag, count=MEMBERS):
    """`count` tables made twice with the same rows: (replayed names, uncaptured names)."""
    pair = []
    for way in ("replayed", "uncaptured"):
        names = ["%s_%s_%d" % (way, tag, t) for t in range(count)]
        for t, name in enumerate(names):
            api.create_table(name, DIM, member_rows(t), False, SPEC, replace=True)
        pair.append(names)
    for a, b in zip(*pair):
        api.shard(b).values[...] = api.shard(a).values
    return pair


def keys_of(rng, lengths):
    return np.concatenate([rng.integers(0, member_rows(t) * SIZE, size=n)
                           for t, n in enumerate(lengths)]).astype(np.int64)


def step(names, keys, lengths, scale, rule, number, replay, checks="backward", prefix=None,
         given=None, clip=None, segment_ids=None, weights=None):
    """A keyed lookup, backward and keyed update of `names`; returns host copies of (output,
    values, rows, counts). scale None: the output itself is the top gradient; clip: the update
    gets the values times it; prefix and given: as RULES' and step_rules.hyper's;
    checks="tower": "backward", the lookup and its backward the first two ops of a tower (as a
    graph's are: the backward opens no step), not two ops named alone."""
    ops = [names[0] + "_fwd", names[0] + "_bwd"]
    if checks == "tower":
        checks, ops = "backward", [OpId(op, names[0], place) for place, op in enumerate(ops)]
    segments = lengths if segment_ids is None else np.array(
        [int(s.max()) + 1 if s.size else 0 for s in np.split(segment_ids, np.cumsum(lengths)[:-1])])
    item = KeyedInput(keys, lengths, segment_ids, segments, weights, "sum")
    out, token = api.keyed_lookup(names, ops[0], item, True, checks=checks, replay=replay)
    copied = np.array(out)  # a replayed output is rewritten by the next replay
    grads = out if scale is None else out * scale
    values, rows, counts = api.keyed_lookup_grad(names, ops[1], token, grads)
    copies = np.array(values), np.array(rows), np.array(counts)
    api.apply_keyed_update(names, rule, prefix or RULES[rule][0], {},
                           given or hyper(rule, number),
                           values if clip is None else values * clip, rows, counts)
    return (copied,) + copies


def assert_same_tables(pair):
    for a, b in zip(*pair):
        x, y = api.shard(a), api.shard(b)
        np.testing.assert_array_equal(x.values, y.values)
        assert sorted(x.slots) == sorted(y.slots)
        for slot in x.slots:
            np.testing.assert_array_equal(x.slots[slot], y.slots[slot])


def run_both(pair, keys, lengths, scale, rule, number, **options):
    got = step(pair[0], keys, lengths, scale, rule, number, True, **options)
    want = step(pair[1], keys, lengths, scale, rule, number, False, **options)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert_same_tables(pair)
    return got


def held():
    with runtime.entered() as rt:
        return replayed_step.classes_held(rt), replayed_step.updates_recorded(rt)


def fresh():
    """No class held, and no op's per-peer caps set: a run after it, of tables and ops named as
    an earlier run's, sets its own at its first step, as that run did."""
    with runtime.entered() as rt:
        replayed_step.free(rt)
        rt.capacities.clear()


@pytest.mark.parametrize("rule", ["lazy_adam", "adagrad"])
@pytest.mark.parametrize("top", ["output", "scaled"])
@pytest.mark.parametrize("checks", ["backward", "end"])
def test_replayed_keyed_group_equals_uncaptured(rule, top, checks):
    pair = make_tables("equal_%s_%s_%s" % (rule, top, checks))
    rng = np.random.default_rng([3, RANK])
    for number in range(1, 11):
        scale = None if top == "output" else np.float32(0.5 + 0.25 * number)
        got = run_both(pair, keys_of(rng, LENGTHS), LENGTHS, scale, rule, number, checks=checks)
        if SIZE == 1:  # a piece per member, its keys rounded up to 8
            np.testing.assert_array_equal(got[3], [8, 8, 0, 8])
    assert held() == (1, 1)  # recorded at the second step, replayed since, the update
    # from the fourth


def test_a_keyed_lookup_of_one_table_replays():
    fresh()
    pair = make_tables("one", count=1)
    rng = np.random.default_rng([5, RANK])
    for number in range(1, 8):
        run_both(pair, keys_of(rng, [19]), np.array([19]), np.float32(1.25), "lazy_adam",
                 number)
    assert held() == (1, 1)


def test_a_new_layout_is_a_new_shape_class():
    fresh()
    pair = make_tables("layouts")
    rng = np.random.default_rng([7, RANK])
    layouts = [LENGTHS, np.array([3, 5, 0, 7]), LENGTHS, np.array([1, 1, 1, 1])]
    for number in range(1, 13):
        lengths = layouts[(number // 2) % len(layouts)]
        run_both(pair, keys_of(rng, lengths), lengths, None, "adagrad", number)
    assert held()[0] == 3


@pytest.mark.parametrize("checks", ["backward", "end"])
def test_a_bad_key_of_one_member_fails_the_replayed_step(checks):
    pair = make_tables("bad_" + checks)
    rng = np.random.default_rng([11, RANK])
    for number in range(1, 5):
        run_both(pair, keys_of(rng, LENGTHS), LENGTHS, None, "adagrad", number, checks=checks)
    before = [api.shard(name).values.copy() for name in pair[0]]
    for member, bad in ((3, member_rows(3) * SIZE + 1), (1, -2)):
        keys = keys_of(rng, LENGTHS)
        if RANK == SIZE - 1:  # one rank's key past its member's table, or negative
            keys[int(np.sum(LENGTHS[:member]))] = bad
        with pytest.raises(InvalidInputError, match=pair[0][member]):
            step(pair[0], keys, LENGTHS, None, "adagrad", 5, True, checks=checks)
        for name, values in zip(pair[0], before):
            np.testing.assert_array_equal(api.shard(name).values, values)
    for number in range(5, 9):  # the uncaptured tables skipped the failed steps too
        run_both(pair, keys_of(rng, LENGTHS), LENGTHS, None, "adagrad", number, checks=checks)
    assert held()[1] >= 1


def _bad_keys(rng):
    """Keys of LENGTHS with one of member 3's past its table (on the last rank)."""
    keys = keys_of(rng, LENGTHS)
    if RANK == SIZE - 1:
        keys[int(np.sum(LENGTHS[:3]))] = member_rows(3) * SIZE + 1
    return keys


def _forward(names, keys):
    """A replayed keyed lookup of `names` whose checks its backward reads: (output, token)."""
    item = KeyedInput(keys, LENGTHS, None, LENGTHS, None, "sum")
    return api.keyed_lookup(names, names[0] + "_fwd", item, True, checks="backward",
                            replay=True)


def _halves(names, keys):
    """_forward and its backward: (values, rows, counts)."""
    out, token = _forward(names, keys)
    return api.keyed_lookup_grad(names, names[0] + "_bwd", token, out)


def _warmed_pair(tag, seed, rule):
    """On one rank (skipped on several), a pair of tables (make_tables) trained 5 steps by
    run_both with `rule`, so that the lookup, its backward and its update replay: (pair,
    rng)."""
    if SIZE > 1:
        pytest.skip("a backward leaves its checks to its update on one rank only")
    fresh()
    pair = make_tables(tag)
    rng = np.random.default_rng([seed, RANK])
    for number in range(1, 6):
        run_both(pair, keys_of(rng, LENGTHS), LENGTHS, None, rule, number)
    return pair, rng


def _state_of(names):
    return [(api.shard(name).values.copy(),
             {slot: array.copy() for slot, array in api.shard(name).slots.items()})
            for name in names]


def _assert_state(names, state):
    for name, (values, slots) in zip(names, state):
        np.testing.assert_array_equal(api.shard(name).values, values)
        assert sorted(api.shard(name).slots) == sorted(slots)
        for slot, array in slots.items():
            np.testing.assert_array_equal(api.shard(name).slots[slot], array)


@pytest.mark.parametrize("update", ["replayed", "clipped"])
def test_a_replayed_steps_bad_key_fails_its_update_which_changes_nothing(update):
    """On one rank a replayed backward leaves its forward's checks to its update (its recorded
    work drops its rows on the device where they failed): the backward returns, the update
    raises the bad key's error and no table changes; clipped values (the uncaptured update)
    read them before changing anything. The replays go on after, equal to the uncaptured."""
    pair, rng = _warmed_pair("left_" + update, 13, "lazy_adam")
    before = _state_of(pair[0])
    values, rows, counts = _halves(pair[0], _bad_keys(rng))
    with runtime.entered() as rt:
        assert [d.left for d in rt.unread_checks] == [bounded_step.NO_UPDATE]
    with pytest.raises(InvalidInputError, match=pair[0][3]):
        api.apply_keyed_update(pair[0], "lazy_adam", RULES["lazy_adam"][0], {},
                               hyper("lazy_adam", 6),
                               values if update == "replayed" else values * np.float32(0.5),
                               rows, counts)
    _assert_state(pair[0], before)
    with runtime.entered() as rt:
        assert not rt.unread_checks
    for number in range(6, 10):
        run_both(pair, keys_of(rng, LENGTHS), LENGTHS, None, "lazy_adam", number)


def test_a_replayed_backward_whose_update_never_came_fails_at_the_next_op():
    """The checks a replayed backward left to its update are read by the next op where no
    update comes: it raises the bad key's error, saying so, and the step changes nothing."""
    pair, rng = _warmed_pair("no_update", 17, "adagrad")
    before = _state_of(pair[0])
    _halves(pair[0], _bad_keys(rng))
    with pytest.raises(InvalidInputError, match=r"an op before its update(.|\n)*%s" % pair[0][3]):
        step(pair[0], keys_of(rng, LENGTHS), LENGTHS, None, "adagrad", 6, True)
    _assert_state(pair[0], before)
    for number in range(6, 10):
        run_both(pair, keys_of(rng, LENGTHS), LENGTHS, None, "adagrad", number)


def test_an_update_that_moves_every_row_leaves_no_check_to_it():
    """Adam's update moves every row, whatever rows a failed step drops: its replayed backward
    still reads its forward's checks itself, and a bad key fails there, changing nothing."""
    if SIZE > 1:
        pytest.skip("a backward leaves its checks to its update on one rank only")
    fresh()
    names = make_tables("every_row")[0]
    rng = np.random.default_rng([19, RANK])
    for number in range(1, 6):
        api.apply_keyed_update(names, "adam", "Adam", {}, every_rule_hyper("adam", number),
                               *_halves(names, keys_of(rng, LENGTHS)))
    before = _state_of(names)
    with pytest.raises(InvalidInputError, match=names[3]):
        _halves(names, _bad_keys(rng))
    _assert_state(names, before)
    with runtime.entered() as rt:
        assert not rt.unread_checks


def test_a_bad_key_of_another_group_fails_an_update_before_it_changes_anything():
    """Two groups, each a lookup, backward and update replayed: where group A's update comes
    after group B's backward left B's checks to B's update, A's update reads them before its
    own work is queued (A's is predicated on A's checks alone): B's bad key fails it, and
    neither group changes."""
    if SIZE > 1:
        pytest.skip("a backward leaves its checks to its update on one rank only")
    fresh()
    first, second = make_tables("other_a")[0], make_tables("other_b")[0]
    rng = np.random.default_rng([23, RANK])
    for number in range(1, 6):
        for names in (first, second):
            step(names, keys_of(rng, LENGTHS), LENGTHS, None, "lazy_adam", number, True)
    before = _state_of(first) + _state_of(second)
    gradient = _halves(first, keys_of(rng, LENGTHS))
    _halves(second, _bad_keys(rng))
    with pytest.raises(InvalidInputError, match=second[3]):
        api.apply_keyed_update(first, "lazy_adam", "Adam", {}, hyper("lazy_adam", 6),
                               *gradient)
    _assert_state(first + second, before)


def test_an_update_after_its_lookups_next_forward_still_applies():
    """An update that comes after the next forward of its lookup (whose replay rewrote the
    flags its recorded work is predicated on) takes the uncaptured path: it applies its own
    step's gradient as the uncaptured step does, whatever that next forward's keys."""
    pair, rng = _warmed_pair("late_update", 29, "lazy_adam")
    keys = keys_of(rng, LENGTHS)
    gradient = _halves(pair[0], keys)
    _, late_token = _forward(pair[0], _bad_keys(rng))
    api.apply_keyed_update(pair[0], "lazy_adam", "Adam", {}, hyper("lazy_adam", 6), *gradient)
    with pytest.raises(InvalidInputError, match=pair[0][3]):  # its own backward reads them
        api.keyed_lookup_grad(pair[0], pair[0][0] + "_bwd", late_token,
                              np.zeros((int(LENGTHS.sum()), DIM), np.float32))
    step(pair[1], keys, LENGTHS, None, "lazy_adam", 6, False)
    assert_same_tables(pair)


@pytest.mark.parametrize("rule", sorted(optimizer_updates.RULES))
def test_every_rule_is_replayed_with_each_steps_hyper_parameters(rule):
    fresh()
    pair = make_tables("rule_" + rule)
    rng = np.random.default_rng([13, RANK])
    for number in range(1, 8):
        run_both(pair, keys_of(rng, LENGTHS), LENGTHS, np.float32(0.75), rule, number,
                 prefix="R", given=every_rule_hyper(rule, number))
    assert held() == (1, 1)


def test_clipped_values_take_the_uncaptured_update():
    fresh()
    pair = make_tables("clipped")
    rng = np.random.default_rng([17, RANK])
    for number in range(1, 8):
        run_both(pair, keys_of(rng, LENGTHS), LENGTHS, None, "lazy_adam", number,
                 clip=np.float32(0.5))
    assert held() == (1, 0)


@pytest.mark.parametrize("checks", ["end", "backward"])
@pytest.mark.parametrize("kind", ["segment_ids", "weights"])
def test_pooled_or_weighted_keys(kind, checks):
    """Pooled keys (segment ids) and weighted ones replay (their pooling after the replay,
    spread again before the replayed backward): on several ranks, where the op header reads the
    checks, and on one rank when the forward reads them at its end; on one rank reading them in
    the backward, they run uncaptured. Every step agrees with the uncaptured one."""
    fresh()
    pair = make_tables("pooled_%s_%s" % (kind, checks))
    rng = np.random.default_rng([19, RANK])
    for number in range(1, 7):
        keys = keys_of(rng, LENGTHS)
        options = {"checks": checks}
        if kind == "segment_ids":
            options["segment_ids"] = np.concatenate([np.arange(n) // 2 for n in LENGTHS])
        else:
            options["weights"] = rng.random(keys.size).astype(np.float32)
        run_both(pair, keys, LENGTHS, np.float32(2.0), "adagrad", number, **options)
    assert held() == ((1, 1) if SIZE > 1 or checks == "end" else (0, 0))


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_a_replayed_pooled_step_equals_the_uncaptured_one(combiner):
    """Segment ids that change from step to step (rows of a few keys, empty rows; as many rows
    each step: a new number of rows is a new shape class), with sum and mean, replay and agree
    bit for bit; a segment id out of its member's rows on the last
    rank in a replayed step fails it on every rank, naming the member, and changes no table;
    the replays go on after."""
    fresh()
    pair = make_tables("pooled_rows_" + combiner)
    rng = np.random.default_rng([29, RANK])

    def segments_of(lengths):
        parts = []
        for n in lengths:
            rows = np.sort(rng.integers(0, max(1, int(n) // 2 + 1), size=n))
            parts.append(rows)
        return np.concatenate(parts).astype(np.int64)

    def rows_of(segment_ids):  # as many output rows each step (a batch), the last one empty
        del segment_ids
        return np.array([int(n) // 2 + 2 if n else 0 for n in LENGTHS])

    def both(keys, segment_ids, number, replay_only=False, segments=None):
        segments = rows_of(segment_ids) if segments is None else segments
        outs = []
        for names, replay in ((pair[0], True), (pair[1], False))[:1 if replay_only else 2]:
            item = KeyedInput(keys, LENGTHS, segment_ids, segments, None, combiner)
            out, token = api.keyed_lookup(names, names[0] + "_fwd", item, True, replay=replay)
            copied = np.array(out)
            values, rows, counts = api.keyed_lookup_grad(names, names[0] + "_bwd", token,
                                                         out * np.float32(1.5))
            api.apply_keyed_update(names, "lazy_adam", "Adam", {}, hyper("lazy_adam", number),
                                   values, rows, counts)
            outs.append((copied, np.array(values), np.array(rows), np.array(counts)))
        return outs

    for number in range(1, 11):
        keys = keys_of(rng, LENGTHS)
        segment_ids = segments_of(LENGTHS)
        if number == 6:  # a bad segment id in a replayed step
            bad = segment_ids.copy()
            if RANK == SIZE - 1:
                bad[LENGTHS[0]] = 99  # member 1's first key
            before = [np.array(api.shard(name).values) for name in pair[0]]
            with pytest.raises(InvalidInputError, match="_1: a key belongs to output row 99"):
                both(keys, bad, number, replay_only=True, segments=rows_of(segment_ids))
            for name, rows in zip(pair[0], before):
                np.testing.assert_array_equal(api.shard(name).values, rows)
        got, want = both(keys, segment_ids, number)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        assert_same_tables(pair)
    assert held() == (1, 1)


def test_int32_keys_are_not_replayed():
    """int32 keys take the uncaptured path (widened into a new array at each run, their key
    checks could not be recorded on cuda) and agree."""
    fresh()
    pair = make_tables("int32")
    rng = np.random.default_rng([23, RANK])
    for number in range(1, 6):
        run_both(pair, keys_of(rng, LENGTHS).astype(np.int32), LENGTHS, None, "adagrad", number)
    assert held() == (0, 0)


def test_first_sightings_are_forgotten_past_a_bound(monkeypatch):
    """Layouts seen once each (a last batch of an epoch, say) do not pile up: past
    _SIGHTINGS_KEPT the first sightings are forgotten, and a layout seen twice in a row is still
    recorded."""
    monkeypatch.setattr(replayed_step, "_SIGHTINGS_KEPT", 4)
    fresh()
    pair = make_tables("sightings")
    rng = np.random.default_rng([29, RANK])
    for number in range(1, 10):
        lengths = np.array([number, 2, 0, 1])
        run_both(pair, keys_of(rng, lengths), lengths, None, "adagrad", number)
        with runtime.entered() as rt:
            assert rt.replays is None or len(rt.replays.sightings) <= 4
    for number in range(10, 13):  # as many keys for each owner: no cap overflows at any size
        keys = np.concatenate([rng.integers(0, member_rows(t), size=n) * SIZE + np.arange(n) % SIZE
                               for t, n in enumerate(LENGTHS)]).astype(np.int64)
        run_both(pair, keys, LENGTHS, None, "adagrad", number)
    assert held()[0] == 1


def dense_step(name, keys, number, replay):
    """A dense lookup, backward and LazyAdam update of table `name`: host (output, values,
    rows)."""
    out, token = api.dense_lookup(name, name + "_fwd", keys, True, checks="backward",
                                  replay=replay)
    copied = np.array(out)
    values, rows = api.dense_lookup_grad(name, name + "_bwd", token, out)
    got = copied, np.array(values), np.array(rows)
    api.apply_optimizer_updates([name], "lazy_adam", "Adam", {}, hyper("lazy_adam", number),
                                [values], [rows])
    return got


def test_a_keyed_group_and_a_dense_table_of_another_dim_replay_in_one_step():
    """A keyed group (dim DIM) and a dense lookup of a table of dim 12 in the same steps: both
    replayed on one rank, each equal to its uncaptured twin."""
    fresh()
    pair = make_tables("beside")
    dense = ["replayed_beside_dense", "uncaptured_beside_dense"]
    for name in dense:
        api.create_table(name, 12, ROWS, False, SPEC, replace=True)
    api.shard(dense[1]).values[...] = api.shard(dense[0]).values
    rng = np.random.default_rng([31, RANK])
    for number in range(1, 8):
        run_both(pair, keys_of(rng, LENGTHS), LENGTHS, None, "lazy_adam", number)
        keys = rng.integers(0, ROWS * SIZE, size=9)
        for a, b in zip(dense_step(dense[0], keys, number, True),
                        dense_step(dense[1], keys, number, False)):
            np.testing.assert_array_equal(a, b)
        assert_same_tables([[dense[0]], [dense[1]]])
    assert held() == (2, 2)


@pytest.mark.parametrize("given", ["array", "list"])
def test_a_known_layout_skips_the_host_checks(monkeypatch, given):
    """From its first replay on, a keyed step of a layout seen before (lengths and num_segments
    given alike, as arrays or as lists) skips the host's layout checks, which it passed then;
    another layout is checked, and every step equals the uncaptured one; a table declared on
    the last rank and never made there (as one that could not be made) changes none of it."""
    fresh()
    pair = make_tables("known_" + given)
    if RANK == SIZE - 1:
        api.create_table("known_never_made", DIM, ROWS, False, SPEC, replace=True)
    rng = np.random.default_rng([47, RANK])
    checked = []
    original = keyed._normalized
    monkeypatch.setattr(keyed, "_normalized",
                        lambda backend, tables, item: checked.append(tables[0].name)
                        or original(backend, tables, item))
    other = np.array([2, 2, 2, 2])
    skipped = []
    for number in range(1, 11):
        lengths = other if number == 7 else LENGTHS
        if given == "list":
            lengths = [int(n) for n in lengths]
        run_both(pair, keys_of(rng, lengths), lengths, None, "lazy_adam", number)
        skipped.append(pair[0][0] not in checked)
        checked.clear()
    # first sight, recorded, first replay; known; the other layout's first sight; known
    assert skipped == [False] * 3 + [True] * 3 + [False] + [True] * 3


def hash_steps(tag, steps, replay, capacity, checks="backward", bad_step=None, dynamic=None,
               uncaptured=()):
    """A keyed step of v1 hash tables (a hash group that does not evict) for each keys of
    `steps`, on tables made anew under names of `tag` (a hash table's first values follow from
    its name), replay=True or not; bad_step: the index of a step whose keys hold a negative key
    of member 1 on the last rank, which must fail (InvalidInputError, naming that member) and
    change nothing; dynamic: None, or the tables' DynamicVariable settings (make_dynamic);
    uncaptured: the indexes of steps that take the uncaptured path (replay=False) anyway.
    Returns (each step's host results, or None for the failed one, each table's held values,
    slots and size at the end, held())."""
    fresh()
    names = ["hash_%s_%d" % (tag, t) for t in range(MEMBERS)]
    for name in names:
        api.create_table(name, DIM, capacity, True, SPEC, replace=True, dynamic=dynamic)
    results = []
    for number, keys in enumerate(steps, 1):
        if number - 1 != bad_step:
            results.append(step(names, keys, LENGTHS, np.float32(0.75), "lazy_adam", number,
                                replay and number - 1 not in uncaptured, checks=checks))
            continue
        keys = keys.copy()
        if RANK == SIZE - 1:
            keys[int(LENGTHS[0])] = -4
        before = [held_rows(n) for n in names]
        with pytest.raises(InvalidInputError, match=names[1]):
            step(names, keys, LENGTHS, np.float32(0.75), "lazy_adam", number, replay,
                 checks=checks)
        for name, (values, slots, size) in zip(names, before):
            assert api.shard(name).index.size == size
            np.testing.assert_array_equal(held_rows(name)[0], values)
            for slot, want in slots.items():
                np.testing.assert_array_equal(held_rows(name)[1][slot], want)
        results.append(None)
    return results, [held_rows(n) for n in names], held()


def held_rows(name):
    """(values, {slot: rows}, size) of a hash table's held rows: rows are handed out in
    arrival order, so its size's first rows (a failed step's inserted keys erased again leave
    their rows past the size, as an uncaptured step that fails after its insert does)."""
    shard = api.shard(name)
    size = shard.index.size
    return (whole(shard.values)[:size].copy(),
            {s: whole(a)[:size].copy() for s, a in shard.slots.items()}, size)


def whole(array):
    """A shard's rows as one array (a split one's on cpu: its rows in order, both parts)."""
    return array.whole if hybrid_rows.is_split(array) else array


def hash_keys(seed, steps, span):
    """Each step's keys: LENGTHS of each member, drawn from `span` values (new ones arrive)."""
    rng = np.random.default_rng([seed, RANK])
    return [np.concatenate([rng.integers(0, span, size=n) for n in LENGTHS]).astype(np.int64)
            for _ in range(steps)]


def assert_same_hash_runs(got, want):
    for a, b in zip(got[0], want[0]):
        assert (a is None) == (b is None)
        for x, y in zip(a or (), b or ()):
            np.testing.assert_array_equal(x, y)
    for (values, slots, size), (want_values, want_slots, want_size) in zip(got[1], want[1]):
        np.testing.assert_array_equal(values, want_values)
        assert sorted(slots) == sorted(want_slots)
        for name in slots:
            np.testing.assert_array_equal(slots[name], want_slots[name])
        assert size == want_size


@pytest.mark.parametrize("checks", ["backward", "end", "tower"])
def test_a_hash_group_replays_its_inserts(checks):
    """A hash group's keyed steps replay their inserts (table_group.ReplayedInsert: each
    member's next rows and the time stamp written before each replay), new keys arriving at
    every step: outputs, padded gradients, every row, slot and size equal the uncaptured steps
    bit for bit; on one rank the class is recorded and its update replayed."""
    steps = hash_keys(61, 12, 40 * SIZE)
    got = hash_steps("replay_" + checks, steps, True, 64, checks)
    want = hash_steps("replay_" + checks, steps, False, 64, checks)
    assert_same_hash_runs(got, want)
    assert got[2] == (1, 1) and want[2] == (0, 0)


def test_a_hash_step_whose_members_might_fill_up_is_not_replayed():
    """Where a member's keys in the step could pass its room (its size and its keys in the
    lookup above its capacity), the step takes the uncaptured path, which counts the new keys
    exactly; replays go on when the keys fit again, and every step equals the uncaptured one."""
    steps = hash_keys(67, 14, 20 * SIZE)  # at most 20 keys a member: they fit 24 once counted
    got = hash_steps("tight", steps, True, 24)
    want = hash_steps("tight", steps, False, 24)
    assert_same_hash_runs(got, want)
    if SIZE == 1:
        assert got[2][0] == 1


@pytest.mark.parametrize("checks", ["backward", "end", "tower"])
def test_a_negative_key_fails_a_replayed_hash_step_and_inserts_nothing(checks):
    """A negative key (one rank's, of one member) in a replayed hash step: the recorded insert
    passes it by, the step fails on every rank naming the member, no table changes (values,
    sizes) and the step's other new keys are erased again; the replays go on after, equal to
    the uncaptured steps."""
    steps = hash_keys(71, 10, 40 * SIZE)
    got = hash_steps("bad_" + checks, steps, True, 64, checks, bad_step=5)
    want = hash_steps("bad_" + checks, steps, False, 64, checks, bad_step=5)
    assert_same_hash_runs(got, want)
    assert got[2] == (1, 1)


def test_an_owner_whose_insert_is_not_ready_runs_it_uncaptured_while_its_peers_replay(
        monkeypatch):
    """Several ranks: where an owner's replayed insert is not ready after the op header (here
    rank 0's, at two steps, refused by hand), that owner places its keys as an uncaptured step
    does, inside the same exchanges, while its peers replay theirs; every step, row, slot and
    size equals the uncaptured run's bit for bit, and the class replays on after."""
    if SIZE == 1:
        pytest.skip("one rank's replay asks before its op header, the uncaptured path then")
    ready = table_group.ReplayedInsert.ready
    answers = refused_twice_on_rank_0(monkeypatch)
    kept = spied_kept_halves(monkeypatch)
    steps = hash_keys(83, 10, 40 * SIZE)
    got = hash_steps("unready", steps, True, 64)
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", ready)
    want = hash_steps("unready", steps, False, 64)
    assert_same_hash_runs(got, want)
    assert len(answers) > 6 and got[2] == (1, 1)
    assert len(kept) == (2 if RANK == 0 else 0)  # its peers replayed those steps


def refused_twice_on_rank_0(monkeypatch, evicting=False):
    """Has ReplayedInsert.ready answer False on rank 0 at its third and sixth call (evicting:
    of an evicting class's, the others' answered as they are and not counted), as asked
    elsewhere; returns the list of its answers, one a call counted."""
    ready, answers = table_group.ReplayedInsert.ready, []

    def refused_twice(insert, keys, *rest):
        if evicting and not insert.evicting:
            return ready(insert, keys, *rest)
        refused = RANK == 0 and len(answers) in (2, 5)
        answers.append(False if refused else ready(insert, keys, *rest))
        return answers[-1]
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", refused_twice)
    return answers


def spied_kept_halves(monkeypatch):
    """A list replayed_ranks.kept_half appends to at each call (an owner's insert uncaptured
    inside a replayed step)."""
    kept, kept_half = [], replayed_ranks.kept_half
    monkeypatch.setattr(replayed_ranks, "kept_half",
                        lambda *args: kept.append(None) or kept_half(*args))
    return kept


def test_a_replayed_hash_step_whose_keys_overflow_a_cap_runs_counted_and_records_again():
    """Several ranks: a hash group's replayed steps of 96 keys a member spread over the owners,
    then one whose keys all belong to owner 0 (key % size 0): every rank sees the overflow of
    its caps in the op header, the step runs the counted way from the replayed prepare half,
    the caps grow and the class is dropped, then recorded again; every step equals the
    uncaptured run's bit for bit."""
    if SIZE == 1:
        pytest.skip("per-peer caps size several ranks only")
    lengths = np.array([96, 96])
    rng = np.random.default_rng([89, RANK])
    steps = [rng.integers(0, 1 << 20, size=int(lengths.sum())).astype(np.int64)
             for _ in range(8)]
    steps[4] = steps[4] - steps[4] % SIZE  # every key owner 0's

    def run(replay):
        fresh()
        names = ["hash_skewed_%d" % t for t in range(len(lengths))]
        for name in names:
            api.create_table(name, DIM, 1 << 12, True, SPEC, replace=True)
        results, classes = [], []
        for number, keys in enumerate(steps, 1):
            results.append(step(names, keys, lengths, np.float32(0.75), "lazy_adam", number,
                                replay))
            classes.append(held()[0])
        with runtime.entered() as rt:
            settled = [plan.settled for plan in rt.capacities.values() if plan is not None]
        return (results, [held_rows(n) for n in names], held()), settled, classes
    (got, settled, classes), (want, _, _) = run(True), run(False)
    assert_same_hash_runs(got, want)
    assert max(settled) == 2, settled  # the first step's caps, then the overflow's
    # recorded at the second step, dropped by the overflowing fifth, recorded at the next
    assert classes == [0, 1, 1, 1, 0, 1, 1, 1], classes
    assert got[2] == (1, 1)


def test_a_replayed_hash_step_writes_its_member_list_only_where_the_indexes_moved(monkeypatch):
    """The member list a replayed insert reads (each member's next row and room) is moved past
    the step's new keys by its own recorded work (backend.hash_members_advance), so a step of
    the class writes no list while the sizes the host counts agree with it: the step that
    records the class writes it, and so do the replay after a step of the uncaptured path
    (its keys placed without the list) and the step after a failed one (its new keys erased
    again); the steps equal the uncaptured ones. (cpu has no list: the writes are counted
    here; tests/gpu's hash group replays check the list's rows against uncaptured steps.)"""
    with runtime.entered() as rt:
        backend = rt.backend
    written = []
    listing = backend.hash_insert_members

    def counted(indexes, row_starts, into=None, sizes=None):
        written.append(sizes.tolist())
        return listing(indexes, row_starts, into, sizes)
    monkeypatch.setattr(backend, "hash_insert_members", counted)
    steps = hash_keys(73, 12, 40 * SIZE)
    got = hash_steps("listed", steps, True, 64, bad_step=8, uncaptured=(5,))
    monkeypatch.setattr(backend, "hash_insert_members", listing)
    want = hash_steps("listed", steps, False, 64, bad_step=8)
    assert_same_hash_runs(got, want)
    if SIZE == 1:  # (several ranks list it after the op header too)
        # step 2 records the class, 3-5 replay, 6 is uncaptured, 7 writes the list again, 8
        # replays, 9 fails (undone), 10 writes it again, 11-12 replay
        assert len(written) == 3
        sizes = [size for _, _, size in want[1]]
        for before, after in zip(written, written[1:] + [sizes]):
            assert before != after and all(a <= b for a, b in zip(before, after))


def test_a_replayed_hash_forward_in_a_tower_leaves_its_checks_to_its_backward(monkeypatch):
    """One rank (hash groups replay there only): the replayed forward of a hybrid group whose
    steps have room, the first op of a tower, returns with its key checks unread (no wait for
    its work: the step's wait is its backward's, once that work is queued); its backward reads
    them, and only then is the lookup counted in the rows' statistics (ReplayedInsert.checked).
    Named alone, the backward opens a step of its own, so it reads them before anything else."""
    if SIZE > 1:
        pytest.skip("on several ranks the op header reads a forward's checks")
    events = []
    lookup, grad, checked = (api.keyed_lookup, api.keyed_lookup_grad,
                             table_group.ReplayedInsert.checked)

    def noted_lookup(*args, **kwargs):
        result = lookup(*args, **kwargs)
        with runtime.entered() as rt:
            events.append(("forward", len(rt.unread_checks)))
        return result

    def noted_grad(*args, **kwargs):
        events.append(("backward",))
        return grad(*args, **kwargs)
    monkeypatch.setattr(api, "keyed_lookup", noted_lookup)
    monkeypatch.setattr(api, "keyed_lookup_grad", noted_grad)
    monkeypatch.setattr(table_group.ReplayedInsert, "checked",
                        lambda insert: events.append(("checked",)) or checked(insert))
    dynamic = make_dynamic("hybrid", 64, 64, "lru")
    for checks, want in (("tower", [("forward", 1), ("backward",), ("checked",)]),
                         ("backward", [("forward", 1), ("backward",), ("checked",)]),
                         ("end", [("checked",), ("forward", 0), ("backward",)])):
        del events[:]
        hash_steps("tower_" + checks, hash_keys(79, 4, 30), True, 64, checks, dynamic=dynamic)
        assert events[-3:] == want, events  # the last step's, replayed
    assert held()[0] == 1


@pytest.mark.parametrize("between", ["lookup", "dump"])
def test_a_replayed_hash_forward_whose_backward_never_came_fails_at_the_next_op(between,
                                                                                tmp_path):
    """One rank: a hash group's replayed forward, a tower's first op promising its backward
    (checks="backward"), holds a negative key and no backward comes; the next op (the next
    step's lookup, or a checkpoint's dump, which no step's rollback covers), before anything
    else, reads those checks and fails naming the member and that no backward came, the
    forward's insert taken back (sizes and held rows as before it); the replays go on after."""
    if SIZE > 1:
        pytest.skip("on several ranks the op header reads a forward's checks")
    fresh()
    names = ["hash_promise_%s_%d" % (between, t) for t in range(MEMBERS)]
    for name in names:
        api.create_table(name, DIM, 64, True, SPEC, replace=True)
    steps = hash_keys(83, 7, 40)
    for number, keys in enumerate(steps[:4], 1):
        step(names, keys, LENGTHS, np.float32(0.75), "lazy_adam", number, True, "tower")
    before = [held_rows(name) for name in names]
    bad = steps[4].copy()
    bad[int(LENGTHS[0])] = -4
    item = KeyedInput(bad, LENGTHS, None, LENGTHS, None, "sum")
    api.keyed_lookup(names, OpId(names[0] + "_fwd", names[0], 0), item, True, checks="backward",
                     replay=True)  # no backward: its checks are left unread
    with pytest.raises(InvalidInputError, match=r"no backward pass(.|\n)*%s: key -4" % names[1]):
        if between == "dump":
            checkpoint_tables.dump_tables(str(tmp_path), names)
        else:
            step(names, steps[5], LENGTHS, np.float32(0.75), "lazy_adam", 5, True, "tower")
    for name, (values, slots, size) in zip(names, before):
        assert api.shard(name).index.size == size
        np.testing.assert_array_equal(held_rows(name)[0], values)
        for slot, want in slots.items():
            np.testing.assert_array_equal(held_rows(name)[1][slot], want)
    step(names, steps[6], LENGTHS, np.float32(0.75), "lazy_adam", 5, True, "tower")
    assert held() == (1, 1)


def test_a_dynamic_group_that_grows_while_its_steps_replay():
    """hbm DynamicVariables (a hash group that grows, never evicts) from 16 rows a shard: a
    step whose keys might not fit takes the uncaptured path, which grows the group (its rows
    move, so its class is dropped and recorded again later); every step, and the tables after,
    equal the uncaptured steps bit for bit."""
    steps = hash_keys(73, 16, 90 * SIZE)
    dynamic = make_dynamic("hbm", 16, 512)
    got = hash_steps("grow", steps, True, 512, dynamic=dynamic)
    want = hash_steps("grow", steps, False, 512, dynamic=dynamic)
    assert_same_hash_runs(got, want)
    assert all(api.shard("hash_grow_%d" % t).capacity > 16 for t in (0, 3))
    if SIZE == 1:
        assert got[2][0] == 1


def test_a_group_growing_in_place_backs_ahead_while_its_steps_replay(monkeypatch):
    """hbm DynamicVariables growing in place (table_group.GROW_ENV), each step new keys: a
    member that passes 3/4 of its capacity while its steps replay has its next rows backed
    ahead in a step before the one that grows it (the replay's ready() backs ahead as an
    uncaptured step's header does), so that growth finds them backed."""
    from sok1x.engine.lookup import table_group
    monkeypatch.setenv(table_group.GROW_ENV, "1")
    fresh()
    names = ["ahead_replay_%d" % t for t in range(MEMBERS)]
    for name in names:
        api.create_table(name, 8, 1 << 14, True, SPEC, replace=True,
                         dynamic=make_dynamic("hbm", 256, 1 << 14))
    number, issued, grown, replays = [0], {}, [], []
    back_ahead, grow = table_group.HashGroup._back_ahead, table_group.HashGroup._grow_in_place
    ready = table_group.ReplayedInsert.ready

    def noted_ahead(group, sizes):
        before = set(group._ahead)
        back_ahead(group, sizes)
        issued.update((t, number[0]) for t in set(group._ahead) - before)

    def noted_grow(group, capacities, members):
        grown.append((number[0], group.capacities.copy(), group.sizes(), set(group._ahead)))
        return grow(group, capacities, members)
    monkeypatch.setattr(table_group.HashGroup, "_back_ahead", noted_ahead)
    monkeypatch.setattr(table_group.HashGroup, "_grow_in_place", noted_grow)
    monkeypatch.setattr(table_group.ReplayedInsert, "ready",
                        lambda insert, keys, *opens: replays.append(ready(insert, keys, *opens))
                        or replays[-1])
    first = RANK * 10 ** 9
    # LENGTHS new keys a step, each its own, until every rank grew (the ranks step together)
    while not COMM.allreduce(int(bool(grown)), op=MPI.MIN) and number[0] < 80:
        number[0] += 1
        keys = np.arange(first, first + int(LENGTHS.sum()), dtype=np.int64)
        first += int(LENGTHS.sum())
        step(names, keys, LENGTHS, np.float32(0.75), "lazy_adam", number[0], True)
    assert grown, "no member grew"
    at, capacities, sizes, ahead = grown[0]
    near = [t for t in range(MEMBERS) if sizes[t] > 0.75 * capacities[t]]
    assert near and set(near) <= ahead, (near, ahead)
    assert all(issued[t] < at for t in near), (issued, at)
    if SIZE == 1:
        assert sum(replays) > 10, replays


def test_a_hash_group_near_its_capacity_replays_while_its_new_keys_fit(monkeypatch):
    """Members whose sizes come within a step's keys of their capacity (up to 28 keys a member
    in shards of 30, up to 7 keys a step): a step replays once its new keys, counted on the
    device, fit every member's room, so a table that holds every key its steps bring keeps
    replaying (8 more steps of keys it holds take the uncaptured insert in none); every step
    equals the uncaptured one."""
    steps = hash_keys(79, 24, 28 * SIZE)
    inserts = []
    original = key_exchange._insert_keys
    monkeypatch.setattr(key_exchange, "_insert_keys",
                        lambda *args: inserts.append(None) or original(*args))
    got = hash_steps("near", steps, True, 30)
    first = len(inserts)
    hash_steps("near", steps + steps[-8:], True, 30)
    again = len(inserts) - first
    want = hash_steps("near", steps, False, 30)
    assert_same_hash_runs(got, want)
    if SIZE == 1:
        assert got[2] == (1, 1)
        assert again == first < len(steps), (first, again)


def _alone_then_together_steps(names, replay):
    """Seven keyed SGD steps of table names[0] looked up alone, the fifth of names[0] and
    names[1] together; returns the outputs and names[0]'s rows of keys 0..39 after them."""
    rng = np.random.default_rng(1)
    outs = []
    for number in range(1, 8):
        looked = names if number == 5 else names[:1]
        lengths = np.array([6, 4]) if number == 5 else np.array([6])
        keys = rng.integers(0, 40, size=int(lengths.sum())).astype(np.int64)
        item = KeyedInput(keys, lengths, None, lengths, None, "sum")
        out, token = api.keyed_lookup(looked, "%s_fwd%d" % (looked[0], len(looked)), item,
                                      True, checks="backward", replay=replay)
        outs.append(np.array(out))
        values, rows, counts = api.keyed_lookup_grad(
            looked, "%s_bwd%d" % (looked[0], len(looked)), token, out * np.float32(0.75))
        api.apply_keyed_update(looked, "sgd", "", {}, {"lr": 0.5}, values, rows, counts)
    table = api.shard(names[0])
    keys = np.arange(40, dtype=np.int64)
    found = np.array(table.index.find(keys))
    return outs, {int(k): np.array(table.values[r]) for k, r in zip(keys, found) if r >= 0}


def test_a_table_alone_that_joins_a_group_replays_no_more_into_its_group_of_one(monkeypatch):
    """An hbm DynamicVariable alone, a hash group of one growing in place, replays its keyed
    step; looked up with another table its group of one is dissolved (its rows copied into
    the new group); looked up alone again, no class replays into the old group's arrays:
    outputs and rows equal the same steps run uncaptured."""
    monkeypatch.setenv(table_group.GROW_ENV, "1")
    fresh()
    runs = []
    names = ["joins_%d" % t for t in range(2)]  # made anew for each way: the same rows
    for way in ("replayed", "uncaptured"):
        for name in names:
            api.create_table(name, DIM, 512, True, SPEC, replace=True,
                             dynamic=make_dynamic("hbm", 64, 512))
            api.shard(name)  # made now: a table made later would free every class
        runs.append(_alone_then_together_steps(names, way == "replayed"))
    (got_outs, got_rows), (want_outs, want_rows) = runs
    for got, want in zip(got_outs, want_outs):
        np.testing.assert_array_equal(got, want)
    assert sorted(got_rows) == sorted(want_rows)
    for key, row in want_rows.items():
        np.testing.assert_array_equal(got_rows[key], row)


def hybrid_keys(seed):
    """Keys of hybrid steps: a few steps whose keys fit (from few values), then twice a step of
    many new keys (members evict) followed by three steps of the same keys (held: room again)."""
    rng = np.random.default_rng([seed, RANK])

    def drawn(span):
        return np.concatenate([rng.integers(0, span, size=n) for n in LENGTHS]).astype(np.int64)
    steps = [drawn(10 * SIZE) for _ in range(4)]
    for _ in range(2):
        wide = drawn(400 * SIZE)
        steps += [wide] * 4
    return steps


def hybrid_state(name, relative=True):
    """A hybrid shard's held keys in row order with their rows, vectors, slots and access
    statistics (each row's last step counted back from the journal's step now: two runs'
    steps have different numbers), and its evicted keys with their vectors (read:
    pop_evicted)."""
    shard = api.shard(name)
    keys, rows = (np.asarray(a) for a in shard.index.export())
    order = np.argsort(rows)
    keys, rows = keys[order], rows[order]
    slots = {s: np.array(whole(a)[rows]) for s, a in shard.slots.items()}
    statistics = np.array(shard.statistics[rows])
    if relative:  # (not across a failed step: it takes a step number too)
        statistics[:, 0] -= shard.journal.step
    return (keys, rows, np.array(whole(shard.values)[rows]), slots, statistics,
            shard.evicted_keys) + tuple(api.pop_evicted(name))


@pytest.mark.usefixtures("spare_rows")
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("checks", ["backward", "tower"])
@pytest.mark.parametrize("bad_step", [None, 6])
def test_a_hybrid_group_replays_its_steps_with_room(bad_step, checks, split, monkeypatch):
    """Hybrid DynamicVariables (a hash group that counts its lookups and evicts; 8 rows a shard
    growing to 16): steps whose new keys fit replay their insert (table_group.ReplayedInsert),
    the lookup counted in the rows' statistics once the checks pass; a step that must evict
    takes the uncaptured path, and the steps after it, bringing keys held, replay again. Every
    step, every held key's row, vector, slots and statistics, and the evicted keys equal the
    uncaptured steps; bad_step: a replayed step holding a negative key fails on every rank and
    changes nothing (its lookup not counted), whether its backward is a tower's second op
    (checks="tower": it reads the forward's checks once its work is queued) or an op named alone
    (it reads them first). split: each member's rows past its fifth lie in host memory
    (max_hbm_for_vectors), its rows a GroupedRows of the group."""
    steps = hybrid_keys(83)
    ready, readies = table_group.ReplayedInsert.ready, []

    def noted(insert, keys, *opens):
        evicted = sum(member._evicted_keys for member in insert.group.members)
        readies.append((ready(insert, keys, *opens), evicted))
        return readies[-1][0]
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", noted)
    dynamic = make_dynamic("hybrid", 8, 16, "lru", SPLIT_GIB if split else 0.0)
    runs = []
    for replay in (True, False):
        runs.append(hash_steps("hybrid_%s_%s" % (bad_step, split), steps, replay, 16, checks,
                               bad_step, dynamic))
        runs[-1] += ([hybrid_state("hash_hybrid_%s_%s_%d" % (bad_step, split, t))
                      for t in range(MEMBERS)],)
    got, want = runs
    assert_same_hash_runs(got, want)
    for a, b in zip(got[3], want[3]):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            if isinstance(x, dict):
                for slot in x:
                    np.testing.assert_array_equal(x[slot], y[slot])
            else:
                np.testing.assert_array_equal(x, y)
    evicted = COMM.allreduce(sum(int(state[5]) for state in got[3]), op=MPI.SUM)
    assert evicted > 0
    if SIZE == 1:
        assert got[2] == (1, 1)
        assert any(ok and count for ok, count in readies), readies  # replayed after evicting
        assert not all(ok for ok, _ in readies)


def test_a_hybrid_group_with_room_replays_on_several_ranks(monkeypatch):
    """Several ranks: hybrid DynamicVariables (8 rows a shard a rank and 16 more, growing) whose
    steps have room (every rank's keys of a member fit each shard's room, as the op header
    tells) replay their insert on every rank, the lookup counted in the rows' statistics; once a
    shard might fill up (the header counts every key as new), the steps go the counted way and
    grow the group; where rank 0's insert is refused by hand at two steps, it places its keys
    uncaptured inside the same exchanges (kept_half), counting the lookup there, while its peers
    replay. Every step, held key's row, vector, slots and statistics equals the uncaptured
    run's."""
    if SIZE == 1:
        pytest.skip("the one-rank way is test_a_hybrid_group_replays_its_steps_with_room's")
    rng = np.random.default_rng([5, RANK])
    # narrow keys (they fit), then wide ones (members fill up and grow)
    steps = [np.concatenate([rng.integers(0, span, size=n) for n in LENGTHS]).astype(np.int64)
             for span in [12 * SIZE] * 6 + [100 * SIZE] * 12]
    ready = table_group.ReplayedInsert.ready
    answers = refused_twice_on_rank_0(monkeypatch)
    kept = spied_kept_halves(monkeypatch)
    first = 8 * SIZE + 16  # rows a shard: room for every rank's keys of a member, and more
    dynamic = make_dynamic("hybrid", first, 128 * SIZE, "lru")
    runs = []
    for replay in (True, False):
        runs.append(hash_steps("hybrid_ranks", steps, replay, 128 * SIZE, dynamic=dynamic))
        runs[-1] += ([hybrid_state("hash_hybrid_ranks_%d" % t) for t in range(MEMBERS)],)
        monkeypatch.setattr(table_group.ReplayedInsert, "ready", ready)
    got, want = runs
    assert_same_hash_runs(got, want)
    for a, b in zip(got[3], want[3]):
        assert_same_state(a, b)
    assert sum(answers) >= 4, answers  # replayed (or recorded) steps
    assert len(kept) == (2 if RANK == 0 else 0)
    assert any(api.shard("hash_hybrid_ranks_%d" % t).capacity > first for t in range(4))


SPLIT_GIB = 5 * 4 * DIM / 2 ** 30  # max_hbm_for_vectors: a hybrid shard's first 5 rows


def noted_readies(monkeypatch):
    """A list ReplayedInsert.ready appends (its answer, whether its class evicts) to, each call."""
    readies, ready = [], table_group.ReplayedInsert.ready
    monkeypatch.setattr(table_group.ReplayedInsert, "ready",
                        lambda insert, keys, *opens: readies.append(
                            (ready(insert, keys, *opens), insert.evicting)) or readies[-1][0])
    return readies


def full_hybrid_tables(prefix, lengths, rows, drop=True, split=False):
    """Makes anew one hybrid DynamicVariable of `rows` rows a shard that never grows per member
    of `lengths`, named `prefix`_t, dropping what it evicts (drop) or keeping it for a reader,
    its rows past the fifth in host memory where `split`; returns their names."""
    fresh()
    names = ["%s_%d" % (prefix, t) for t in range(len(lengths))]
    for name in names:
        api.drop_evicted(name, drop)
        api.create_table(name, DIM, rows, True, SPEC, replace=True,
                         dynamic=make_dynamic("hybrid", rows, rows, "lru",
                                              SPLIT_GIB if split else 0.0))
    return names


def full_hybrid_run(tag, steps, lengths, replay, failing=(), rows=16, drop=True,
                    checks="backward", split=False):
    """Keyed steps of hybrid DynamicVariables of `rows` rows a shard that never grow (full from
    the first steps on, then every new key evicts) and drop what they evict (drop_evicted: no
    one reads it), made anew under names of `tag`, for each keys of `steps`; a step of
    `failing` must fail on every rank (InvalidInputError where it holds a negative key, else
    TableFullError) and change no table. Returns (each step's host results or None, each
    member's hybrid_state). drop=False: they keep what they evict for a reader; checks: as
    step()'s; split: as full_hybrid_tables'."""
    names = full_hybrid_tables("full_%s" % tag, lengths, rows, drop, split)
    results = []
    for number, keys in enumerate(steps, 1):
        if number - 1 not in failing:
            results.append(step(names, keys, lengths, np.float32(0.75), "lazy_adam", number,
                                replay, checks))
            continue
        before = [hybrid_state(name, False)[:6] for name in names]
        negative = COMM.allreduce(int((keys < 0).any()), op=MPI.MAX)  # on some rank
        error = InvalidInputError if negative else TableFullError
        with pytest.raises(error, match=names[1] if error is InvalidInputError else "full"):
            step(names, keys, lengths, np.float32(0.75), "lazy_adam", number, replay, checks)
        for name, want in zip(names, before):
            assert_same_state(hybrid_state(name, False)[:6], want)
        results.append(None)
    return results, [hybrid_state(name) for name in names]


def layouts_run(tag, steps, replay):
    """Keyed steps, each of its own (lengths, keys) of `steps`, of full hybrid tables of 16 rows
    a shard made anew under `tag` (full_hybrid_tables, LENGTHS' members): (each step's host
    results, each member's hybrid_state)."""
    names = full_hybrid_tables(tag, LENGTHS, 16)
    results = [step(names, keys, lengths, np.float32(0.75), "lazy_adam", number, replay,
                    "backward") for number, (lengths, keys) in enumerate(steps, 1)]
    return results, [hybrid_state(name) for name in names]


def assert_same_full_runs(got, want):
    """full_hybrid_run's results agree: each step's host results (or its failure) and every
    member's hybrid_state."""
    for a, b in zip(got[0], want[0]):
        assert (a is None) == (b is None)
        for x, y in zip(a or (), b or ()):
            np.testing.assert_array_equal(x, y)
    for mine, theirs in zip(got[1], want[1]):
        assert_same_state(mine, theirs)


def assert_same_state(got, want):
    for x, y in zip(got, want):
        if isinstance(x, dict):
            assert sorted(x) == sorted(y)
            for slot in x:
                np.testing.assert_array_equal(x[slot], y[slot])
        else:
            np.testing.assert_array_equal(x, y)


@pytest.mark.usefixtures("spare_rows")
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("checks", ["backward", "tower"])
@pytest.mark.parametrize("bad_step", [None, 13])
def test_a_full_hybrid_group_replays_its_evicting_steps(bad_step, checks, split, monkeypatch):
    """Full hybrid members that drop what they evict, new keys at every step: once every member
    with keys is full and frees no row, the steps whose new keys all evict in place are a shape
    class of their own, recorded with the pick, the erase and the insert into the victims' rows
    (table_group.ReplayedInsert, evicting) and replayed; every step, every held key's row,
    vector, slots and statistics, and the counts of evicted keys equal the uncaptured steps;
    bad_step: a replayed evicting step holding a negative key fails on every rank and changes
    nothing, whether the backward reads its checks and counts first (an op named alone) or
    once its own work is queued (checks="tower"). SOK1X_REPLAY_EVICTION=0 leaves those steps
    uncaptured. split: each member's rows past its fifth lie in host memory."""
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    rng = np.random.default_rng([89, RANK])
    steps = [np.concatenate([rng.integers(0, 300 * SIZE, size=n) for n in LENGTHS])
             .astype(np.int64) for _ in range(18)]
    if bad_step is not None and RANK == SIZE - 1:
        steps[bad_step] = steps[bad_step].copy()
        steps[bad_step][int(LENGTHS[0])] = -4
    readies = noted_readies(monkeypatch)
    failing = () if bad_step is None else (bad_step,)
    tag = "evict_%s_%s" % (bad_step, split)
    got = full_hybrid_run(tag, steps, LENGTHS, True, failing, checks=checks, split=split)
    replays = list(readies)
    monkeypatch.setenv(table_group.REPLAY_EVICTION_ENV, "0")
    off = full_hybrid_run(tag, steps, LENGTHS, True, failing, checks=checks, split=split)
    want = full_hybrid_run(tag, steps, LENGTHS, False, failing, checks=checks, split=split)
    for run in (got, off):
        assert_same_full_runs(run, want)
    assert COMM.allreduce(sum(int(state[5]) for state in got[1]), op=MPI.SUM) > 0
    evicting = [ok for ok, evicts in replays if evicts]
    assert sum(evicting) >= 8, replays  # replayed evicting steps (on several ranks too)
    assert not any(ok for ok, evicts in readies[len(replays):] if evicts)  # switched off


def test_an_owner_whose_evicting_insert_is_not_ready_evicts_uncaptured_while_its_peers_replay(
        monkeypatch):
    """Several ranks: full hybrid members that evict at every step, rank 0's evicting insert
    refused by hand at two steps: there it evicts and inserts uncaptured, sized by the caps,
    inside the same two exchanges and the same agreement on the counts
    (replayed_ranks.uncaptured_rest, in place), while its peers replay theirs; every step and
    every member's state equal the uncaptured run's."""
    if SIZE == 1:
        pytest.skip("an owner's own replay: several ranks only")
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    rng = np.random.default_rng([107, RANK])
    steps = [np.concatenate([rng.integers(0, 300 * SIZE, size=n) for n in LENGTHS])
             .astype(np.int64) for _ in range(20)]
    ready = table_group.ReplayedInsert.ready
    answers = refused_twice_on_rank_0(monkeypatch, evicting=True)
    rest, in_place = replayed_ranks.uncaptured_rest, []
    monkeypatch.setattr(replayed_ranks, "uncaptured_rest", lambda *args: in_place.append(
        len(args) > 8 and args[8]) or rest(*args))
    got = full_hybrid_run("refused", steps, LENGTHS, True)
    monkeypatch.setattr(table_group.ReplayedInsert, "ready", ready)
    assert_same_full_runs(got, full_hybrid_run("refused", steps, LENGTHS, False))
    assert sum(answers) >= 8, answers  # replayed evicting steps
    rests = COMM.allgather(sum(in_place))  # steps this rank evicted uncaptured, in place
    assert rests[0] == rests[1] + 2 and len(set(rests[1:])) == 1, rests


def test_an_evicting_class_whose_bound_moves_on_another_rank_runs_that_step_uncaptured(
        monkeypatch):
    """Several ranks: rank 1 brings member 1 more keys at every third step, so the most keys of
    it an owner can get (the op header's bound on each owner's victims) moves: an evicting
    class recorded with the other bound refuses those steps, which its owner evicts uncaptured
    inside the same exchanges (uncaptured_rest, in place) while the other steps replay; every
    step and every member's state equal the uncaptured run's."""
    if SIZE == 1:
        pytest.skip("the bound is every rank's keys: several ranks only")
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    rng = np.random.default_rng([109, RANK])
    layouts = []
    for number in range(24):
        lengths = LENGTHS.copy()
        if RANK == 1 and number % 3 == 2:
            lengths[1] = 14
        layouts.append((lengths, np.concatenate([rng.integers(0, 300 * SIZE, size=n)
                                                 for n in lengths]).astype(np.int64)))
    readies = noted_readies(monkeypatch)
    got = layouts_run("bound", layouts, True)
    evicting = [ok for ok, evicts in readies if evicts]
    assert_same_full_runs(got, layouts_run("bound", layouts, False))
    assert sum(evicting) >= 6, evicting
    # (rank 1's two layouts are two classes, each with its own bound)
    assert COMM.allgather(evicting.count(False))[0] >= 4, evicting


@pytest.mark.usefixtures("spare_rows")
def test_an_evicting_class_whose_first_replay_fails_replays_after(monkeypatch):
    """The no-victim step of test_a_replayed_evicting_step_whose_new_keys_find_no_victim_...
    moved to the evicting class's first replay (the seventh step: the class is seen first at
    the fifth, recorded at the sixth): it fails on every rank (on several ranks in its
    backward's op header) and changes nothing; the next steps
    replay the class, and every step equals the uncaptured run's."""
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    first_replay = 6  # (the step's index)
    lengths, steps = steps_without_victims(16, short_at=first_replay)
    readies = noted_readies(monkeypatch)
    got = full_hybrid_run("first_fails", steps, lengths, True, (first_replay,), rows=20)
    evicting = [ok for ok, evicts in readies if evicts]
    want = full_hybrid_run("first_fails", steps, lengths, False, (first_replay,), rows=20)
    assert_same_full_runs(got, want)
    assert sum(evicting) >= 8, evicting


def test_a_full_group_whose_evicting_members_change_step_by_step_replays_both_classes(
        monkeypatch):
    """Two layouts of one full hybrid group's keys, step after step: one in which a member has
    no key, one in which every member has keys. With spare rows enough for every step's new
    keys (SOK1X_SPARE_ROWS=1), each layout is an evicting class of its own whose new keys take
    the spare rows of its own evicting members (a SpareLists each); both classes go on
    replaying while the other runs between their steps, and every step and every member's state
    equal the same steps run uncaptured."""
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    monkeypatch.setenv(dynamic_table.SPARE_ENV, "1")
    layouts = [LENGTHS, np.array([5, 3, 6, 7])]
    rng = np.random.default_rng([97, RANK])
    steps = [(layouts[i % 2], np.concatenate([rng.integers(0, 300 * SIZE, size=n)
                                              for n in layouts[i % 2]]).astype(np.int64))
             for i in range(20)]
    readies = noted_readies(monkeypatch)
    got = layouts_run("layouts", steps, True)
    replays = list(readies)
    assert_same_full_runs(got, layouts_run("layouts", steps, False))
    assert sum(ok for ok, evicts in replays if evicts) >= (12 if SIZE == 1 else 10), replays


@pytest.mark.usefixtures("spare_rows")
def test_a_load_into_a_replaying_full_group_drops_its_recorded_classes(tmp_path, monkeypatch):
    """Full hybrid members replaying their evicting steps, a checkpoint dumped, more steps, and
    the checkpoint loaded back: the load gives each member another index, whose slots a class
    recorded before it does not read, so the group's classes go (its layout moves: the step
    after the load records its class anew, and later steps replay again); every step and every
    member's state equal the same steps and load run uncaptured. Also a load of a member that
    holds no key (LENGTHS[2] is 0) while the group has optimizer slots: the files give it no
    row, and it still gets its slots."""
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    rng = np.random.default_rng([103, RANK])
    steps = [np.concatenate([rng.integers(0, 300 * SIZE, size=n) for n in LENGTHS])
             .astype(np.int64) for _ in range(20)]
    readies, captured = noted_readies(monkeypatch), []
    capture = replayed_step._capture_forward
    monkeypatch.setattr(replayed_step, "_capture_forward",
                        lambda *args, **kwargs: captured.append(args[2]) or capture(*args,
                                                                                     **kwargs))
    runs, after_load = [], []
    for replay in (True, False):
        names = full_hybrid_tables("load", LENGTHS, 16)  # (the same names: the same values)
        folder = str(tmp_path / ("replayed" if replay else "uncaptured"))
        results = []
        for number, keys in enumerate(steps, 1):
            if number == 9:
                checkpoint_tables.dump_tables(folder, names)
            if number == 13:
                checkpoint_tables.load_tables(folder, names)
                called = len(captured)
            results.append(step(names, keys, LENGTHS, np.float32(0.75), "lazy_adam", number,
                                replay))
            if number == 13:
                after_load.append(len(captured) - called)
        runs.append((results, [hybrid_state(name) for name in names]))
    assert_same_full_runs(*runs)
    if SIZE == 1:
        assert after_load[0] == 1, after_load  # its class recorded anew
        assert sum(ok for ok, evicts in readies[-6:] if evicts) >= 4, readies  # replayed since


def test_a_replayed_evicting_forward_waits_for_its_op_header_alone(monkeypatch):
    """Several ranks: a replayed evicting step's forward is one recorded work after its op header
    (the keys to the owners, the eviction and insert, the vectors back), and the host waits in
    it once, for the header: its counts and every rank's agreement on a new key left without a
    victim wait for the backward's header (bounded_step.agreed_check), where each rank reads
    them once. Every step still equals the uncaptured run's (the tests above)."""
    if SIZE == 1:
        pytest.skip("an op header between two recorded works: several ranks only")
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    rng = np.random.default_rng([113, RANK])
    steps = [np.concatenate([rng.integers(0, 300 * SIZE, size=n) for n in LENGTHS])
             .astype(np.int64) for _ in range(14)]
    readies = noted_readies(monkeypatch)
    names = full_hybrid_tables("waits", LENGTHS, 16)
    for number, keys in enumerate(steps[:10], 1):
        step(names, keys, LENGTHS, np.float32(0.75), "lazy_adam", number, True)
    forward_waits, header_reads = [], []
    agree = getattr(bounded_step, "_agree_on_left", None)
    monkeypatch.setattr(bounded_step, "_agree_on_left", lambda *args: header_reads.append(
        len(args[1])) or agree(*args), raising=False)
    for number, keys in enumerate(steps[10:], 11):
        item = KeyedInput(keys, LENGTHS, None, LENGTHS, None, "sum")
        waits = runtime.get().stats()["host_waits"]
        out, token = api.keyed_lookup(names, names[0] + "_fwd", item, True, checks="backward",
                                      replay=True)
        forward_waits.append(runtime.get().stats()["host_waits"] - waits)
        values, rows, counts = api.keyed_lookup_grad(names, names[0] + "_bwd", token, out)
        api.apply_keyed_update(names, "lazy_adam", RULES["lazy_adam"][0], {},
                               hyper("lazy_adam", number), values, rows, counts)
    assert readies[-4:] == [(True, True)] * 4, readies  # replayed evicting steps
    assert forward_waits == [1] * 4, forward_waits
    assert header_reads == [1] * 4, header_reads  # each step's, in its backward's header


def test_a_save_rank_0_makes_alone_after_an_evicting_forward_reads_its_counts_first(
        monkeypatch, shared_dir):
    """Several ranks, the Horovod idiom: after a replayed evicting forward whose counts wait for
    the next op header, rank 0 alone saves (engine/checkpoint/join.py) while its peers go on to
    the step's backward: rank 0 reads the counts and agrees on them with its peers, as their
    header does first, before its marker crosses; they then take part in its save inside that
    header, and the step's backward and update go on, every rank's tables equal to the same
    steps run uncaptured."""
    if SIZE == 1:
        pytest.skip("a save rank 0 makes alone: several ranks only")
    from sok1x.engine.checkpoint import join
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    rng = np.random.default_rng([127, RANK])
    steps = [np.concatenate([rng.integers(0, 300 * SIZE, size=n) for n in LENGTHS])
             .astype(np.int64) for _ in range(12)]
    readies = noted_readies(monkeypatch)
    states = []
    for replay in (True, False):
        names = full_hybrid_tables("alone", LENGTHS, 16)
        for number, keys in enumerate(steps[:11], 1):
            step(names, keys, LENGTHS, np.float32(0.75), "lazy_adam", number, replay)
        item = KeyedInput(steps[11], LENGTHS, None, LENGTHS, None, "sum")
        out, token = api.keyed_lookup(names, names[0] + "_fwd", item, True, checks="backward",
                                      replay=replay)
        if replay:
            assert readies[-1] == (True, True), readies  # a replayed evicting step
            assert len(runtime.get().unread_checks) == 1  # its counts, left to the next header
        if RANK == 0:
            description = {"kind": "save", "stem": "alone_%s" % replay,
                           "directory": shared_dir, "names": names, "live": []}
            description, everyone = join.open_checkpoint(runtime.get(), description)
            assert not everyone and not runtime.get().unread_checks
            join.perform(description)
        values, rows, counts = api.keyed_lookup_grad(names, names[0] + "_bwd", token, out)
        api.apply_keyed_update(names, "lazy_adam", RULES["lazy_adam"][0], {},
                               hyper("lazy_adam", 12), values, rows, counts)
        states.append([hybrid_state(name) for name in names])
    for mine, theirs in zip(*states):
        assert_same_state(mine, theirs)
    COMM.Barrier()
    saved = sorted(os.listdir(shared_dir))
    assert any(f.startswith("alone_True") for f in saved), saved


def steps_without_victims(count, short_at=10):
    """(lengths, `count` steps' keys) of two members: member 1 gets 24 keys a step, ten fresh
    values at each step, except step `short_at`: the last step's ten values and 14 fresh ones
    (ten evictable keys for 14 new ones in a shard of 20 rows: four find no victim). Each
    rank's keys go to its own shard (placement "mod": key % SIZE is the rank), so that each
    owner's steps are those of one rank."""
    rng = np.random.default_rng(97)
    steps, fresh_at = [], 10 ** 6
    for number in range(count):
        if number == short_at:
            values = np.concatenate([np.unique(steps[-1][5:]), fresh_at + np.arange(14)])
        else:
            values = fresh_at + np.arange(10)
        fresh_at += 100
        member = np.concatenate([values, rng.choice(values, size=24 - values.size)])
        steps.append(np.concatenate([rng.integers(0, 300, size=5), member]).astype(np.int64))
    return np.array([5, 24]), [keys * SIZE + RANK for keys in steps]


@pytest.mark.usefixtures("spare_rows")
@pytest.mark.parametrize("checks", ["backward", "tower"])
def test_a_replayed_evicting_step_whose_new_keys_find_no_victim_fails_and_changes_nothing(
        checks, monkeypatch):
    """Member 1 of shards of 20 rows gets 24 keys a step (on each owner), ten fresh values at
    each step (all evict, every held key evictable), so its evicting steps replay; a step of
    its last step's ten values and 14 fresh ones (ten evictable keys for 14 new ones: four find
    no victim) fails with TableFullError on every rank and changes no table, and the replays go
    on after, equal to the uncaptured steps; on one rank in a tower (checks="tower") the
    backward reads the step's counts once its own work is queued and fails there (on several
    ranks every rank reads and agrees on them in the backward's op header)."""
    lengths, steps = steps_without_victims(16)
    readies = noted_readies(monkeypatch)
    got = full_hybrid_run("unserved", steps, lengths, True, (10,), rows=20, checks=checks)
    replayed = [ok for ok, evicts in readies if evicts]
    want = full_hybrid_run("unserved", steps, lengths, False, (10,), rows=20, checks=checks)
    assert_same_full_runs(got, want)
    assert replayed[:12] and sum(replayed) >= 10, readies
    assert readies[9] == (True, True), readies  # (the failing step's ready: a replay)


@pytest.mark.usefixtures("spare_rows")
@pytest.mark.parametrize("replay", [True, False])
def test_an_evicting_forward_whose_keys_find_no_victim_fails_the_dump_after_it(monkeypatch,
                                                                              tmp_path, replay):
    """The step of the test above whose new keys find no victim is a forward alone (its
    backward never comes), replayed or not; a checkpoint's dump after it reads its checks and
    counts (on several ranks every rank's, agreed in the dump's op header), fails with
    TableFullError on every rank, and takes its eviction and insert back: member 1 holds the
    keys it held before, none without a row. The uncaptured forward leaves them as the replayed
    one does, on one rank as on several (key_exchange._agreed_in_place)."""
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    lengths, steps = steps_without_victims(11)
    readies = noted_readies(monkeypatch)
    fresh()
    names = ["unserved_dump_%d" % t for t in range(2)]
    for name in names:
        api.drop_evicted(name, True)
        api.create_table(name, DIM, 20, True, SPEC, replace=True,
                         dynamic=make_dynamic("hybrid", 20, 20, "lru"))
    for number, keys in enumerate(steps[:10], 1):
        step(names, keys, lengths, np.float32(0.75), "lazy_adam", number, replay, "tower")
    before = api.shard(names[1]).index.export()
    item = KeyedInput(steps[10], lengths, None, lengths, None, "sum")
    op = OpId(names[0] + "_fwd", names[0], 0)
    api.keyed_lookup(names, op, item, True, checks="backward", replay=replay)
    assert not replay or readies[-1] == (True, True), readies  # a replayed evicting step
    with pytest.raises(TableFullError, match="full"):
        checkpoint_tables.dump_tables(str(tmp_path), names)
    keys, rows = api.shard(names[1]).index.export()
    assert sorted(keys.tolist()) == sorted(before[0].tolist())
    assert (rows >= 0).all() and api.shard(names[1]).index.size == before[0].shape[0]


@pytest.mark.usefixtures("spare_rows")
def test_a_reader_after_an_evicting_forward_whose_keys_find_no_victim_hands_out_none_of_it(
        monkeypatch, tmp_path):
    """The failing forward of the tests above, uncaptured, of members that keep what they evict
    for a reader, read right after it (pop_evicted, what sparse_read_and_evict calls between a
    lookup and its backward): on one rank the read takes the forward's counts first, fails with
    TableFullError and takes the eviction back, so the reader gets none of the step's victims
    (nor a place without one); on several ranks the read is local and the dump's op header
    fails the step on every rank. Either way member 1 then holds the keys it held before."""
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    lengths, steps = steps_without_victims(11)
    names = full_hybrid_tables("unserved_read", lengths, 20, drop=False)
    for number, keys in enumerate(steps[:10], 1):
        step(names, keys, lengths, np.float32(0.75), "lazy_adam", number, False, "tower")
    for name in names:
        api.pop_evicted(name)  # what the ten steps evicted, read
    before = api.shard(names[1]).index.export()
    item = KeyedInput(steps[10], lengths, None, lengths, None, "sum")
    op = OpId(names[0] + "_fwd", names[0], 0)
    api.keyed_lookup(names, op, item, True, checks="backward", replay=False)
    if SIZE == 1:
        with pytest.raises(TableFullError, match="full"):
            api.pop_evicted(names[1])
    else:
        api.pop_evicted(names[1])
        with pytest.raises(TableFullError, match="full"):
            checkpoint_tables.dump_tables(str(tmp_path), names)
    keys, rows = api.shard(names[1]).index.export()
    assert sorted(keys.tolist()) == sorted(before[0].tolist())
    assert (rows >= 0).all() and api.shard(names[1]).index.size == before[0].shape[0]
    if SIZE == 1:
        evicted, vectors = api.pop_evicted(names[1])
        assert evicted.shape == (0,) and vectors.shape == (0, DIM), evicted


@pytest.mark.usefixtures("spare_rows")
def test_a_full_hybrid_group_whose_evicted_keys_are_read_replays_its_steps_with_room(
        monkeypatch):
    """Full hybrid members that keep what they evict for a reader: their evicting steps run
    uncaptured (a replay would hand the reader arrays the next replay writes), and their steps
    that bring only held keys replay as steps with room (the new keys counted on the device: one
    wait); every step, every held key's state and what each member evicted equal the uncaptured
    steps."""
    rng = np.random.default_rng([101, RANK])
    steps = []
    for _ in range(3):  # a step of new keys (members evict), then five of its keys again
        wide = np.concatenate([rng.integers(0, 300 * SIZE, size=n) for n in LENGTHS])
        steps += [wide.astype(np.int64)] * 6
    readies = noted_readies(monkeypatch)
    got = full_hybrid_run("read", steps, LENGTHS, True, drop=False)
    want = full_hybrid_run("read", steps, LENGTHS, False, drop=False)
    assert_same_full_runs(got, want)
    assert COMM.allreduce(sum(len(state[6]) for state in got[1]), op=MPI.SUM) > 0  # read
    if SIZE == 1:
        assert not any(evicts for _, evicts in readies)
        assert sum(ok for ok, _ in readies) >= 8, readies


@pytest.mark.usefixtures("spare_rows")
@pytest.mark.parametrize("pattern", ["short", "worn"])
@pytest.mark.parametrize("inside", [True, False])
def test_a_replayed_evicting_step_rebuilds_an_index_short_of_empty_slots(inside, pattern,
                                                                         monkeypatch):
    """Member 1 of shards of 32 rows (64 slots). short: it gets 14 new keys, then
    20, in turn (repeated to 24 keys a step): after a step of 14 its index holds 14 tombstones
    (not worn), so the next step's 20 new keys find 18 empty slots; worn: 18 new keys every
    step, which find 32 empty slots but leave 18 tombstones, past half the capacity (worn:
    table.is_worn). Either way its recorded work rebuilds that index between its erase and its
    insert (backend.rebuild_flags, hash_rehash_many's when) as the uncaptured step's rebuild
    of worn indexes does, so that the insert's probes never walk past the step's tombstones;
    inside=False (a copy of the slots past table_group.REBUILD_INSIDE_BYTES): ready() rebuilds
    an index with fewer empty slots than its keys before the replay, and runs a step
    uncaptured where that falls short. Every step equals the uncaptured one."""
    monkeypatch.setattr(table_group, "REBUILD_INSIDE_BYTES", (256 << 20) if inside else 0)
    from sok1x.backend import cpu
    lengths = np.array([5, 24])
    rng = np.random.default_rng(103)
    steps, fresh_at = [], 10 ** 6
    for number in range(16):
        values = fresh_at + np.arange(18 if pattern == "worn" else 14 if number % 2 else 20)
        fresh_at += 100
        member = np.concatenate([values, rng.choice(values, size=24 - values.size)])
        steps.append(np.concatenate([rng.integers(0, 300, size=5), member]).astype(np.int64)
                     * SIZE + RANK)  # (each rank's keys to its own shard)
    flagged = []
    flags = cpu.rebuild_flags
    monkeypatch.setattr(cpu, "rebuild_flags", lambda wanted, erased, room: flagged.append(
        flags(wanted, erased, room)) or flagged[-1])
    got = full_hybrid_run("crowded_" + pattern, steps, lengths, True, rows=32)
    want = full_hybrid_run("crowded_" + pattern, steps, lengths, False, rows=32)
    assert_same_full_runs(got, want)
    assert any(f[1] for f in flagged) == inside, flagged  # rebuilt inside a replay


def _steps_with_a_failing_read(tag, steps, lengths, replay, fail_at, checks, monkeypatch,
                               rows=20):
    """Runs `steps` on full hybrid tables, the fail_at-th backend.read_many_later (an evicting
    replay's count copy, queued in ReplayedInsert.done) raising; returns (the failed step's
    number, each step's results or None, each table's final state), checking that the failed
    step changed nothing."""
    from sok1x.backend import cpu
    names = full_hybrid_tables("rf_%s" % tag, lengths, rows)
    real, calls = cpu.read_many_later, []

    def failing(arrays):
        calls.append(1)
        if len(calls) == fail_at:
            raise RuntimeError("injected: read_many_later")
        return real(arrays)
    monkeypatch.setattr(cpu, "read_many_later", failing)
    results, failed = [], None
    for number, keys in enumerate(steps, 1):
        before = [hybrid_state(name, False)[:6] for name in names]
        try:
            results.append(step(names, keys, lengths, np.float32(0.75), "lazy_adam", number,
                                replay, checks))
        except (RuntimeError, InvalidInputError) as error:
            assert "injected" in str(error) or isinstance(error, InvalidInputError)
            failed = number
            for name, want in zip(names, before):
                assert_same_state(hybrid_state(name, False)[:6], want)
            results.append(None)
    monkeypatch.setattr(cpu, "read_many_later", real)
    return failed, results, [hybrid_state(name) for name in names]


@pytest.mark.usefixtures("spare_rows")
@pytest.mark.parametrize("checks", ["backward", "tower"])
def test_an_evicting_replay_whose_count_copy_fails_changes_nothing(checks, monkeypatch):
    """A replayed evicting step whose copy of its counts cannot be queued (inside done(), after
    its undo actions are recorded) fails and changes nothing, and the steps after it equal
    those of the uncaptured steps with a bad key in that step instead. On several ranks it
    fails on rank 0 alone, and its peers, agreeing on the step's counts with it in the
    backward's op header, fail with it."""
    monkeypatch.delenv(table_group.REPLAY_EVICTION_ENV, raising=False)
    lengths, steps = steps_without_victims(16)
    steps[10] = steps[9]  # no TableFullError step
    failed, got, state = _steps_with_a_failing_read(checks, steps, lengths, True,
                                                    5 if RANK == 0 else -1, checks, monkeypatch)
    assert failed is not None and len(set(COMM.allgather(failed))) == 1
    bad = list(steps)
    bad[failed - 1] = bad[failed - 1].copy()
    if RANK == 0:
        bad[failed - 1][0] = -4
    failed_too, want, want_state = _steps_with_a_failing_read(checks, bad, lengths, False, -1,
                                                              checks, monkeypatch)
    assert failed_too == failed
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        for x, y in zip(a or (), b or ()):
            np.testing.assert_array_equal(x, y)
    for mine, theirs in zip(state, want_state):
        assert_same_state(mine, theirs)
