"""What a training step costs when a group of DynamicVariables grows or evicts, and the memory a
growth holds at its peak (issue 17: hbm and hybrid DynamicVariables in hash groups).

    mpiexec -n 1 python3 bench/growth_step.py --out results/growth1.json
    python3 bench/growth_step.py --backend cpu --rows 4096 --new 512 --out /tmp/growth.json

--tables DynamicVariables of --dim (26 x 128: dlrm26's; --tables 1: one table alone, a hash group
of one where it grows in place), each shard filled to exactly --rows keys
(every rank's keys of a table split alike over the owners; in training steps as a loop brings
keys: to 3/4 and --new more, then --new a step), then one timed
training step (forward, backward, LazyAdam update through engine/api.py) that brings --new new
keys a rank and table, these ways, each from tables made anew and filled alike:
    room     hbm, init_capacity 2 x rows: the new keys fit (the ordinary step, the reference)
    grow     hbm, init_capacity rows: every member of the group doubles in this step, its rows
             growing in place (device memory mapped behind its new rows of the flat values,
             LazyAdam's two slots and update times, nothing copied: table_group.GROW_ENV's
             default at this size), its index rebuilt
    grow_copies  the same with SOK1X_GROW_IN_PLACE=0 while the group forms: its flat arrays
             laid out again and copied (the growth before 2026-11-27)
    evict    hybrid, max_capacity rows: every member evicts --new keys by LRU and hands their rows
             to the new keys, keeping the evicted keys and vectors for a reader, who reads them
             in the timed step (api.pop_evicted of every table: sok1x.sparse_read_and_evict)
    evict_device  the same, the reader taking them as device arrays (api.pop_evicted with
             on_device=True: what sparse_read_and_evict hands TensorFlow on a GPU through
             sok1x's kernels), with no copy to the host
    evict_drop  the same where no one reads evicted keys (a DynamicVariable's default, as SOK's:
             they are dropped, not copied to the host)
and `second`: the next step, with new keys again (after the growth: the group at its new size,
the keys fit; room: they fit again; evict: every member evicts again). The timed first step
follows a release of sok1x's device memory pool (the memory figures below need it), so its
arrays are new allocations; the second step takes them from the pool, as every step of a
training loop after its first does.
Per way the median of --repeats repeats (min-max) of the slowest rank's ms; grow's extra time
(grow - room) against the floor of its copies: the group's bytes read and written once at the
device copy rate measured here (backend.write_rows of 256 MiB). Memory: the GPU memory in use
(driver) before the step and the most seen while the group grows (in one more growth, not
timed: sampled when the grown members' indexes are made, after the new flat arrays, the moment
both layouts are held, which waits for the device each time), each less what was in use before
the tables were made, against the group's bytes before the growth.
With SOK1X_BENCH_PROFILE=FILE, rank 0 appends a cProfile of each way's step (one more round).
"""
import contextlib
import importlib
import inspect
import os
import sys
import time

import numpy as np

from sok1x.backend import random_init
from sok1x.engine import api
from sok1x.engine.lookup import table_group
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.engine.lookup.pooled import PooledInput

import harness

SPEC = random_init.make_spec("uniform", -0.05, 0.05, seed=5)
HYPER = {"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}  # LazyAdam's
WAYS = ("room", "grow", "grow_copies", "evict", "evict_device", "evict_drop")


def parse_args(argv=None):
    parser = harness.parser(__doc__, out=True, backend=True, repeats=True)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--rows", type=int, default=1 << 18, help="keys a shard holds before")
    parser.add_argument("--new", type=int, default=16384, help="new keys a rank and table")
    parser.add_argument("--ways", default=",".join(WAYS),
                        help="the ways timed, of %s (room, grow and grow_copies always)"
                        % ", ".join(WAYS))
    parser.add_argument("--switch-us", type=float, default=0.0,
                        help="the interpreter's thread switch interval (sys.setswitchinterval) "
                        "in microseconds for the whole run (0: Python's 5 ms): whether the rows "
                        "backed ahead on a helper thread wait for the GIL behind the steps")
    parser.add_argument("--between-ms", type=float, default=0.0,
                        help="host time after each fill step with Python's lock free: the rest "
                        "of a framework's step (its dense layers run in its own threads)")
    return parser.parse_args(argv)


def used_bytes(backend):
    """GPU memory in use on this rank's device (the driver's count; 0 on cpu)."""
    if backend.NAME != "cuda":
        return 0
    import pycuda.driver as driver
    from sok1x.backend.cuda import context as cuda_context
    with cuda_context.entered():
        free, total = driver.mem_get_info()
    return total - free


class Case:
    """One way's tables, filled: names, and the keys (device arrays per table) of its steps."""

    def __init__(self, rt, args, way, repeat, steps=2):
        self.rt, self.args, self.way = rt, args, way
        rows, size, rank = args.rows, rt.size, rt.rank
        self.names = ["grow_%s_%d_%d" % (way, repeat, t) for t in range(args.tables)]
        for name in self.names:
            if way == "evict_device":
                api.drop_evicted(name, False, on_device=True)
            else:
                api.drop_evicted(name, way == "evict_drop")
            if way.startswith("evict"):
                dynamic = make_dynamic("hybrid", rows, rows, "lru")
            else:
                dynamic = make_dynamic("hbm", 2 * rows if way == "room" else rows, 4 * rows)
            api.create_table(name, args.dim, dynamic.max_capacity, True, SPEC, replace=True,
                             dynamic=dynamic)
        upload = rt.backend.asarray
        # keys 0 .. size*rows-1 of each table, a slice per rank: every owner ("mod") gets rows
        self.fill = [upload(np.arange(rank * rows, (rank + 1) * rows, dtype=np.int64))
                     for _ in self.names]
        self.steps = []  # `steps` steps' new keys: after the filled ones, a slice per rank again
        for s in range(steps):
            first = size * rows + s * size * args.new + rank * args.new
            self.steps.append([upload(np.arange(first, first + args.new, dtype=np.int64))
                               for _ in self.names])
        self.tops = {n: upload(np.ones((n, args.dim), np.float32)) for n in (rows, args.new)}
        # the fill in steps as a training loop brings keys: to 3/4 of the rows and --new keys
        # more, then --new keys a step until all are there (a group growing in place maps a
        # member's next rows ahead once it passes 3/4: table_group.HashGroup._back_ahead)
        cuts = list(range(min(rows, 3 * rows // 4 + args.new), rows, args.new)) + [rows]
        view = rt.backend.row_view  # (a GPUArray is sliced inside the device's context)
        self.fills = [[view(keys, start, stop) for keys in self.fill]
                      for start, stop in zip([0] + cuts[:-1], cuts)]
        for part in self.fills:
            count = int(part[0].shape[0])
            self.tops.setdefault(count, upload(np.ones((count, args.dim), np.float32)))

    def fill_up(self):
        """The fill's training steps (every shard then holds exactly --rows keys). The group
        forms in the first (in growth_switch(way), as every step of the case)."""
        for s, keys in enumerate(self.fills):
            self.step(keys, "fill%d" % s)
            time.sleep(self.args.between_ms / 1e3)

    def step(self, keys, op):
        """One training step of the case's tables on `keys` (a device array per table)."""
        count = int(keys[0].shape[0])
        inputs = [PooledInput(k, None, count, None, "sum") for k in keys]
        _, token = api.pooled_lookup(self.names, op + "_fwd", inputs, True)
        grads = api.pooled_lookup_grad(self.names, op + "_bwd", token,
                                       [self.tops[count]] * len(keys))
        api.apply_optimizer_updates(self.names, "lazy_adam", "Adam", {}, HYPER,
                                    [g[0] for g in grads], [g[1] for g in grads])

    def drop(self):
        """Forgets the case's tables (and the lookups' saved state, which holds their rows)."""
        self.rt.stash.clear()
        for name in self.names:
            self.rt.tables.pop(name, None)
            self.rt.pending_tables.pop(name, None)

    def group(self):
        return api.shard(self.names[0]).group

    def group_bytes(self):
        """The bytes of the group's rows held (not those a group growing in place reserved);
        of the table's, for one table alone (not in a group of one: grow_copies)."""
        group = self.group() or api.shard(self.names[0])
        arrays = [group.values, group.times] + list(group.slots.values())
        if group.statistics is not None:
            arrays.append(group.statistics)
        if hasattr(group, "row_starts"):
            held = int(np.sum(getattr(group, "held_rows", np.diff(group.row_starts))))
        else:
            held = group.capacity
        return sum(int(a.nbytes) // int(a.shape[0]) * held for a in arrays)


def read_evicted(case, way, _=None):
    """The reader's part of an evict step: every table's evicted keys and vectors handed to the
    host (api.pop_evicted, as a sok1x.sparse_read_and_evict each step), or as device arrays
    (evict_device: as that op hands them to TensorFlow through sok1x's kernels on a GPU);
    nothing for the other ways."""
    if way == "evict":
        for name in case.names:
            api.pop_evicted(name)
    elif way == "evict_device":
        for name in case.names:
            api.pop_evicted(name, on_device=True)


def timed(rt, run):
    """The slowest rank's ms of run() (synchronised, after a barrier)."""
    harness.barrier()
    start = time.perf_counter()
    run()
    rt.backend.synchronize()
    return harness.job_max((time.perf_counter() - start) * 1e3)


def copy_gbps(backend, nbytes=256 << 20, repeats=5):
    """Device copy rate (bytes read + written per second / 1e9) of backend.write_rows."""
    src = backend.zeros((nbytes // 4,), np.float32)
    dst = backend.zeros((nbytes // 4,), np.float32)
    times = [harness.wall_ms(lambda: backend.write_rows(dst, 0, src), 1, backend.synchronize)
             for _ in range(repeats + 1)][1:]
    return 2 * nbytes / (harness.median(times) * 1e6)


def table_group_env():
    """The switch of growth in place (an older sok1x has none: its name is harmless there)."""
    return getattr(table_group, "GROW_ENV", "SOK1X_GROW_IN_PLACE")


@contextlib.contextmanager
def growth_switch(way):
    """Growth in place switched off for grow_copies, for as long as its tables step: a group
    forms at the first step, but a table alone asks at every lookup whether it is a group of
    one (so the switch must hold through the timed steps too)."""
    name = table_group_env()
    before = os.environ.get(name)
    if way == "grow_copies":
        os.environ[name] = "0"
    try:
        yield
    finally:
        if way == "grow_copies":
            os.environ.pop(name, None)
            if before is not None:
                os.environ[name] = before


def run_case(rt, args, way, repeat, peaks, profile=False):
    """Times one way once from fresh tables (profile: profiles it instead); returns {figure:
    value}."""
    with growth_switch(way):
        return _run_case(rt, args, way, repeat, peaks, profile)


def ahead_jobs(backend, since, until):
    """(jobs, seconds, GiB) of the rows backed ahead by the helper thread in jobs that began
    between perf_counter `since` and `until` (the case's fill, before its timed step), and the
    end of its last such job (cuda's reserved_rows.AHEAD_LOG; none elsewhere)."""
    if backend.NAME != "cuda":
        return 0, 0.0, 0.0, None
    # (the module: the package's attribute of that name is its reserved_rows function)
    reserved_rows = importlib.import_module("sok1x.backend.cuda.reserved_rows")
    log = tuple(getattr(reserved_rows, "AHEAD_LOG", ()))  # (the helper may append meanwhile)
    jobs = [job for job in log if since <= job[0] < until]
    return (len(jobs), sum(end - start for start, end, _ in jobs),
            sum(nbytes for _, _, nbytes in jobs) / 2 ** 30,
            max((end for _, end, _ in jobs), default=None))


def _run_case(rt, args, way, repeat, peaks, profile):
    backend = rt.backend
    harness.release_memory(backend)
    base = used_bytes(backend)
    made_at = time.perf_counter()
    case = Case(rt, args, way, repeat)
    case.fill_up()
    group = case.group()
    assert isinstance(group, table_group.HashGroup) or (args.tables == 1 and group is None), \
        "the tables did not form a hash group"
    capacities = [api.shard(name).capacity for name in case.names]
    before_bytes = case.group_bytes()
    harness.release_memory(backend)
    before = used_bytes(backend) - base
    del peaks[:]
    # members whose next rows the helper thread had not backed yet (HashGroup._back_ahead): the
    # growing step waits for it where the fill's steps outran it
    ahead = getattr(group, "_ahead", None) or {}
    backed, behind = len(ahead), sum(1 for _, future in ahead.values() if not future.done())
    if profile:  # the step itself under cProfile ($SOK1X_BENCH_PROFILE): where its host time goes
        harness.profile_steps(rt, lambda: case.step(case.steps[0], "first"),
                              backend.synchronize, "%s, %d rank(s)" % (way, rt.size), steps=1)
        ms = float("nan")
    else:
        step_at = time.perf_counter()
        ms = timed(rt, lambda: read_evicted(case, way, case.step(case.steps[0], "first")))
    grown = [api.shard(name).capacity for name in case.names]
    result = {"ms": ms, "group_bytes_before": before_bytes, "used_before": before,
              "backed_ahead": backed, "ahead_behind": harness.job_max(behind),
              "in_place": bool(getattr(group, "reserved", False)),
              "grew": harness.job_max(any(g > c for g, c in zip(grown, capacities))),
              "evicting_members": harness.job_max(sum(api.shard(n).evicted_keys > 0
                                                          for n in case.names))}
    if not profile:  # the helper's jobs of the fill: their time, how far into the step it ran
        jobs, busy, gib, last = ahead_jobs(backend, made_at, step_at)
        result.update({"ahead_jobs": jobs, "ahead_ms": 1e3 * busy, "ahead_gib": gib,
                       "ahead_into_step_ms": float("nan") if last is None
                       else 1e3 * (last - step_at)})
    if peaks:
        result["peak_used"] = harness.job_max(max(peaks) - base)
    if not profile:  # the next step, warm: the group's memory pool holds what a step takes
        result["second_ms"] = timed(rt, lambda: read_evicted(
            case, way, case.step(case.steps[1], "second")))
    case.drop()
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.switch_us:
        sys.setswitchinterval(args.switch_us / 1e6)
    rt = harness.start_engine(args.backend)
    backend = rt.backend
    peaks = []
    name = "rebuilt_indexes" if hasattr(table_group, "rebuilt_indexes") else "rebuilt_index"
    made = getattr(table_group, name)

    def sampled(*a, **k):  # the grown members' indexes: both layouts of the group held now
        indexes = made(*a, **k)
        backend.synchronize()
        peaks.append(used_bytes(backend))
        return indexes
    gbps = copy_gbps(backend)
    asked = {way for way in args.ways.split(",") if way} | {"room", "grow", "grow_copies"}
    if asked - set(WAYS):
        raise SystemExit("--ways: no way %s (the ways: %s)"
                         % (", ".join(sorted(asked - set(WAYS))), ", ".join(WAYS)))
    ways = tuple(way for way in WAYS if way in asked)
    if "on_device" not in inspect.signature(api.drop_evicted).parameters:  # an older sok1x
        ways = tuple(way for way in ways if way != "evict_device")
        harness.say("this sok1x's pop_evicted has no device reader: evict_device left out")
    results = {way: [] for way in ways}
    for repeat in range(args.repeats + 1):  # the first round warms up (kernels compile)
        for way in ways:
            result = run_case(rt, args, way, repeat, peaks)
            if repeat:
                results[way].append(result)
    # The memory a growth holds at its peak, in a growth of its own: sampling it waits for the
    # device at every member's new index, which the timed steps above must not do.
    setattr(table_group, name, sampled)
    peak = run_case(rt, args, "grow", args.repeats + 1, peaks).get("peak_used", 0)
    setattr(table_group, name, made)
    if os.environ.get("SOK1X_BENCH_PROFILE"):
        for way in ways:
            run_case(rt, args, way, args.repeats + 2, peaks, profile=True)
    out = {"environment": harness.environment({"ranks": rt.size, "backend": args.backend}),
           "args": vars(args), "copy_gbps": gbps, "ways": {}}
    for way, runs in results.items():
        entry = harness.summary([r["ms"] for r in runs])
        for key in ("second_ms", "peak_used", "used_before", "group_bytes_before", "grew",
                    "evicting_members", "in_place", "backed_ahead", "ahead_behind",
                    "ahead_jobs", "ahead_ms", "ahead_gib", "ahead_into_step_ms"):
            if all(key in r for r in runs):
                entry[key] = harness.median([r[key] for r in runs])
        out["ways"][way] = entry
        harness.say("%-5s %d rank(s): %.3f ms (min %.3f, max %.3f)%s" % (
            way, rt.size, entry["median_ms"], entry["min_ms"], entry["max_ms"],
            "" if "second_ms" not in entry else ", next step %.3f ms" % entry["second_ms"]))
    grow, room = out["ways"]["grow"], out["ways"]["room"]
    grow["peak_used"] = peak
    group_bytes = grow["group_bytes_before"]
    floor_ms = 2 * group_bytes / (gbps * 1e6)  # every byte of the group read and written once
    extra = grow["median_ms"] - room["median_ms"]
    copies = out["ways"]["grow_copies"]
    out["growth"] = {"extra_ms": extra, "floor_ms": floor_ms,
                     "over_room": grow["median_ms"] / room["median_ms"],
                     "copies_over_room": copies["median_ms"] / room["median_ms"],
                     "floor_share": floor_ms / extra if extra > 0 else None,
                     "group_gib": group_bytes / 2 ** 30,
                     "peak_over_group": (grow.get("peak_used", 0) - grow["used_before"])
                     / group_bytes if group_bytes else None}
    harness.say("growth: %.3f ms more than a step with room; the copy floor %.3f ms (%.0f%% of "
                "the extra) for %.2f GiB at %.0f GB/s; peak memory added while growing %.2fx "
                "the group's bytes" % (extra, floor_ms, 100 * out["growth"]["floor_share"] if
                                       out["growth"]["floor_share"] else 0,
                                       out["growth"]["group_gib"], gbps,
                                       out["growth"]["peak_over_group"] or 0))
    harness.say("a doubling step / a step with room: %.2fx in place (%s), %.2fx by copies; "
                "members backed ahead %s, of them not done when the step began %s; the "
                "helper's %s jobs took %.1f ms for %.2f GiB, its last ending %.1f ms into the "
                "step" % (out["growth"]["over_room"], grow.get("in_place"),
                          out["growth"]["copies_over_room"], grow.get("backed_ahead"),
                          grow.get("ahead_behind"), grow.get("ahead_jobs", 0),
                          grow.get("ahead_ms", 0.0), grow.get("ahead_gib", 0.0),
                          grow.get("ahead_into_step_ms", float("nan"))))
    harness.write_json(args.out, out)
    harness.finish()


if __name__ == "__main__":
    main()
