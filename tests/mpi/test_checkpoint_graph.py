"""Tables in graph-mode checkpoints (D8), rank-agnostic: tf.compat.v1.train.Saver in a plain
Session (every rank saving into one directory), sok1x.dump / load as ops with an optimizer's
slots, and the v2 variables by table_name (SOK v1's sok.Saver: tests/mpi/test_sok_v1_saver.py).
The reference is the same job's own earlier steps: training on from a restored checkpoint must
repeat them bit for bit."""
import os

import numpy as np
import pytest
from mpi4py import MPI
from tf_support import session, tf1

import sok1x

COMM = MPI.COMM_WORLD
SLOTS, NNZ, DIM, PER_RANK, VOCAB = 2, 2, 4, 2, 20


def _model(use_hashtable, optimizer):
    """Returns (layer, keys placeholder, loss, train op) of a one-table model."""
    keys = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
    layer = sok1x.All2AllDenseEmbedding(
        VOCAB, DIM, SLOTS, NNZ, use_hashtable=use_hashtable,
        embedding_initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=3))
    vectors = layer(keys)
    target = tf1.cast(tf1.reshape(keys % 3, [-1, SLOTS, NNZ, 1]), tf1.float32)
    loss = tf1.reduce_sum(tf1.square(vectors - target))
    grad, = tf1.gradients(loss, [layer.var])
    with sok1x.OptimizerScope([layer.var]):
        train = optimizer.apply_gradients([(grad, layer.var)])
    return layer, keys, loss, train


def _feeds(steps):
    rng = np.random.default_rng(5)
    batches = [rng.integers(0, VOCAB, (PER_RANK * COMM.size, SLOTS, NNZ)) for _ in range(steps)]
    return [b[COMM.rank * PER_RANK:(COMM.rank + 1) * PER_RANK] for b in batches]


def _losses(sess, loss, train, keys, batches):
    return [COMM.allreduce(float(sess.run([loss, train], {keys: b})[0])) for b in batches]


@pytest.mark.parametrize("use_hashtable", [True, False])
def test_saver_save_and_restore_in_a_session(shared_dir, use_hashtable):
    sok1x.init(backend="cpu")
    batches = _feeds(6)
    with tf1.Graph().as_default() as graph:
        layer, keys, loss, train = _model(use_hashtable, tf1.train.AdamOptimizer(0.05))
        saver = tf1.train.Saver()  # every rank saves into one directory
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            _losses(sess, loss, train, keys, batches[:3])
            path = saver.save(sess, os.path.join(shared_dir, "model"))
            after = _losses(sess, loss, train, keys, batches[3:])
            saver.restore(sess, path)
            again = _losses(sess, loss, train, keys, batches[3:])
    assert after == again  # values and Adam's slots came back exactly


def test_dump_and_load_ops_keep_only_the_optimizers_slots(shared_dir):
    sok1x.init(backend="cpu")
    batches = _feeds(4)
    with tf1.Graph().as_default() as graph:
        optimizer = tf1.train.AdagradOptimizer(0.1)
        layer, keys, loss, train = _model(True, optimizer)
        dump = sok1x.dump(shared_dir, [layer.var], optimizer)
        load = sok1x.load(shared_dir, [layer.var], optimizer)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            _losses(sess, loss, train, keys, batches[:2])
            sess.run(dump)
            after = _losses(sess, loss, train, keys, batches[2:])
            sess.run(load)
            assert _losses(sess, loss, train, keys, batches[2:]) == after


def test_v2_variables_dump_and_load(shared_dir):
    """sok1x.Variable (rows i % size) and sok1x.DynamicVariable (hash placement) by table_name."""
    graph = tf1.Graph()
    with graph.as_default():
        values = np.arange(15 * 3, dtype=np.float32).reshape(15, 3)
        table = sok1x.Variable(values)
        dynamic = sok1x.DynamicVariable(dimension=3, initializer="ones")
        keys = np.array([3, 1000003, 77, 5], np.int64)
        put = sok1x.assign(dynamic, keys, np.arange(12, dtype=np.float32).reshape(4, 3) / 7)
        dump = sok1x.dump(shared_dir, [table, dynamic])
        spoil = [sok1x.assign(table, np.arange(15), np.zeros([15, 3], np.float32)),
                 sok1x.assign(dynamic, keys[:2], np.zeros([2, 3], np.float32))]
        load = sok1x.load(shared_dir, [table, dynamic])
        exports = [sok1x.export(table), sok1x.export(dynamic)]
        with session(graph) as sess:
            sess.run(sok1x.Init(backend="cpu"))
            sess.run(tf1.global_variables_initializer())
            sess.run(put)
            before = sess.run(exports)
            sess.run(dump)
            sess.run(spoil)
            assert not np.array_equal(sess.run(exports)[0][1], before[0][1])
            sess.run(load)
            after = sess.run(exports)
    for (k0, v0), (k1, v1) in zip(before, after):
        order0, order1 = np.argsort(k0), np.argsort(k1)
        np.testing.assert_array_equal(k0[order0], k1[order1])
        np.testing.assert_array_equal(v0[order0], v1[order1])
