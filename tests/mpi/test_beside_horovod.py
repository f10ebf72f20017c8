"""A job that keeps Horovod for its dense gradients (hvd.allreduce,
hvd.BroadcastGlobalVariablesHook) next to sok1x embeddings trains as one process would on the
whole batch. Horovod is initialised after mpi4py, as sok1x's users do (tests/mpi/conftest.py
imports mpi4py first), so MPI starts with the thread support both need."""
import numpy as np
import pytest
from embedding_reference import full_table
from tf_support import global_batch, local_part, tf1

import sok1x

hvd = pytest.importorskip("horovod.tensorflow")

SLOTS, NNZ, DIM, PER_RANK, VOCAB, STEPS, LR = 2, 2, 4, 4, 30, 4, 0.05


def model(vectors, kernel):
    """A tiny dense tower: [batch, SLOTS, NNZ, DIM] -> [batch] logits."""
    flat = tf1.reshape(vectors, [-1, SLOTS * NNZ * DIM])
    return tf1.reshape(tf1.matmul(flat, kernel), [-1])


def batch_and_labels(size):
    keys = global_batch(31, PER_RANK * size, SLOTS, NNZ, VOCAB)
    labels = np.random.default_rng(32).random(PER_RANK * size).astype(np.float32)
    return keys, labels


def sok1x_losses(rank, size):
    keys, labels = batch_and_labels(size)
    graph = tf1.Graph()
    with graph.as_default():
        layer = sok1x.All2AllDenseEmbedding(64, DIM, SLOTS, NNZ,
                                            embedding_initializer="random_uniform")
        # Each rank starts its dense kernel differently; Horovod's hook must make them rank 0's.
        # A resource variable (here and in the reference): TensorFlow 1.15's ref variable hands
        # the matmul's gradient a view its own update may already have changed in place.
        kernel = tf1.Variable(tf1.random_normal([SLOTS * NNZ * DIM, 1], seed=rank),
                              name="kernel", use_resource=True)
        logits = model(layer(tf1.constant(local_part(keys, rank, size))), kernel)
        errors = tf1.square(logits - local_part(labels, rank, size))
        local_loss = tf1.reduce_sum(errors) / float(PER_RANK * size)
        job_loss = hvd.allreduce(local_loss, op=hvd.Sum)
        emb_vars, dense_vars = sok1x.split_embedding_variable_from_others(
            tf1.trainable_variables())
        grads = tf1.gradients(local_loss, list(emb_vars) + list(dense_vars))
        dense_grads = [hvd.allreduce(g, op=hvd.Sum) for g in grads[len(emb_vars):]]
        with sok1x.OptimizerScope(emb_vars):
            emb_step = tf1.train.GradientDescentOptimizer(LR).apply_gradients(
                zip(grads[:len(emb_vars)], emb_vars))
        dense_step = tf1.train.GradientDescentOptimizer(LR).apply_gradients(
            zip(dense_grads, dense_vars))
        train = tf1.group(emb_step, dense_step)
        hooks = [sok1x.InitHook(backend="cpu", global_batch_size=PER_RANK * size),
                 hvd.BroadcastGlobalVariablesHook(0)]
        losses = []
        with tf1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            first_kernel = sess.run(kernel)
            for _ in range(STEPS):
                losses.append(sess.run([job_loss, train])[0])
    return np.array(losses), first_kernel, layer, keys, labels


def reference_losses(layer, keys, labels, kernel0):
    """One process, the whole batch, plain TensorFlow."""
    graph = tf1.Graph()
    unique, values = full_table(layer, keys)
    with graph.as_default():
        table = tf1.Variable(values, use_resource=True)
        kernel = tf1.Variable(kernel0, use_resource=True)
        vectors = tf1.nn.embedding_lookup(table, np.searchsorted(unique, keys))
        loss = tf1.reduce_mean(tf1.square(model(vectors, kernel) - labels))
        train = tf1.train.GradientDescentOptimizer(LR).minimize(loss)
        losses = []
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for _ in range(STEPS):
                losses.append(sess.run([loss, train])[0])
    return np.array(losses)


def test_horovod_dense_gradients_with_sok1x_embeddings(world):
    rank, size = world
    hvd.init()
    assert (hvd.rank(), hvd.size()) == (rank, size)
    sok1x.init(backend="cpu", global_batch_size=PER_RANK * size)
    losses, kernel0, layer, keys, labels = sok1x_losses(rank, size)
    with tf1.Graph().as_default(), tf1.Session() as sess:
        expected_kernel = sess.run(tf1.random_normal([SLOTS * NNZ * DIM, 1], seed=0))
    np.testing.assert_allclose(kernel0, expected_kernel, rtol=1e-6)  # rank 0's, broadcast
    want = reference_losses(layer, keys, labels, kernel0)
    np.testing.assert_allclose(losses, want, rtol=1e-4)
    assert losses[-1] < losses[0]


def test_embedding_gradients_through_horovod_are_refused(world):
    hvd.init()
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(8, 2, 1, 1)
        loss = tf1.reduce_sum(layer(tf1.constant(np.zeros((1, 1, 1), np.int64))))
        optimizer = hvd.DistributedOptimizer(tf1.train.GradientDescentOptimizer(0.1))
        with sok1x.OptimizerScope([layer.var]):
            with pytest.raises(sok1x.errors.Sok1xError, match="went through .*Horovod"):
                optimizer.minimize(loss)
        # Clipping on the way is fine: only other frameworks' collectives are refused.
        grad = tf1.gradients(loss, [layer.var])[0]
        clipped = tf1.IndexedSlices(tf1.clip_by_norm(grad.values, 1.0), grad.indices,
                                    grad.dense_shape)
        with sok1x.OptimizerScope([layer.var]):
            tf1.train.GradientDescentOptimizer(0.1).apply_gradients([(clipped, layer.var)])
