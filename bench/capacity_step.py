"""One engine training lookup (forward and backward) sized by per-peer capacities against the same
lookup sized by its counts, side by side in one job (engine/lookup/peer_capacity.py).

    mpiexec -n 2 python bench/capacity_step.py --backend cpu --out results/capacity.json

--tables tables of --dim columns, each looked up with --keys uniform keys a rank and step over a
vocabulary of --vocab-per-rank keys a rank, then the gradient of a sum pooling; both ways run
on the same tables in alternating rounds (harness.interleaved_ms). Per way: ms per step (the
slowest rank's, median of --repeats with min and max), and Python calls per step (a cProfile of
--steps steps on rank 0). Prints one line per way and the ratio sized / counted.
"""
import cProfile
import functools
import itertools
import os
import pstats
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api  # noqa: E402
from sok1x.engine.lookup import peer_capacity  # noqa: E402
from sok1x.engine.lookup.pooled import PooledInput  # noqa: E402


def parse_args(argv):
    parser = harness.parser(__doc__, out=True, backend=True, steps=20, repeats=5)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--keys", type=int, default=8192)
    parser.add_argument("--vocab-per-rank", type=int, default=1 << 16)
    return parser.parse_args(argv)


def make_steps(rt, args):
    """{way: run()} for way "counted" and "sized": one lookup and its gradient each."""
    spec = random_init.make_spec("uniform", -0.1, 0.1, seed=3)
    names = ["capacity_bench_%d" % t for t in range(args.tables)]
    for name in names:
        api.create_table(name, args.dim, args.vocab_per_rank, False, spec, replace=True)
    rng = np.random.default_rng([7, rt.rank])
    vocab = args.vocab_per_rank * rt.size
    batches = []
    for _ in range(4):
        inputs = [PooledInput(rt.backend.asarray(rng.integers(0, vocab, size=args.keys)),
                              rt.backend.asarray(np.arange(args.keys) // 4), args.keys // 4,
                              None, "sum") for _ in names]
        tops = [rt.backend.asarray(np.ones((args.keys // 4, args.dim), np.float32))
                for _ in names]
        batches.append((inputs, tops))
    return {way: functools.partial(_step, names, way, batches, itertools.count())
            for way in ("counted", "sized")}


def _step(names, way, batches, counter):
    """One forward and backward of `names` the given way, on the next of `batches`."""
    os.environ[peer_capacity.ENV] = "1" if way == "sized" else "0"
    inputs, tops = batches[next(counter) % len(batches)]
    _, token = api.pooled_lookup(names, way + "_fwd", inputs, True)
    api.pooled_lookup_grad(names, way + "_bwd", token, tops)


def python_calls(run, steps):
    """Python function calls per step of run() (cProfile over `steps` steps)."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        run()
    profile.disable()
    return pstats.Stats(profile).total_calls / float(steps)


def main(argv=None):
    args = parse_args(argv)
    rt = harness.start_engine(args.backend)
    steps = make_steps(rt, args)
    times = harness.interleaved_ms(steps, args.repeats, args.steps, rt.backend.synchronize)
    result = {"environment": harness.environment({"ranks": rt.size, "backend": args.backend}),
              "args": vars(args)}
    for way, run in steps.items():
        result[way] = harness.summary(times[way])
        result[way]["python_calls"] = python_calls(run, args.steps)
        harness.say("%s: %.3f ms a step (%.3f-%.3f), %.0f Python calls a step" % (
            way, result[way]["median_ms"], result[way]["min_ms"], result[way]["max_ms"],
            result[way]["python_calls"]))
    ratios = [s / c for s, c in zip(times["sized"], times["counted"])]
    result["sized_over_counted"] = harness.summary(ratios, ("median", "min", "max", "repeats"))
    plans = [p for key, p in rt.capacities.items() if key[0] == "sized_fwd"]
    result["sized_lookups"] = plans[0].sized if plans else 0
    harness.say("sized / counted: %.3f (%.3f-%.3f), %d lookups sized" % (
        result["sized_over_counted"]["median"], result["sized_over_counted"]["min"],
        result["sized_over_counted"]["max"], result["sized_lookups"]))
    if args.out:
        harness.write_json(args.out, result)
    harness.finish()


if __name__ == "__main__":
    main()
