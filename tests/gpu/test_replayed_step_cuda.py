"""The replayed step (engine/lookup/replayed_step.py, SOK1X_CAPTURE) on the cuda engine at one
GPU: a dense lookup, its backward and its update recorded as CUDA graphs per shape class and
replayed equal the uncaptured step over many steps with changing keys (bit for bit where no key
repeats, so no atomic addition's order matters; outputs and rows bit for bit and sums to rounding
otherwise), every optimizer rule's update with each step's hyper-parameters read from device
memory, a replayed step queues one graph per op instead of its kernels, bad keys in a replayed
step fail it and change no table, new shape classes come and the graphs go with a remade table,
a step of more classes than are kept (the oldest, replayed earlier in the step, dropped before
its backward) stays right, and a program that replays steps and exits without shutting the
engine down exits 0.

    mpiexec --allow-run-as-root -n 1 python3 -m pytest -q tests/gpu/test_replayed_step_cuda.py
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("pycuda")

from conftest import skip_without_gpu  # noqa: E402
from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.lookup import bounded_step, replayed_step  # noqa: E402
from sok1x.engine.tables import optimizer_updates  # noqa: E402
from sok1x.errors import InvalidInputError  # noqa: E402

pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.usefixtures("engine")]
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=43)
DIM, ROWS = 16, 20000
RULES = {"lazy_adam": ("Adam", ("Adam/m", "Adam/v")),
         "adagrad": ("Adagrad", ("Adagrad/accumulator",))}


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
    """The same table made twice: (replayed name, uncaptured name)."""
    backend = runtime.get().backend
    names = ["replayed_" + tag, "uncaptured_" + tag]
    for name in names:
        api.create_table(name, DIM, ROWS, False, SPEC, replace=True)
        api.shard(name)
    rows = backend.asarray(np.arange(ROWS, dtype=np.int64))
    backend.put_rows(api.shard(names[1]).values, rows,
                     backend.asarray(host(api.shard(names[0]).values)))
    return names


def step(name, keys, scale, rule, number, replay, checks="backward", prefix=None, given=None):
    """A dense lookup, backward and update of `name`: host (output, values, rows); prefix and
    given: the update's slot prefix and hyper-parameters, where not RULES' and hyper's."""
    backend = runtime.get().backend
    with runtime.entered():
        out, token = api.dense_lookup(name, name + "_fwd", backend.asarray(keys), True,
                                      checks=checks, replay=replay)
        copied = host(out)  # a replay rewrites it
        grads = out if scale is None else backend.scale_rows(
            out, backend.asarray(np.full(out.shape[0], scale, np.float32)))
        values, rows = api.dense_lookup_grad(name, name + "_bwd", token, grads)
        got = copied, host(values), host(rows)
        api.apply_optimizer_updates([name], rule, prefix or RULES[rule][0], {},
                                    given or hyper(rule, number), [values], [rows])
    return got


def tables(names, rule=None):
    """Per table of `names`, host copies of its rows and every slot (by name)."""
    return [[host(api.shard(name).values)] + [host(api.shard(name).slots[slot])
                                              for slot in sorted(api.shard(name).slots)]
            for name in names]


def updates_recorded():
    with runtime.entered() as rt:
        return replayed_step.updates_recorded(rt)


def held():
    with runtime.entered() as rt:
        return replayed_step.classes_held(rt), replayed_step.held_bytes(rt)


@pytest.mark.parametrize("rule", ["lazy_adam", "adagrad"])
@pytest.mark.parametrize("checks", ["backward", "end"])
def test_replayed_equals_uncaptured_bit_for_bit(rule, checks):
    names = make_pair("exact_%s_%s" % (rule, checks))
    rng = np.random.default_rng(3)
    for number in range(1, 13):
        keys = rng.permutation(ROWS)[:4096]  # distinct keys: one addend per sum
        got = step(names[0], keys, None, rule, number, True, checks)
        want = step(names[1], keys, None, rule, number, False, checks)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(*tables(names, rule)):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    assert held()[0] == 1 and updates_recorded() == 1


_BASE = {"lr": 0.05, "lr_t": 0.02, "epsilon": 1e-6, "beta1": 0.9, "beta2": 0.999,
         "momentum": 0.8, "rho": 0.9, "lr_power": -0.5, "l1": 0.001, "l2": 0.01,
         "l2_shrinkage": 0.02}


def every_rule_hyper(rule, number):
    """Hyper-parameters of `rule` that all move every step (tests/mpi/step_rules.py's)."""
    names = optimizer_updates.RULES[rule].hyper_names
    return {name: _BASE[name] * (1.0 - 0.002 * number * (1 + position))
            for position, name in enumerate(names)}


@pytest.mark.parametrize("rule", sorted(optimizer_updates.RULES))
def test_every_rule_replayed_reads_each_steps_hyper_parameters(rule):
    names = make_pair("rule_" + rule)
    rng = np.random.default_rng(13)
    for number in range(1, 9):
        keys = rng.permutation(ROWS)[:3000]  # distinct: the sums are exact
        got = step(names[0], keys, 0.75, rule, number, True, prefix="R",
                   given=every_rule_hyper(rule, number))
        want = step(names[1], keys, 0.75, rule, number, False, prefix="R",
                    given=every_rule_hyper(rule, number))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(*tables(names)):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    recorded = updates_recorded()
    print("%s: update recorded %d" % (rule, recorded))
    # a rule on every row makes its dense gradient from an upload, which a graph refuses
    assert recorded == (0 if rule.endswith(optimizer_updates.ALL_ROWS) else 1)


def test_repeated_keys_and_a_scaled_gradient():
    names = make_pair("repeats")
    rng = np.random.default_rng(5)
    for number in range(1, 11):
        keys = rng.integers(0, ROWS // 4, size=(3000, 2))
        got = step(names[0], keys, 0.5 + number, "lazy_adam", number, True)
        want = step(names[1], keys, 0.5 + number, "lazy_adam", number, False)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[2], want[2])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
        for a, b in zip(*tables(names, "lazy_adam")):
            for x, y in zip(a, b):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_a_replayed_step_launches_a_graph_per_op():
    names = make_pair("launches")
    rng = np.random.default_rng(7)
    backend = runtime.get().backend
    launches, update_launches, update_copies = {}, {}, {}
    for replay in (True, False):
        for number in range(1, 7):
            keys = backend.asarray(rng.integers(0, ROWS, size=8192))
            before = backend.counts()
            with runtime.entered():
                out, token = api.dense_lookup(names[0], "launch_fwd", keys, True,
                                              checks="backward", replay=replay)
                values, rows = api.dense_lookup_grad(names[0], "launch_bwd", token, out)
                between = backend.counts()
                started = time.time()
                api.apply_optimizer_updates([names[0]], "lazy_adam", "Adam", {},
                                            hyper("lazy_adam", number), [values], [rows])
                ended = time.time()
            after = backend.counts()
            if replay:  # the recorded stamp wrote this step's time
                held = backend.to_host(rows)
                stamped = backend.to_host(api.shard(names[0]).times)[held[held >= 0]]
                assert stamped.size and np.all((stamped >= started) & (stamped <= ended))
        launches[replay] = between["launches"] - before["launches"]
        update_launches[replay] = after["launches"] - between["launches"]
        update_copies[replay] = after["copies"] - between["copies"]
    print("kernels launched by a forward and backward: replayed %d, uncaptured %d; by the "
          "update: replayed %d (copies %d), uncaptured %d (copies %d)" % (
              launches[True], launches[False], update_launches[True], update_copies[True],
              update_launches[False], update_copies[False]))
    assert launches[True] == 0 < launches[False]
    # The replayed update's own kernel: one write of its hyper-parameters and its stamp's time,
    # with no upload; the update and the stamp are in the graph (updates_recorded above). Its
    # one copy is the flag of the step's key checks, which the backward left to it (read once
    # its work, predicated on that flag on the device, is queued).
    assert (update_launches[True], update_copies[True]) == (1, 1)
    assert replayed_step.updates_recorded(runtime.get()) >= 1


@pytest.mark.parametrize("checks", ["backward", "end"])
def test_bad_keys_in_a_replayed_step_fail_and_change_nothing(checks):
    names = make_pair("bad_" + checks)
    rng = np.random.default_rng(9)
    for number in range(1, 5):
        step(names[0], rng.integers(0, ROWS, size=1000), None, "adagrad", number, True, checks)
    before = tables(names[:1], "adagrad")
    for bad in (ROWS + 3, -1):
        keys = rng.integers(0, ROWS, size=1000)
        keys[517] = bad
        with pytest.raises(InvalidInputError, match=names[0]):
            step(names[0], keys, None, "adagrad", 5, True, checks)
        for a, b in zip(before[0], tables(names[:1], "adagrad")[0]):
            np.testing.assert_array_equal(a, b)
    keys = rng.integers(0, ROWS, size=1000)
    got = step(names[0], keys, None, "adagrad", 5, True, checks)  # replays go on
    assert held()[0] == 1 and got[0].shape == (1000, DIM)


def test_shape_classes_and_their_memory():
    names = make_pair("classes")
    rng = np.random.default_rng(11)
    counts = [4000, 4000, 6000, 6000, 4000, 6000, 8000, 8000, 8000]
    for number, count in enumerate(counts, 1):
        keys = rng.integers(0, ROWS, size=count)
        got = step(names[0], keys, None, "lazy_adam", number, True)
        want = step(names[1], keys, None, "lazy_adam", number, False)
        np.testing.assert_array_equal(got[0], want[0])
    classes, nbytes = held()
    # per class at least its keys (its rows too, alone) and output, and its backward's padded
    # rows, local rows and sums
    least = sum(8 * n + 4 * n * DIM + 16 * n + 4 * n * DIM for n in (4000, 6000, 8000))
    print("3 classes hold %.2f MiB (at least %.2f)" % (nbytes / 2.0 ** 20, least / 2.0 ** 20))
    assert classes == 3 and least <= nbytes <= 4 * least
    make_pair("classes")  # remade: the graphs go at the next lookup
    step(names[0], rng.integers(0, ROWS, size=4000), None, "lazy_adam", 1, True)
    assert held() == (0, 0)


def test_more_classes_in_a_step_than_are_kept_stay_right(monkeypatch):
    """Tables looked up in one step, each its own shape class, with at most two classes kept:
    two replay from the third step on; from the fifth a third table joins, whose recording (at
    its second sight) drops the oldest class, replayed earlier in that very step, its backward
    still to come. Every output, gradient, row and slot equals the uncaptured step's."""
    monkeypatch.setattr(replayed_step, "MAX_CLASSES", 2)
    pairs = [make_pair("crowd%d" % t) for t in range(3)]
    rng = np.random.default_rng(17)
    backend = runtime.get().backend
    for number in range(1, 11):
        tables_now = 2 if number < 5 else 3
        keys = [rng.integers(0, ROWS, size=3000 + 1000 * t) for t in range(tables_now)]
        got = {}
        for side in (0, 1):
            with runtime.entered():
                fronts = [api.dense_lookup(names[side], names[side] + "_fwd",
                                           backend.asarray(k), True, checks="backward",
                                           replay=side == 0)
                          for names, k in zip(pairs, keys)]
                outs = [host(out) for out, _ in fronts]
                grads = [api.dense_lookup_grad(names[side], names[side] + "_bwd", token, out)
                         for names, (out, token) in zip(pairs, fronts)]
                got[side] = outs + [host(a) for pair in grads for a in pair]
                for names, (values, rows) in zip(pairs, grads):
                    api.apply_optimizer_updates([names[side]], "adagrad", "Adagrad", {},
                                                hyper("adagrad", number), [values], [rows])
        for a, b in zip(got[0], got[1]):
            np.testing.assert_array_equal(a, b)
        for names in pairs:
            for a, b in zip(*tables(names)):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y)


PROGRAM = r"""
import os
import numpy as np
os.environ["SOK1X_BOUNDED_STEP"] = "1"
from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup import replayed_step
rt = runtime.init(backend="cuda")
api.create_table("exit_table", 16, 1 << 12, False, random_init.make_spec("uniform", -1, 1, 3))
rng = np.random.default_rng(1)
with runtime.entered():
    for step in range(6):
        keys = rt.backend.asarray(rng.integers(0, 1 << 12, size=512))
        vectors, token = api.dense_lookup("exit_table", "exit_fwd", keys, True,
                                          checks="backward", replay=True)
        values, rows = api.dense_lookup_grad("exit_table", "exit_bwd", token, vectors)
        api.apply_optimizer_updates(["exit_table"], "adagrad", "Adagrad", {},
                                    {"lr": 0.1, "epsilon": 1e-7}, [values], [rows])
    print("done", replayed_step.classes_held(rt), float(rt.backend.to_host(values).sum()))
"""


def test_a_program_that_replays_exits_zero(tmp_path):
    skip_without_gpu()
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONFAULTHANDLER="1"),
                          cwd=str(tmp_path))
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "done 1 " in done.stdout
    assert "terminate called" not in done.stderr and "Aborted" not in done.stderr
