"""Where a doubling step's time goes: growth_step's grow (or grow_copies) step with the pieces of
a growth wrapped, each piece timed from a synchronize before it to a synchronize after it (so
its device work counts, and the pieces do not overlap: their sum is more than the step).

    mpiexec -n 1 python bench/growth_breakdown.py --way grow --repeats 3
"""
import collections
import functools
import time

from sok1x.engine.lookup import table_group

import growth_step
import harness

TOTALS = collections.Counter()
COUNTS = collections.Counter()


def synchronized(backend, owner, name, label=None):
    """Wraps owner.name with a wall timer between two synchronizes; returns the original."""
    function = getattr(owner, name)
    label = label or name

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        backend.synchronize()
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            backend.synchronize()
            TOTALS[label] += time.perf_counter() - start
            COUNTS[label] += 1
    setattr(owner, name, wrapper)
    return function


def main():
    parser = harness.parser(__doc__, out={"required": False, "default": None},
                            backend={"default": "cuda"}, repeats=3)
    parser.add_argument("--way", default="grow", choices=("grow", "grow_copies"))
    for flag, default in (("--tables", 26), ("--dim", 128), ("--rows", 1 << 18),
                          ("--new", 16384)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--between-ms", type=float, default=0.0)  # growth_step's
    args = parser.parse_args()
    rt = harness.start_engine(args.backend)
    backend = rt.backend
    pieces = [(table_group.HashGroup, "grow"), (table_group.HashGroup, "rows_needed"),
              (table_group.HashGroup, "insert_start"), (table_group, "rebuilt_indexes"),
              (backend, "fill_value"), (backend, "back_rows"), (backend, "write_rows"),
              (backend, "join_ahead"),
              (backend, "release_unused")]
    steps = []
    for repeat in range(args.repeats + 1):  # the first round compiles the kernels
        harness.release_memory(backend)
        with growth_step.growth_switch(args.way):
            case = growth_step.Case(rt, args, args.way, repeat)
            case.fill_up()
            harness.release_memory(backend)
            TOTALS.clear()
            COUNTS.clear()
            originals = [(owner, name, synchronized(backend, owner, name))
                         for owner, name in pieces if hasattr(owner, name)]
            start = time.perf_counter()
            case.step(case.steps[0], "first")
            backend.synchronize()
            ms = (time.perf_counter() - start) * 1e3
        for owner, name, function in originals:
            setattr(owner, name, function)
        if repeat:
            steps.append((ms, dict(TOTALS), dict(COUNTS)))
        case.drop()
    for ms, totals, counts in steps:
        harness.say("%s step %.3f ms: %s" % (args.way, ms, ", ".join(
            "%s %.3f ms (%d)" % (label, 1e3 * seconds, counts[label])
            for label, seconds in sorted(totals.items(), key=lambda kv: -kv[1]))))
    harness.finish()


if __name__ == "__main__":
    main()
