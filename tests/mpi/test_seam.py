"""The seam between TensorFlow and the engine (graph_ops/boundary.py, DESIGN D1) on TensorFlow's
CPU tensors: which path an op takes, that sok1x's kernels and the zero-copy path hand the engine
TensorFlow's own memory and TensorFlow the engine's, that an input the engine keeps stays
TensorFlow's to read, that nothing lent stays held after a step, that errors reach sess.run as
py_func's do, that every path gives the same numbers, bit for bit, and that a step leaves no
Python memory behind."""
import gc
import itertools
import sys

import numpy as np
import pytest
from tf_support import session, tf1

import sok1x
from sok1x.backend import cpu, dlpack
from sok1x.engine import kernel_calls
from sok1x.errors import OrderError
from sok1x.graph_ops import boundary, op_library, tf_compat

needs_dlpack = pytest.mark.skipif(not tf_compat.HAS_DLPACK, reason="TensorFlow without DLPack")
needs_kernels = pytest.mark.skipif(not op_library.available(),
                                   reason="sok1x's op library cannot be built here")


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.init(backend="cpu")


@pytest.fixture(params=["kernels", "dlpack", "host"])
def seam(request, monkeypatch):
    if request.param == "dlpack" and not tf_compat.HAS_DLPACK:
        pytest.skip("TensorFlow without DLPack")
    if request.param == "kernels" and not op_library.available():
        pytest.skip("sok1x's op library cannot be built here: %s" % op_library.reason())
    monkeypatch.setenv(boundary.SEAM_ENV, request.param)
    return request.param


def test_the_path_is_chosen_at_graph_build(seam):
    with tf1.Graph().as_default():
        out = boundary.engine_op(lambda x: x, [tf1.constant([1.0])], tf1.float32, "identity")
        assert out.op.type == {"kernels": "Sok1xEngineCall", "dlpack": "EagerPyFunc",
                               "host": "PyFunc"}[seam]


def test_an_unknown_seam_is_an_error(monkeypatch):
    monkeypatch.setenv(boundary.SEAM_ENV, "shared-memory")
    with pytest.raises(ValueError, match="SOK1X_SEAM='shared-memory'"):
        boundary.seam_path()


@needs_dlpack
def test_zero_copy_reads_tensorflow_memory_in_place_and_hands_back_its_own(monkeypatch):
    monkeypatch.setenv(boundary.SEAM_ENV, "dlpack")
    seen = {}

    def engine(keys):
        seen["in_place"] = isinstance(keys.base, cpu._HostMemory)
        seen["writable_copy"] = keys.flags.owndata
        out = (keys * 2).astype(np.float32)
        seen["exported_while_running"] = dlpack.live_exports()
        return out

    with tf1.Graph().as_default() as graph:
        keys = tf1.placeholder(tf1.int64, [None])
        out = boundary.engine_op(engine, [keys], tf1.float32, "double")
        with session(graph) as sess:
            got = sess.run(out, {keys: np.arange(1000)})
    gc.collect()
    np.testing.assert_array_equal(got, np.arange(1000) * 2.0)
    assert seen["in_place"] and not seen["writable_copy"]
    assert dlpack.live_exports() == 0, "an exported array is still held after the step"


@needs_kernels
def test_kernels_read_tensorflow_memory_in_place_and_hand_back_the_engines(monkeypatch):
    monkeypatch.setenv(boundary.SEAM_ENV, "kernels")
    seen, before = {}, kernel_calls.lent_count()

    def engine(keys):
        seen["in_place"] = isinstance(keys.base, kernel_calls._HostView)
        seen["writable_copy"] = keys.flags.owndata
        raw = np.empty(keys.size * 4 + 64, np.uint8)  # an aligned engine array: lent
        start = -raw.ctypes.data % 64
        out = raw[start:start + keys.size * 4].view(np.float32)
        out[:] = keys * 2
        seen["made"] = out.ctypes.data
        return out

    def reader(values):
        seen["read"] = values.__array_interface__["data"][0]
        return np.float32(values.sum())

    with tf1.Graph().as_default() as graph:
        keys = tf1.placeholder(tf1.int64, [None])
        out = boundary.engine_op(engine, [keys], tf1.float32, "double")
        total = boundary.engine_op(reader, [out], tf1.float32, "read", host_outputs=(0,))
        with session(graph) as sess:
            got, got_total = sess.run([out, total], {keys: np.arange(1000)})
    del out, total, graph
    gc.collect()
    np.testing.assert_array_equal(got, np.arange(1000) * 2.0)
    assert got_total == 999.0 * 1000
    assert seen["in_place"] and not seen["writable_copy"]
    assert seen["read"] == seen["made"], "the output was copied on its way to the next op"
    del got
    gc.collect()
    assert kernel_calls.lent_count() == before, "a lent array is still held"


@needs_kernels
def test_an_input_the_engine_keeps_stays_readable(monkeypatch):
    """The engine may keep a view of an input past its op (a forward pass stashes its keys for
    the backward): TensorFlow must not reuse that memory while the engine holds it."""
    monkeypatch.setenv(boundary.SEAM_ENV, "kernels")
    kept = []

    def keep(keys):
        kept.append(keys)
        return np.int64(keys.shape[0])

    with tf1.Graph().as_default() as graph:
        feed = tf1.placeholder(tf1.int64, [None])
        count = boundary.engine_op(keep, [feed * 3], tf1.int64, "keep", host_outputs=(0,))
        churn = tf1.reduce_sum(tf1.ones([4096]) * tf1.cast(feed[0], tf1.float32))
        with session(graph) as sess:
            for step in range(20):
                sess.run([count, churn], {feed: np.arange(4096) + step})
    for step, keys in enumerate(kept):
        np.testing.assert_array_equal(keys, (np.arange(4096) + step) * 3)


@needs_kernels
# (exception class, message): made when raised, never at collection (Python 3.7's MemoryError
# free list hands a kept instance's memory to later MemoryErrors of other classes)
@pytest.mark.parametrize("kind, text, tf_error", [
    (ValueError, "bad keys", "InvalidArgumentError"),
    (TypeError, "bad dtype", "InvalidArgumentError"),
    (MemoryError, "no room", "ResourceExhaustedError"),
    (OrderError, "ranks reached different sok1x collectives", "UnknownError")])
def test_engine_errors_reach_sess_run_as_py_funcs_do(monkeypatch, kind, text, tf_error):
    monkeypatch.setenv(boundary.SEAM_ENV, "kernels")
    before = kernel_calls.lent_count()

    def engine(x):
        raise kind(text)

    with tf1.Graph().as_default() as graph:
        out = boundary.engine_op(engine, [tf1.constant([1.0])], tf1.float32, "failing")
        with session(graph) as sess:
            with pytest.raises(getattr(tf1.errors, tf_error)) as info:
                sess.run(out)
    assert "%s: %s" % (kind.__name__, text) in str(info.value)
    gc.collect()
    assert kernel_calls.lent_count() == before


@needs_kernels
def test_a_call_failing_at_a_later_output_lends_nothing(monkeypatch):
    """An engine call whose first output was lent when its second failed (more dims than a
    record carries): TensorFlow gets neither record, so the first is given back at once, and no
    memory of it stays held (a replay would never write it again)."""
    from sok1x.backend.cpu.aligned import exportable
    from sok1x.engine import lent_memory
    monkeypatch.setenv(boundary.SEAM_ENV, "kernels")
    before = kernel_calls.lent_count()
    lent = exportable(np.ones((16, 4), np.float32))

    def engine(x):
        return [lent, np.zeros((1,) * 9, np.float32)]

    with tf1.Graph().as_default() as graph:
        outs = boundary.engine_op(engine, [tf1.constant([1.0])], [tf1.float32, tf1.float32],
                                  "failing_late")
        with session(graph) as sess:
            with pytest.raises(tf1.errors.InvalidArgumentError, match="9 dims"):
                sess.run(outs)
    assert kernel_calls.lent_count() == before
    assert not lent_memory.holds_arrays(cpu, [lent])


def test_host_staging_hands_numpy_arrays(monkeypatch):
    monkeypatch.setenv(boundary.SEAM_ENV, "host")
    seen = {}

    def engine(keys):
        seen["in_place"] = isinstance(keys.base, cpu._HostMemory)
        return keys.astype(np.float32)

    with tf1.Graph().as_default() as graph:
        out = boundary.engine_op(engine, [tf1.constant([1, 2, 3], tf1.int64)], tf1.float32, "c")
        with session(graph) as sess:
            np.testing.assert_array_equal(sess.run(out), [1.0, 2.0, 3.0])
    assert not seen["in_place"]


def test_empty_and_scalar_tensors_cross(seam):
    with tf1.Graph().as_default() as graph:
        empty = tf1.zeros([0, 4], tf1.float32)
        scalar = tf1.constant(7, tf1.int64)
        a, b = boundary.engine_op(lambda e, s: (e + 1, np.int64(s) * 2), [empty, scalar],
                                  [tf1.float32, tf1.int64], "small", host_inputs=(1,))
        with session(graph) as sess:
            got_a, got_b = sess.run([a, b])
    assert got_a.shape == (0, 4) and int(got_b) == 14


def _blocks_left_per_step(sess, fetches, steps=3000, warm_up=1000):
    """Python memory blocks (sys.getallocatedblocks) that stay allocated per sess.run. An object
    kept each step counts 1 or more; TensorFlow's warm-up (its threads' first calls) a few
    hundredths, fading."""
    for _ in range(warm_up):
        sess.run(fetches)
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(steps):
        sess.run(fetches)
    gc.collect()
    return (sys.getallocatedblocks() - before) / float(steps)


def test_a_step_leaves_no_python_memory_behind(seam):
    """An engine op with tensor and host inputs, array and scalar results, beside a one-result
    py_func: 3,000 steps leave nothing allocated. (On Python 3.11 TensorFlow alone keeps a block
    of every EagerTensor a py_function makes, and the value of a bare 0-d array a PyFunc returns:
    five blocks a step here without graph_ops/tf_compat.py's release_eager_tensors and py_func.)"""
    # Values past Python's cached small ints; a counter per op, as TensorFlow may run the two
    # ops of one sess.run in either order.
    op_counter, tick_counter = itertools.count(1000), itertools.count(100000)
    with tf1.Graph().as_default() as graph:
        vector = tf1.constant(np.arange(6, dtype=np.float32))
        scalar = tf1.constant(7, tf1.int64)
        doubled, counted = boundary.engine_op(
            lambda v, s: (v * 2, np.int64(next(op_counter)) + s), [vector, scalar],
            [tf1.float32, tf1.int64], "per_step", host_inputs=(1,))
        tick = tf_compat.py_func(lambda: np.int64(next(tick_counter)), [], tf1.int64, "tick")
        with session(graph) as sess:
            got = sess.run([doubled, counted, tick])
            per_step = _blocks_left_per_step(sess, [doubled, counted, tick])
    np.testing.assert_array_equal(got[0], np.arange(6) * 2.0)
    assert got[1] == 1007 and got[2] == 100000
    assert per_step < 0.5, "%.3f Python memory blocks left per step on the %s seam" % (
        per_step, seam)


@needs_dlpack
def test_tensorflow_alone_keeps_a_block_per_eager_tensor():
    """The control: a plain tf.py_function (no sok1x code) with two inputs and two outputs, on
    TensorFlow's own, leaves four blocks a step where its EagerTensors do not free their attribute
    values (Python 3.11 with TensorFlow's pywrap_tensor.cc EagerTensor_dealloc, 2.15)."""
    with tf1.Graph().as_default() as graph:
        inputs = [tf1.constant(np.arange(6, dtype=np.float32)), tf1.constant(3.0)]
        outputs = tf1.py_function(lambda v, s: [v + v, s + s], inputs, [tf1.float32] * 2)
        with session(graph) as sess:
            per_step = _blocks_left_per_step(sess, outputs)
    if per_step < 0.5:
        pytest.skip("this Python and TensorFlow free their EagerTensors: nothing to compare with")
    assert 3.5 < per_step < 4.5, per_step


def _train_two_steps(seed):
    """Two training steps of both v1 layers; returns outputs, gradients and updated tables."""
    with tf1.Graph().as_default() as graph:
        dense = sok1x.All2AllDenseEmbedding(32, 4, 2, 3, name="seam_dense_%d" % seed)
        sparse = sok1x.DistributedEmbedding("mean", 32, 4, 2, 3, name="seam_sparse_%d" % seed)
        rng = np.random.default_rng([seed, sok1x.rank()])
        keys = rng.integers(0, 32 * sok1x.num_gpus(), size=(4, 2, 3))
        sp = tf1.SparseTensor(np.array([[0, 0], [0, 2], [3, 1], [5, 0]], np.int64),
                              np.array([1, 5, 7, 2], np.int64), [8, 3])
        out = dense(tf1.constant(keys)) * 1.5
        pooled = sparse(sp)
        loss = tf1.reduce_sum(out * out) + tf1.reduce_sum(pooled)
        opt = tf1.train.AdagradOptimizer(0.1)
        with sok1x.OptimizerScope([dense.var, sparse.var]):
            train = opt.minimize(loss)
        grads = tf1.gradients(loss, [dense.var, sparse.var])
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            first = sess.run([out, pooled] + [g.values for g in grads])
            sess.run(train)
            second = sess.run([out, pooled])
    return first + second


def test_every_path_gives_the_same_numbers(monkeypatch):
    monkeypatch.setenv(boundary.SEAM_ENV, "host")
    staged = _train_two_steps(3)
    paths = [path for path, can in (("kernels", op_library.available()),
                                    ("dlpack", tf_compat.HAS_DLPACK)) if can]
    if not paths:
        pytest.skip("this TensorFlow has only host staging")
    for path in paths:
        monkeypatch.setenv(boundary.SEAM_ENV, path)
        for a, b in zip(_train_two_steps(3), staged):
            np.testing.assert_array_equal(a, b, err_msg=path)
