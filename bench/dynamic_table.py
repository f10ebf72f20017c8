"""DynamicVariable's shard (engine/tables/dynamic_table.py) on HierarchicalKV's grid: find and
find_or_insert in 2^30 keys/s for var_type "hbm" and for "hybrid" with a quarter, a half and three
quarters of the vectors in page-locked host memory that the kernels read and write in place over
PCIe, at dim 64 and 128, load 0.5 and 0.75, and (hybrid only) 1.0: a full table, whose new keys
evict as many held ones in the engine's path (the bare calls take free rows, which a full table
has none of, so they are left out there; HierarchicalKV evicts inside its insert).

    python3 bench/dynamic_table.py --out results/dynamic.json [--rows-log2 24] [--scale 16]

The table holds 2^rows_log2 rows (26: HKV's 64M capacity) and is filled to the load with distinct
keys (load as HKV counts it, of the rows; the index itself has twice as many slots as rows). For
hybrid the held keys' rows are a random permutation of all rows, the free rows likewise, so a
key's row is in host memory with the host share's probability. Each call handles 2^20 keys:
    find                    index.find + the table's gather (60% of the keys held, 40% not)
    find_or_insert          the bare table: index.find_or_insert_values with a row pool, one
                            kernel that finds, places, initialises the new rows and copies
                            every key's vector out (60% held, 40% new; on a sok1x without it,
                            the three ops of find_or_insert_unfused)
    find_or_insert_unfused  the same as three ops: index.find_or_insert + init of the new rows
                            (queued before the wait for their count) + gather (the bare figure
                            before 2026-11-23's issue 21 third round)
    find_or_insert_engine   the engine's training path for those keys: DynamicTable.capacity_error
                            + inserted_rows_and_vectors (free list, statistics, step journal),
                            as key_exchange's lookup: the one kernel for hybrid's split rows,
                            find_or_insert + queued init + gather for hbm. A full table drops
                            the keys it evicts (--evicted: its first way), as HierarchicalKV's
                            find_or_insert does; find_or_insert_engine_<way> times the others
                            (kept: for a reader on the host, a copy queued each call, which
                            every full-table figure before 2026-11-28's f358934 pass had)
Each inserting call is undone (untimed: the index's slots copied back, after the step journal's
rollback for the engine path; --keep-tombstones: the rollback alone, whose erased keys leave
tombstones that lengthen later probes) so every call starts at the load. The bare path queues
the new rows' init before its one wait (HashIndex.find_or_insert's queue_first), as the engine
does. An hbm table has no free list (it
never evicts), so its new keys take the index's next rows; hybrid's take the free list's.
Beside them, measured in the same run:
- `pcie_same_size` (each hybrid point): page-locked mapped reads and writes of the table's own
  host part (the region of the hybrid table's host rows, its size and its pages), in the ops'
  access pattern: random rows of `dim` floats (2^20 distinct host rows per call, the gather and
  put_rows kernels hybrid uses; the write puts back the rows just read, so the table is left as
  it was), and the same rows read in ascending order (`read_sorted`: what ordering the host
  accesses could gain). `pcie_bound_gkeys_per_s["same_size"]` is what those rates allow for
  the host bytes each op moves per key (below), `pct_of_bound` the op's figure as a percentage;
- `mapped` (per dim), the probe of before 2026-11-23's fourth round: a gather from and a
  scatter into 2^20 random rows of a 2^22-row region (1 GiB at dim 64, 2 GiB at 128), its bounds
  under "mapped_2^22_rows";
- `h2d_gib_per_s`, a 256 MiB page-locked copy;
- with --hkv BINARY, HierarchicalKV's own benchmark routine on each (dim, host share), both
  loads, run right before ours (bench/hkv_reference.py says how to build it and how it times),
  under `hkv_same_run` in each entry.
Host bytes per key (share: the host share, row: dim * 4 bytes): find 0.6 * share * row read;
find_or_insert and the engine path (one kernel: held rows read, new rows written)
0.6 * share * row read + 0.4 * share * row written; find_or_insert_unfused (the gather reads
new rows too) share * row read + 0.4 * share * row written. Every figure: the median of
--repeats calls with min and max. HierarchicalKV's stored H200 figures are kept beside ours.
--markdown PATH writes the grid as a table.
"""
import sys
import types

import numpy as np

import harness
import hkv_reference
from hash_table import HIT_RATE, HKV_H200, Snapshot, keys_of, op_figures, rotations

KEYS_PER_CALL = 1 << 20
DIMS = (64, 128)
LOADS = (0.5, 0.75)
HOST_SHARES = (0.0, 0.25, 0.5, 0.75)  # 0: var_type "hbm"
# (rows read, rows written) in host memory per key and per unit of host share, by op
HOST_ROWS = {"find": (0.6, 0.0), "find_or_insert": (0.6, 0.4),
             "find_or_insert_engine": (0.6, 0.4), "find_or_insert_unfused": (1.0, 0.4)}
HKV_HYBRID_H200 = {"source": "HierarchicalKV on an H200, dim 64, load 0.5, half the vectors in "
                             "host memory (issue 21)", "find": 0.200, "find_or_insert": 0.159}


def new_keys(keys_per_call):
    """The keys of a find_or_insert call that its table does not hold (1 - HIT_RATE of them)."""
    return keys_per_call - int(keys_per_call * HIT_RATE)


def make_table(backend, host_share, rows, dim, load, rng):
    """A DynamicTable of `rows` rows (no growth), host_share of its vectors in host memory (0:
    var_type "hbm"), filled to `load`; returns (table, held count)."""
    from sok1x.backend import random_init
    from sok1x.engine.tables.dynamic_table import DynamicTable, make_dynamic
    from sok1x.engine.lookup.step_journal import StepJournal
    spec = random_init.make_spec("uniform", -0.05, 0.05, seed=1)
    var_type = "hybrid" if host_share else "hbm"
    hbm_gib = rows * (1.0 - host_share) * dim * 4 / 2 ** 30 if host_share else 0.0
    dynamic = make_dynamic(var_type, rows, rows, "lru", hbm_gib)
    place = types.SimpleNamespace(backend=backend, rank=0, size=1, journal=StepJournal())
    with backend.device_context():
        table = DynamicTable(place, "bench_" + var_type, dim, spec, "hash", dynamic)
        held = int(load * rows)
        # every row the shard holds (a hybrid one at max_capacity: its spare rows too), spread:
        # after its first evicting steps a full shard's free rows are rows keys left anywhere
        total = int(table.values.shape[0])
        order = rng.permutation(total) if host_share else np.arange(rows)
        piece = 1 << 22
        for first in range(0, held, piece):
            n = min(piece, held - first)
            table.index.assign(backend.asarray(keys_of(first, n)),
                               backend.asarray(order[first:first + n].astype(np.int64)))
        if host_share:  # rows spread over both parts: the unused ones on the free list
            table._high_water = total
            table.set_free_rows(order[held:].astype(np.int64))  # first: first
        else:  # as an hbm table always is: no free list, rows [0, held) handed out
            table._high_water = held
        backend.synchronize()
    return table, held


def mapped_gib_per_s(backend, timer, dim, repeats, rng):
    """(read, write) GiB/s of the row kernels on page-locked mapped host rows: a gather of 2^20
    random rows of `dim` floats from 2^22 host rows, and a scatter into them."""
    rows = 1 << 22
    with backend.device_context():
        host = backend.host_mapped_zeros((rows, dim), np.float32)
        index = backend.asarray(rng.choice(rows, KEYS_PER_CALL, replace=False).astype(np.int64))
        src = backend.zeros((KEYS_PER_CALL, dim), np.float32)
        nbytes = KEYS_PER_CALL * dim * 4 / 2 ** 30
        read = timer.time_ms(lambda: backend.gather_rows(host, index), repeats)
        write = timer.time_ms(lambda: backend.put_rows(host, index, src), repeats)
    return tuple(dict(harness.summary(ms, ("ms", "ms_min", "ms_max", "ms_repeats")),
                      gib_per_s=nbytes / harness.median(ms) * 1e3) for ms in (read, write))


def same_size_gib_per_s(backend, timer, table, keys_per_call, repeats, rng):
    """Mapped-read and -write GiB/s on the hybrid table's own host part: keys_per_call distinct
    random host rows gathered (`read`), the same rows in ascending order (`read_sorted`), and
    put back where they were read (`write`, leaving the table as it was)."""
    host = table.values.parts[1]
    host_rows = int(host.shape[0])
    picks = rng.choice(host_rows, min(keys_per_call, host_rows), replace=False).astype(np.int64)
    nbytes = picks.shape[0] * host.shape[1] * 4 / 2 ** 30
    figures = {"host_gib": host_rows * host.shape[1] * 4 / 2 ** 30, "rows": int(picks.shape[0])}
    with backend.device_context():
        shuffled, ascending = backend.asarray(picks), backend.asarray(np.sort(picks))
        rows = backend.gather_rows(host, shuffled)
        for name, run in (("read", lambda: backend.gather_rows(host, shuffled)),
                          ("read_sorted", lambda: backend.gather_rows(host, ascending)),
                          ("write", lambda: backend.put_rows(host, shuffled, rows))):
            ms = timer.time_ms(run, repeats)
            figures[name] = dict(harness.summary(ms, ("ms", "ms_min", "ms_max", "ms_repeats")),
                                 gib_per_s=nbytes / harness.median(ms) * 1e3)
        backend.synchronize()
    return figures


def pcie_gib_per_s(backend, timer):
    """Host-to-device copy bandwidth from page-locked memory (GiB/s), or None on cpu."""
    if backend.NAME != "cuda":
        return None
    import pycuda.driver as driver
    from sok1x.backend.cuda import context as cuda_context
    nbytes = 256 << 20
    with cuda_context.entered():
        host = driver.pagelocked_empty(nbytes, np.uint8)
        device = driver.mem_alloc(nbytes)

        def copy():
            driver.memcpy_htod_async(device, host, cuda_context.stream())
        ms = harness.median(timer.time_ms(copy, 5))
    return nbytes / 2 ** 30 / (ms / 1e3)


EVICTED_WAYS = ("drop", "kept", "device")


def evicted_way(name, way):
    """Has table `name` drop the keys it evicts ("drop": no reader, SOK's DynamicVariable without
    sparse_read_and_evict, and what HierarchicalKV's find_or_insert does), keep them for a
    reader on the host ("kept": a copy to the host queued at each eviction) or for one on the
    device ("device")."""
    from sok1x.engine.tables import dynamic_table
    for ways in (dynamic_table._DROPPED, dynamic_table._READ, dynamic_table._ON_DEVICE):
        ways.discard(name)
    if way == "drop":
        dynamic_table.drop_evicted(name, True)
    else:
        dynamic_table.drop_evicted(name, False, on_device=way == "device")


def measure(backend, timer, host_share, rows, keys_per_call, dim, load, repeats, rng,
            keep_tombstones=False, order_ab=False, region_sweep=(), walk_sweep=(),
            evicted_ways=("drop",)):
    table, held = make_table(backend, host_share, rows, dim, load, rng)
    evicted_way(table.name, evicted_ways[0])
    finds, inserts = rotations(backend, held, keys_per_call, rng)
    journal = table.journal

    def find():
        table.gather(table.index.find(finds()))

    new_per_call = new_keys(keys_per_call)
    pool = None  # hbm: the index's own next rows, as the engine's
    if table._free.size:
        pool = backend.asarray(table.free_rows()[:new_per_call])  # the next free rows
    snapshot = Snapshot(backend, table.index)

    def init_new_rows(new_keys, new_rows, count, *rows):  # rows: since issue 21's 4th round
        table.backend.init_rows(table.values, new_rows, new_keys, table.spec, 7, count)

    # A sok1x without find_or_insert_values (before 2026-11-23's third round) runs the three
    # ops for find_or_insert and rows_of + gather on the engine path, so one script times both.
    fused = hasattr(table.index, "find_or_insert_values")

    def find_or_insert_unfused():
        found, _, _ = table.index.find_or_insert(inserts(), row_pool=pool,
                                                 queue_first=init_new_rows)
        table.gather(found)

    def find_or_insert():
        if not fused:
            return find_or_insert_unfused()
        table.index.find_or_insert_values(inserts(), table.values, table.spec, 7, row_pool=pool)

    def find_or_insert_engine():
        keys = inserts()
        assert table.capacity_error(keys) is None
        if fused:
            table.inserted_rows_and_vectors(keys)
        else:
            table.gather(table.rows_of(keys, True))

    def restore():  # the bare path inserts without the journal: the slots are put back
        snapshot.restore()

    def new_step():
        journal.rollback()
        if not keep_tombstones:  # the slots as the bare path's calls find them
            snapshot.restore()
        journal.begin_step()

    entry = {"var_type": table.dynamic.var_type, "host_share": host_share, "rows": rows,
             "dim": dim, "load": load, "keys_per_call": keys_per_call,
             "hbm_rows": table.hbm_rows, "engine_keeps_tombstones": keep_tombstones,
             "fused": fused}
    ops = [("find", find, None),
           ("find_or_insert", find_or_insert, restore),
           ("find_or_insert_unfused", find_or_insert_unfused, restore),
           ("find_or_insert_engine", find_or_insert_engine, new_step)]
    full = rows - held < new_per_call  # (nearly) full: new keys evict, which the engine path
    if full:  # alone does (the bare calls take free rows: too few left)
        ops = [ops[0], ops[3]]
    with backend.device_context():
        for name, run, before in ops:
            entry[name] = op_figures(timer.time_ms(run, repeats, warmup=2, before=before),
                                     keys_per_call)
        if order_ab and host_share and backend.NAME == "cuda":
            entry["walk_as_given"] = walk_as_given(timer, repeats, keys_per_call, ops)
        if host_share and backend.NAME == "cuda":
            from sok1x.backend.cuda import host_row_order as cuda_host_order
            for key, what, settings, setting in (
                    ("by_region_bytes", "region bytes", region_sweep, cuda_host_order.regions_of),
                    ("by_walk_blocks", "walk blocks", walk_sweep, cuda_host_order.walked_by)):
                if settings:
                    entry[key] = walk_by(timer, repeats, keys_per_call, ops, what, settings,
                                         setting)
        if full:  # the engine path with evicted keys kept for a reader, say
            for way in evicted_ways[1:]:
                evicted_way(table.name, way)
                entry["find_or_insert_engine_" + way] = op_figures(
                    timer.time_ms(find_or_insert_engine, repeats, warmup=2, before=new_step),
                    keys_per_call)
            evicted_way(table.name, evicted_ways[0])
            entry["evicted_ways"] = list(evicted_ways)
        if full:  # one call more, untimed: the table evicted to take them
            new_step()
            find_or_insert_engine()
            entry["held_after_engine_call"] = int(table.index.size)
            assert table.index.size == rows, "a full table's call left %d keys of %d" % (
                table.index.size, rows)
        journal.rollback()
        restore()
    for key, bare in (("engine_over_bare", "find_or_insert"),
                      ("engine_over_unfused", "find_or_insert_unfused")):
        if bare in entry:
            entry[key] = entry["find_or_insert_engine"]["ms"] / entry[bare]["ms"]
    if host_share and backend.NAME == "cuda":
        probe = entry["pcie_same_size"] = same_size_gib_per_s(backend, timer, table,
                                                              keys_per_call, repeats, rng)
        harness.log("  its host part %.2f GiB: mapped read %.1f GiB/s (ascending rows %.1f), "
                    "write %.1f" % (probe["host_gib"], probe["read"]["gib_per_s"],
                                    probe["read_sorted"]["gib_per_s"],
                                    probe["write"]["gib_per_s"]))
    rate = {name: "%.3f" % entry[name]["gkeys_per_s"] if name in entry else "-"
            for name in ("find", "find_or_insert", "find_or_insert_unfused",
                         "find_or_insert_engine")}
    others = "".join(", engine evicted %s %.3f" % (way, entry[
        "find_or_insert_engine_" + way]["gkeys_per_s"]) for way in entry.get(
            "evicted_ways", ())[1:])
    harness.log("%s share %.2f dim %d load %.2f: find %s, find_or_insert %s (unfused %s, "
                "engine %s%s) [2^30 keys/s, medians]" % (
                    entry["var_type"], host_share, dim, load, rate["find"],
                    rate["find_or_insert"], rate["find_or_insert_unfused"],
                    rate["find_or_insert_engine"], others))
    return entry


def walk_as_given(timer, repeats, keys_per_call, ops):
    """The ops' figures with the row kernels walking the batch as given (SOK1X_HOST_ORDER=0, the
    walk before 2026-11-23's fifth round), timed right after the ordered walk in one process."""
    from sok1x.backend.cuda import host_row_order as cuda_host_order
    figures = {}
    with cuda_host_order.walked_as_given():
        for name, run, before in ops:
            figures[name] = op_figures(timer.time_ms(run, repeats, warmup=2, before=before),
                                       keys_per_call)
    harness.log("  walked as given: " + ", ".join(
        "%s %.3f" % (name, f["gkeys_per_s"]) for name, f in figures.items()))
    return figures


def walk_by(timer, repeats, keys_per_call, ops, what, settings, setting):
    """The ops' figures (but the unfused one) under each of `settings` (host_row_order's
    `setting`: regions_of or walked_by), timed one after the other in one process:
    {setting: {op: figures}}."""
    by_setting = {}
    for value in settings:
        figures = by_setting[str(value)] = {}
        with setting(value):
            for name, run, before in ops:
                if name != "find_or_insert_unfused":
                    figures[name] = op_figures(timer.time_ms(run, repeats, warmup=2,
                                                             before=before), keys_per_call)
        harness.log("  %s %s: " % (what, value) + ", ".join(
            "%s %.3f" % (name, f["gkeys_per_s"]) for name, f in figures.items()))
    return by_setting


def pcie_bounds(read, write, host_share, dim):
    """2^30 keys/s the mapped rates (GiB/s) allow for each op's host bytes (module docstring)."""
    row_gib = dim * 4 / 2 ** 30 * host_share
    return {op: 1.0 / (row_gib * (rows_read / read + rows_written / write)) / 2 ** 30
            for op, (rows_read, rows_written) in HOST_ROWS.items()}


def add_bounds(entry, mapped):
    """Puts the PCIe bounds of a hybrid entry (the same-size probe's and the 2^22-row probe's
    `mapped` rates) and each op's percentage of them into the entry."""
    probes = {"same_size": entry["pcie_same_size"], "mapped_2^22_rows": mapped}
    entry["pcie_bound_gkeys_per_s"] = {
        name: pcie_bounds(probe["read"]["gib_per_s"], probe["write"]["gib_per_s"],
                          entry["host_share"], entry["dim"]) for name, probe in probes.items()}
    entry["pct_of_bound"] = {
        name: {op: 100.0 * entry[op]["gkeys_per_s"] / bound for op, bound in bounds.items()
               if op in entry}
        for name, bounds in entry["pcie_bound_gkeys_per_s"].items()}


def percent(shares, op):
    """An op's % of a bound, or "-" where the op did not run (a full table's bare calls)."""
    return "%.0f" % shares[op] if op in shares else "-"


def markdown(results):
    """The grid as a markdown table (2^30 keys/s, medians with min-max)."""
    def cell(figures):
        if not figures or "gkeys_per_s" not in figures:
            return "-"
        low, high = (figures.get("gkeys_per_s_" + k, figures.get("ms_" + k)) for k in
                     ("min", "max"))
        if "ms" in figures:  # ours: the spread in ms turned into keys/s
            keys = figures["gkeys_per_s"] * figures["ms"]
            low, high = keys / figures["ms_max"], keys / figures["ms_min"]
        return "%.3f (%.3f-%.3f)" % (figures["gkeys_per_s"], low, high)

    lines = ["| dim | load | host share | find | HKV find | find_or_insert | HKV find_or_insert"
             " | engine | engine / bare | host GiB | same-size read / sorted / write GiB/s"
             " | % of same-size bound: find, foi, engine | % of 2^22-row bound: find, foi |",
             "|" + "---|" * 13]
    for e in results["grid"]:
        hkv = e.get("hkv_same_run", {})
        probe = e.get("pcie_same_size")
        pct = e.get("pct_of_bound", {})
        same, old = pct.get("same_size"), pct.get("mapped_2^22_rows")
        lines.append("| %d | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            e["dim"], e["load"], e["host_share"], cell(e["find"]), cell(hkv.get("find")),
            cell(e.get("find_or_insert")), cell(hkv.get("find_or_insert")),
            cell(e["find_or_insert_engine"]),
            "%.2f" % e["engine_over_bare"] if "engine_over_bare" in e else "-",
            "%.2f" % probe["host_gib"] if probe else "-",
            "%.1f / %.1f / %.1f" % tuple(probe[k]["gib_per_s"] for k in (
                "read", "read_sorted", "write")) if probe else "-",
            ", ".join(percent(same, op) for op in ("find", "find_or_insert",
                                                    "find_or_insert_engine")) if same else "-",
            ", ".join(percent(old, op) for op in ("find", "find_or_insert")) if old else "-"))
    return "\n".join(lines) + "\n"


def main(argv):
    parser = harness.parser(__doc__, backend=True, out=True, scale=True, repeats=7)
    parser.add_argument("--rows-log2", type=int, default=26, help="table rows: 2^rows_log2")
    parser.add_argument("--dims", default=",".join(map(str, DIMS)))
    parser.add_argument("--loads", default=",".join(map(str, LOADS)))
    parser.add_argument("--shares", default=",".join(map(str, HOST_SHARES)),
                        help="shares of the vectors in host memory (0: var_type hbm)")
    parser.add_argument("--keep-tombstones", action="store_true",
                        help="the engine path's undo leaves the erased keys' tombstones in the "
                             "index (as before 2026-11-23) instead of restoring the slots")
    parser.add_argument("--hkv", help="HierarchicalKV's benchmark binary (bench/hkv_build.sh) "
                                      "to run on the same grid, in the same run")
    parser.add_argument("--hkv-dims", help="dims to run --hkv at (default: every dim)")
    parser.add_argument("--markdown", help="also write the grid as a markdown table here")
    parser.add_argument("--order-ab", action="store_true",
                        help="hybrid points also time every op with the row kernels walking "
                             "the batch as given (walk_as_given)")
    parser.add_argument("--region-sweep", default="",
                        help="hybrid points also time find and find_or_insert (bare and engine) "
                             "with host parts cut into regions of each of these KiB "
                             "(walk_by), e.g. 8192,1024,256,64")
    parser.add_argument("--walk-sweep", default="",
                        help="the same with the ordered walks launched with each of these "
                             "numbers of blocks (0: as launch() sizes any kernel), e.g. "
                             "0,512,128,32")
    parser.add_argument("--evicted", default="drop,kept",
                        help="how a full table's engine path treats the keys it evicts, the "
                             "first the figure of record: drop (no reader: HierarchicalKV's "
                             "find_or_insert discards them too), kept (for a reader on the host; "
                             "the figure before 2026-11-28's f358934 pass), device (a reader "
                             "on the device)")
    args = parser.parse_args(argv)
    evicted_ways = [way for way in args.evicted.split(",") if way]
    if not evicted_ways or any(way not in EVICTED_WAYS for way in evicted_ways):
        parser.error("--evicted: ways among %s" % ", ".join(EVICTED_WAYS))
    region_sweep = [int(kib) << 10 for kib in args.region_sweep.split(",") if kib]
    walk_sweep = [int(blocks) for blocks in args.walk_sweep.split(",") if blocks]
    dims, loads, shares = ([kind(v) for v in text.split(",")] for kind, text in (
        (int, args.dims), (float, args.loads), (float, args.shares)))
    if any(not 0 < load <= 1 for load in loads):
        parser.error("--loads: each load is a share of the rows, above 0 and at most 1")
    backend = harness.backend_module(args.backend)
    timer = harness.StreamTimer(backend)
    rng = harness.seeded_rng()
    rows, keys_per_call = (1 << args.rows_log2) // args.scale, KEYS_PER_CALL // args.scale
    results = {"hkv": HKV_H200, "hkv_hybrid": HKV_HYBRID_H200, "grid": [],
               "h2d_gib_per_s": pcie_gib_per_s(backend, timer), "mapped": {},
               "environment": harness.environment()}
    for dim in dims:
        if backend.NAME == "cuda":
            read, write = mapped_gib_per_s(backend, timer, dim, args.repeats, rng)
            results["mapped"][str(dim)] = {"read": read, "write": write}
            harness.log("dim %d: mapped host rows read %.1f GiB/s, write %.1f GiB/s; page-locked "
                       "copy %.1f GiB/s" % (dim, read["gib_per_s"], write["gib_per_s"],
                                            results["h2d_gib_per_s"]))
        for share in shares:
            hkv = None
            if args.hkv and (not args.hkv_dims or str(dim) in args.hkv_dims.split(",")):
                hkv = hkv_reference.run(args.hkv, dim, rows, share, loads, args.repeats)
                harness.log("HierarchicalKV share %.2f dim %d: %s" % (share, dim, "; ".join(
                    "load %s find %.3f, find_or_insert %.3f" % (
                        load, f["find"]["gkeys_per_s"], f["find_or_insert"]["gkeys_per_s"])
                    for load, f in sorted(hkv.items()) if load != "error") or hkv["error"]))
            for load in loads:
                new = new_keys(keys_per_call)
                if not share and rows - int(load * rows) < new:  # an hbm table never evicts:
                    harness.log("hbm share 0.00 dim %d load %.2f: skipped (no room for a "
                                "call's %d new keys)" % (dim, load, new))
                    continue  # one without room for a call's new keys refuses them
                entry = measure(backend, timer, share, rows, keys_per_call, dim, load,
                                args.repeats, rng, args.keep_tombstones, args.order_ab,
                                region_sweep, walk_sweep, evicted_ways)
                if hkv is not None:
                    entry["hkv_same_run"] = hkv.get("%.2f" % load, {"error": hkv.get("error")})
                if share and backend.NAME == "cuda":
                    add_bounds(entry, results["mapped"][str(dim)])
                results["grid"].append(entry)
                harness.write_json(args.out, results)
                harness.release_memory(backend)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(markdown(results))


if __name__ == "__main__":
    main(sys.argv[1:])
