"""Where a full hybrid table's evicting call goes: dynamic_table.py's engine path at load 1.0 (a
DynamicVariable alone, 2^20 keys a call, 40% new, each new key evicting a held one) with the
pieces of DynamicTable's counted eviction wrapped, each timed from a synchronize before it to a
synchronize after it (so its device work counts; nested pieces are inside their caller's time).

    python3 bench/full_table_parts.py --rows-log2 26 --dim 128 --share 0.25 --evicted drop

--evicted: drop (no reader, HierarchicalKV's find_or_insert's way), kept (for a reader on the
host: a copy queued each call) or device. --kernels (cuda): also each launch of the backend's
eviction module (pick_victims' passes) by kernel name, its scans and fills. Prints, per piece,
its ms a call (median over --repeats calls, the whole call without the wrappers first).
"""
import collections
import importlib
import statistics
import time

import harness
from dynamic_table import evicted_way, make_table, new_keys
from growth_breakdown import COUNTS, TOTALS, synchronized
from hash_table import Snapshot, rotations


def pieces(backend, table):
    """(owner, name) of what a full table's evicting call runs."""
    from sok1x.engine.tables import dynamic_table, eviction, hybrid_rows
    index_class = type(table.index)
    return [(dynamic_table.DynamicTable, "capacity_error"), (index_class, "count_missing"),
            (eviction, "evict"), (backend, "hash_find_many"), (backend, "gather_rows"),
            (backend, "stamp_last_step"), (backend, "pick_victims"),
            (eviction, "_check_found"), (backend, "offset_parts"),
            (hybrid_rows, "gather_rows"), (backend, "hash_erase_many"),
            (eviction, "_take_victims"), (eviction, "_prefetch"), (eviction, "rebuild_worn"),
            (dynamic_table.DynamicTable, "_insert"), (index_class, "find_or_insert_values"),
            (dynamic_table.DynamicTable, "reset_slot_rows")]


def time_launches(backend, module):
    """Wraps `module`'s launch, exclusive_scan and fill_bytes (cuda's eviction module) with
    synchronized timers, launches by kernel name; returns what puts them back."""
    names = {id(function): name for name, function in module._eviction_kernels().items()}
    launch = module.launch

    def timed_launch(function, *args, **kwargs):
        backend.synchronize()
        start = time.perf_counter()
        try:
            return launch(function, *args, **kwargs)
        finally:
            backend.synchronize()
            label = "kernel " + names.get(id(function), "other")
            TOTALS[label] += time.perf_counter() - start
            COUNTS[label] += 1
    module.launch = timed_launch
    others = [(name, synchronized(backend, module, name, "eviction module " + name))
              for name in ("exclusive_scan", "fill_bytes")]

    def put_back():
        module.launch = launch
        for name, function in others:
            setattr(module, name, function)
    return put_back


def main():
    parser = harness.parser(__doc__, out={"required": False, "default": None},
                            backend={"default": "cuda"}, repeats=5)
    parser.add_argument("--rows-log2", type=int, default=26)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--share", type=float, default=0.25)
    parser.add_argument("--evicted", default="drop")
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args()
    backend = harness.backend_module(args.backend)
    rng = harness.seeded_rng()
    rows, keys_per_call = 1 << args.rows_log2, 1 << 20
    table, held = make_table(backend, args.share, rows, args.dim, 1.0, rng)
    evicted_way(table.name, args.evicted)
    _, inserts = rotations(backend, held, keys_per_call, rng)
    snapshot, journal = Snapshot(backend, table.index), table.journal
    assert rows - table.index.size < new_keys(keys_per_call), "the table is not full"

    def call():
        keys = inserts()
        assert table.capacity_error(keys) is None
        table.inserted_rows_and_vectors(keys)

    def new_step():
        journal.rollback()
        snapshot.restore()
        journal.begin_step()

    whole, parts = [], collections.defaultdict(list)
    with backend.device_context():
        for repeat in range(args.repeats + 2):  # two warm-up calls
            new_step()
            backend.synchronize()
            start = time.perf_counter()
            call()
            backend.synchronize()
            if repeat >= 2:
                whole.append((time.perf_counter() - start) * 1e3)
        wrapped = [(owner, name, synchronized(backend, owner, name, "%s.%s" % (
            getattr(owner, "__name__", "?").split(".")[-1], name)))
                   for owner, name in pieces(backend, table) if hasattr(owner, name)]
        put_back = None
        if args.kernels and backend.NAME == "cuda":
            put_back = time_launches(backend,
                                     importlib.import_module("sok1x.backend.cuda.eviction"))
        for _ in range(args.repeats):
            new_step()
            TOTALS.clear()
            COUNTS.clear()
            backend.synchronize()
            start = time.perf_counter()
            call()
            backend.synchronize()
            parts["(the call, wrapped)"].append((time.perf_counter() - start) * 1e3)
            for label, seconds in TOTALS.items():
                parts[label].append(seconds * 1e3)
        for owner, name, function in wrapped:
            setattr(owner, name, function)
        if put_back is not None:
            put_back()
        new_step()
        journal.rollback()
    harness.say("full table, 2^%d rows, dim %d, share %.2f, evicted %s: a call %.3f ms "
                "(%.3f-%.3f), %.3f 2^30 keys/s" % (
                    args.rows_log2, args.dim, args.share, args.evicted,
                    statistics.median(whole), min(whole), max(whole),
                    keys_per_call / statistics.median(whole) * 1e3 / 2 ** 30))
    table_out = {}
    for label, values in sorted(parts.items(), key=lambda kv: -statistics.median(kv[1])):
        table_out[label] = values
        harness.say("  %-34s %8.3f ms (%.3f-%.3f)" % (label, statistics.median(values),
                                                     min(values), max(values)))
    if args.out:
        harness.write_json(args.out, {"args": vars(args), "whole_ms": whole,
                                      "parts_ms": table_out, "environment": harness.environment()})
    harness.finish()


if __name__ == "__main__":
    main()
