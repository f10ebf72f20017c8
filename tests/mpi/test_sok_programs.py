"""SOK programs with only the import changed (issue 20), in the manner of SOK's own function
tests: each builds a sok1x model and the same model on stock TensorFlow variables, trains or
reads both on the same data, and compares. Ids come as TF1 programs feed them (sparse
placeholders without shape, int32, tf.ragged.constant), and SOK's v1/v2 names are used as SOK's
tests use them (sok.SGD, tf.nn.embedding_lookup on sok variables, filter_variables,
all2all_dense_embedding, sparse_read_and_evict(var, ids), key_dtype uint32, m_var_name)."""
import os

import numpy as np
import pytest
from mpi4py import MPI
from tf_support import session, tf1

import sok1x as sok

DIM, VOCAB, STEPS = 4, 24, 3


@pytest.fixture(autouse=True)
def up():
    sok.init(backend="cpu")


def rank_size():
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def table_rows():
    return np.random.default_rng(1).normal(size=(VOCAB, DIM)).astype(np.float32)


def local_sparse_value(seed, rows_per_rank, dtype=np.int64):
    """This rank's part of a global [rows_per_rank * size, 3] sparse batch (equal seeds give
    equal global batches on every rank); returns (global value, local value)."""
    rank, size = rank_size()
    rng = np.random.default_rng(seed)
    rows = rows_per_rank * size
    counts = rng.integers(1, 4, size=rows)
    indices = np.array([[r, c] for r in range(rows) for c in range(counts[r])], np.int64)
    ids = rng.integers(0, VOCAB, size=len(indices)).astype(dtype)
    mine = (indices[:, 0] >= rank * rows_per_rank) & (indices[:, 0] < (rank + 1) * rows_per_rank)
    return (tf1.SparseTensorValue(indices, ids, [rows, 3]),
            tf1.SparseTensorValue(indices[mine] - [rank * rows_per_rank, 0], ids[mine],
                                  [rows_per_rank, 3]))


@pytest.mark.parametrize("dtype", [np.int64, np.int32], ids=["int64", "int32"])
def test_lookup_sparse_of_a_shapeless_sparse_placeholder_trains_as_stock_tf(world, dtype):
    """sok.lookup_sparse fed by tf.sparse_placeholder (no shape), trained with sok.SGD, against
    tf.nn.embedding_lookup_sparse on the whole batch trained by stock SGD."""
    rank, size = world
    feeds = [local_sparse_value(s, 2, dtype) for s in range(STEPS)]
    with tf1.Graph().as_default() as graph:
        var = sok.Variable(table_rows())
        ids = tf1.sparse_placeholder(tf1.as_dtype(dtype))
        out = sok.lookup_sparse(var, ids, combiners="mean")
        train = sok.SGD(lr=0.5).apply_gradients(
            zip(tf1.gradients(tf1.reduce_sum(out * out), [var]), [var]))
        probe = tf1.nn.embedding_lookup(var, tf1.range(VOCAB, dtype=tf1.int64))
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for _, local in feeds:
                sess.run(train, {ids: local})
            got = sess.run(probe)
    with tf1.Graph().as_default() as graph:
        var = tf1.Variable(table_rows())
        ids = tf1.sparse_placeholder(tf1.int64)
        out = tf1.nn.embedding_lookup_sparse(var, ids, None, combiner="mean")
        train = tf1.train.GradientDescentOptimizer(0.5).minimize(tf1.reduce_sum(out * out))
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for whole, _ in feeds:
                sess.run(train, {ids: tf1.SparseTensorValue(whole.indices,
                                                            whole.values.astype(np.int64),
                                                            whole.dense_shape)})
            want = sess.run(var)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ids_of_the_wrong_rank_fail_in_the_step_on_every_rank(world):
    with tf1.Graph().as_default() as graph:
        var = sok.Variable(table_rows())
        ids = tf1.sparse_placeholder(tf1.int64)
        out = sok.lookup_sparse(var, ids)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            bad = tf1.SparseTensorValue([[0, 0, 0]], [1], [1, 1, 1])
            with pytest.raises(tf1.errors.InvalidArgumentError, match="rank 2"):
                sess.run(out, {ids: bad})
    with tf1.Graph().as_default():
        var = sok.Variable(table_rows())
        three = tf1.SparseTensor([[0, 0, 0]], tf1.constant([1], tf1.int64), [1, 1, 1])
        with pytest.raises(ValueError, match="rank 2.*got rank 3"):
            sok.lookup_sparse(var, three)


def test_ragged_constant_ids_in_every_front_door(world):
    """tf.ragged.constant ids: sok.lookup_sparse, a group lookup of a plain variable and of a
    sok variable give tf.nn.embedding_lookup_sparse's rows."""
    rank, _ = world
    rows = [[rank % VOCAB, 3], [], [5, 5, 7]]
    with tf1.Graph().as_default() as graph:
        var = sok.Variable(table_rows())
        plain = tf1.get_variable("plain", initializer=table_rows())
        ragged = tf1.ragged.constant(rows, dtype=tf1.int64)
        outs = [sok.lookup_sparse(var, ragged, combiners="sum")]
        outs += sok.group_embedding_lookup_sparse([plain, var], [ragged, ragged], ["sum", "sum"])
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got = sess.run(outs)
    want = np.stack([table_rows()[r].sum(axis=0) if r else np.zeros(DIM, np.float32)
                     for r in rows])
    for value in got:
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)


def test_distributed_embedding_takes_a_shapeless_sparse_placeholder(world):
    rank, size = world
    with tf1.Graph().as_default() as graph:
        layer = sok.DistributedEmbedding("sum", VOCAB, DIM, slot_num=2, max_nnz=3,
                                         use_hashtable=False,
                                         embedding_initializer=tf1.ones_initializer())
        ids = tf1.sparse_placeholder(tf1.int64)
        out = layer(ids)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got = sess.run(out, {ids: tf1.SparseTensorValue([[0, 0], [0, 1], [1, 0], [3, 2]],
                                                            [1, 2, rank, 9], [4, 3])})
    np.testing.assert_allclose(got[:, :, 0], [[2.0, 1.0], [0.0, 1.0]])


def test_dynamic_variable_before_any_init_with_embedding_lookup_and_sok_sgd(fresh_sok1x):
    """SOK's sok_sgd test, rewritten: a DynamicVariable read by tf.nn.embedding_lookup and
    trained by sok.SGD in a graph that never calls sok.init(), against a tf.Variable."""
    rng = np.random.default_rng(3)
    steps = [(rng.integers(0, VOCAB, size=5), rng.normal(size=(5, DIM)).astype(np.float32))
             for _ in range(STEPS)]
    with tf1.Graph().as_default() as graph:
        var = sok.DynamicVariable(dimension=DIM, initializer="3", var_type="hbm")
        ids = tf1.placeholder(tf1.int64, [None])
        weight = tf1.placeholder(tf1.float32, [None, DIM])
        emb = tf1.nn.embedding_lookup(var, ids)
        grads = tf1.gradients(tf1.reduce_sum(emb * weight), [var])
        train = sok.SGD(lr=1.0).apply_gradients(zip(grads, [var]))
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for keys, w in steps:
                sess.run(train, {ids: keys, weight: w})
            got = sess.run(emb, {ids: np.arange(VOCAB)})
    want = np.full((VOCAB, DIM), 3.0, np.float32)
    for keys, w in steps:  # plain SGD; every rank feeds the same keys: their gradients add up
        np.subtract.at(want, keys, w * MPI.COMM_WORLD.Get_size())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_all2all_dense_embedding_of_a_computed_initial_value(world):
    rank, size = world
    keys = np.random.default_rng(4).integers(0, VOCAB, size=(size, 6))
    with tf1.Graph().as_default() as graph:
        computed = tf1.constant(table_rows()) * tf1.constant(2.0)  # not a constant: computed
        var = sok.Variable(computed)
        vectors = sok.all2all_dense_embedding(var, tf1.constant(keys[rank]))
        sok_vars, others = sok.filter_variables([computed, var])
        assert sok_vars == [var] and others == [computed]
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got = sess.run(vectors)
            local = var.eval(sess)
    np.testing.assert_allclose(got, 2.0 * table_rows()[keys[rank]], rtol=1e-6)
    np.testing.assert_allclose(local, 2.0 * table_rows()[rank::size], rtol=1e-6)


def test_sparse_read_and_evict_takes_the_variable_and_indices():
    with tf1.Graph().as_default() as graph:
        var = sok.DynamicVariable(dimension=DIM, initializer="7", var_type="hybrid",
                                  init_capacity=8, max_capacity=8)
        ids = tf1.placeholder(tf1.int64, [None])
        rows, keys, values = sok.sparse_read_and_evict(var, ids)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            first, evicted_keys, evicted_values = sess.run([rows, keys, values],
                                                           {ids: np.arange(8)})
    np.testing.assert_allclose(first, np.full((8, DIM), 7.0))
    assert evicted_keys.shape[0] == evicted_values.shape[0] == 0  # nothing full yet


def test_v1_layer_with_uint32_keys_dumps_sok_files(world, rank_dir):
    """key_dtype=uint32, as SOK's v1 demo takes it: looks up as int64 keys do, and
    Saver.dump_to_file writes SOK's <m_var_name>_keys.file (uint32) and _values.file."""
    rank, size = world
    keys = np.random.default_rng(5).integers(0, VOCAB, size=(size, 2, 3)).astype(np.uint32)
    path = rank_dir
    with tf1.Graph().as_default() as graph:
        layer = sok.All2AllDenseEmbedding(VOCAB, DIM, slot_num=3, nnz_per_slot=1,
                                          key_dtype="uint32", use_hashtable=False)
        out = layer(tf1.constant(keys[rank].reshape(2, 3, 1)))
        saver = sok.Saver()
        load = saver.load_embedding_values(layer.embedding_variable, table_rows())
        dump = saver.dump_to_file(layer.embedding_variable, path)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(load)
            got = sess.run(out)
            sess.run(dump)
    np.testing.assert_allclose(got[..., 0, :], table_rows()[keys[rank]], rtol=1e-6)
    if rank == 0:
        name = layer.embedding_variable.m_var_name
        saved_keys = np.fromfile(os.path.join(path, name + "_keys.file"), np.uint32)
        saved = np.fromfile(os.path.join(path, name + "_values.file"), np.float32)
        assert sorted(saved_keys) == list(range(VOCAB * size))
        np.testing.assert_allclose(saved.reshape(-1, DIM)[:VOCAB], table_rows(), rtol=1e-6)


def test_loss_scale_optimizer_unscales_dense_and_sparse_gradients():
    with tf1.Graph().as_default() as graph:
        scaled = sok.tf.keras.mixed_precision.LossScaleOptimizer(
            tf1.train.GradientDescentOptimizer(1.0), 1024)
        dense = scaled.get_unscaled_gradients([tf1.constant([2048.0])])[0]
        sparse = scaled.get_unscaled_gradients([tf1.IndexedSlices(
            tf1.constant([[1024.0]]), tf1.constant([0]), tf1.constant([1, 1]))])[0]
        loss = scaled.get_scaled_loss(tf1.constant(0.5))
        with session(graph) as sess:
            assert sess.run([dense, sparse.values, loss]) == [[2.0], [[1.0]], 512.0]


@pytest.mark.parametrize("kind", ["Variable", "DynamicVariable"])
def test_a_localized_variable_is_read_on_its_rank_alone(world, kind):
    """SOK's localized tests read a "localized:r" variable with tf.nn.embedding_lookup on rank r
    only: no collective, and trained rows as stock TensorFlow's."""
    rank, size = world
    owner = size - 1
    keys = np.array([1, 3, 3, 5])
    with tf1.Graph().as_default() as graph:
        if kind == "Variable":
            var = sok.Variable(table_rows(), mode="localized:%d" % owner)
        else:
            var = sok.DynamicVariable(DIM, initializer="2", mode="localized:%d" % owner,
                                      var_type="hbm")
        ids = tf1.placeholder(tf1.int64, [None])
        reads = []
        if rank == owner:
            emb = tf1.nn.embedding_lookup(var, ids)
            train = sok.SGD(lr=0.5).apply_gradients(
                zip(tf1.gradients(tf1.reduce_sum(emb), [var]), [var]))
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            if rank == owner:
                sess.run(train, {ids: keys})
                reads = sess.run(emb, {ids: np.arange(6)})
    if rank == owner:
        want = table_rows()[:6] if kind == "Variable" else np.full((6, DIM), 2.0, np.float32)
        np.subtract.at(want, keys, 0.5)
        np.testing.assert_allclose(reads, want, rtol=1e-6)
