"""Real GPU programs run to their end and exit 0 (issue 45, item 6): every device object sok1x
made is freed with its context current, also those a program still holds at exit (a table, its
arrays, staging buffers, kernels), and a block that comes back to the memory pool during the
interpreter's teardown goes to the driver, where PyCUDA's pool would ask for a current context
and, finding none, abort the interpreter (rc 134, "explicit_context_dependent failed": the
bounded-waits suite, whose tests bring the engine up and down, ended so on one H200 before)."""
import os
import subprocess
import sys

from conftest import skip_without_gpu

PROGRAM = r"""
import numpy as np
from sok1x.backend import random_init
from sok1x.engine import api, runtime
rt = runtime.init(backend="cuda")
api.create_table("exit_table", 16, 1 << 12, True, random_init.make_spec("uniform", -1, 1, 3))
keys = np.arange(512, dtype=np.int64).reshape(64, 8, 1)
with runtime.entered():
    vectors, token = api.dense_lookup("exit_table", "exit_fwd", keys, True, (8, 1))
    values, rows = api.dense_lookup_grad("exit_table", "exit_bwd", token, vectors * 2.0)
    HELD = [vectors, values, rows, rt.backend.download_staged(vectors)]  # alive at exit
print("done", float(rt.backend.to_host(values).sum()))
"""


def test_a_gpu_program_that_holds_device_arrays_exits_zero(tmp_path):
    skip_without_gpu()
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "done" in done.stdout
    assert "terminate called" not in done.stderr and "Aborted" not in done.stderr


GROWN_PROGRAM = r"""
import os
import numpy as np
from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.engine.tables.dynamic_table import make_dynamic
os.environ["SOK1X_GROW_IN_PLACE"] = "1"
rt = runtime.init(backend="cuda")
spec = random_init.make_spec("uniform", -1, 1, 3)
names = ["exit_grown_%d" % t for t in range(3)]
for name in names:
    api.create_table(name, 16, 1 << 16, True, spec, dynamic=make_dynamic("hbm", 64, 1 << 16))
with runtime.entered():
    for step in range(3):  # every member doubles in each step
        keys = rt.backend.asarray(np.arange(step * 500, (step + 1) * 500, dtype=np.int64))
        outs, token = api.pooled_lookup(names, "exit_grown_%d" % step,
                                        [PooledInput(keys, None, 500, None, "sum")] * 3, True)
    group = api.shard(names[0]).group
    HELD = [outs, group]  # alive at exit: the group's reserved rows among them
print("done", group.reserved, [api.shard(n).capacity for n in names])
"""


def test_a_program_whose_group_grew_in_place_exits_zero(tmp_path):
    """A group whose rows grew in place, still held at exit: its mapped memory and reserved
    addresses are given back with the context current, and the program exits 0."""
    skip_without_gpu()
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    done = subprocess.run([sys.executable, "-c", GROWN_PROGRAM], capture_output=True,
                          text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "done True [2048, 2048, 2048]" in done.stdout, done.stdout
    assert "terminate called" not in done.stderr and "Aborted" not in done.stderr


def test_the_bounded_waits_suite_exits_zero():
    skip_without_gpu()
    suite = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_bounded_waits.py")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           suite], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "terminate called" not in done.stderr
