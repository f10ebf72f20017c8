"""DeepRec's GroupEmbedding on sok1x: a DeepRec program on stock TensorFlow with one added line,
`sok1x.deeprec.install()`. Two feature-column groups (group_embedding_column_scope: "item" with
two columns, "user" with one) are each looked up in one fused, model-parallel lookup; a third
table goes through tf.nn.group_embedding_lookup_sparse. The dense tower's gradients are summed
over the ranks with sok1x.allreduce. Prints loss and samples/s every --log_every steps. Runs on
TensorFlow 1.15 and on TensorFlow 2.x in graph mode.

    mpiexec -n 2 python deeprec_group_embedding.py [--steps 100 --backend cpu]
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402  (a DeepRec program is a TF 1.x program)

import sok1x  # noqa: E402

tf.disable_eager_execution()
tf.logging.set_verbosity(tf.logging.ERROR)
sok1x.deeprec.install()  # the one added line: DeepRec's names on stock TensorFlow

COLUMNS = {"ad": 200, "cate": 50, "user": 400, "query": 300}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--log_every", type=int, default=20)
    parser.add_argument("--global_batch_size", type=int, default=256)
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--num_batches", type=int, default=16)
    return parser.parse_args()


def synthetic_batches(args, rank, size):
    """This rank's rows of `num_batches` global batches: a dict of int64 ids [b, 1] per column
    and labels [b, 1] that a hidden weight per ad and per user id decides."""
    hidden = np.random.default_rng(0)
    weight = {name: hidden.standard_normal(COLUMNS[name]) for name in ("ad", "user")}
    per_rank = args.global_batch_size // size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    batches = []
    for index in range(args.num_batches):
        rng = np.random.default_rng(300 + index)
        ids = {name: rng.integers(0, rows, size=(args.global_batch_size, 1), dtype=np.int64)
               for name, rows in COLUMNS.items()}
        labels = (weight["ad"][ids["ad"]] + weight["user"][ids["user"]] > 0).astype(np.float32)
        batches.append(({name: value[mine] for name, value in ids.items()}, labels[mine]))
    return batches


def build(args, features, labels):
    """Returns (global loss after the update, train op)."""
    def column(name, dimension):
        return tf.feature_column.embedding_column(
            tf.feature_column.categorical_column_with_identity(name, COLUMNS[name]), dimension,
            initializer=tf.truncated_normal_initializer(stddev=0.05))
    with tf.feature_column.group_embedding_column_scope(name="item"):
        item_columns = [column("ad", 8), column("cate", 4)]
    with tf.feature_column.group_embedding_column_scope(name="user"):
        user_columns = [column("user", 8)]
    net = tf.feature_column.input_layer(features, item_columns + user_columns)
    query_table = tf.get_variable("query_table", [COLUMNS["query"], 4],
                                  initializer=tf.truncated_normal_initializer(stddev=0.05))
    query_ids = tf.sparse.from_dense(features["query"] + 1)  # ids + 1: 0 would be missing
    query_ids = tf.SparseTensor(query_ids.indices, query_ids.values - 1, query_ids.dense_shape)
    query, = tf.nn.group_embedding_lookup_sparse([query_table], [query_ids], ["sum"])
    hidden = tf.layers.Dense(32, tf.nn.relu, name="hidden")(tf.concat([net, query], 1))
    logits = tf.layers.Dense(1, name="logit")(hidden)
    loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits)) / float(args.global_batch_size)
    # A plain variable in a group lookup (query_table) trains through its sok1x handle, which
    # is among `tables`; the variable itself gets no gradient and is left out.
    tables, dense = sok1x.split_embedding_variable_from_others(tf.trainable_variables())
    dense = [v for v, g in zip(dense, tf.gradients(loss, list(dense))) if g is not None]
    grads = tf.gradients(loss, list(tables) + dense)
    dense_grads = sok1x.allreduce(grads[len(tables):], average=False)
    optimizer = tf.train.AdagradOptimizer(args.learning_rate)
    train = optimizer.apply_gradients(list(zip(grads[:len(tables)], tables)) +
                                      list(zip(dense_grads, dense)))
    with tf.control_dependencies([train]):
        return tf.identity(sok1x.allreduce(loss, average=False)), dense


def main():
    args = parse_args()
    # DeepRec: "the distributed mode needs this setting"
    tf.config.experimental.enable_distributed_strategy(strategy="collective")
    init = sok1x.Init(global_batch_size=args.global_batch_size, backend=args.backend)
    features = {name: tf.placeholder(tf.int64, [None, 1], name=name) for name in COLUMNS}
    labels = tf.placeholder(tf.float32, [None, 1])
    global_loss, dense = build(args, features, labels)
    broadcast_dense = sok1x.broadcast_variables(dense, root_rank=0)
    config = tf.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    with tf.Session(config=config) as sess:
        sess.run(init)
        sess.run(tf.global_variables_initializer())
        sess.run(broadcast_dense)
        rank, size = sok1x.rank(), sok1x.num_gpus()
        batches = synthetic_batches(args, rank, size)
        if rank == 0:
            print("[sok1x deeprec] %d ranks, global batch %d, %d steps" % (
                size, args.global_batch_size, args.steps), flush=True)
        started = last = time.time()
        for step in range(1, args.steps + 1):
            ids, step_labels = batches[(step - 1) % len(batches)]
            feed = {features[name]: value for name, value in ids.items()}
            feed[labels] = step_labels
            loss_value = sess.run(global_loss, feed)
            if rank == 0 and (step % args.log_every == 0 or step == args.steps):
                now = time.time()
                done_since = step % args.log_every or args.log_every
                print("[sok1x deeprec] step %d/%d loss %.4f samples/s %.0f" % (
                    step, args.steps, loss_value,
                    done_since * args.global_batch_size / max(now - last, 1e-9)), flush=True)
                last = now
        if rank == 0:
            elapsed = time.time() - started
            print("[sok1x deeprec] done: %d steps in %.1f s, %.0f samples/s" % (
                args.steps, elapsed, args.steps * args.global_batch_size / elapsed), flush=True)


if __name__ == "__main__":
    main()
