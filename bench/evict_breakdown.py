"""Where an evicting step's host time goes, in wall time (no profiler): dlrm26_full's engine step
timed with the engine's main pieces wrapped (inclusive microseconds per step, per piece).

    python bench/evict_breakdown.py --backend cuda --steps 40
"""
import collections
import functools
import time

from sok1x.engine.lookup import key_exchange, keyed, table_group
from sok1x.engine.tables import dynamic_table, eviction

import harness
import step_calls

TOTALS = collections.Counter()
COUNTS = collections.Counter()


def timed(owner, name, label=None):
    function = getattr(owner, name)
    label = label or "%s.%s" % (getattr(owner, "__name__", owner), name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            TOTALS[label] += time.perf_counter() - start
            COUNTS[label] += 1
    setattr(owner, name, wrapper)


def main():
    parser = harness.parser(__doc__, out={"required": False, "default": None},
                            backend={"default": "cuda"}, scale=1, steps=40, repeats=1)
    parser.add_argument("--workload", default="dlrm26_full")
    args = parser.parse_args()
    rt = harness.start_engine(args.backend)
    case = step_calls.Case(rt, args.workload, args.scale)
    for _ in range(5):
        case.run()
    rt.backend.synchronize()
    for owner, name in [
            (table_group.HashGroup, "rows_needed"), (table_group.HashGroup, "growth_error"),
            (table_group.HashGroup, "make_room"), (table_group.HashGroup, "insert_start"),
            (table_group.HashGroup, "insert_finish"), (table_group.HashGroup, "count_kept"),
            (eviction, "evict"), (dynamic_table.DynamicTable, "take_victims"),
            (key_exchange, "_insert_keys"), (key_exchange, "lookup_forward_many"),
            (keyed, "keyed_forward"), (keyed, "keyed_backward"), (keyed, "keyed_update"),
            (table_group.HashGroup, "make_room_in_place"),
            (table_group.HashGroup, "in_place_bounds")]:
        if hasattr(owner, name):  # (a tree before the eviction in place has neither)
            timed(owner, name)
    backend = rt.backend
    for name in ("count_new_keys", "count_evictable", "pick_victims", "hash_find_many",
                 "hash_insert_many", "hash_erase_many", "part_bounds", "gather_rows",
                 "download_staged_many", "to_host_many", "hash_rehash_many", "init_rows",
                 "init_rows_tagged", "stamp_last_step", "offset_parts", "put_rows",
                 "touch_rows", "row_views"):
        if hasattr(backend, name):
            timed(backend, name, "backend." + name)
    TOTALS.clear()
    COUNTS.clear()
    rt.backend.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        case.run()
    rt.backend.synchronize()
    step_us = (time.perf_counter() - start) * 1e6 / args.steps
    pieces = {label: {"us": seconds * 1e6 / args.steps, "calls": COUNTS[label] / args.steps}
              for label, seconds in TOTALS.most_common()}
    if rt.rank == 0:
        print("%s: %.0f us a step (wall, %d steps, pieces inclusive)" % (
            args.workload, step_us, args.steps))
        for label, piece in pieces.items():
            print("  %-40s %8.0f us  %6.1f calls" % (label, piece["us"], piece["calls"]))
    if args.out:
        harness.write_json(args.out, {"environment": harness.environment(),
                                      "workload": args.workload, "steps": args.steps,
                                      "step_us": step_us, "pieces": pieces})
    harness.finish()


if __name__ == "__main__":
    main()
