"""A DLRM-style click model on sok1x: 26 sparse features in one All2AllDenseEmbedding, 13 dense
features through a bottom MLP, a top MLP over both, LazyAdam for every variable, trained under
tf.compat.v1.train.MonitoredTrainingSession, which saves checkpoints into --checkpoint_dir and
restores the latest one when started again (run it twice: the second run goes on from the first's
last step). Prints loss, this rank's streaming AUC and samples/s every --log_every steps. Synthetic
data whose labels a hidden weight per key and per dense feature decides. Runs on TensorFlow 1.15
and on TensorFlow 2.x in graph mode.

    mpiexec -n 2 python dlrm_tf1.py --checkpoint_dir /tmp/dlrm [--steps 200 --backend cpu]
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok1x as sok  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
tf1.logging.set_verbosity(tf1.logging.ERROR)

SPARSE_FEATURES, DENSE_FEATURES = 26, 13


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="train until this global step")
    parser.add_argument("--log_every", type=int, default=20)
    parser.add_argument("--save_every", type=int, default=50, help="checkpoint every N steps")
    parser.add_argument("--checkpoint_dir", default="/tmp/sok1x-dlrm")
    parser.add_argument("--global_batch_size", type=int, default=512)
    parser.add_argument("--vocabulary_per_feature", type=int, default=1000)
    parser.add_argument("--embedding_vector_size", type=int, default=16)
    parser.add_argument("--bottom_units", default="64,16", help="bottom MLP widths")
    parser.add_argument("--top_units", default="64,32", help="top MLP widths, before the logit")
    parser.add_argument("--learning_rate", type=float, default=0.002)
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--num_batches", type=int, default=64,
                        help="distinct synthetic batches, used in turn")
    return parser.parse_args()


def synthetic_batches(args, rank, size):
    """This rank's rows of `num_batches` global batches: (sparse keys [b, 26, 1] with feature f's
    keys in [f * V, (f + 1) * V), dense features [b, 13], labels [b, 1]); the same global data on
    any number of ranks."""
    vocabulary = args.vocabulary_per_feature
    hidden = np.random.default_rng(0)
    key_weight = hidden.standard_normal(SPARSE_FEATURES * vocabulary)
    dense_weight = hidden.standard_normal(DENSE_FEATURES)
    per_rank = args.global_batch_size // size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    batches = []
    for index in range(args.num_batches):
        rng = np.random.default_rng(1000 + index)
        keys = rng.integers(0, vocabulary, size=(args.global_batch_size, SPARSE_FEATURES))
        keys = (keys + np.arange(SPARSE_FEATURES) * vocabulary).astype(np.int64)
        dense = rng.standard_normal((args.global_batch_size, DENSE_FEATURES)).astype(np.float32)
        score = key_weight[keys].sum(axis=1) / 4.0 + dense @ dense_weight
        labels = (score > 0).astype(np.float32).reshape(-1, 1)
        batches.append((keys[mine].reshape(-1, SPARSE_FEATURES, 1), dense[mine], labels[mine]))
    return batches


def mlp(inputs, widths, name):
    """ReLU layers of the given widths."""
    for index, width in enumerate(widths):
        inputs = tf1.keras.layers.Dense(width, activation=tf1.nn.relu,
                                        name="%s_%d" % (name, index))(inputs)
    return inputs


def build_model(args, sparse_keys, dense_features):
    """Returns the logits [b, 1]: embeddings and the bottom MLP's output, their pairwise dot
    products (DLRM's interaction), then the top MLP."""
    size = args.embedding_vector_size
    embedding = sok.All2AllDenseEmbedding(
        max_vocabulary_size_per_gpu=SPARSE_FEATURES * args.vocabulary_per_feature,
        embedding_vec_size=size, slot_num=SPARSE_FEATURES, nnz_per_slot=1)
    vectors = tf1.reshape(embedding(sparse_keys, training=True), [-1, SPARSE_FEATURES, size])
    bottom_widths = [int(w) for w in args.bottom_units.split(",")]
    if bottom_widths[-1] != size:
        raise ValueError("--bottom_units must end with --embedding_vector_size (%d)" % size)
    bottom = mlp(dense_features, bottom_widths, "bottom")
    features = tf1.concat([vectors, tf1.expand_dims(bottom, 1)], axis=1)  # [b, 27, size]
    dots = tf1.matmul(features, features, transpose_b=True)               # [b, 27, 27]
    count = SPARSE_FEATURES + 1
    upper = np.triu_indices(count, k=1)
    pairs = tf1.gather(tf1.reshape(dots, [-1, count * count]),
                       upper[0] * count + upper[1], axis=1)
    top = mlp(tf1.concat([bottom, pairs], axis=1),
              [int(w) for w in args.top_units.split(",")], "top")
    return tf1.keras.layers.Dense(1, name="logit")(top)


def build_train_step(args, sparse_keys, dense_features, labels):
    """Returns (global loss after the update, this rank's streaming AUC after this batch)."""
    logits = build_model(args, sparse_keys, dense_features)
    per_sample = tf1.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    loss = tf1.reduce_sum(per_sample) / float(args.global_batch_size)
    emb_vars, dense_vars = sok.split_embedding_variable_from_others(tf1.trainable_variables())
    grads = tf1.gradients(loss, list(emb_vars) + list(dense_vars))
    # Each rank's loss is already divided by the global batch: dense gradients are summed.
    dense_grads = sok.allreduce(grads[len(emb_vars):], average=False)
    optimizer = sok.tf.keras.optimizers.LazyAdamOptimizer(learning_rate=args.learning_rate)
    train = optimizer.apply_gradients(
        list(zip(grads[:len(emb_vars)], emb_vars)) + list(zip(dense_grads, dense_vars)),
        global_step=tf1.train.get_or_create_global_step())
    _, auc = tf1.metrics.auc(labels, tf1.sigmoid(logits), num_thresholds=200)
    with tf1.control_dependencies([train]):
        global_loss = tf1.identity(sok.allreduce(loss, average=False))
    return global_loss, auc


def main():
    args = parse_args()
    sparse_keys = tf1.placeholder(tf1.int64, [None, SPARSE_FEATURES, 1])
    dense_features = tf1.placeholder(tf1.float32, [None, DENSE_FEATURES])
    labels = tf1.placeholder(tf1.float32, [None, 1])
    global_loss, auc = build_train_step(args, sparse_keys, dense_features, labels)
    global_step = tf1.train.get_global_step()
    hooks = [sok.InitHook(global_batch_size=args.global_batch_size, backend=args.backend),
             sok.BroadcastGlobalVariablesHook(0),
             tf1.train.StopAtStepHook(last_step=args.steps)]
    config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    # Every rank names the same folder: the ranks take turns with TensorFlow's files and each
    # writes its own shard of the embedding table beside them.
    with tf1.train.MonitoredTrainingSession(
            checkpoint_dir=args.checkpoint_dir, save_checkpoint_steps=args.save_every,
            save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
            hooks=hooks, config=config) as sess:
        rank, size = sok.rank(), sok.num_gpus()
        batches = synthetic_batches(args, rank, size)
        step = start = sess.run(global_step)
        if rank == 0:
            print("[sok1x dlrm] %d ranks, global batch %d, starting at step %d of %d%s" % (
                size, args.global_batch_size, start, args.steps,
                " (restored from %s)" % args.checkpoint_dir if start else ""), flush=True)
        started = last = time.time()
        while not sess.should_stop():
            keys, dense, step_labels = batches[step % len(batches)]
            loss_value, auc_value = sess.run([global_loss, auc], {
                sparse_keys: keys, dense_features: dense, labels: step_labels})
            step += 1
            if rank == 0 and (step % args.log_every == 0 or step == args.steps):
                now = time.time()
                done_since = step % args.log_every or args.log_every
                print("[sok1x dlrm] step %d/%d loss %.4f auc %.4f samples/s %.0f" % (
                    step, args.steps, loss_value, auc_value,
                    done_since * args.global_batch_size / max(now - last, 1e-9)), flush=True)
                last = now
    if rank == 0:
        elapsed = time.time() - started
        print("[sok1x dlrm] done: steps %d-%d in %.1f s, %.0f samples/s, checkpoint in %s" % (
            start, step, elapsed, (step - start) * args.global_batch_size / max(elapsed, 1e-9),
            args.checkpoint_dir), flush=True)


if __name__ == "__main__":
    main()
