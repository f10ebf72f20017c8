"""An MPI job for test_same_prefix_saves: tf.compat.v1.train.Saver.save(sess, <dir>/model)
without global_step (every save under one prefix, every rank into one shared directory), six
sok1x tables, and a save killed in the middle.

    same_prefix_save_job.py save <dir> <out.json>   trains 2 steps, saves, evaluates (the
        evaluation loss the checkpoint holds), trains 2 more, evaluates again, then saves under
        the same prefix and rank 1 SIGKILLs itself right after writing its third shard.
    same_prefix_save_job.py restore <dir> <out.json>   restores <dir>/model, evaluates; trains
        a step, evaluates, saves under the same prefix, waits until the prefix's only shard
        files are the new save's, lists them; restores that save in a new graph, evaluates.

The evaluation loss is summed over the ranks' shares of one global batch: it does not depend
on the number of ranks. Rank 0 writes the results.
"""
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x  # noqa: E402

tf1 = tf.compat.v1
COMM = MPI.COMM_WORLD
GLOBAL_BATCH, SLOTS, NNZ, DIM, VOCAB, TABLES = 8, 2, 2, 4, 40, 6


def data(step):
    rng = np.random.default_rng(700 + step)
    keys = rng.integers(0, VOCAB, size=(TABLES, GLOBAL_BATCH, SLOTS, NNZ), dtype=np.int64)
    return keys, rng.standard_normal((GLOBAL_BATCH, 1)).astype(np.float32)


def build():
    keys = tf1.placeholder(tf1.int64, [TABLES, None, SLOTS, NNZ])
    labels = tf1.placeholder(tf1.float32, [None, 1])
    layers = [sok1x.All2AllDenseEmbedding(
        VOCAB, DIM, SLOTS, NNZ, name="emb%d" % t,
        embedding_initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=3 + t))
        for t in range(TABLES)]
    vectors = tf1.concat([tf1.reshape(layer(keys[t]), [-1, SLOTS * NNZ * DIM])
                          for t, layer in enumerate(layers)], axis=1)
    weights = tf1.Variable((np.random.default_rng(4).standard_normal(
        (TABLES * SLOTS * NNZ * DIM, 1)) * 0.3).astype(np.float32), name="w",
        use_resource=True)
    loss = tf1.reduce_sum(tf1.square(tf1.matmul(tf1.tanh(vectors), weights) - labels))
    loss = loss / float(GLOBAL_BATCH)
    handles = [layer.embedding_variable for layer in layers]
    grads = tf1.gradients(loss, handles + [weights])
    dense_grad, = sok1x.allreduce([grads[-1]], average=False)
    train = sok1x.tf.keras.optimizers.Adam(0.05).apply_gradients(
        list(zip(grads[:-1], handles)) + [(dense_grad, weights)])
    return train, loss, keys, labels


def feed(parts, step):
    _, _, keys, labels = parts
    step_keys, step_labels = data(step)
    per = GLOBAL_BATCH // COMM.size
    share = slice(COMM.rank * per, (COMM.rank + 1) * per)
    return {keys: step_keys[:, share], labels: step_labels[share]}


def train(sess, parts, steps):
    for step in steps:
        sess.run(parts[0], feed(parts, step))


def evaluate(sess, parts):
    return COMM.allreduce(float(sess.run(parts[1], feed(parts, 99))))


def die_after_third_shard(victim):
    """On rank `victim`, the next save SIGKILLs this process right after its third shard."""
    from sok1x.engine.checkpoint import tables
    real, written = tables._write_shard, []

    def dying(*args):
        shard = real(*args)
        written.append(shard)
        if COMM.rank == victim and len(written) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return shard
    tables._write_shard = dying


def built():
    """The model, a Saver and an initialized Session, in the default graph."""
    parts = build()
    saver = tf1.train.Saver()
    init = tf1.group(sok1x.Init(global_batch_size=GLOBAL_BATCH, backend="cpu"),
                     tf1.global_variables_initializer())
    sess = tf1.Session(config=tf1.ConfigProto(inter_op_parallelism_threads=2,
                                              intra_op_parallelism_threads=1))
    sess.run(init)
    return parts, saver, sess


def shard_files(root):
    return sorted(n for n in os.listdir(root) if n.startswith("model.data-")
                  and not n.endswith("-of-00001") and ".tmp-" not in n)


def write(out, results):
    if COMM.rank == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)


def save_phase(root, out):
    prefix = os.path.join(root, "model")
    with tf1.Graph().as_default():
        parts, saver, sess = built()
        with sess:
            train(sess, parts, range(2))
            saver.save(sess, prefix)
            results = {"saved": evaluate(sess, parts)}
            train(sess, parts, range(2, 4))
            results["trained_on"] = evaluate(sess, parts)
            write(out, results)
            die_after_third_shard(victim=1)
            COMM.barrier()
            saver.save(sess, prefix)


def restore_phase(root, out):
    prefix = os.path.join(root, "model")
    with tf1.Graph().as_default():
        parts, saver, sess = built()
        with sess:
            saver.restore(sess, prefix)
            results = {"restored": evaluate(sess, parts)}
            train(sess, parts, range(2, 3))
            results["trained_on"] = evaluate(sess, parts)
            saver.save(sess, prefix)
            COMM.barrier()
            deadline = time.monotonic() + 60
            while len(shard_files(root)) != TABLES * COMM.size and time.monotonic() < deadline:
                time.sleep(0.05)
            results["files"] = shard_files(root)
            COMM.barrier()
    with tf1.Graph().as_default():
        parts, saver, sess = built()
        with sess:
            saver.restore(sess, prefix)
            results["restored_again"] = evaluate(sess, parts)
    write(out, results)


if __name__ == "__main__":
    tf1.disable_eager_execution()
    {"save": save_phase, "restore": restore_phase}[sys.argv[1]](*sys.argv[2:4])
