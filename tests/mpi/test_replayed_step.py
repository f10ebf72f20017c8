"""The replayed step (engine/lookup/replayed_step.py, SOK1X_CAPTURE, DESIGN D14) on the cpu
backend, at any number of ranks: a dense lookup of one table, its backward and the update, run
with replay=True under the bounded step, equal the same step run uncaptured bit for bit
(outputs, the padded gradient's rows and values, every row and optimizer slot) over many steps
with changing keys, with the top gradient the output itself or another array, across shape
classes that come and go; on one rank the classes are really recorded and replayed (held,
counted, freed when a table is remade; past MAX_CLASSES or SOK1X_REPLAY_MIB dropped but kept
until nothing of their step reads them), the update too, with each step's
hyper-parameters for every optimizer rule, and recorded again where a slot moved; on several
ranks too when the lookups are sized by per-peer capacities (SOK1X_PEER_CAPACITY=1; a step that
overflows them equals the uncaptured one), and without
them nothing is recorded there; bad keys in a replayed step fail it with the uncaptured error,
in its forward or its backward, change no table, and the replays go on after; two tables of
different dims replay in one step; work the backend refuses to record (CaptureError) leaves its
class uncaptured and the steps right; SOK1X_CAPTURE=0 records nothing; an update given a hyper-
parameter array of the wrong length refuses it, as write_given refuses values that do not fit
its array."""
import time

import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import random_init
from sok1x.engine import api, lent_memory, runtime
from sok1x.engine.lookup import bounded_step, peer_capacity, replay_budget, replayed_step
from sok1x.engine.op_order import OpId
from sok1x.errors import InitError, InvalidInputError
from sok1x.engine.tables import optimizer_updates
from step_rules import RULES, every_rule_hyper, hyper

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=37)
DIM, ROWS = 8, 48


@pytest.fixture(scope="module", autouse=True)
def engine():
    return runtime.init(backend="cpu")


@pytest.fixture(autouse=True)
def bounded(monkeypatch):
    monkeypatch.setenv(bounded_step.ENV, "1")
    monkeypatch.setenv(peer_capacity.ENV, "1")  # on several ranks: sized by per-peer caps
    monkeypatch.delenv(replayed_step.ENV, raising=False)
    monkeypatch.delenv(replay_budget.MEMORY_ENV, raising=False)


def make_tables(tag):
    """The same table made twice: (replayed name, uncaptured name)."""
    names = ["replayed_" + tag, "uncaptured_" + tag]
    for name in names:
        api.create_table(name, DIM, ROWS, False, SPEC, replace=True)
    api.shard(names[1]).values[...] = api.shard(names[0]).values
    return names


def step(name, keys, scale, rule, number, replay, checks="backward", prefix=None, given=None,
         options=None):
    """A dense lookup, backward and update of `name`; returns host copies of (output, values,
    rows). scale None: the output itself is the top gradient; prefix and given: the update's
    slot prefix and hyper-parameters, where not RULES' and step_rules.hyper's."""
    out, token = api.dense_lookup(name, name + "_fwd", keys, True, checks=checks,
                                  replay=replay)
    copied = np.array(out)  # the replayed output is rewritten by the next replay
    grads = out if scale is None else out * scale
    values, rows = api.dense_lookup_grad(name, name + "_bwd", token, grads)
    copies = np.array(values), np.array(rows)
    api.apply_optimizer_updates([name], rule, prefix or RULES[rule][0], options or {},
                                given or hyper(rule, number), [values], [rows])
    return (copied,) + copies


def assert_same_tables(names, rule=None):
    a, b = (api.shard(name) for name in names)
    np.testing.assert_array_equal(a.values, b.values)
    assert sorted(a.slots) == sorted(b.slots)
    for slot in a.slots:
        np.testing.assert_array_equal(a.slots[slot], b.slots[slot])


def held():
    with runtime.entered() as rt:
        return replayed_step.classes_held(rt), replayed_step.held_bytes(rt)


def updates_replayed():
    with runtime.entered() as rt:
        return replayed_step.updates_recorded(rt)


def run_both(names, keys, scale, rule, number, checks="backward"):
    got = step(names[0], keys, scale, rule, number, True, checks)
    want = step(names[1], keys, scale, rule, number, False, checks)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert_same_tables(names, rule)
    return got


@pytest.mark.parametrize("rule", ["lazy_adam", "adagrad"])
@pytest.mark.parametrize("top", ["output", "scaled"])
@pytest.mark.parametrize("checks", ["backward", "end"])
def test_replayed_equals_uncaptured(rule, top, checks):
    names = make_tables("equal_%s_%s_%s" % (rule, top, checks))
    rng = np.random.default_rng([7, RANK])
    for number in range(1, 11):
        keys = rng.integers(0, ROWS * SIZE, size=(13, 2))  # one shape class, repeated keys
        scale = None if top == "output" else np.float32(0.5 + 0.25 * number)
        run_both(names, keys, scale, rule, number, checks)
    classes, nbytes = held()
    assert classes == 1  # recorded at the second step and replayed since
    assert nbytes >= 26 * 8 + 26 * DIM * 4  # its fixed keys and output at least
    assert updates_replayed() == 1  # the update from the fourth step on


def test_shape_classes_come_and_go():
    names = make_tables("classes")
    rng = np.random.default_rng([11, RANK])
    sizes = [5, 9, 5, 5, 17, 9, 9, 5, 17, 17, 9, 5]
    for number, count in enumerate(sizes, 1):
        keys = rng.integers(0, ROWS * SIZE, size=count)
        run_both(names, keys, np.float32(2.0), "lazy_adam", number)
    assert held()[0] == 3


def test_at_most_max_classes(monkeypatch):
    monkeypatch.setattr(replayed_step, "MAX_CLASSES", 2)
    names = make_tables("most")
    rng = np.random.default_rng([13, RANK])
    for number, count in enumerate([3, 3, 4, 4, 6, 6, 3, 3, 3], 1):
        keys = rng.integers(0, ROWS * SIZE, size=count)
        run_both(names, keys, None, "adagrad", number)
        assert held()[0] <= 2


def test_more_classes_in_a_step_than_are_kept_stay_right(monkeypatch):
    """Tables looked up in one step, each its own shape class, with at most two classes kept:
    two replay from the third step on; from the fifth a third table joins, whose recording (at
    its second sight) drops the oldest class, replayed earlier in that very step, its backward
    and update still to come. Every output, gradient, row and slot equals the uncaptured
    step's (the cpu twin poisons a freed class's arrays, as cuda's pool reuses them)."""
    monkeypatch.setattr(replayed_step, "MAX_CLASSES", 2)
    pairs = [make_tables("crowd%d" % t) for t in range(3)]
    rng = np.random.default_rng([23, RANK])
    for number in range(1, 11):
        now = pairs[:2] if number < 5 else pairs
        keys = [rng.integers(0, ROWS * SIZE, size=3 + 2 * t) for t in range(len(now))]
        got = {}
        for side in (0, 1):
            fronts = [api.dense_lookup(names[side], names[side] + "_fwd", k, True,
                                       checks="backward", replay=side == 0)
                      for names, k in zip(now, keys)]
            outs = [np.array(out) for out, _ in fronts]
            grads = [api.dense_lookup_grad(names[side], names[side] + "_bwd", token, out)
                     for names, (out, token) in zip(now, fronts)]
            got[side] = outs + [np.array(a) for pair in grads for a in pair]
            for names, (values, rows) in zip(now, grads):
                api.apply_optimizer_updates([names[side]], "adagrad", "Adagrad", {},
                                            hyper("adagrad", number), [values], [rows])
        for a, b in zip(got[0], got[1]):
            np.testing.assert_array_equal(a, b)
        for names in pairs:
            assert_same_tables(names)
        assert held()[0] <= 2


def balanced_keys(rng, count, rows=ROWS):
    """`count` keys of a table of `rows` rows a rank, as many for each owner (key % SIZE) as
    can be: no step of a class overflows the caps its first steps set (peer_capacity)."""
    return rng.integers(0, rows, size=count) * SIZE + np.arange(count) % SIZE


def test_a_replayed_step_whose_keys_overflow_a_cap_equals_the_uncaptured_one():
    """On several ranks, a step of a replayed class whose keys all go to one owner overflows
    the caps its class was recorded with: it goes on the counted way, into arrays of its own
    (not the class's output, which the step's caller is handed otherwise), and its output,
    gradient and update equal the uncaptured step's; the class is recorded again and replays
    on the grown caps."""
    rows, count = 512, 128
    names = ["replayed_overflow", "uncaptured_overflow"]
    for name in names:
        api.create_table(name, DIM, rows, False, SPEC, replace=True)
    api.shard(names[1]).values[...] = api.shard(names[0]).values
    rng = np.random.default_rng([31, RANK])
    for number in range(1, 10):
        if number in (5, 6):  # distinct keys, every one owned by rank 0
            keys = rng.permutation(rows)[:count] * SIZE
        else:
            keys = balanced_keys(rng, count, rows)
        run_both(names, keys, None, "adagrad", number)
    assert held()[0] == 1


def kept_sizes():
    """The kept forward classes by their number of keys (a dense class's key holds it)."""
    with runtime.entered() as rt:
        return sorted(key[4] for key in rt.replays.forwards)


def retired(entry):
    """Whether forward class `entry` is retired: dropped, its memory not yet freed."""
    with runtime.entered() as rt:
        return any(other is entry for other in rt.replays.retired)


def test_past_the_replay_budget_the_oldest_classes_go_and_stay_uncaptured(monkeypatch):
    """SOK1X_REPLAY_MIB=0 keeps the newest class only: the one it drops is not recorded again
    (two classes taking turns would record each other out at every step), and every step still
    equals the uncaptured one."""
    monkeypatch.setenv(replay_budget.MEMORY_ENV, "0")
    names = make_tables("budget")
    rng = np.random.default_rng([17, RANK])

    def steps(counts, first):
        for number, count in enumerate(counts, first):
            run_both(names, balanced_keys(rng, count), None, "adagrad", number)
    steps([5, 5, 5], 1)  # recorded at the second step, replayed at the third
    assert kept_sizes() == [5]
    steps([9, 9, 9], 4)  # the second class: the first goes
    assert kept_sizes() == [9]
    steps([5, 5, 5], 7)  # the first stays uncaptured: the second is kept
    assert kept_sizes() == [9]
    steps([9], 10)  # and replays
    assert kept_sizes() == [9]
    monkeypatch.setenv(replay_budget.MEMORY_ENV, "1024")
    steps([13, 13, 9, 13], 11)  # room for both: the new one is kept beside the second
    assert kept_sizes() == [9, 13]


@pytest.mark.parametrize("value", ["lots", "-1", "nan", "inf"])
def test_a_replay_budget_that_is_no_number_fails_init_on_every_rank(monkeypatch, value):
    """sok1x's init asks every rank's SOK1X_REPLAY_MIB beside its global batch size, in one
    all-gather (runtime._check_start_settings): a value that is no budget on one rank fails it
    on every rank, naming that rank and the value."""
    if RANK == SIZE - 1:
        monkeypatch.setenv(replay_budget.MEMORY_ENV, value)
    with runtime.entered() as rt:
        with pytest.raises(InitError, match="rank %d: SOK1X_REPLAY_MIB=%r" % (SIZE - 1, value)):
            runtime._check_start_settings(rt.host, None)
    monkeypatch.setenv(replay_budget.MEMORY_ENV, "0.5")
    with runtime.entered() as rt:
        runtime._check_start_settings(rt.host, 4 * SIZE)
        if SIZE > 1:
            with pytest.raises(InitError, match="ranks disagree on global_batch_size"):
                runtime._check_start_settings(rt.host, 4 * SIZE + RANK)


def test_a_replay_budget_spoiled_after_init_is_warned_of_and_left_unused(monkeypatch):
    """A value set after init that is no budget (init did not see it; a rank alone failing a
    lookup would leave its peers in the lookup's collectives) is warned of once, and the steps
    go on as without a budget, equal to the uncaptured ones."""
    names = make_tables("spoiled_budget")
    rng = np.random.default_rng([19, RANK])
    monkeypatch.setenv(replay_budget.MEMORY_ENV, "a lot %d" % RANK)
    with pytest.warns(UserWarning, match="SOK1X_REPLAY_MIB='a lot %d'.*left unused" % RANK):
        for number, count in enumerate([5, 5, 5, 9, 9, 9], 1):
            run_both(names, balanced_keys(rng, count), None, "lazy_adam", number)
    assert kept_sizes() == [5, 9]


def test_same_named_lookups_of_a_tower_keep_a_dropped_class_to_their_steps_end(monkeypatch):
    """Three lookups of one name at three places of one tower (as a graph makes them), at most
    three classes kept: from the fifth step the middle one's keys change, and its new class,
    recorded at the sixth, drops the first one's, replayed earlier in that step; the last
    lookup's call does not free it (only the same place's next call, or the tower's next step,
    does), and every output, gradient and row equals the uncaptured step's. (checks="end": no
    forward's checks are left unread, which would keep it anyway.)"""
    monkeypatch.setattr(replayed_step, "MAX_CLASSES", 3)
    pairs = [make_tables("tower%d" % t) for t in range(3)]
    rng = np.random.default_rng([37, RANK])
    for number in range(1, 10):
        counts = [3, 5 if number < 5 else 11, 7]
        keys = [balanced_keys(rng, count) for count in counts]
        got = {}
        for side in (0, 1):
            tower = "tower_%d" % side
            fronts = [api.dense_lookup(pairs[t][side], OpId("lookup", tower, t), keys[t], True,
                                       checks="end", replay=side == 0) for t in range(3)]
            outs = [np.array(out) for out, _ in fronts]
            grads = [api.dense_lookup_grad(pairs[t][side], OpId("grad", tower, 3 + t), token,
                                           out) for t, (out, token) in enumerate(fronts)]
            got[side] = outs + [np.array(a) for pair in grads for a in pair]
            for t, (values, rows) in enumerate(grads):
                api.apply_optimizer_updates([pairs[t][side]], "adagrad", "Adagrad", {},
                                            hyper("adagrad", number), [values], [rows])
        for a, b in zip(got[0], got[1]):
            np.testing.assert_array_equal(a, b)
        for names in pairs:
            assert_same_tables(names)


def test_a_dropped_class_is_freed_at_its_ops_next_call_and_not_while_it_is_held(monkeypatch):
    """A class dropped (past MAX_CLASSES) keeps its memory, counted in held_bytes, until its op
    is called again, and past that while the framework holds its output (lent_memory); the
    steps stay right throughout."""
    monkeypatch.setattr(replayed_step, "MAX_CLASSES", 1)
    first, second = make_tables("retire_a"), make_tables("retire_b")
    rng = np.random.default_rng([29, RANK])

    def steps(names, count, numbers):
        for number in numbers:
            run_both(names, rng.integers(0, ROWS * SIZE, size=count), None, "adagrad", number)
    steps(first, 6, range(1, 4))  # recorded and replayed
    with runtime.entered() as rt:
        entry = next(iter(rt.replays.forwards.values()))
    output = entry.handed_out()[0]
    before = held()[1]
    keep = lent_memory.lend(output, output.ctypes.data, output.nbytes)  # a framework holds it
    try:
        steps(second, 10, range(1, 4))  # its recording drops the first's class
        assert kept_sizes() == [10] and retired(entry)
        assert held()[1] > before  # counted beside the second's
        steps(first, 6, [4])  # its op again, its output still held: kept
        assert retired(entry) and entry.work.outputs is not None
    finally:
        lent_memory.release(keep)
    steps(first, 6, [5])  # given back: freed at the op's next call
    assert not retired(entry) and entry.work.outputs is None


def test_a_remade_table_frees_the_classes():
    names = make_tables("remade")
    rng = np.random.default_rng([17, RANK])
    for number in range(1, 5):
        run_both(names, rng.integers(0, ROWS * SIZE, size=7), None, "lazy_adam", number)
    assert held()[0] == 1
    names = make_tables("remade")  # replace=True: the old shards go, and the classes at once
    assert held() == (0, 0)
    for number in range(1, 5):
        if number == 1:
            run_both(names, rng.integers(0, ROWS * SIZE, size=7), None, "lazy_adam", number)
            assert held() == (0, 0)  # the first sight after the change: nothing held
        else:
            run_both(names, rng.integers(0, ROWS * SIZE, size=7), None, "lazy_adam", number)
    assert held()[0] == 1


@pytest.mark.parametrize("checks", ["backward", "end"])
def test_bad_keys_in_a_replayed_step(checks):
    names = make_tables("bad_" + checks)
    rng = np.random.default_rng([19, RANK])
    for number in range(1, 5):
        run_both(names, rng.integers(0, ROWS * SIZE, size=10), None, "adagrad", number,
                 checks)
    before = api.shard(names[0]).values.copy()
    keys = rng.integers(0, ROWS * SIZE, size=10)
    keys[3] = ROWS * SIZE + 2 if RANK == 0 else keys[3]  # one rank's key past the table
    with pytest.raises(InvalidInputError, match="replayed_bad_%s" % checks):
        step(names[0], keys, None, "adagrad", 5, True, checks)
    np.testing.assert_array_equal(api.shard(names[0]).values, before)
    negative = rng.integers(0, ROWS * SIZE, size=10)
    negative[-1] = -4 if RANK == SIZE - 1 else negative[-1]
    with pytest.raises(InvalidInputError, match="replayed_bad_%s" % checks):
        step(names[0], negative, None, "adagrad", 5, True, checks)
    np.testing.assert_array_equal(api.shard(names[0]).values, before)
    for number in range(5, 8):  # the uncaptured table skipped the failed steps too
        run_both(names, rng.integers(0, ROWS * SIZE, size=10), None, "adagrad", number,
                 checks)
    assert held()[0] == 1


def test_several_ranks_without_caps_record_nothing(monkeypatch):
    """On several ranks a lookup sized by its counts has no bound before its header: it is not
    recorded (on one rank the caps play no part)."""
    monkeypatch.setenv(peer_capacity.ENV, "0")
    with runtime.entered() as rt:
        replayed_step.free(rt)
    names = make_tables("uncapped")
    rng = np.random.default_rng([67, RANK])
    for number in range(1, 6):
        run_both(names, rng.integers(0, ROWS * SIZE, size=8), None, "lazy_adam", number)
    assert held()[0] == (1 if SIZE == 1 else 0)


def test_capture_off_records_nothing(monkeypatch):
    monkeypatch.setenv(replayed_step.ENV, "0")
    with runtime.entered() as rt:
        replayed_step.free(rt)
    names = make_tables("off")
    rng = np.random.default_rng([23, RANK])
    for number in range(1, 5):
        run_both(names, rng.integers(0, ROWS * SIZE, size=6), None, "lazy_adam", number)
    assert held() == (0, 0)


def test_two_tables_of_different_dims_in_one_step():
    pairs = []
    for tag, dim in (("wide", 12), ("narrow", 3)):
        names = ["replayed_" + tag, "uncaptured_" + tag]
        for name in names:
            api.create_table(name, dim, ROWS, False, SPEC, replace=True)
        api.shard(names[1]).values[...] = api.shard(names[0]).values
        pairs.append(names)
    rng = np.random.default_rng([29, RANK])
    for number in range(1, 9):
        for names, count in zip(pairs, (11, 4 + number % 2)):  # the narrow one: two classes
            run_both(names, rng.integers(0, ROWS * SIZE, size=(count, 2)), None, "adagrad",
                     number)
    assert held()[0] == 3


def test_work_that_cannot_be_recorded_stays_uncaptured(monkeypatch):
    from sok1x.errors import CaptureError
    names = make_tables("refused")
    with runtime.entered() as rt:
        backend = rt.backend

    def refuse(run):
        raise CaptureError("an upload of host data inside a captured CUDA graph")
    monkeypatch.setattr(backend, "captured_work", refuse)
    rng = np.random.default_rng([31, RANK])
    for number in range(1, 7):
        run_both(names, rng.integers(0, ROWS * SIZE, size=9), None, "lazy_adam", number)
    assert held() == (0, 0)


@pytest.mark.parametrize("rule", sorted(optimizer_updates.RULES))
def test_every_rule_is_replayed_with_each_steps_hyper_parameters(rule):
    names = make_tables("rule_" + rule)
    rng = np.random.default_rng([37, RANK])
    for number in range(1, 9):
        keys = rng.integers(0, ROWS * SIZE, size=(11, 2))
        got = step(names[0], keys, np.float32(0.75), rule, number, True, prefix="R",
                   given=every_rule_hyper(rule, number))
        want = step(names[1], keys, np.float32(0.75), rule, number, False, prefix="R",
                    given=every_rule_hyper(rule, number))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        assert_same_tables(names)
    assert updates_replayed() == 1


def test_an_update_whose_slot_moved_is_recorded_again():
    names = make_tables("moved")
    rng = np.random.default_rng([41, RANK])
    for number in range(1, 11):
        if number == 6:  # as a load that gives the table new slot arrays would
            for name in names:
                shard = api.shard(name)
                shard.slots["Adam/m"] = shard.slots["Adam/m"].copy()
        run_both(names, rng.integers(0, ROWS * SIZE, size=8), None, "lazy_adam", number)
    assert updates_replayed() == 1


def test_a_hyper_parameter_array_of_the_wrong_length_is_refused():
    with runtime.entered() as rt:
        backend = rt.backend
        var = backend.asarray(np.ones((4, 2), np.float32))
        accum = backend.asarray(np.ones((4, 2), np.float32))
        rows = backend.asarray(np.array([1, 3], np.int64))
        grads = backend.asarray(np.ones((2, 2), np.float32))
        with backend.hyper_given(backend.asarray(np.array([0.1], np.float32))):
            with pytest.raises(ValueError, match="2 hyper-parameters"):
                backend.update_adagrad(var, accum, rows, grads, 0.1, 1e-7)
        np.testing.assert_array_equal(backend.to_host(var), np.ones((4, 2), np.float32))


def test_write_given_fills_the_array_or_refuses_and_writes_nothing():
    with runtime.entered() as rt:
        backend = rt.backend
        given = backend.asarray(np.zeros(4, np.float32))
        values = np.float32([0.5, 0.9, 0.999, 1e-8])
        backend.write_given(given, values)
        for wrong in ([1.0] * 3, [1.0] * 5):
            with pytest.raises(ValueError, match="write_given: %d values" % len(wrong)):
                backend.write_given(given, wrong)
        np.testing.assert_array_equal(backend.to_host(given), values)
        with pytest.raises(ValueError, match="at most 6"):
            backend.write_given(backend.asarray(np.zeros(7, np.float32)), [1.0] * 7)


def test_copy_array_copies_across_shapes_or_refuses_and_writes_nothing():
    """A replayed step's keys go into its fixed array by backend.copy_array: any shapes of one
    dtype and size; another size or dtype is refused and the array keeps its values."""
    with runtime.entered() as rt:
        backend = rt.backend
        fixed = backend.asarray(np.zeros(6, np.int64))
        backend.copy_array(fixed, backend.asarray(np.arange(6, dtype=np.int64).reshape(2, 3)))
        np.testing.assert_array_equal(backend.to_host(fixed), np.arange(6))
        for wrong in (np.zeros(5, np.int64), np.zeros(6, np.int32)):
            with pytest.raises(ValueError, match="copy_array"):
                backend.copy_array(fixed, backend.asarray(wrong))
        np.testing.assert_array_equal(backend.to_host(fixed), np.arange(6))


def test_a_known_class_skips_the_host_checks_until_its_rows_move(monkeypatch):
    """From its first replay on, a step of a known class (the same table, op, keys' shape and
    dtype, row shape and checks) skips the lookup's shape checks, which it passed then; a table
    whose rows moved (as a load that gives it new arrays would) is recorded anew, checked until
    it replays again, and every step equals the uncaptured one."""
    names = make_tables("known")
    rng = np.random.default_rng([43, RANK])
    checked = []
    original = api.check_dense_shape
    monkeypatch.setattr(api, "check_dense_shape",
                        lambda name, *rest: checked.append(name) or original(name, *rest))

    def shaped_step(name, keys, number, replay):
        out, token = api.dense_lookup(name, name + "_fwd", keys, True, (3, 2),
                                      checks="backward", replay=replay)
        copied = np.array(out)
        values, rows = api.dense_lookup_grad(name, name + "_bwd", token, out)
        copies = np.array(values), np.array(rows)
        api.apply_optimizer_updates([name], "adagrad", RULES["adagrad"][0], {},
                                    hyper("adagrad", number), [values], [rows])
        return (copied,) + copies
    skipped = []
    for number in range(1, 11):
        if number == 6:
            for name in names:
                shard = api.shard(name)
                shard.values = shard.values.copy()
        keys = rng.integers(0, ROWS * SIZE, size=(4, 3, 2))
        got = shaped_step(names[0], keys, number, True)
        want = shaped_step(names[1], keys, number, False)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        assert_same_tables(names)
        skipped.append(names[0] not in checked)
        checked.clear()
    # first sight, recorded, first replay; then known; moved: recorded, first replay; known
    assert skipped == [False] * 3 + [True] * 2 + [False] * 2 + [True] * 3


def test_a_replayed_update_stamps_each_steps_time(monkeypatch):
    """The stamp of a replayed update is recorded with it and writes the time its own step put
    into the clock (write_given), not a time of its own: the replayed step's clock is given
    made-up times here, which its stamps must hold exactly; the uncaptured update stamps the
    time it runs at."""
    names = make_tables("stamped")
    rng = np.random.default_rng([53, RANK])
    made_up = iter(1.5e9 + 0.25 * n for n in range(1, 1000))

    class Clock:
        now = None

        def time(self):
            self.now = next(made_up)
            return self.now
    clock = Clock()
    monkeypatch.setattr(replayed_step, "time", clock)
    clocked = []
    for number in range(1, 9):
        keys = rng.integers(0, ROWS * SIZE, size=10)
        before, clock.now = time.time(), None
        got = step(names[0], keys, None, "lazy_adam", number, True)
        want = step(names[1], keys, None, "lazy_adam", number, False)
        stamped = np.asarray(api.shard(names[0]).times)[got[2][got[2] >= 0]]
        clocked.append(clock.now is not None)
        if clocked[-1]:  # the update recorded (its first sight) or replayed
            np.testing.assert_array_equal(stamped, clock.now)
        else:  # uncaptured: the time it ran at
            assert np.all((stamped >= before) & (stamped <= time.time())), number
        uncaptured = np.asarray(api.shard(names[1]).times)[want[2][want[2] >= 0]]
        assert np.all((uncaptured >= before) & (uncaptured <= time.time())), number
    assert clocked == [False] * 3 + [True] * 5
    assert updates_replayed() == 1


def test_dropped_classes_leave_no_front_behind(monkeypatch):
    """A class dropped (past MAX_CLASSES) takes the fronts that reached it along, so that no
    front keeps its arrays alive; every front left reaches a class still held."""
    monkeypatch.setattr(replayed_step, "MAX_CLASSES", 2)
    names = make_tables("fronts")
    rng = np.random.default_rng([59, RANK])
    for number, count in enumerate([3] * 3 + [4] * 3 + [5] * 3 + [6] * 3 + [3] * 3, 1):
        run_both(names, balanced_keys(rng, count), None, "adagrad", number)
    with runtime.entered() as rt:
        classes = rt.replays
        fronts = [] if classes is None else list(classes.fronts.values())
        assert all(classes.forwards.get(entry.key) is entry for entry, _, _ in fronts)
        assert len(fronts) == 2


def test_options_given_as_pairs_replay_as_a_dict_does():
    """An update's options as (name, value) pairs, as the uncaptured update takes them."""
    names = make_tables("pairs")
    rng = np.random.default_rng([61, RANK])
    for number in range(1, 8):
        keys = rng.integers(0, ROWS * SIZE, size=9)
        got = step(names[0], keys, None, "adagrad", number, True,
                   options=[("initial_accumulator", 0.5)])
        want = step(names[1], keys, None, "adagrad", number, False,
                    options={"initial_accumulator": 0.5})
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        assert_same_tables(names)
    assert updates_replayed() == 1
