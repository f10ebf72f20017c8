"""The replayed step (engine/lookup/replayed_step.py, SOK1X_CAPTURE) on the cuda engine at one
GPU: a dense lookup and its backward recorded as CUDA graphs per shape class and replayed equal
the uncaptured step over many steps with changing keys (bit for bit where no key repeats, so no
atomic addition's order matters; outputs and rows bit for bit and sums to rounding otherwise), a
replayed step queues one graph per op instead of its kernels, bad keys in a replayed step fail it
and change no table, new shape classes come and the graphs go with a remade table, and a program
that replays steps and exits without shutting the engine down exits 0.

    mpiexec --allow-run-as-root -n 1 python3 -m pytest -q tests/gpu/test_replayed_step_cuda.py
"""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("pycuda")

from conftest import skip_without_gpu  # noqa: E402
from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.lookup import bounded_step, replayed_step  # noqa: E402
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


def step(name, keys, scale, rule, number, replay, checks="backward"):
    """A dense lookup, backward and update of `name`: host (output, values, rows)."""
    backend = runtime.get().backend
    with runtime.entered():
        out, token = api.dense_lookup(name, name + "_fwd", backend.asarray(keys), True,
                                      checks=checks, replay=replay)
        copied = host(out)  # a replay rewrites it
        grads = out if scale is None else backend.scale_rows(
            out, backend.asarray(np.full(out.shape[0], scale, np.float32)))
        values, rows = api.dense_lookup_grad(name, name + "_bwd", token, grads)
        got = copied, host(values), host(rows)
        api.apply_optimizer_updates([name], rule, RULES[rule][0], {}, hyper(rule, number),
                                    [values], [rows])
    return got


def tables(names, rule):
    return [[host(api.shard(name).values)] + [host(api.shard(name).slots[slot])
                                              for slot in RULES[rule][1]] for name in names]


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
    assert held()[0] == 1


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
    launches = {}
    for replay in (True, False):
        for _ in range(1, 6):
            keys = backend.asarray(rng.integers(0, ROWS, size=8192))
            before = backend.counts()
            with runtime.entered():
                out, token = api.dense_lookup(names[0], "launch_fwd", keys, True,
                                              checks="backward", replay=replay)
                api.dense_lookup_grad(names[0], "launch_bwd", token, out)
            after = backend.counts()
        launches[replay] = after["launches"] - before["launches"]
    print("kernels launched by a forward and backward: replayed %d, uncaptured %d"
          % (launches[True], launches[False]))
    assert launches[True] == 0 < launches[False]


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
