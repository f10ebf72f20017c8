"""The CPU graph step: sok1x against the same model in native TensorFlow ops, and weak scaling.

    python bench/cpu_step.py --out results/cpu1.json              # 1 rank: sok1x and native TF
    mpiexec -n 4 python bench/cpu_step.py --out results/cpu4.json # sok1x only (weak scaling)

The model is the seed demo's embedding on the CPU: DistributedEmbedding(sum, slot_num=10,
max_nnz=5, dim=16) over --vocab-per-rank keys per rank, --batch-per-rank samples per rank, loss
0.5 * ||pooled||^2, TF1 Adam (sok1x.optimizers.Adam in the engine; tf.compat.v1.train.AdamOptimizer
on a tf.Variable with tf.nn.embedding_lookup_sparse for native TF). Graph mode, tf.Session, a
SparseTensor fed each step. On one rank both start from the same table (sok1x's initial values)
and their losses over the first steps are checked equal before timing. Each figure is the median
of --repeats repeats of --steps steps (the slowest rank's), with min and max beside it.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x  # noqa: E402
from sok1x.backend.cpu import random_rows as cpu_random  # noqa: E402
from sok1x.graph_ops.embedding_tag import table_of  # noqa: E402
from sok1x.engine.op_keys import name_key  # noqa: E402

import harness  # noqa: E402
import workloads  # noqa: E402

tf1 = tf.compat.v1
SLOTS, NNZ, DIM = 10, 5, 16
CHECK_STEPS = 3


def parse_args(argv):
    parser = harness.parser(__doc__, out=True, steps=20, repeats=5)
    parser.add_argument("--batch-per-rank", type=int, default=4096)
    parser.add_argument("--vocab-per-rank", type=int, default=1 << 18)
    return parser.parse_args(argv)


def batches(rank, batch, vocab, count=3):
    """Sparse feeds (indices, values, dense_shape) of keys uniform over the job's vocabulary."""
    feeds = []
    for i in range(count):
        rng = np.random.default_rng(100 * i + rank)
        keys = rng.integers(0, vocab, size=(batch, SLOTS, NNZ))
        parts = workloads.sparse_parts(keys)
        feeds.append((parts.indices, parts.values, parts.dense_shape))
    return feeds


def time_steps(session, fetch, placeholder, feeds, args, name):
    """{name: median ms per step, name_min, name_max, name_repeats} of args.repeats repeats of
    args.steps runs after warm-up (the slowest rank's)."""
    run = harness.Steps(lambda i: session.run(fetch, {placeholder: feeds[i % len(feeds)]}))
    times = [harness.job_max(harness.step_ms(run, args.steps, lambda: None))
             for _ in range(args.repeats)]
    return harness.summary(times, (name, name + "_min", name + "_max", name + "_repeats"))


def sok1x_model(args, size):
    graph = tf1.Graph()
    with graph.as_default():
        init = sok1x.Init(global_batch_size=args.batch_per_rank * size, backend="cpu")
        layer = sok1x.DistributedEmbedding("sum", args.vocab_per_rank, DIM, SLOTS, NNZ,
                                           use_hashtable=False)
        ids = tf1.sparse_placeholder(tf1.int64, shape=[None, NNZ])
        pooled = layer(ids, training=True)
        loss = 0.5 * tf1.reduce_sum(pooled * pooled)
        grads = tf1.gradients(loss, [layer.var])
        train = sok1x.optimizers.Adam(learning_rate=1e-3).apply_gradients(
            zip(grads, [layer.var]))
        variables = tf1.global_variables_initializer()
    session = tf1.Session(graph=graph)
    session.run(init)
    session.run(variables)
    return session, ids, loss, train, table_of(layer.var)


def native_model(args, initial):
    graph = tf1.Graph()
    with graph.as_default():
        params = tf1.Variable(initial, name="params")
        ids = tf1.sparse_placeholder(tf1.int64, shape=[None, NNZ])
        pooled = tf1.nn.embedding_lookup_sparse(params, ids, None, combiner="sum")
        loss = 0.5 * tf1.reduce_sum(pooled * pooled)
        train = tf1.train.AdamOptimizer(learning_rate=1e-3).minimize(loss)
        variables = tf1.global_variables_initializer()
    session = tf1.Session(graph=graph)
    session.run(variables)
    return session, ids, loss, train


def main(argv):
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    vocab = args.vocab_per_rank * size
    feeds = batches(rank, args.batch_per_rank, vocab)
    session, ids, loss, train, table = sok1x_model(args, size)
    sok_losses = [session.run([loss, train], {ids: feeds[i]})[0] for i in range(CHECK_STEPS)]
    result = {"ranks": size, "batch_per_rank": args.batch_per_rank,
              "vocab_per_rank": args.vocab_per_rank, "keys_per_rank": args.batch_per_rank *
              SLOTS * NNZ, "steps_per_repeat": args.steps, "repeats": args.repeats,
              "environment": harness.environment({"tensorflow": tf.__version__,
                                                 "cpus": os.cpu_count()})}
    result.update(time_steps(session, train, ids, feeds, args, "sok1x_ms"))
    if size == 1:
        initial = cpu_random.initial_values(table.init_spec, name_key("table:" + table.name),
                                            np.arange(vocab), DIM)
        native, native_ids, native_loss, native_train = native_model(args, initial)
        native_losses = [native.run([native_loss, native_train], {native_ids: feeds[i]})[0]
                         for i in range(CHECK_STEPS)]
        result["loss_sok1x"] = [float(v) for v in sok_losses]
        result["loss_native"] = [float(v) for v in native_losses]
        result["loss_max_rel_diff"] = float(np.max(np.abs(np.subtract(sok_losses, native_losses))
                                                   / np.abs(native_losses)))
        result.update(time_steps(native, native_train, native_ids, feeds, args, "native_ms"))
        result["sok1x_vs_native"] = result["sok1x_ms"] / result["native_ms"]
    harness.say("cpu step, %d rank(s): sok1x %.1f ms (%.1f-%.1f)%s" % (
        size, result["sok1x_ms"], result["sok1x_ms_min"], result["sok1x_ms_max"],
        "" if size > 1 else ", native TF %.1f ms (%.1f-%.1f, x%.2f), loss rel diff %.1e" % (
            result["native_ms"], result["native_ms_min"], result["native_ms_max"],
            result["sok1x_vs_native"], result["loss_max_rel_diff"])))
    harness.write_json(args.out, result)
    harness.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
