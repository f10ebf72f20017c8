"""One fused lookup of many tables against one lookup per table (DeepRec's GroupEmbedding, D12).

    mpiexec -n 1 python3 bench/group_lookup.py --out group1.json
    mpiexec -n 4 python3 bench/group_lookup.py --out group4.json

A DLRM-like step: 26 tables (vocabularies from 1e3 to ~2e5 rows, dim 32 by default), each
sample `hotness` ids per table, sum pooling; per step the forward lookup and its backward (the
top gradient is the output itself; no optimizer update, which is the same work either way).
Both variants drive sok1x.engine.api directly with device arrays made once (no TensorFlow):

    fused     api.pooled_lookup(all 26 tables) + api.pooled_lookup_grad: one exchange each way,
              what sok1x.group_embedding_lookup_sparse and a group_embedding_column_scope run
    separate  26 x (api.pooled_lookup([table]) + api.pooled_lookup_grad): one exchange per table
              each way, what 26 separate lookups run

Outputs of the two are compared on the first step (max abs difference recorded) before timing.
Each repeat times `--steps` steps on the sok1x stream (CUDA events; host clock on cpu) and gives
ms/step; the figure is the median of `--repeats` (>= 5) repeats, with min and max beside it.
--backend cpu runs the same on CPU-only hosts (use small --batch) to check the script.
"""
import sys

import numpy as np

from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup.pooled import PooledInput

import harness

SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=3)


def parse_args(argv):
    parser = harness.parser(__doc__, backend=True, out=True, steps=10, repeats=7)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8192, help="samples per rank")
    parser.add_argument("--hotness", type=int, default=1, help="ids per sample and table")
    parser.add_argument("--max-vocabulary", type=int, default=200000)
    return parser.parse_args(argv)


say = harness.say


def vocabularies(count, largest):
    """Table sizes spread log-uniformly from 1000 to `largest`."""
    return [int(round(1000 * (largest / 1000.0) ** (t / max(count - 1, 1))))
            for t in range(count)]


def make_inputs(rt, args, sizes):
    """Per table a PooledInput of this rank's batch (device arrays), the same every step."""
    rng = np.random.default_rng(1000 + rt.rank)
    backend = rt.backend
    segment_ids = np.repeat(np.arange(args.batch, dtype=np.int64), args.hotness)
    inputs = []
    with runtime.entered():  # the cuda backend makes device arrays only with its context current
        for vocabulary in sizes:
            keys = rng.integers(0, vocabulary, size=args.batch * args.hotness, dtype=np.int64)
            inputs.append(PooledInput(backend.asarray(keys), backend.asarray(segment_ids),
                                      args.batch, None, "sum"))
    return inputs


def fused_step(names, inputs):
    outputs, token = api.pooled_lookup(names, "group_fwd", inputs, True)
    api.pooled_lookup_grad(names, "group_bwd", token, outputs)
    return outputs


def separate_step(names, inputs):
    all_outputs = []
    for name, item in zip(names, inputs):
        outputs, token = api.pooled_lookup([name], "single_fwd", [item], True)
        api.pooled_lookup_grad([name], "single_bwd", token, outputs)
        all_outputs += outputs
    return all_outputs


def max_difference(rt, fused, separate):
    with runtime.entered():
        pairs = [(rt.backend.to_host(a), rt.backend.to_host(b)) for a, b in zip(fused, separate)]
    return harness.job_max(max(float(np.max(np.abs(a - b))) if a.size else 0.0
                               for a, b in pairs))


def time_variant(rt, step, args):
    """ms/step of each repeat (job maximum over ranks)."""
    timer = harness.StreamTimer(rt.backend)

    def steps():
        for _ in range(args.steps):
            step()
    per_repeat = timer.time_ms(steps, args.repeats, warmup=1)
    return [harness.job_max(t / args.steps) for t in per_repeat]


def main(argv):
    args = parse_args(argv)
    if args.repeats < 5:
        raise SystemExit("--repeats must be at least 5")
    rt = harness.start_engine(args.backend)
    sizes = vocabularies(args.tables, args.max_vocabulary)
    names = ["group_bench_%02d" % t for t in range(args.tables)]
    for name, vocabulary in zip(names, sizes):
        api.create_table(name, args.dim, -(-vocabulary // rt.size), False, SPEC, replace=True)
    inputs = make_inputs(rt, args, sizes)
    say("%d ranks, %s backend: %d tables (%d..%d rows), dim %d, %d samples x %d ids per rank"
        % (rt.size, args.backend, args.tables, sizes[0], sizes[-1], args.dim, args.batch,
           args.hotness))
    difference = max_difference(rt, fused_step(names, inputs), separate_step(names, inputs))
    say("first step: fused and separate outputs differ by at most %.3g" % difference)
    results = {}
    for variant, step in (("fused", lambda: fused_step(names, inputs)),
                          ("separate", lambda: separate_step(names, inputs))):
        results[variant] = harness.summary(time_variant(rt, step, args))
        say("%-8s %8.3f ms/step (min %.3f, max %.3f over %d repeats of %d steps)"
            % (variant, results[variant]["median_ms"], results[variant]["min_ms"],
               results[variant]["max_ms"], args.repeats, args.steps))
    speedup = results["separate"]["median_ms"] / results["fused"]["median_ms"]
    say("fused is %.2fx faster than %d separate lookups" % (speedup, args.tables))
    harness.write_json(args.out, {
        "ranks": rt.size, "backend": args.backend, "args": vars(args),
        "vocabularies": sizes, "max_abs_difference": difference, "results": results,
        "speedup": speedup, "environment": harness.environment()})
    harness.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
