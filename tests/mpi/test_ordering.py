"""Every rank issues sok1x's collectives in the same order (DESIGN D3), whatever TensorFlow does."""
import numpy as np
import pytest
from tf_support import session, tf1

import sok1x


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.init(backend="cpu")


def three_independent_collectives(rank, size):
    """Two lookups of two tables and an all-reduce, none feeding another: TensorFlow may start
    them in any order. Returns the three fetches and their expected values."""
    a = sok1x.All2AllDenseEmbedding(64, 2, 1, 1, embedding_initializer="ones")
    b = sok1x.All2AllDenseEmbedding(64, 3, 1, 1, embedding_initializer=2.0)
    keys = tf1.constant(np.array([[[rank * 7 + 1]]], dtype=np.int64))
    fetches = [a(keys), b(keys), sok1x.allreduce(tf1.constant([float(rank + 1)]), average=False)]
    expected = [np.ones((1, 1, 1, 2)), np.full((1, 1, 1, 3), 2.0), [size * (size + 1) / 2.0]]
    return fetches, expected


@pytest.mark.parametrize("threads", [1, 2, 8])
def test_any_subset_of_collectives_in_any_step_never_deadlocks(world, threads):
    rank, size = world
    graph = tf1.Graph()
    with graph.as_default():
        fetches, expected = three_independent_collectives(rank, size)
        subsets = [[0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2], [2, 1, 0]]
        order = np.random.default_rng(11).integers(0, len(subsets), size=40)  # same on all ranks
        with session(graph, threads) as sess:
            sess.run(tf1.global_variables_initializer())
            for step in order:
                chosen = subsets[step]
                got = sess.run([fetches[i] for i in chosen])
                for i, value in zip(chosen, got):
                    np.testing.assert_allclose(value, expected[i])


def test_eval_tower_built_after_training_runs_alone(world):
    rank, size = world
    graph = tf1.Graph()
    with graph.as_default():
        layer = sok1x.All2AllDenseEmbedding(64, 4, 2, 1, embedding_initializer="ones")
        train_keys = tf1.placeholder(tf1.int64, [None, 2, 1], name="train_keys")
        train_out = layer(train_keys)
        dense = tf1.Variable(np.ones([4], np.float32))
        loss = tf1.reduce_sum(train_out * dense)
        grads = tf1.gradients(loss, [layer.var, dense])
        dense_grad = sok1x.allreduce(grads[1])
        train_op = tf1.group(grads[0].values, dense.assign_sub(0.1 * dense_grad))
        eval_keys = tf1.placeholder(tf1.int64, [None, 2, 1], name="eval_keys")
        eval_out = layer(eval_keys, training=False)  # after backward ops: a new tower
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            unseen = np.array([[[1000 + rank]], [[2000 + rank]]]).reshape(1, 2, 1) % 64
            # No training feed, no training op: keys never seen give zero vectors.
            np.testing.assert_array_equal(sess.run(eval_out, {eval_keys: unseen}), 0.0)
            seen = np.array([[[rank]], [[rank + 1]]]).reshape(1, 2, 1)
            sess.run(train_op, {train_keys: seen})
            np.testing.assert_array_equal(sess.run(eval_out, {eval_keys: seen}), 1.0)
            np.testing.assert_array_equal(sess.run(eval_out, {eval_keys: unseen}), 0.0)


def test_towers_interleaved_in_one_run_raise_on_every_rank(world):
    rank, size = world
    graph = tf1.Graph()
    with graph.as_default():
        layer = sok1x.All2AllDenseEmbedding(64, 2, 1, 1, embedding_initializer="ones")
        keys = tf1.constant(np.array([[[rank]]], dtype=np.int64))
        train_out = layer(keys)
        with sok1x.new_tower("eval"):
            with tf1.control_dependencies([train_out]):
                eval_out = layer(tf1.identity(keys), training=False)
        # The training backward pass waits for the eval lookup: train, eval, train.
        scale = 1.0 + 0.0 * tf1.reduce_sum(eval_out)
        grad = tf1.gradients(tf1.reduce_sum(train_out * scale), [layer.var])[0]
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            with pytest.raises(tf1.errors.OpError, match="fetched in one sess.run") as info:
                sess.run([grad.values, eval_out])
            assert "OrderError" in str(info.value)
            # The job goes on: the training tower alone still runs on every rank.
            np.testing.assert_array_equal(sess.run(train_out), 1.0)


def test_ranks_in_different_collectives_raise_naming_both(world):
    rank, size = world
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    graph = tf1.Graph()
    with graph.as_default():
        keys = tf1.constant(np.array([[[rank]]], dtype=np.int64))

        def lookup(name, after):
            with sok1x.new_tower(name), tf1.control_dependencies(after):
                return sok1x.All2AllDenseEmbedding(64, 2, 1, 1, name=name + "_table")(keys)

        # Rank 0 runs first then second; the other ranks the other way round.
        if rank == 0:
            first = lookup("first", [])
            second = lookup("second", [first.op])
        else:
            second = lookup("second", [])
            first = lookup("first", [second.op])
        fetch = [first, second]
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            with pytest.raises(tf1.errors.OpError, match="different sok1x collectives") as info:
                sess.run(fetch)
            message = str(info.value)
            assert "first_table_lookup" in message and "second_table_lookup" in message


def test_keras_functional_model_called_on_real_keys_needs_no_input_feed(world):
    rank, size = world
    with tf1.Graph().as_default():
        inputs = tf1.keras.Input(shape=(2, 1), dtype=tf1.int64)
        layer = sok1x.All2AllDenseEmbedding(64, 4, 2, 1, embedding_initializer="ones")
        model = tf1.keras.Model(inputs, layer(inputs))
        keys = np.array([[[rank], [rank + 1]]], dtype=np.int64)
        out = model(tf1.constant(keys))  # real keys: not chained after the build-time lookup
        grad = tf1.gradients(tf1.reduce_sum(out), [layer.var])[0]
        total = sok1x.allreduce(tf1.reduce_sum(grad.values), average=False)
        # Training through the model's own input works too, fed as usual.
        fed_grad = tf1.gradients(tf1.reduce_sum(model.output), [layer.var])[0]
        with session(tf1.get_default_graph()) as sess:
            sess.run(tf1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(out), 1.0)
            assert sess.run(total) == 2 * 4 * size
            got = sess.run(fed_grad.values, {inputs: keys})
            assert sum(all_gathered(float(got.sum()))) == 2 * 4 * size


def test_keras_functional_model_on_a_sparse_input_called_on_real_keys(world):
    """SOK's v1 demos' --functional_api: keras.Input(sparse=True) into DistributedEmbedding
    (Keras marks the SparseTensor, not its parts, as symbolic)."""
    rank, size = world
    with tf1.Graph().as_default():
        inputs = tf1.keras.Input(shape=(2,), sparse=True, dtype=tf1.int64)
        layer = sok1x.DistributedEmbedding("sum", 64, 4, 1, 2, embedding_initializer="ones")
        model = tf1.keras.Model(inputs, layer(inputs))
        keys = tf1.SparseTensor([[0, 0], [0, 1]], tf1.constant([rank, rank + 1], tf1.int64),
                                [1, 2])
        out = model(keys)
        grad = tf1.gradients(tf1.reduce_sum(out), [layer.var])[0]
        total = sok1x.allreduce(tf1.reduce_sum(grad.values), average=False)
        with session(tf1.get_default_graph()) as sess:
            sess.run(tf1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(out), np.full([1, 1, 4], 2.0))
            assert sess.run(total) == 2 * 4 * size


def all_gathered(value):
    from mpi4py import MPI
    return MPI.COMM_WORLD.allgather(value)
