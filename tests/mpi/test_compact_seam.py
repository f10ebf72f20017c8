"""sok1x.lookup_sparse on the host seam (SOK1X_SEAM=host: TensorFlow 1.15's, DESIGN D1) in a real
tf.Session: per table the engine hands over the pooled vectors or, where fewer bytes, the
batch's distinct rows with int32 indices that the graph gathers and pools itself
(graph_ops/pooled_lookup_ops.py's compact form). Outputs, gradients and the tables after an SGD
step equal tf.nn.embedding_lookup_sparse on plain tf.Variables of the same global tables, fed
each rank's batch (the gradients summed over the ranks), at any number of ranks."""
import numpy as np
import pytest
import tf_support
from mpi4py import MPI

import sok1x as sok
from sok1x.graph_ops import boundary

tf1 = tf_support.tf1
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, BATCH, LEARNING_RATE = 64, 12, 0.5


def batches(rng):
    """Per table (ids [BATCH, width] with -1 for none, weights or None, combiner, dim):
    one key a row from 4 (distinct rows pay), 8 distinct keys a row (pooled pays), a weighted
    mean over 5 keys of 3, with empty rows (distinct rows pay)."""
    one_hot = rng.integers(0, 4, size=(BATCH, 1))
    multi = np.resize(np.arange(ROWS), BATCH * 8).reshape(BATCH, 8)
    multi = (multi + 8 * RANK) % ROWS
    weighted = rng.integers(0, 3, size=(BATCH, 5))
    weighted[::4] = -1
    return [(one_hot, None, "sum", 16), (multi, None, "sum", 16),
            (weighted, rng.random((BATCH, 5)).astype(np.float32), "mean", 8)]


def sparse(ids, weights=None):
    where = np.argwhere(ids >= 0)
    shape = np.array(ids.shape, np.int64)
    sp_ids = tf1.SparseTensor(where, ids[ids >= 0].astype(np.int64), shape)
    sp_weights = None if weights is None else tf1.SparseTensor(where, weights[ids >= 0], shape)
    return sp_ids, sp_weights


def model(sok_side, initials, inputs):
    """Returns (graph, pooled outputs, gradients, train op, tables after training)."""
    graph = tf1.Graph()
    with graph.as_default():
        tables = [sok.Variable(v) if sok_side else tf1.Variable(v, use_resource=True)
                  for v in initials]
        sparse_inputs = [sparse(ids, weights) for ids, weights, _, _ in inputs]
        combiners = [combiner for _, _, combiner, _ in inputs]
        if sok_side:  # one fused lookup of all three
            pooled = sok.lookup_sparse(tables, [i for i, _ in sparse_inputs],
                                       [w for _, w in sparse_inputs], combiners=combiners)
        else:
            pooled = [tf_support.embedding_lookup_sparse(table, i, w, combiner)
                      for table, (i, w), combiner in zip(tables, sparse_inputs, combiners)]
        scale = [tf1.constant(np.linspace(0.5, 2.0, dim, dtype=np.float32)) for *_, dim in inputs]
        loss = tf1.add_n([tf1.reduce_sum(p * p * s) for p, s in zip(pooled, scale)])
        grads = tf1.gradients(loss, tables)
        optimizer = tf1.train.GradientDescentOptimizer(LEARNING_RATE)
        if sok_side:
            train = sok.OptimizerWrapper(optimizer).apply_gradients(zip(grads, tables))
            after = [sok.export(t) for t in tables]
        else:
            grads = [tf1.convert_to_tensor(g) for g in grads]
            train = tf1.no_op()
            after = [t.read_value() for t in tables]
    return graph, pooled, grads, train, after


def keyed_batches(rng):
    """Three tables of one dim and one pooling (sum, no weights): the keyed form's inputs, whose
    distinct rows pay summed over the tables."""
    one_hot, _, _, _ = batches(rng)[0]
    weighted = rng.integers(0, 3, size=(BATCH, 5))
    weighted[::4] = -1
    return [(one_hot, None, "sum", 8), (rng.integers(0, 4, size=(BATCH, 1)), None, "sum", 8),
            (weighted, None, "sum", 8)]


@pytest.mark.parametrize("keyed", [False, True])
def test_the_host_seam_step_equals_tensorflows_own(monkeypatch, keyed):
    monkeypatch.setenv(boundary.SEAM_ENV, "host")
    rng = np.random.default_rng([11, RANK])
    inputs = keyed_batches(rng) if keyed else batches(rng)
    initials = [np.random.default_rng(t).uniform(-1, 1, (ROWS, dim)).astype(np.float32)
                for t, (*_, dim) in enumerate(inputs)]
    graph, pooled, _, train, after = model(True, initials, inputs)
    forward = [op for op in graph.get_operations() if op.type == "PyFunc"
               and any(o.dtype == tf1.int32 for o in op.outputs)]
    assert len(forward) == 1  # the compact form: rows and int32 indices (per table, or joined)
    outputs = forward[0].outputs
    indices = [outputs[1]] if keyed else [outputs[2 * t + 1] for t in range(len(inputs))]
    with tf_support.initialized_session(graph) as sess:
        got_pooled, got_sizes = sess.run([pooled, [tf1.size(i) for i in indices]])
        sess.run(train)
        shards = sess.run(after)
    if keyed:  # all tables' keys: the unit's distinct rows
        assert got_sizes == [sum(ids[ids >= 0].size for ids, *_ in inputs)], got_sizes
    else:
        assert got_sizes[0] == BATCH and got_sizes[1] == 0 and got_sizes[2] > 0, got_sizes
    ref_graph, ref_pooled, ref_grads, _, _ = model(False, initials, inputs)
    with tf_support.session(ref_graph) as sess:
        sess.run(tf1.global_variables_initializer())
        want_pooled, want_grads = sess.run([ref_pooled, ref_grads])
    for got, want in zip(got_pooled, want_pooled):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for shard, initial, grad in zip(shards, initials, want_grads):
        want = initial - LEARNING_RATE * COMM.allreduce(grad, op=MPI.SUM)
        everything = np.zeros_like(initial)
        for keys, values in COMM.allgather(shard):
            everything[keys] = values
        np.testing.assert_allclose(everything, want, rtol=1e-5, atol=1e-5)


def test_the_zero_copy_seam_keeps_the_pooled_form(monkeypatch):
    from sok1x.graph_ops import tf_compat
    if not tf_compat.HAS_DLPACK:
        pytest.skip("TensorFlow without DLPack: the host seam is its only one")
    monkeypatch.setenv(boundary.SEAM_ENV, "dlpack")
    inputs = batches(np.random.default_rng([11, RANK]))
    initials = [np.zeros((ROWS, dim), np.float32) for *_, dim in inputs]
    graph = model(True, initials, inputs)[0]
    assert not any(o.dtype == tf1.int32 for op in graph.get_operations()
                   if op.type == "EagerPyFunc" for o in op.outputs)
