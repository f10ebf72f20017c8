"""sok1x's TensorFlow op library (graph_ops/op_library.py, DESIGN D1): it builds from the
installed package against the installed TensorFlow into an empty cache and trains through its
kernels; the cache serves the next process without a build, and a damaged entry is built again;
`sok1x-build-ops` builds it ahead of time for a node without a compiler; where no compiler and
no library can be had, sok1x says so once, with what to do, and trains through the old seam.
Each case is a fresh Python process (a loaded library stays loaded)."""
import os
import subprocess
import sys

import pytest
from mpi_jobs import lane_a_only

from sok1x.graph_ops import op_library

# The cache's and the ahead-of-time build's logic is the same for every TensorFlow.
CACHE_LOGIC = lane_a_only("the op cache's logic, the same on every TensorFlow")
pytestmark = pytest.mark.skipif(op_library.compiler() is None,
                                reason="no C++ compiler on this machine")

# Trains two steps of a v1 layer in graph mode; prints the seam, the loss and the library.
PROGRAM = """
import warnings
warnings.simplefilter("always")
import numpy as np
import tensorflow as tf
import sok1x as sok
from sok1x.graph_ops import boundary, op_library
tf1 = tf.compat.v1
tf1.disable_eager_execution()
init = sok.Init(global_batch_size=8, backend="cpu")
layer = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=64, embedding_vec_size=4,
                                  slot_num=2, nnz_per_slot=1)
keys = tf1.placeholder(tf1.int64, [None, 2, 1])
loss = tf1.reduce_sum(tf1.square(layer(keys) - 1.0))
emb_vars, _ = sok.split_embedding_variable_from_others(tf1.trainable_variables())
with sok.OptimizerScope(emb_vars):
    train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
types = {op.type for op in tf1.get_default_graph().get_operations()}
with tf1.Session() as sess:
    sess.run(init)
    sess.run(tf1.global_variables_initializer())
    batch = np.arange(8).reshape(4, 2, 1).astype(np.int64)
    losses = [sess.run([loss, train], {keys: batch})[0] for _ in range(2)]
loaded = op_library.load()
print("SEAM", boundary.seam_path(), "Sok1xEngineCall" in types)
print("LOSSES", " ".join("%.6f" % value for value in losses))
print("LIBRARY", loaded.path if loaded else None)
"""
WANT_LOSSES = "32.277996 20.657917"  # 8 keys, 4 dims, initial rows of the default initializer


def run(env_changes, program=PROGRAM, path=None):
    """Runs `program` in a fresh interpreter with `env_changes` (None removes a variable)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", SOK1X_QUIET="0")
    env.pop("SOK1X_SEAM", None)
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    if path is not None:
        env["PATH"] = path
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300, env=env, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def said(done, key):
    return [line.split(" ", 1)[1] for line in done.stdout.splitlines()
            if line.startswith(key + " ")][0]


def cached_libraries(folder):
    return sorted(name for name in os.listdir(folder) if name.endswith(".so"))


def test_builds_into_an_empty_cache_and_trains_through_its_kernels(tmp_path):
    cache = str(tmp_path / "ops")
    done = run({"SOK1X_OPS_CACHE_DIR": cache, "SOK1X_OPS_LIBRARY": None})
    assert said(done, "SEAM") == "kernels True"
    assert said(done, "LOSSES") == WANT_LOSSES
    built = cached_libraries(cache)
    assert len(built) == 1 and said(done, "LIBRARY") == os.path.join(cache, built[0])
    assert "graph ops run as sok1x's TensorFlow kernels" in done.stderr  # sok.Init's line
    assert os.stat(cache).st_mode & 0o777 == 0o700
    # The next process finds it: no second build (its file is the same one, untouched).
    stamp = os.stat(os.path.join(cache, built[0])).st_mtime_ns
    again = run({"SOK1X_OPS_CACHE_DIR": cache, "SOK1X_OPS_LIBRARY": None})
    assert said(again, "LIBRARY") == said(done, "LIBRARY")
    assert os.stat(os.path.join(cache, built[0])).st_mtime_ns == stamp


@CACHE_LOGIC
def test_a_damaged_library_in_the_cache_is_built_again(tmp_path):
    cache = str(tmp_path / "ops")
    run({"SOK1X_OPS_CACHE_DIR": cache, "SOK1X_OPS_LIBRARY": None})
    built = os.path.join(cache, cached_libraries(cache)[0])
    with open(built, "r+b") as handle:
        handle.truncate(4096)  # a copy cut short
    done = run({"SOK1X_OPS_CACHE_DIR": cache, "SOK1X_OPS_LIBRARY": None})
    assert said(done, "SEAM") == "kernels True" and said(done, "LOSSES") == WANT_LOSSES
    assert os.path.getsize(built) > 4096


def _path_without_a_compiler(tmp_path):
    """A PATH with this Python and nothing else (no g++, no c++)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    os.symlink(sys.executable, str(folder / "python"))
    return str(folder)


def test_without_a_compiler_it_says_so_and_trains_through_the_old_seam(tmp_path):
    done = run({"SOK1X_OPS_CACHE_DIR": str(tmp_path / "ops"), "SOK1X_OPS_LIBRARY": None,
                "SOK1X_CXX": None, "CXX": None}, path=_path_without_a_compiler(tmp_path))
    old = "dlpack" if op_library.tf_compat.HAS_DLPACK else "host"
    assert said(done, "SEAM") == "%s False" % old
    assert said(done, "LOSSES") == WANT_LOSSES
    assert done.stderr.count("sok1x could not build or load its TensorFlow kernels") == 1
    assert "no C++ compiler was found" in done.stderr and "sok1x-build-ops" in done.stderr


@CACHE_LOGIC
def test_a_library_built_ahead_of_time_serves_a_node_without_a_compiler(tmp_path):
    into = str(tmp_path / "prebuilt")
    command = os.path.join(os.path.dirname(sys.executable), "sok1x-build-ops")
    built = subprocess.run([command, "--into", into], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert built.returncode == 0, built.stderr[-3000:]
    library = built.stdout.split("sok1x-build-ops: ", 1)[1].split(" (")[0]
    assert os.path.dirname(library) == into and os.path.isfile(library)
    # The package's own prebuilt folder is where nodes look; here it is pointed at `into`.
    program = ("from sok1x.graph_ops import op_library\n"
               "op_library.PREBUILT = %r\n" % into) + PROGRAM
    done = run({"SOK1X_OPS_CACHE_DIR": str(tmp_path / "empty"), "SOK1X_OPS_LIBRARY": None,
                "SOK1X_CXX": None, "CXX": None}, program=program,
               path=_path_without_a_compiler(tmp_path))
    assert said(done, "SEAM") == "kernels True" and said(done, "LOSSES") == WANT_LOSSES
    assert said(done, "LIBRARY").startswith(into)
    assert not os.path.exists(str(tmp_path / "empty")) or not cached_libraries(
        str(tmp_path / "empty"))


@CACHE_LOGIC
def test_sok1x_ops_0_keeps_the_old_seam_without_a_warning(tmp_path):
    done = run({"SOK1X_OPS": "0", "SOK1X_OPS_CACHE_DIR": str(tmp_path / "ops")})
    assert said(done, "SEAM").endswith("False") and said(done, "LOSSES") == WANT_LOSSES
    assert "could not build" not in done.stderr and "SOK1X_OPS=0" in done.stderr
