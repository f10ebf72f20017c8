"""A Horovod program that keeps Horovod for its dense layers and takes its embedding from sok1x:
hvd.allreduce sums the dense gradients, hvd.BroadcastGlobalVariablesHook starts the dense layers
equal, and every rank names the same --checkpoint_dir. (Not rank 0 only, as Horovod's examples
do: MonitoredTrainingSession runs the chief's first save before the user's hooks, so rank 0 would
wait in that save for ranks that wait in Horovod's broadcast; docs/checkpoints.md.) Prints loss
and samples/s every --log_every steps. Runs on TensorFlow 1.15 and on TensorFlow 2.x in graph
mode, with Horovod built for TensorFlow (HOROVOD_WITH_TENSORFLOW=1, HOROVOD_WITH_MPI=1).

    mpiexec -n 2 python horovod_tf1.py [--steps 100 --checkpoint_dir /tmp/sok1x-hvd]
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mpi4py import MPI  # noqa: E402,F401  (first: MPI starts with the threads sok1x needs)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

import sok1x as sok  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
tf1.logging.set_verbosity(tf1.logging.ERROR)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="train until this global step")
    parser.add_argument("--log_every", type=int, default=20)
    parser.add_argument("--checkpoint_dir", default="/tmp/sok1x-hvd")
    parser.add_argument("--global_batch_size", type=int, default=512)
    parser.add_argument("--vocabulary_per_gpu", type=int, default=2048)
    parser.add_argument("--slot_num", type=int, default=8)
    parser.add_argument("--nnz_per_slot", type=int, default=2)
    parser.add_argument("--embedding_vector_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--num_batches", type=int, default=32)
    return parser.parse_args()


def synthetic_batches(args, rank, size):
    """This rank's rows of `num_batches` global batches: keys [b, slots, nnz] and labels [b, 1]
    that a hidden weight per key decides; the same global data on any number of ranks."""
    vocabulary = args.vocabulary_per_gpu * size
    weight = np.random.default_rng(0).standard_normal(vocabulary)
    per_rank = args.global_batch_size // size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    batches = []
    for index in range(args.num_batches):
        rng = np.random.default_rng(500 + index)
        keys = rng.integers(0, vocabulary, size=(args.global_batch_size, args.slot_num,
                                                 args.nnz_per_slot), dtype=np.int64)
        labels = (weight[keys].sum(axis=(1, 2)) > 0).astype(np.float32).reshape(-1, 1)
        batches.append((keys[mine], labels[mine]))
    return batches


def build(args, keys, labels):
    """Returns (global loss after the update, train op): TensorFlow's Adam for the embedding inside
    sok.OptimizerScope, Adam over Horovod-summed gradients for the dense layers."""
    embedding = sok.All2AllDenseEmbedding(
        max_vocabulary_size_per_gpu=args.vocabulary_per_gpu,
        embedding_vec_size=args.embedding_vector_size, slot_num=args.slot_num,
        nnz_per_slot=args.nnz_per_slot)
    width = args.slot_num * args.nnz_per_slot * args.embedding_vector_size
    flat = tf1.reshape(embedding(keys, training=True), [-1, width])
    hidden = tf1.keras.layers.Dense(64, activation="relu", name="hidden")(flat)
    logits = tf1.keras.layers.Dense(1, name="logit")(hidden)
    loss = tf1.reduce_sum(tf1.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits)) / float(args.global_batch_size)
    emb_vars, dense_vars = sok.split_embedding_variable_from_others(tf1.trainable_variables())
    grads = tf1.gradients(loss, list(emb_vars) + list(dense_vars))
    # Each rank's loss is already divided by the global batch: Horovod sums, not averages.
    dense_grads = [hvd.allreduce(g, op=hvd.Sum) for g in grads[len(emb_vars):]]
    global_step = tf1.train.get_or_create_global_step()
    with sok.OptimizerScope(emb_vars):
        emb_step = tf1.train.AdamOptimizer(args.learning_rate).apply_gradients(
            zip(grads[:len(emb_vars)], emb_vars))
    dense_step = tf1.train.AdamOptimizer(args.learning_rate).apply_gradients(
        zip(dense_grads, dense_vars), global_step=global_step)
    train = tf1.group(emb_step, dense_step)
    with tf1.control_dependencies([train]):
        return tf1.identity(hvd.allreduce(loss, op=hvd.Sum)), global_step


def main():
    args = parse_args()
    hvd.init()
    keys = tf1.placeholder(tf1.int64, [None, args.slot_num, args.nnz_per_slot])
    labels = tf1.placeholder(tf1.float32, [None, 1])
    global_loss, global_step = build(args, keys, labels)
    hooks = [sok.InitHook(global_batch_size=args.global_batch_size, backend=args.backend),
             hvd.BroadcastGlobalVariablesHook(0),
             tf1.train.StopAtStepHook(last_step=args.steps)]
    rank, size = hvd.rank(), hvd.size()
    config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    with tf1.train.MonitoredTrainingSession(
            checkpoint_dir=args.checkpoint_dir,
            save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
            hooks=hooks, config=config) as sess:
        batches = synthetic_batches(args, rank, size)
        step = start = sess.run(global_step)
        if rank == 0:
            print("[sok1x horovod] %d ranks, global batch %d, starting at step %d of %d" % (
                size, args.global_batch_size, start, args.steps), flush=True)
        started = last = time.time()
        while not sess.should_stop():
            step_keys, step_labels = batches[step % len(batches)]
            loss_value = sess.run(global_loss, {keys: step_keys, labels: step_labels})
            step += 1
            if rank == 0 and (step % args.log_every == 0 or step == args.steps):
                now = time.time()
                done_since = step % args.log_every or args.log_every
                print("[sok1x horovod] step %d/%d loss %.4f samples/s %.0f" % (
                    step, args.steps, loss_value,
                    done_since * args.global_batch_size / max(now - last, 1e-9)), flush=True)
                last = now
    if rank == 0:
        elapsed = time.time() - started
        print("[sok1x horovod] done: steps %d-%d in %.1f s, %.0f samples/s" % (
            start, step, elapsed, (step - start) * args.global_batch_size / max(elapsed, 1e-9)),
            flush=True)


if __name__ == "__main__":
    main()
