"""An MPI job for test_checkpoint_restarts: a small All2AllDenseEmbedding model trained in
MonitoredTrainingSession with checkpoint_dir (a checkpoint every 5 steps), once per optimizer.

    checkpoint_job.py first  <ckpt_root> <out.json>   per optimizer: an uninterrupted 20-step run
                                                      (no checkpoints), then 10 steps saving to
                                                      <ckpt_root>/<optimizer>
    checkpoint_job.py resume <ckpt_root> <out.json>   per optimizer: restores, trains 10 more
    checkpoint_job.py horovod_first | horovod_resume <ckpt_root> <out.json>
                                                      as first and resume, for sok_adam and
                                                      lazy_adam, with checkpoint_dir on rank 0
                                                      alone (the Horovod idiom)

The global batch (8 samples) is the same on any number of ranks, each rank feeding its share, the
loss summed over ranks: so the losses do not depend on the number of ranks. Rank 0 writes
{optimizer: losses} to out.json.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x  # noqa: E402

tf1 = tf.compat.v1
GLOBAL_BATCH, SLOTS, NNZ, DIM, VOCAB, CAPACITY = 8, 2, 2, 4, 24, 32
STEPS, EVERY = 20, 5
OPTIMIZERS = {
    # name: (use_hashtable, make the embedding optimizer, in OptimizerScope)
    "sok_adam": (False, lambda: sok1x.optimizers.Adam(0.05), False),
    "lazy_adam": (True, lambda: sok1x.tf.keras.optimizers.LazyAdamOptimizer(0.05), False),
    "scope_adagrad": (True, lambda: tf1.train.AdagradOptimizer(0.2), True),
    "scope_ftrl": (False, lambda: tf1.train.FtrlOptimizer(0.2, l1_regularization_strength=0.01),
                   True),
}


HOROVOD_OPTIMIZERS = ("sok_adam", "lazy_adam")


def data(step):
    rng = np.random.default_rng(1000 + step)
    keys = rng.integers(0, VOCAB, size=(GLOBAL_BATCH, SLOTS, NNZ), dtype=np.int64)
    labels = rng.standard_normal((GLOBAL_BATCH, 1)).astype(np.float32)
    return keys, labels


def build(name):
    """Returns (train_op, loss, placeholders) of optimizer `name`'s model in the default graph."""
    use_hashtable, make, in_scope = OPTIMIZERS[name]
    global_step = tf1.train.get_or_create_global_step()
    keys = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
    labels = tf1.placeholder(tf1.float32, [None, 1])
    layer = sok1x.All2AllDenseEmbedding(
        CAPACITY, DIM, SLOTS, NNZ, use_hashtable=use_hashtable, name="emb_" + name,
        embedding_initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=11))
    rng = np.random.default_rng(3)
    weights = tf1.Variable((rng.standard_normal((SLOTS * NNZ * DIM, 1)) * 0.3).astype(np.float32),
                           name="w", use_resource=True)
    vectors = tf1.reshape(layer(keys), [-1, SLOTS * NNZ * DIM])
    loss = tf1.reduce_sum(tf1.square(tf1.matmul(tf1.tanh(vectors), weights) - labels))
    loss = loss / float(GLOBAL_BATCH)
    emb_grad, dense_grad = tf1.gradients(loss, [layer.var, weights])
    dense_grad, = sok1x.allreduce([dense_grad], average=False)
    optimizer = make()
    if in_scope:
        with sok1x.OptimizerScope([layer.var]):
            emb_op = optimizer.apply_gradients([(emb_grad, layer.var)])
    else:
        emb_op = optimizer.apply_gradients([(emb_grad, layer.var)])
    dense_op = tf1.train.GradientDescentOptimizer(0.1).apply_gradients(
        [(dense_grad, weights)], global_step=global_step)
    return tf1.group(emb_op, dense_op), loss, keys, labels


def run(name, steps, checkpoint_dir, first_step, horovod=False):
    """horovod: the loss is summed over ranks in the graph (sok1x.allreduce: no collective of
    the program between steps, where rank 0 alone may be saving) and the dense variables start
    as rank 0's (sok1x.BroadcastGlobalVariablesHook), as a Horovod program does."""
    rank, size = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
    per = GLOBAL_BATCH // size
    losses = []
    with tf1.Graph().as_default():
        train, loss, keys, labels = build(name)
        hooks = [sok1x.InitHook(global_batch_size=GLOBAL_BATCH, backend="cpu")]
        if horovod:
            loss, = sok1x.allreduce([loss], average=False)
            hooks.append(sok1x.BroadcastGlobalVariablesHook(0))
        config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
        with tf1.train.MonitoredTrainingSession(
                checkpoint_dir=checkpoint_dir, save_checkpoint_steps=EVERY,
                save_checkpoint_secs=None, save_summaries_steps=None, log_step_count_steps=None,
                hooks=hooks, config=config) as sess:
            for step in range(first_step, first_step + steps):
                step_keys, step_labels = data(step)
                mine = slice(rank * per, (rank + 1) * per)
                local, _ = sess.run([loss, train], {keys: step_keys[mine],
                                                    labels: step_labels[mine]})
                losses.append(float(local) if horovod else MPI.COMM_WORLD.allreduce(float(local)))
    return losses


def main(phase, root, out):
    tf1.disable_eager_execution()
    results = {}
    for name in OPTIMIZERS:
        directory = os.path.join(root, name)
        if phase == "first":
            results[name + "/whole"] = run(name, STEPS, None, 0)
            results[name] = run(name, STEPS // 2, directory, 0)
        elif phase == "resume":
            results[name] = run(name, STEPS // 2, directory, STEPS // 2)
        else:  # the Horovod idiom: checkpoint_dir on rank 0 only
            if name not in HOROVOD_OPTIMIZERS:
                continue
            mine = directory if MPI.COMM_WORLD.rank == 0 else None
            if phase == "horovod_first":
                results[name + "/whole"] = run(name, STEPS, None, 0, horovod=True)
                results[name] = run(name, STEPS // 2, mine, 0, horovod=True)
            else:
                results[name] = run(name, STEPS // 2, mine, STEPS // 2, horovod=True)
    if MPI.COMM_WORLD.rank == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
