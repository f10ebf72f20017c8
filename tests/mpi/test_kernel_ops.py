"""sok1x's per-step graph ops run as its TensorFlow kernels (graph_ops/engine_call_op.cc, DESIGN D1)
on every front door: a training step of SOK v1 layers (TensorFlow's optimizer in OptimizerScope and
sok1x's Adam), SOK v2 variables (sok1x.Variable and DynamicVariable in one keyed lookup,
OptimizerWrapper, sparse_read_and_evict), DeepRec's group lookup over a plain tf.Variable and a
sok1x variable, sok1x's dense all-reduce and sok1x.unique / unsorted_segment_sum, traced by
TensorFlow (RunMetadata's step_stats: the ops that ran): none of the ops a step runs is a PyFunc or
EagerPyFunc, and every sok1x op that ran is a Sok1xEngineCall."""
import functools
import os

import numpy as np
import pytest
import tf_support
from mpi4py import MPI

import sok1x as sok
from sok1x.engine import kernel_calls
from sok1x.graph_ops import boundary, op_library

tf1 = tf_support.tf1
RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
PYTHON_OPS = ("PyFunc", "EagerPyFunc")

pytestmark = pytest.mark.skipif(not op_library.available(),
                                reason="sok1x's op library cannot be built here")


@pytest.fixture(autouse=True)
def kernels(monkeypatch):
    monkeypatch.setenv(boundary.SEAM_ENV, "kernels")


def v1_program():
    dense = sok.All2AllDenseEmbedding(64, 4, 2, 1, name="kernel_v1_dense")
    sparse = sok.DistributedEmbedding("mean", 64, 4, 2, 3, name="kernel_v1_sparse")
    keys = tf1.constant(np.arange(8, dtype=np.int64).reshape(4, 2, 1) + RANK)
    ids = tf1.SparseTensor(np.array([[0, 0], [0, 2], [3, 1], [7, 0]], np.int64),
                           np.array([1, 5, 7, 2], np.int64) + RANK, [8, 3])
    kernel = tf1.Variable(tf1.ones([4, 1]), name="kernel_v1_kernel")
    out = tf1.matmul(tf1.reshape(dense(keys), [-1, 4]), kernel)
    loss = tf1.reduce_sum(out * out) + tf1.reduce_sum(sparse(ids))
    emb_vars, others = sok.split_embedding_variable_from_others(tf1.trainable_variables())
    grads = tf1.gradients(loss, emb_vars + others)
    dense_grads = sok.allreduce(grads[len(emb_vars):])  # sok1x's own dense all-reduce
    with sok.OptimizerScope(emb_vars[:1]):
        first = tf1.train.AdagradOptimizer(0.1).apply_gradients(zip(grads[:1], emb_vars[:1]))
    second = sok.optimizers.Adam(0.01).apply_gradients(zip(grads[1:2], emb_vars[1:2]))
    dense_step = tf1.train.GradientDescentOptimizer(0.1).apply_gradients(
        zip(dense_grads, others))
    return tf1.group(first, second, dense_step)


def v2_program():
    variables = [sok.Variable(np.full((13, 4), float(t), np.float32)) for t in range(2)]
    variables.append(sok.DynamicVariable(dimension=4, initializer="ones"))
    ids = [tf1.RaggedTensor.from_tensor(tf1.constant(np.arange(6).reshape(3, 2) + t + RANK,
                                                     tf1.int64)) for t in range(3)]
    pooled = sok.lookup_sparse(variables, ids, combiners=["sum"] * 3)
    distinct, where = sok.unique(tf1.constant([3, 1, 3, 7], tf1.int64))
    summed = sok.unsorted_segment_sum(tf1.ones([4, 2]), where, tf1.size(distinct))
    loss = tf1.add_n([tf1.reduce_sum(p) for p in pooled]) + tf1.reduce_sum(summed)
    grads = tf1.gradients(loss, variables)
    step = sok.OptimizerWrapper(tf1.train.GradientDescentOptimizer(0.1)).apply_gradients(
        zip(grads, variables))
    with tf1.control_dependencies([step]):
        evicted = sok.sparse_read_and_evict(variables[2])  # a reader of its evicted keys
    return tf1.group(step, *evicted)


def deeprec_program():
    plain = tf1.get_variable("kernel_deeprec_plain", [16, 4],
                             initializer=tf1.zeros_initializer())
    shared = sok.Variable(np.ones((16, 4), np.float32))
    ids = tf1.SparseTensor([[0, 0], [1, 0]], tf1.constant([RANK % 16, 3], tf1.int64), [2, 1])
    pooled = sok.group_embedding_lookup_sparse([plain, shared], [ids, ids], ["sum", "mean"])
    loss = tf1.add_n([tf1.reduce_sum(p) for p in pooled])
    return tf1.train.GradientDescentOptimizer(0.5).minimize(-loss)


def ops_that_ran(sess, fetch):
    """The op types of every node TensorFlow ran for `fetch` (a traced sess.run)."""
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    metadata = tf1.RunMetadata()
    sess.run(fetch, options=options, run_metadata=metadata)
    names = {node.node_name.split(":")[0] for device in metadata.step_stats.dev_stats
             for node in device.node_stats}
    graph = sess.graph
    return {name: graph.get_operation_by_name(name).type for name in names
            if name not in ("_SOURCE", "_SINK") and _in_graph(graph, name)}


def _in_graph(graph, name):
    try:
        graph.get_operation_by_name(name)
        return True
    except KeyError:  # a node TensorFlow made (a send, a receive)
        return False


@pytest.mark.parametrize("program", [v1_program, v2_program, deeprec_program])
def test_a_training_step_runs_no_python_op(program):
    with tf1.Graph().as_default() as graph:
        train = program()
        with tf_support.session(graph) as sess:
            sess.run(sok.Init(backend="cpu"))
            sess.run(tf1.global_variables_initializer())
            sess.run(train)
            ran = ops_that_ran(sess, train)
    python = sorted(name for name, kind in ran.items() if kind in PYTHON_OPS)
    assert not python, "a step ran Python ops: %s" % python
    engine = [name for name, kind in ran.items() if kind == boundary.KERNEL_OP]
    # lookups, their gradients, updates, tickers (and the v1 program's all-reduce)
    assert len(engine) >= 4, sorted(ran.items())


def _source_file(function):
    """The file a callable's code was compiled from (through partials and bound methods)."""
    while isinstance(function, functools.partial):
        function = function.func
    function = getattr(function, "__func__", function)
    return function.__code__.co_filename


def test_what_a_step_runs_is_sok1x_own_code_inside_a_converted_keras_call():
    """Keras converts a layer's call with autograph, and whatever the call reaches unless its
    package is on autograph's do-not-convert list. sok1x is (graph_ops/tf_compat.py), so the
    functions its kernels call at every step are sok1x's own, not autograph's rewrites, which ran
    each call through converted_call (on TensorFlow 2.15 a 400-step job took 45 s, not 3.7)."""
    class Tower(tf1.keras.layers.Layer):
        def build(self, input_shape):
            self.embedding = sok.All2AllDenseEmbedding(64, 4, 2, 1, name="converted_tower")

        def call(self, keys):
            return tf1.reduce_sum(self.embedding(keys))

    before = set(kernel_calls._calls)
    with tf1.Graph().as_default():
        keys = tf1.constant(np.arange(8, dtype=np.int64).reshape(4, 2, 1) + RANK)
        loss = Tower()(keys)
        tf1.gradients(loss, tf1.trainable_variables())
        calls = [kernel_calls.call_of(n) for n in sorted(set(kernel_calls._calls) - before)]
        files = {call.name: _source_file(call.function) for call in calls}
    assert files, "the tower made no kernel call"
    converted = {name: path for name, path in files.items()
                 if "autograph" in os.path.basename(path)}
    assert not converted, converted
