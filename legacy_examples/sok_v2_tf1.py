"""SOK's v2 API on sok1x in a TF1 graph program: a sok.Variable (a dense table, rows spread over
the ranks) and a sok.DynamicVariable (a hash table that grows as keys arrive) looked up together
by sok.lookup_sparse, a dense tower, and one tf.compat.v1.train.AdamOptimizer wrapped by
sok.OptimizerWrapper for both tables and the dense variables (whose gradients sok.allreduce sums).
At the end it writes both tables with their Adam slots by sok.dump, trains on, then sok.load puts
them back and checks that a lookup reads the dumped rows again. Prints loss and samples/s every
--log_every steps. Runs on TensorFlow 1.15 and on TensorFlow 2.x in graph mode.

    mpiexec -n 2 python sok_v2_tf1.py [--steps 100 --dump_dir /tmp/sok1x-v2 --backend cpu]
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


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--log_every", type=int, default=20)
    parser.add_argument("--global_batch_size", type=int, default=256)
    parser.add_argument("--item_rows", type=int, default=4096, help="rows of the sok.Variable")
    parser.add_argument("--user_keys", type=int, default=1 << 40,
                        help="keys of the DynamicVariable are drawn below this")
    parser.add_argument("--dimension", type=int, default=16)
    parser.add_argument("--hotness", type=int, default=4, help="keys per sample and table")
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--dump_dir", default="/tmp/sok1x-v2")
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--num_batches", type=int, default=16)
    return parser.parse_args()


def sparse_keys(rng, batch, hotness, below, pool):
    """A [batch, hotness] batch of keys drawn from `pool` distinct keys below `below`, as the
    (indices, values, dense_shape) of a tf.SparseTensorValue; a row holds 1 to hotness keys."""
    distinct = np.random.default_rng(7).integers(0, below, size=pool, dtype=np.int64)
    counts = rng.integers(1, hotness + 1, size=batch)
    indices = np.array([[row, col] for row in range(batch) for col in range(counts[row])],
                       np.int64)
    return indices, distinct[rng.integers(0, pool, size=len(indices))], [batch, hotness]


def synthetic_batches(args, rank, size):
    """This rank's rows of `num_batches` global batches: (item ids, user ids, labels); labels
    depend on the first item key of each row, so the loss can fall."""
    per_rank = args.global_batch_size // size
    batches = []
    for index in range(args.num_batches):
        rng = np.random.default_rng(100 + index)
        item = sparse_keys(rng, args.global_batch_size, args.hotness, args.item_rows, 2048)
        user = sparse_keys(rng, args.global_batch_size, args.hotness, args.user_keys, 4096)
        first = np.full(args.global_batch_size, -1)
        first[item[0][::-1, 0]] = item[1][::-1]
        labels = (first % 3 == 0).astype(np.float32).reshape(-1, 1)

        def mine(ids):
            indices, values, shape = ids
            keep = (indices[:, 0] >= rank * per_rank) & (indices[:, 0] < (rank + 1) * per_rank)
            return tf1.SparseTensorValue(indices[keep] - [rank * per_rank, 0], values[keep],
                                         [per_rank, shape[1]])
        batches.append((mine(item), mine(user), labels[rank * per_rank:(rank + 1) * per_rank]))
    return batches


def main():
    args = parse_args()
    sok.init(backend=args.backend)
    rank, size = sok.rank(), sok.num_gpus()
    item_table = sok.Variable(tf1.random_uniform_initializer(-0.05, 0.05),
                              shape=[args.item_rows, args.dimension], name="item")
    user_table = sok.DynamicVariable(dimension=args.dimension, initializer="normal",
                                     var_type="hbm", name="user")
    item_ids, user_ids = tf1.sparse_placeholder(tf1.int64), tf1.sparse_placeholder(tf1.int64)
    labels = tf1.placeholder(tf1.float32, [None, 1])
    item_vec, user_vec = sok.lookup_sparse([item_table, user_table], [item_ids, user_ids],
                                           combiners=["mean", "sum"])
    hidden = tf1.keras.layers.Dense(64, tf1.nn.relu, name="h")(tf1.concat([item_vec, user_vec], 1))
    logits = tf1.keras.layers.Dense(1, name="logit")(hidden)
    loss = tf1.reduce_sum(tf1.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits)) / float(args.global_batch_size)
    tables = [item_table, user_table]
    _, dense_vars = sok.split_embedding_variable_from_others(tf1.trainable_variables())
    dense_vars = list(dense_vars)
    grads = tf1.gradients(loss, tables + dense_vars)
    dense_grads = sok.allreduce(grads[len(tables):], average=False)
    optimizer = sok.OptimizerWrapper(tf1.train.AdamOptimizer(args.learning_rate))
    train = optimizer.apply_gradients(list(zip(grads[:len(tables)], tables)) +
                                      list(zip(dense_grads, dense_vars)))
    with tf1.control_dependencies([train]):
        global_loss = tf1.identity(sok.allreduce(loss, average=False))
    broadcast_dense = sok.broadcast_variables(dense_vars, root_rank=0)
    dump = sok.dump(args.dump_dir, tables, optimizer)
    load = sok.load(args.dump_dir, tables, optimizer)

    batches = synthetic_batches(args, rank, size)
    probe = {item_ids: batches[0][0], user_ids: batches[0][1]}
    config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    with tf1.Session(config=config) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(broadcast_dense)
        if rank == 0:
            print("[sok1x v2] %d ranks, global batch %d, %d steps" % (
                size, args.global_batch_size, args.steps), flush=True)
        started = last = time.time()
        for step in range(1, args.steps + 1):
            items, users, step_labels = batches[(step - 1) % len(batches)]
            loss_value = sess.run(global_loss, {item_ids: items, user_ids: users,
                                                labels: step_labels})
            if rank == 0 and (step % args.log_every == 0 or step == args.steps):
                now = time.time()
                done_since = step % args.log_every or args.log_every
                print("[sok1x v2] step %d/%d loss %.4f samples/s %.0f" % (
                    step, args.steps, loss_value,
                    done_since * args.global_batch_size / max(now - last, 1e-9)), flush=True)
                last = now
        elapsed = time.time() - started
        dumped = sess.run([item_vec, user_vec], probe)
        sess.run(dump)
        items, users, step_labels = batches[1]
        sess.run(global_loss, {item_ids: items, user_ids: users, labels: step_labels})
        sess.run(load)
        loaded = sess.run([item_vec, user_vec], probe)
        same = all(np.array_equal(a, b) for a, b in zip(dumped, loaded))
        if rank == 0:
            print("[sok1x v2] done: %d steps in %.1f s, %.0f samples/s; dump and load of %s: "
                  "rows %s" % (args.steps, elapsed, args.steps * args.global_batch_size / elapsed,
                               args.dump_dir, "equal" if same else "DIFFER"), flush=True)
        if not same:
            raise SystemExit("sok.load did not give back the dumped rows")


if __name__ == "__main__":
    main()
