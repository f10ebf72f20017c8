"""An MPI job for test_saver_restarts: tf.compat.v1.train.Saver in a plain Session carries sok1x
tables (rows and the engine's optimizer slots) across jobs of different sizes, and a rank killed
in the middle of a save leaves the previous checkpoint restorable.

    saver_restart_job.py save    <dir> <out.json>   per optimizer: an uninterrupted 10-step run,
        then a run that saves at step 5 (every rank to <dir>/<optimizer>/rank<r>/model), trains
        on and, in its save at step 10, rank 1 kills itself with SIGKILL (the job dies).
    saver_restart_job.py restore <dir> <out.json>   per optimizer: restores the latest checkpoint
        of rank 0's directory on every rank and trains steps 6-10.

The global batch is the same on any number of ranks (each rank feeds its share, the loss is summed
over ranks), so the losses do not depend on the number of ranks. Rank 0 writes {name: losses}.
"""
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x  # noqa: E402

tf1 = tf.compat.v1
COMM = MPI.COMM_WORLD
GLOBAL_BATCH, SLOTS, NNZ, DIM, VOCAB, CAPACITY, STEPS, SAVE_AT = 8, 2, 2, 4, 40, 48, 10, 5
OPTIMIZERS = {
    # name: (use_hashtable, optimizer for both kinds of variables)
    "lazy_adam": (True, lambda: sok1x.tf.keras.optimizers.LazyAdamOptimizer(0.05)),
    "keras_adam": (False, lambda: sok1x.tf.keras.optimizers.Adam(0.05)),
}


def data(step):
    rng = np.random.default_rng(500 + step)
    keys = rng.integers(0, VOCAB, size=(GLOBAL_BATCH, SLOTS, NNZ), dtype=np.int64)
    return keys, rng.standard_normal((GLOBAL_BATCH, 1)).astype(np.float32)


def build(name):
    use_hashtable, make = OPTIMIZERS[name]
    step = tf1.train.get_or_create_global_step()
    keys = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
    labels = tf1.placeholder(tf1.float32, [None, 1])
    layer = sok1x.All2AllDenseEmbedding(
        CAPACITY, DIM, SLOTS, NNZ, use_hashtable=use_hashtable, name="emb_" + name,
        embedding_initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=3))
    weights = tf1.Variable((np.random.default_rng(4).standard_normal((SLOTS * NNZ * DIM, 1))
                            * 0.3).astype(np.float32), name="w", use_resource=True)
    vectors = tf1.reshape(layer(keys), [-1, SLOTS * NNZ * DIM])
    loss = tf1.reduce_sum(tf1.square(tf1.matmul(tf1.tanh(vectors), weights) - labels))
    loss = loss / float(GLOBAL_BATCH)
    emb_grad, dense_grad = tf1.gradients(loss, [layer.embedding_variable, weights])
    dense_grad, = sok1x.allreduce([dense_grad], average=False)
    train = make().apply_gradients([(emb_grad, layer.embedding_variable),
                                    (dense_grad, weights)])
    with tf1.control_dependencies([train]):
        train = tf1.assign_add(step, 1)
    return train, loss, keys, labels


def train_steps(sess, graph_parts, first, last):
    train, loss, keys, labels = graph_parts
    rank, per = COMM.rank, GLOBAL_BATCH // COMM.size
    losses = []
    for step in range(first, last):
        step_keys, step_labels = data(step)
        local, _ = sess.run([loss, train], {keys: step_keys[rank * per:(rank + 1) * per],
                                            labels: step_labels[rank * per:(rank + 1) * per]})
        losses.append(COMM.allreduce(float(local)))
    return losses


def kill_in_next_save(victim):
    """On rank `victim`, the next save SIGKILLs this process once every rank wrote its shards,
    before TensorFlow writes the checkpoint: a rank dying in the middle of a save."""
    from sok1x.graph_ops import checkpoint_ops
    real = checkpoint_ops.save_tables

    def dying(*args):
        real(*args)
        if COMM.rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoint_ops.save_tables = dying


def session():
    config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    return tf1.Session(config=config)


def run(name, phase, root):
    """Returns the losses of one phase of optimizer `name` in a new graph and Session."""
    last = name == list(OPTIMIZERS)[-1]
    with tf1.Graph().as_default():
        parts = build(name)
        init = tf1.group(sok1x.Init(global_batch_size=GLOBAL_BATCH, backend="cpu"),
                         tf1.global_variables_initializer())
        saver = tf1.train.Saver(max_to_keep=5)
        with session() as sess:
            sess.run(init)
            if phase == "whole":
                return train_steps(sess, parts, 0, STEPS)
            if phase == "restore":
                latest = tf1.train.latest_checkpoint(os.path.join(root, name, "rank0"))
                assert latest.endswith("model-%d" % SAVE_AT), latest
                saver.restore(sess, latest)
                return train_steps(sess, parts, SAVE_AT, STEPS)
            prefix = os.path.join(root, name, "rank%d" % COMM.rank, "model")
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            losses = train_steps(sess, parts, 0, SAVE_AT)
            saver.save(sess, prefix, global_step=SAVE_AT)
            if last:  # the job ends here: rank 0 dies in its save at step 10
                train_steps(sess, parts, SAVE_AT, STEPS)
                kill_in_next_save(victim=0)
                COMM.barrier()
                saver.save(sess, prefix, global_step=STEPS)
            return losses


def main(phase, root, out):
    tf1.disable_eager_execution()
    results = {}
    for name in OPTIMIZERS:
        if phase == "save":
            results[name + "/whole"] = run(name, "whole", root)
            if name == list(OPTIMIZERS)[-1] and COMM.rank == 0:
                with open(out, "w") as handle:  # written before the last run dies
                    json.dump(results, handle)
        results[name] = run(name, phase, root)
    if COMM.rank == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
