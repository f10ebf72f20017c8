"""SOK v1's save, restore and train on, at any rank count, as SOK's test_dense_emb_demo.py runs
it under Horovod (a --save_params run, then --restore_params --optimizer=plugin_adam
--use_hashtable=1 --key_dtype=uint32): a hash-table All2AllDenseEmbedding of uint32 keys and a
Dense(1) layer train from ones with sok.tf.keras.optimizers.Adam, dump_to_file writes the table;
a new graph (a new job) restores it with restore_from_file (values only, the optimizer state
fresh, as SOK's does) and trains on with sok.optimizers.Adam. Every step's vectors, the dense
layer and the tables are checked against one TensorFlow process on the whole batch.

The dense layer's gradients are combined over the ranks as the program combines them, summed or
averaged. SOK's script passes them to hvd.allreduce, whose default op is the average, so at N
ranks its dense gradient is 1/N of the whole batch's, while its TensorFlow reference takes the
whole batch's; Adam's epsilon turns that scale into a drift (about 2e-5 after the save run's 30
steps at 2 ranks) that the restored run's fresh Adam amplifies past the script's 1e-3 (issue 39,
defect 5). Here the reference combines as the program does; the last test shows that the two
combinations differ by more than the tolerance the others hold, so a wrong one cannot pass."""

import numpy as np
import pytest
from mpi4py import MPI
from tf_support import local_part, session, tf1

import sok1x

COMM = MPI.COMM_WORLD
SLOTS, NNZ, DIM, VOCAB_PER_RANK, GLOBAL_BATCH, STEPS, LR = 3, 2, 4, 8, 16, 4, 0.1
DENSE_EPSILON = 1e-3  # Adam's epsilon of the dense layer: large enough to show a scaled gradient
NAME = "v1_restore_training_emb"


@pytest.fixture(scope="module", autouse=True)
def up():
    sok1x.init(backend="cpu")


def _data(seed, vocabulary):
    """(uint32 keys [GLOBAL_BATCH * STEPS, SLOTS, NNZ], float32 labels [.., 1]), the same on
    every rank."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, vocabulary, size=(GLOBAL_BATCH * STEPS, SLOTS, NNZ))
    labels = rng.integers(0, 2, size=(GLOBAL_BATCH * STEPS, 1)).astype(np.float32)
    return keys.astype(np.uint32), labels


def _loss(labels, logits):
    """BinaryCrossentropy summed over the rows given, over the global batch (SOK's
    compute_average_loss)."""
    loss = tf1.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf1.reduce_sum(loss) / GLOBAL_BATCH


def _dense_layer():
    return tf1.keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")


def _dense_optimizer():
    return tf1.keras.optimizers.Adam(LR, epsilon=DENSE_EPSILON)


def _sok1x_phase(phase, keys, labels, vocabulary, combine, directory):
    """Runs one job of SOK's script on this rank's share: phase "save" starts the table from
    ones, trains with sok.tf.keras Adam and dumps it into `directory`; "restore" restores it and
    trains with sok.optimizers.Adam. Returns (each step's vectors [local batch, SLOTS*NNZ*DIM],
    the dense kernel after, every key's row after)."""
    rank, size = COMM.rank, COMM.size
    graph = tf1.Graph()
    with graph.as_default():
        batch = tf1.placeholder(tf1.uint32, [None, SLOTS, NNZ])
        label = tf1.placeholder(tf1.float32, [None, 1])
        layer = sok1x.All2AllDenseEmbedding(vocabulary // size, DIM, SLOTS, NNZ,
                                            use_hashtable=True, key_dtype="uint32", name=NAME)
        out = _dense_layer()
        vectors = tf1.reshape(layer(batch), [-1, SLOTS * NNZ * DIM])
        loss = _loss(label, out(vectors))
        emb_vars, other_vars = sok1x.split_embedding_variable_from_others(
            [layer.embedding_variable] + out.trainable_variables)
        grads = tf1.gradients(loss, list(emb_vars) + list(other_vars))
        emb_grads = grads[:len(emb_vars)]
        other_grads = sok1x.allreduce(grads[len(emb_vars):], average=(combine == "average"))
        saver = sok1x.Saver()
        if phase == "save":
            emb_opt = sok1x.tf.keras.optimizers.Adam(learning_rate=LR)
            with sok1x.OptimizerScope(emb_vars):
                emb_train = emb_opt.apply_gradients(zip(emb_grads, emb_vars))
            start = saver.load_embedding_values(
                layer.embedding_variable,
                [np.ones((vocabulary // size, DIM), np.float32) for _ in range(size)])
        else:
            emb_opt = sok1x.optimizers.Adam(learning_rate=LR)
            emb_train = emb_opt.apply_gradients(zip(emb_grads, emb_vars))
            start = saver.restore_from_file(layer.embedding_variable, directory)
        train = tf1.group(emb_train, _dense_optimizer().apply_gradients(zip(other_grads,
                                                                             other_vars)))
        every_key = np.arange(vocabulary, dtype=np.uint32).reshape(-1, 1, 1)
        rows = layer(tf1.constant(np.tile(every_key, [1, SLOTS, NNZ])), training=False)
        init = tf1.group(tf1.global_variables_initializer(), emb_opt.initializer)
        with session(graph) as sess:
            sess.run(init)
            sess.run(start)
            got = []
            for step in range(STEPS):
                block = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
                got.append(sess.run([vectors, train], {
                    batch: local_part(keys[block], rank, size),
                    label: local_part(labels[block], rank, size)})[0])
            if phase == "save":
                sess.run(saver.dump_to_file(layer.embedding_variable, directory))
            kernel, every_row = sess.run([out.kernel, rows])
    return got, kernel, every_row[:, 0, 0, :]


def _reference_phase(table, keys, labels, dense_scale):
    """One TensorFlow process on the whole batch: a [vocabulary, DIM] table starting at `table`,
    its own Dense(1) from ones, keras Adam for both (SOK's script's reference), the dense
    gradient multiplied by `dense_scale`. Returns (each step's vectors, kernel, table after)."""
    graph = tf1.Graph()
    with graph.as_default():
        batch = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
        label = tf1.placeholder(tf1.float32, [None, 1])
        variable = tf1.Variable(table, name="reference_table", use_resource=True)
        out = _dense_layer()
        vectors = tf1.reshape(tf1.nn.embedding_lookup(variable, batch),
                              [-1, SLOTS * NNZ * DIM])
        loss = _loss(label, out(vectors))
        grads = tf1.gradients(loss, [variable] + out.trainable_variables)
        dense_grads = [g * dense_scale for g in grads[1:]]
        train = tf1.group(
            tf1.keras.optimizers.Adam(LR).apply_gradients([(grads[0], variable)]),
            _dense_optimizer().apply_gradients(zip(dense_grads, out.trainable_variables)))
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got = []
            for step in range(STEPS):
                block = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
                got.append(sess.run([vectors, train], {batch: keys[block].astype(np.int64),
                                                       label: labels[block]})[0])
            return got, sess.run(out.kernel), sess.run(variable)


def _reference_job(keys, labels, vocabulary, dense_scale):
    """The save run's and the restore run's references, the second from the first's table."""
    saved = _reference_phase(np.ones((vocabulary, DIM), np.float32), keys[0], labels[0],
                             dense_scale)
    return saved, _reference_phase(saved[2], keys[1], labels[1], dense_scale)


def _assert_phase_matches(got, want, phase):
    rank, size = COMM.rank, COMM.size
    got_vectors, got_kernel, got_table = got
    want_vectors, want_kernel, want_table = want
    for step in range(STEPS):
        np.testing.assert_allclose(got_vectors[step], local_part(want_vectors[step], rank, size),
                                   rtol=1e-5, atol=1e-6, err_msg="%s run, step %d" % (phase, step))
    np.testing.assert_allclose(got_kernel, want_kernel, rtol=1e-5, atol=1e-6,
                               err_msg="%s run, dense kernel" % phase)
    np.testing.assert_allclose(got_table, want_table, rtol=1e-5, atol=1e-6,
                               err_msg="%s run, table" % phase)


@pytest.mark.parametrize("combine", ["average", "sum"])
def test_restored_table_trains_on_as_one_process(combine, shared_dir):
    """SOK's two runs on sok1x against one process whose dense gradient is combined as the
    program combines it: the average (hvd.allreduce's default, SOK's script) or the sum."""
    vocabulary = VOCAB_PER_RANK * COMM.size
    keys, labels = zip(_data(11, vocabulary), _data(12, vocabulary))
    dense_scale = 1.0 / COMM.size if combine == "average" else 1.0
    want_saved, want_restored = _reference_job(keys, labels, vocabulary, dense_scale)
    saved = _sok1x_phase("save", keys[0], labels[0], vocabulary, combine, shared_dir)
    _assert_phase_matches(saved, want_saved, "save")
    restored = _sok1x_phase("restore", keys[1], labels[1], vocabulary, combine, shared_dir)
    np.testing.assert_allclose(restored[0][0], local_part(want_restored[0][0], COMM.rank,
                                                          COMM.size), rtol=1e-6, atol=1e-7,
                               err_msg="restore run, step 0: the restored rows")
    _assert_phase_matches(restored, want_restored, "restore")


def test_the_dense_combination_shows_beyond_the_tolerance():
    """The averaged and the summed dense gradient give references that differ by more than the
    tolerance above (at N > 1 ranks; at one rank they are the same job)."""
    size = max(COMM.size, 2)
    vocabulary = VOCAB_PER_RANK * size
    keys, labels = zip(_data(11, vocabulary), _data(12, vocabulary))
    summed = _reference_job(keys, labels, vocabulary, 1.0)
    averaged = _reference_job(keys, labels, vocabulary, 1.0 / size)
    gap = max(np.max(np.abs(a - b)) for a, b in zip(summed[1][0], averaged[1][0]))
    assert gap > 1e-6 + 1e-5 * 2.0, gap  # the vectors are about 1 to 2
