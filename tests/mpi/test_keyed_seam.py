"""sok1x.lookup_sparse over tables of one dim and one pooling crosses the seam in keyed form
(graph_ops/pooled_lookup_ops.py: the tables' keys joined in the graph, one pooled output split
there), in tf.compat.v1 graph mode on the cpu backend at any number of ranks: its outputs, its
gradients (an unused table's included) and the tables after SGD and Adagrad steps equal
tf.nn.embedding_lookup_sparse and TensorFlow's optimizer on dense tables."""
import numpy as np
import pytest
import tf_support
from mpi4py import MPI

import sok1x as sok
from sok1x.graph_ops import boundary

tf1 = tf_support.tf1
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, DIM, TABLES, STEPS = 11, 4, 4, 3


def _gathered(keys_and_values):
    """The whole table from every rank's export (keys, values)."""
    table = np.zeros((ROWS, DIM), np.float32)
    for keys, values in COMM.allgather(keys_and_values):
        table[keys] = values
    return table


@pytest.mark.parametrize("inter_op", [1, 8])  # TensorFlow's order of the ops, one and many
@pytest.mark.parametrize("combiner,weighted,optimizer,clipped", [
    ("sum", False, "sgd", False), ("mean", True, "adagrad", False),
    ("sum", True, "keras_adam", False), ("sum", False, "sgd", True)])
def test_keyed_lookup_equals_tensorflow(combiner, weighted, optimizer, clipped, inter_op):
    rng = np.random.default_rng(21)  # every rank looks up the same ids
    initial = [rng.uniform(-1, 1, size=(ROWS, DIM)).astype(np.float32) for _ in range(TABLES)]
    make = {"sgd": lambda lr: tf1.train.GradientDescentOptimizer(lr),
            "adagrad": lambda lr: tf1.train.AdagradOptimizer(lr),
            "keras_adam": lambda lr: tf1.keras.optimizers.Adam(lr)}[optimizer]
    graph = tf1.Graph()
    with graph.as_default():
        variables = [sok.Variable(values) for values in initial]
        # resource variables: TensorFlow 1.15's Keras Adam makes no slots for a ref variable
        dense = [tf1.Variable(values, use_resource=True) for values in initial]
        ids = [tf1.sparse.placeholder(tf1.int64 if t % 2 else tf1.int32, name="ids%d" % t)
               for t in range(TABLES)]
        weights = [tf1.sparse.placeholder(tf1.float32, name="w%d" % t) if weighted else None
                   for t in range(TABLES)]
        pooled = sok.lookup_sparse(variables, ids, weights, [combiner] * TABLES)
        if boundary.seam_path() != boundary.HOST_STAGING:  # the keyed form: one output split
            assert all(p.op.type == "SplitV" for p in pooled)
        # (on the host seam, TensorFlow 1.15's, the compact form with an update per table:
        # test_compact_seam.py)
        want = [tf_support.embedding_lookup_sparse(d, tf1.cast(i, tf1.int64), w, combiner)
                for d, i, w in zip(dense, ids, weights)]
        used = [0, 1, 3]  # table 2's output is not in the loss: a zero gradient
        loss = tf1.add_n([tf1.reduce_sum(pooled[t] * pooled[t]) for t in used])
        want_loss = tf1.add_n([tf1.reduce_sum(want[t] * want[t]) for t in used])
        grads = tf1.gradients(loss, variables)
        want_grads = tf1.gradients(want_loss * SIZE, dense)  # each rank's gradient is summed
        if clipped:  # a changed gradient: each table's own update op
            grads = [tf1.IndexedSlices(tf1.clip_by_value(g.values, -0.5, 0.5), g.indices,
                                       g.dense_shape) for g in grads]
            want_grads = [None if g is None else tf1.clip_by_value(
                tf1.convert_to_tensor(g), -0.5, 0.5) for g in want_grads]
        train = sok.OptimizerWrapper(make(0.1)).apply_gradients(zip(grads, variables))
        want_train = make(0.1).apply_gradients(
            [(g, d) for g, d in zip(want_grads, dense) if g is not None])
        updates = [op for op in graph.get_operations() if op.type in tf_support.ENGINE_OP_TYPES
                   and op.name.split("/")[-1].startswith("sok1x_")
                   and op.name.split("/")[-1].endswith("update")]
        keyed_updates = [op for op in updates if "keyed_update" in op.name]
        keyed = boundary.seam_path() in (boundary.KERNELS, boundary.ZERO_COPY)
        if keyed and optimizer != "keras_adam":  # Keras copies the gradients it aggregates
            assert len(keyed_updates) == (0 if clipped else 1), [op.name for op in updates]
            assert len(updates) == (TABLES if clipped else 1), [op.name for op in updates]
        exports = [sok.export(v) for v in variables]
    with tf_support.session(graph, inter_op) as sess:
        sess.run(sok.Init(backend="cpu"))
        sess.run(tf1.global_variables_initializer())
        for step in range(STEPS):
            feed = {}
            for t in range(TABLES):
                keys = rng.integers(0, ROWS, size=(5, 3))
                keys[step % 5, :] = -1  # an empty output row
                indices = np.argwhere(keys >= 0)
                feed[ids[t]] = (indices, keys[keys >= 0], [5, 3])
                if weighted:
                    feed[weights[t]] = (indices, rng.uniform(0.5, 2, size=len(indices)).astype(
                        np.float32), [5, 3])
            got, expected, _, _ = sess.run([pooled, want, train, want_train], feed)
            for a, b in zip(got, expected):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        shards, tables = sess.run(exports), sess.run(dense)
    for shard, table in zip(shards, tables):
        np.testing.assert_allclose(_gathered(shard), table, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_gathered(shards[2]), initial[2])  # a zero gradient: unchanged
