"""SOK v1's checkpoint API (sok1x.Saver, layer.embedding_variable, emb_opt.initializer), in the
manner of SOK's tf1 demo tests (test_dense_emb_demo.py / test_sparse_emb_demo.py): the table
starts from load_embedding_values(ones per GPU), an embedding layer and one Dense(1) output layer
(kernel ones) train with BinaryCrossentropy over a global batch split across ranks, each step's
embedding vectors and loss are checked against one TensorFlow process running the same model on
the whole batch, then dump_to_file writes the table and restore_from_file in a new graph brings
back exactly the reference's trained rows. Rank-agnostic: run at 1, 2 and 4 ranks."""

import numpy as np
import pytest
from mpi4py import MPI
from tf_support import local_part, session, tf1

import sok1x

COMM = MPI.COMM_WORLD
SLOTS, NNZ, DIM, VOCAB_PER_GPU, GLOBAL_BATCH, STEPS, LR = 3, 2, 4, 16, 16, 4, 0.1


@pytest.fixture(scope="module", autouse=True)
def up():
    sok1x.init(backend="cpu")


def _data(seed, vocabulary):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, vocabulary, size=(GLOBAL_BATCH * STEPS, SLOTS, NNZ), dtype=np.int64)
    labels = rng.integers(0, 2, size=(GLOBAL_BATCH * STEPS, 1)).astype(np.float32)
    return keys, labels


def _optimizers(kind):
    """(embedding optimizer, dense optimizer, reference embedding optimizer, reference dense
    optimizer), as SOK's utils.get_embedding_optimizer / get_dense_optimizer pick them."""
    keras = tf1.keras.optimizers
    if kind == "plugin_adam":
        return (sok1x.optimizers.Adam(learning_rate=LR), keras.Adam(LR),
                tf1.train.AdamOptimizer(LR, epsilon=1e-7), keras.Adam(LR))
    if kind == "adam":
        return keras.Adam(LR), keras.Adam(LR), keras.Adam(LR), keras.Adam(LR)
    return keras.SGD(LR), keras.SGD(LR), keras.SGD(LR), keras.SGD(LR)


def _bce(labels, logits):
    loss = tf1.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf1.reduce_sum(loss) / GLOBAL_BATCH


def _sparse_of(keys):
    """The SparseTensor [batch * SLOTS, NNZ] of a dense key block (every position valid)."""
    flat = tf1.reshape(keys, [-1, NNZ])
    indices = tf1.where(tf1.ones_like(flat, dtype=tf1.bool))
    shape = tf1.shape(flat, out_type=tf1.int64)
    return tf1.SparseTensor(indices, tf1.gather_nd(flat, indices), shape)


def _embedding_layer(kind, use_hashtable, name):
    if kind == "dense":
        return sok1x.All2AllDenseEmbedding(VOCAB_PER_GPU * 4, DIM, SLOTS, NNZ,
                                           use_hashtable=use_hashtable, name=name)
    return sok1x.DistributedEmbedding("sum", VOCAB_PER_GPU * 4, DIM, SLOTS, NNZ,
                                      use_hashtable=use_hashtable, name=name)


def _vectors(kind, layer, keys, training=True):
    """[batch, SLOTS * NNZ * DIM] (dense) or [batch, SLOTS * DIM] (sparse, summed)."""
    if kind == "dense":
        return tf1.reshape(layer(keys, training=training), [-1, SLOTS * NNZ * DIM])
    return tf1.reshape(layer(_sparse_of(keys), training=training), [-1, SLOTS * DIM])


def _reference_vectors(kind, table, keys):
    if kind == "dense":
        return tf1.reshape(tf1.nn.embedding_lookup(table, keys), [-1, SLOTS * NNZ * DIM])
    summed = tf1.nn.embedding_lookup_sparse(table, _sparse_of(keys), None, combiner="sum")
    return tf1.reshape(summed, [-1, SLOTS * DIM])


def _train_graph(kind, optimizer, keys, labels, vocabulary, use_hashtable, directory):
    """Builds sok1x's step on this rank's share and the reference step on the whole batch."""
    rank, size = COMM.rank, COMM.size
    batch = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
    label = tf1.placeholder(tf1.float32, [None, 1])
    layer = _embedding_layer(kind, use_hashtable, "v1_saver_emb")
    out = tf1.keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")
    emb_opt, dense_opt, ref_emb_opt, ref_dense_opt = _optimizers(optimizer)
    vectors = _vectors(kind, layer, batch)
    loss = _bce(label, out(vectors))
    emb_vars, other_vars = sok1x.split_embedding_variable_from_others(
        [layer.embedding_variable] + out.trainable_variables)
    grads = tf1.gradients(loss, list(emb_vars) + list(other_vars))
    emb_grads, other_grads = grads[:len(emb_vars)], sok1x.allreduce(grads[len(emb_vars):],
                                                                      average=False)
    if optimizer == "plugin_adam":
        emb_train = emb_opt.apply_gradients(zip(emb_grads, emb_vars))
    else:
        with sok1x.OptimizerScope(emb_vars):
            emb_train = emb_opt.apply_gradients(zip(emb_grads, emb_vars))
    dense_train = dense_opt.apply_gradients(zip(other_grads, other_vars))
    total = sok1x.allreduce(loss, average=False)
    init_tensors = [np.ones((vocabulary // size, DIM), np.float32) for _ in range(size)]
    load = sok1x.Saver().load_embedding_values(layer.embedding_variable, init_tensors)

    # The reference: one process, the whole batch, a [vocabulary, DIM] table of ones.
    ref_batch = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
    ref_label = tf1.placeholder(tf1.float32, [None, 1])
    table = tf1.Variable(tf1.ones([vocabulary, DIM]), name="reference_table", use_resource=True)
    ref_out = tf1.keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")
    ref_vectors = _reference_vectors(kind, table, ref_batch)
    ref_loss = _bce(ref_label, ref_out(ref_vectors))
    ref_grads = tf1.gradients(ref_loss, [table] + ref_out.trainable_variables)
    ref_train = tf1.group(ref_emb_opt.apply_gradients([(ref_grads[0], table)]),
                          ref_dense_opt.apply_gradients(zip(ref_grads[1:],
                                                            ref_out.trainable_variables)))
    init = tf1.group(tf1.global_variables_initializer(), tf1.local_variables_initializer())
    if optimizer == "plugin_adam":
        init = tf1.group(init, emb_opt.initializer)  # SOK's TF1 programs run it
    with tf1.control_dependencies([emb_train, dense_train]):
        step_loss = tf1.identity(total)
    results = []
    with session(tf1.get_default_graph()) as sess:
        sess.run(init)
        sess.run(load)
        for step in range(STEPS):
            block = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
            got_vectors, got_loss = sess.run([vectors, step_loss], {
                batch: local_part(keys[block], rank, size),
                label: local_part(labels[block], rank, size)})
            want_vectors, want_loss, _ = sess.run([ref_vectors, ref_loss, ref_train], {
                ref_batch: keys[block], ref_label: labels[block]})
            results.append((got_vectors, local_part(want_vectors, rank, size), got_loss,
                            want_loss))
        sess.run(sok1x.Saver().dump_to_file(layer.embedding_variable, directory))
        trained = sess.run(table)
    return results, directory, trained


CASES = [("dense", "plugin_adam", True), ("dense", "adam", True), ("dense", "adam", False),
         ("dense", "sgd", False), ("sparse", "plugin_adam", True), ("sparse", "adam", False)]


@pytest.mark.parametrize("kind,optimizer,use_hashtable", CASES)
def test_sok_demo_trains_saves_and_restores_like_tensorflow(kind, optimizer, use_hashtable,
                                                           shared_dir):
    size = COMM.size
    vocabulary = VOCAB_PER_GPU * size if use_hashtable else VOCAB_PER_GPU * 4
    keys, labels = _data(7, vocabulary)
    with tf1.Graph().as_default():
        results, directory, trained = _train_graph(kind, optimizer, keys, labels, vocabulary,
                                                   use_hashtable, shared_dir)
    for step, (got, want, got_loss, want_loss) in enumerate(results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg="step %d" % step)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, err_msg="step %d" % step)
    assert not np.allclose(trained, 1.0)  # training moved the table

    # A new graph (as a new job would), a fresh table of the same name read by a dense layer:
    # restore_from_file gives back the trained rows exactly.
    with tf1.Graph().as_default():
        layer = _embedding_layer("dense", use_hashtable, "v1_saver_emb")
        every_key = tf1.constant(np.arange(vocabulary, dtype=np.int64).reshape(-1, 1, 1))
        lookup = layer(tf1.tile(every_key, [1, SLOTS, NNZ]), training=False)
        restore = sok1x.Saver().restore_from_file(layer.embedding_variable, directory)
        with session(tf1.get_default_graph()) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(restore)
            restored = sess.run(lookup)[:, 0, 0, :]
    np.testing.assert_allclose(restored, trained, rtol=1e-6, atol=1e-7)


def test_load_embedding_values_refuses_another_dim_on_every_rank():
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(VOCAB_PER_GPU, DIM, 1, 1, name="v1_saver_bad_dim")
        load = sok1x.Saver().load_embedding_values(layer.embedding_variable,
                                                   [np.ones((4, DIM + 1), np.float32)])
        with session(tf1.get_default_graph()) as sess:
            sess.run(tf1.global_variables_initializer())
            with pytest.raises(tf1.errors.OpError, match="InvalidInputError") as info:
                sess.run(load)
    assert "v1_saver_bad_dim/EmbeddingVariable needs rows of dim %d" % DIM in str(info.value)


@pytest.mark.parametrize("make", [
    lambda: sok1x.optimizers.Adam(0.1),
    lambda: sok1x.tf.keras.optimizers.Adam(0.1),
    lambda: sok1x.tf.keras.optimizers.LazyAdamOptimizer(0.1)], ids=["sok", "keras", "lazy"])
def test_optimizer_initializer_initialises_its_tensorflow_state(make):
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(VOCAB_PER_GPU, DIM, 1, 1, name="v1_saver_opt_init")
        keys = tf1.constant(np.arange(2, dtype=np.int64).reshape(2, 1, 1) + COMM.rank)
        grad, = tf1.gradients(tf1.reduce_sum(layer(keys)), [layer.embedding_variable])
        optimizer = make()
        train = optimizer.apply_gradients([(grad, layer.embedding_variable)])
        state = list(optimizer.variables())
        assert state  # beta powers / iterations: what the initializer is for
        with session(tf1.get_default_graph()) as sess:
            sess.run(sok1x.Init(backend="cpu"))
            sess.run(layer.embedding_variable.initializer)
            assert len(sess.run(tf1.report_uninitialized_variables(state))) == len(state)
            sess.run(optimizer.initializer)
            assert len(sess.run(tf1.report_uninitialized_variables())) == 0
            sess.run(train)
