"""The demo's TensorFlow training step through each seam, in one job (DESIGN D1, issue 43):

    mpiexec -n 2 python bench/seam_step.py --out results/seam2.json [--seams kernels,host]

The model and step of legacy_examples/demo_tf1.py (SOK's TF 1.15 demo: All2AllDenseEmbedding,
two dense ReLU layers, Keras Adam on the embedding in sok.OptimizerScope, sok.allreduce of the
dense gradients) on the cpu backend, built once per seam in a graph of its own (SOK1X_SEAM set
while it is built), each in its own Session. The seams' steps are timed in turn inside each
repeat (so the host's load drifts over all alike); each figure is the median of --repeats
repeats of --steps steps, the slowest rank's, with min and max. On TensorFlow 1.15 the seams are
sok1x's kernels and host staging (py_func); on 2.x also DLPack (tf.py_function).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import sok1x as sok  # noqa: E402
from sok1x.graph_ops import boundary, tf_compat  # noqa: E402

import harness  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "legacy_examples"))
import demo_tf1  # noqa: E402

tf1 = tf.compat.v1


def parse_args(argv):
    parser = harness.parser(__doc__, out=True, steps=20, repeats=7)
    parser.add_argument("--seams", default=None, help="default: kernels, host (and dlpack "
                        "where TensorFlow has it)")
    parser.add_argument("--global-batch-size", type=int, default=1024)
    args = parser.parse_args(argv)
    if args.seams is None:
        args.seams = "kernels,host" + (",dlpack" if tf_compat.HAS_DLPACK else "")
    return args


def demo_args(global_batch_size):
    """demo_tf1's defaults (its argparse), with the batch given."""
    saved, sys.argv = sys.argv, [sys.argv[0], "--global_batch_size", str(global_batch_size),
                                 "--backend", "cpu"]
    try:
        return demo_tf1.parse_args()
    finally:
        sys.argv = saved


def build(seam, args):
    """The demo's train step with every sok1x op on `seam`; returns (session, fetch, feed of a
    batch index, the op types of the graph's sok1x ops)."""
    os.environ[boundary.SEAM_ENV] = seam
    try:
        graph = tf1.Graph()
        with graph.as_default():
            init = sok.Init(global_batch_size=args.global_batch_size, backend="cpu")
            model = demo_tf1.DemoModel(args.max_vocabulary_size_per_gpu, args.slot_num,
                                       args.nnz_per_slot, args.embedding_vector_size,
                                       args.num_of_dense_layers, args.dense_units,
                                       name="demo_%s" % seam)
            inputs = tf1.placeholder(tf1.int64, [None, args.slot_num, args.nnz_per_slot])
            labels = tf1.placeholder(tf1.float32, [None, 1])
            loss, _ = demo_tf1.build_train_step(args, model, inputs, labels)
            variables = tf1.group(tf1.global_variables_initializer(),
                                  tf1.local_variables_initializer())
            kinds = sorted({op.type for op in graph.get_operations()
                            if op.type in ("Sok1xEngineCall", "PyFunc", "EagerPyFunc")})
    finally:
        os.environ.pop(boundary.SEAM_ENV, None)
    config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    session = tf1.Session(graph=graph, config=config)
    session.run(init)
    session.run(variables)
    batches = demo_tf1.synthetic_batches(args, sok.rank(), sok.num_gpus())

    def feed(index):
        keys, step_labels = batches[index % len(batches)]
        return {inputs: keys, labels: step_labels}
    return session, loss, feed, kinds


def main(argv):
    args = parse_args(argv)
    demo = demo_args(args.global_batch_size)
    seams = args.seams.split(",")
    built = {seam: build(seam, demo) for seam in seams}
    runs = {seam: harness.Steps(lambda i, s=seam: built[s][0].run(built[s][1], built[s][2](i)))
            for seam in seams}
    times = harness.interleaved_ms(runs, args.repeats, args.steps, lambda: None)
    result = {"ranks": sok.num_gpus(), "global_batch_size": args.global_batch_size,
              "steps_per_repeat": args.steps, "repeats": args.repeats,
              "environment": harness.environment({"tensorflow": tf.__version__,
                                                 "cpus": os.cpu_count()}),
              "seams": {}}
    for seam in seams:
        entry = harness.summary(times[seam], ("ms_per_step", "ms_min", "ms_max", "ms_repeats"))
        entry["op_types"] = built[seam][3]
        result["seams"][seam] = entry
        harness.say("demo step, %d rank(s), %s seam: %.2f ms (%.2f-%.2f) %s" % (
            result["ranks"], seam, entry["ms_per_step"], entry["ms_min"], entry["ms_max"],
            entry["op_types"]))
    if "kernels" in seams:
        for seam in seams:
            if seam != "kernels":
                ratio = result["seams"][seam]["ms_per_step"] / result["seams"]["kernels"][
                    "ms_per_step"]
                result["%s_over_kernels" % seam] = ratio
                harness.say("%s / kernels: %.2fx" % (seam, ratio))
    harness.write_json(args.out, result)
    harness.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
