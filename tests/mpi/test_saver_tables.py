"""Several tables in one TensorFlow checkpoint (D8, issue 18), rank-agnostic: three tables of
different dims (hash table on and off) saved and restored by tf.compat.v1.train.Saver in a
Session and by MonitoredTrainingSession, with every rank saving into one shared directory or
into one of its own, at inter_op_parallelism_threads 1 and 8. The reference is the job's own
uninterrupted run: training on from a restored checkpoint repeats it bit for bit, so every
table's rows and Adam slots came back, none crossed with another's."""
import os
import time

import pytest
from mpi4py import MPI
from tf_support import global_batch, local_part, session, tf1

import sok1x

COMM = MPI.COMM_WORLD
SLOTS, NNZ, PER_RANK, VOCAB = 2, 2, 2, 24
TABLES = [(3, False), (5, True), (8, False)]  # (dim, use_hashtable)


def _model():
    """Returns (keys placeholder, loss, train op): three tables, one Adam, a global step."""
    step = tf1.train.get_or_create_global_step()
    keys = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
    outputs, handles = [], []
    for t, (dim, use_hashtable) in enumerate(TABLES):
        layer = sok1x.All2AllDenseEmbedding(
            VOCAB, dim, SLOTS, NNZ, use_hashtable=use_hashtable, name="table%d" % t,
            embedding_initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=3 + t))
        outputs.append(tf1.reduce_sum(layer((keys + t) % VOCAB), axis=[1, 2]))
        handles.append(layer.var)
    target = tf1.cast(tf1.reshape(keys[:, 0, 0] % 3, [-1, 1]), tf1.float32)
    loss = sum(tf1.reduce_sum(tf1.square(out - target)) for out in outputs)
    grads = tf1.gradients(loss, handles)
    train = sok1x.optimizers.Adam(0.05).apply_gradients(list(zip(grads, handles)))
    with tf1.control_dependencies([train]):
        train = tf1.assign_add(step, 1)
    return keys, loss, train


def _batches(steps):
    return [local_part(global_batch(40 + s, PER_RANK * COMM.size, SLOTS, NNZ, VOCAB),
                       COMM.rank, COMM.size) for s in range(steps)]


def _losses(sess, keys, loss, train, batches):
    return [COMM.allreduce(float(sess.run([loss, train], {keys: b})[0])) for b in batches]


@pytest.mark.parametrize("threads", [1, 8])
def test_saver_in_a_session_carries_three_tables(shared_dir, threads):
    sok1x.init(backend="cpu")
    batches = _batches(6)
    prefix = os.path.join(shared_dir, "model")
    with tf1.Graph().as_default() as graph:
        keys, loss, train = _model()
        saver = tf1.train.Saver(max_to_keep=3)
        with session(graph, threads) as sess:
            sess.run(tf1.global_variables_initializer())
            _losses(sess, keys, loss, train, batches[:3])
            for step in (3, 4):
                saver.save(sess, prefix, global_step=step)
            after = _losses(sess, keys, loss, train, batches[3:])
            for step in (5, 6):  # max_to_keep=3 removes model-3, its shards with it
                saver.save(sess, prefix, global_step=step)
            saver.restore(sess, prefix + "-4")
            again = _losses(sess, keys, loss, train, batches[3:])
    COMM.barrier()
    names = os.listdir(shared_dir)
    shards = [n for n in names if ".data-t" in n]
    assert len(shards) == 3 * len(TABLES) * COMM.size, names
    assert not [n for n in names if n.startswith("model-3.")], names
    with tf1.Graph().as_default() as graph:  # a fresh graph and session restore model-4
        keys, loss, train = _model()
        saver = tf1.train.Saver()
        with session(graph, threads) as sess:
            sess.run(tf1.global_variables_initializer())
            saver.restore(sess, prefix + "-4")
            assert sess.run(tf1.train.get_global_step()) == 3
            fresh = _losses(sess, keys, loss, train, batches[3:])
    assert after == again == fresh


def _monitored(checkpoint_dir, batches, threads):
    hooks = [sok1x.InitHook(backend="cpu")]
    config = tf1.ConfigProto(inter_op_parallelism_threads=threads,
                             intra_op_parallelism_threads=1)
    with tf1.Graph().as_default():
        keys, loss, train = _model()
        with tf1.train.MonitoredTrainingSession(
                checkpoint_dir=checkpoint_dir, save_checkpoint_steps=3,
                save_checkpoint_secs=None, save_summaries_steps=None,
                log_step_count_steps=None, hooks=hooks, config=config) as sess:
            return [COMM.allreduce(float(sess.run([loss, train], {keys: b})[0]))
                    for b in batches]


@pytest.mark.parametrize("threads", [1, 8])
@pytest.mark.parametrize("shared", [True, False])
def test_monitored_training_session_restores_three_tables(shared_dir, shared, threads):
    batches = _batches(6)
    whole = _monitored(None, batches, threads)
    directory = shared_dir if shared else os.path.join(shared_dir, "rank%d" % COMM.rank)
    first = _monitored(directory, batches[:3], threads)
    resumed = _monitored(directory, batches[3:], threads)
    assert first == whole[:3]
    assert resumed == whole[3:]


def test_a_save_by_a_rank_other_than_0_alone_fails_at_once_on_every_rank(shared_dir):
    if COMM.size == 1:
        pytest.skip("needs two ranks")
    sok1x.init(backend="cpu")
    batches = _batches(2)
    with tf1.Graph().as_default() as graph:
        keys, loss, train = _model()
        saver = tf1.train.Saver()
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            _losses(sess, keys, loss, train, batches[:1])
            started = time.monotonic()
            with pytest.raises(Exception) as info:  # TensorFlow wraps the CheckpointError
                if COMM.rank == COMM.size - 1:
                    saver.save(sess, os.path.join(shared_dir, "alone"))
                else:
                    sess.run(train, {keys: batches[1]})
    assert "while rank 0 does not" in str(info.value)
    assert time.monotonic() - started < 20
