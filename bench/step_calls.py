"""The engine step's Python calls per step, for one table (dlrm) against the same keys in 26
tables (dlrm26), where issue 17 wants 26 tables to cost what one costs on a host-bound GPU path.

    python bench/step_calls.py --out results/step_calls.json     # cpu backend, one process
    python bench/step_calls.py --workloads dlrm,dlrm26 --scale 64 --steps 20
    python bench/step_calls.py --hashed      # the same as v1 hash tables (dlrm26: a hash group)
    python bench/step_calls.py --backend cuda --workloads dlrm --scale 1 --replayed \
        --stats results/replayed.txt         # the replayed step's host work (one rank)

Per workload (workloads.py), framework_step.py's sok1x_device step (sok_steps.EngineStep:
forward lookup, backward, LazyAdam update through engine/api.py, dense for one table, keyed for
several) at a reduced scale, after warm-up steps: a cProfile of --steps steps gives the Python
function calls per step (pstats' count, C functions included) and their split by module; then
--repeats repeats of --steps steps give the wall and process-CPU ms per step (median, min, max),
the workloads interleaved in each repeat. The engine's Python is the same on cpu and cuda, so
the call counts say what grows with the tables on either; the cpu times do not stand for a GPU's.
With --replayed, each workload is timed once more with its recorded works not launched (host_us:
the wall microseconds of the host's own work around the graphs a step, copies, fills and driver
calls included, none of it waiting for a GPU busy with earlier steps).
"""
import contextlib
import cProfile
import os
import pstats
import sys
import time

import numpy as np

from sok1x.backend import random_init
from sok1x.engine import runtime
from sok1x.engine.lookup import bounded_step, replayed_step

import harness
import sok_steps
import workloads

SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=5)
WARMUP_STEPS = 3


def parse_args(argv):
    parser = harness.parser(__doc__, out={"required": False, "default": None},
                            backend={"default": "cpu"}, scale=64, steps=20, repeats=5)
    parser.add_argument("--workloads", default="dlrm,dlrm26")
    parser.add_argument("--features", type=int, default=26,
                        help="dlrm's features (dlrm26's tables): do the calls grow with them?")
    parser.add_argument("--segment-ids", action="store_true",
                        help="dlrm26's keys with segment ids (sum pooling of one key per "
                             "sample), not each key its own output row")
    parser.add_argument("--hashed", action="store_true",
                        help="the tables as v1 hash tables (use_hashtable): dlrm26's are then "
                             "one hash group")
    parser.add_argument("--replayed", action="store_true",
                        help="workloads as framework_step.py's sok1x_replayed: the "
                             "bounded step (SOK1X_BOUNDED_STEP=1) with replay=True, so what is "
                             "profiled is the host's work around the replayed graphs")
    parser.add_argument("--top", type=int, default=15,
                        help="functions listed whose calls per step differ most")
    parser.add_argument("--stats", default=None,
                        help="FILE: rank 0 writes each workload's cProfile there, its functions "
                             "by own time and by cumulative time (where the host time goes)")
    return parser.parse_args(argv)


def module_of(filename, function):
    """The module a profiled function belongs to: sok1x's and bench's by their dotted name,
    other packages by their top name, C functions as "(C) numpy" or "(C) builtins"."""
    if filename == "~":
        return "(C) numpy" if "numpy" in function else "(C) builtins"
    path = filename.replace(os.sep, "/")
    for root in ("sok1x/", "bench/"):
        if "/" + root in path:
            inner = path.rsplit("/" + root, 1)[1]
            return (root + inner[:-len(".py")]).replace("/", ".")
    if "-packages/" in path:
        return path.rsplit("-packages/", 1)[1].split("/")[0].replace(".py", "")
    folder, name = os.path.split(path)
    return "stdlib " + (os.path.basename(folder) if name == "__init__.py" else name[:-3])


def write_stats(path, profiles, steps, top=45):
    """Writes each workload's cProfile (`profiles`: {name: cProfile}) to `path` as text: the
    functions by own time, then by cumulative time, `top` of each; and each raw, for pstats, to
    `path`.<workload>.prof."""
    import io
    with open(path, "w") as out:
        for name, profile in profiles.items():
            profile.dump_stats("%s.%s.prof" % (path, name))
            text = io.StringIO()
            stats = pstats.Stats(profile, stream=text).strip_dirs()
            for order in ("tottime", "cumulative"):
                stats.sort_stats(order).print_stats(top)
            out.write("== %s, %d steps ==\n%s\n" % (name, steps, text.getvalue()))


def calls_per_step(profile, steps):
    """({module: calls per step}, {function label: calls per step}) of a cProfile."""
    modules, functions = {}, {}
    for (filename, line, function), (_, calls, _, _, _) in pstats.Stats(profile).stats.items():
        module = module_of(filename, function)
        label = function if filename == "~" else "%s:%d(%s)" % (
            filename.replace(os.sep, "/").rsplit("-packages/", 1)[-1], line, function)
        modules[module] = modules.get(module, 0.0) + calls / steps
        functions[label] = functions.get(label, 0.0) + calls / steps
    return modules, functions


class Case:
    """One workload's tables, batches and step (sok_steps.EngineStep on engine arrays)."""

    def __init__(self, rt, name, scale, features=26, segment_ids=False, hashed=False,
                 replayed=False):
        w = workloads.workload(name, rt.size, scale)
        if w.name in ("dlrm", "dlrm26", "dlrm26_hash") and features != w.slots:
            w = w._replace(slots=features, tables=w.tables and (w.vocab,) * features,
                           hotness=w.hotness and (1,) * features)
        self.w = w = w._replace(hashed=w.hashed or hashed)
        self.names = sok_steps.make_tables(rt, w, SPEC)
        self.step = sok_steps.EngineStep(rt, w, self.names, segment_ids)
        self.step.replay = replayed
        if w.tables is None:
            keys = workloads.Batches(w, rt.rank, rt.size).keys
        else:  # the batch as one keyed array, table after table
            keys = [np.concatenate(batch) for batch in workloads.table_batches(w, rt.rank,
                                                                              rt.size)]
        with runtime.entered():
            self.keys = [[rt.backend.asarray(k)] for k in keys]
        self.run = harness.Steps(lambda s: self.step.device(self.keys[s % len(self.keys)]))

    def profile(self, steps):
        """cProfile of `steps` steps (after warm-up)."""
        for _ in range(WARMUP_STEPS):
            self.run()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            self.run()
        profiler.disable()
        return profiler

    def time_ms(self, steps, synchronize):
        """(wall, process CPU) ms per step over `steps` steps."""
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.run()
        synchronize()
        return ((time.perf_counter() - wall) * 1e3 / steps,
                (time.process_time() - cpu) * 1e3 / steps)

    def host_us(self, rt, steps):
        """Wall microseconds per step of `steps` steps with the runtime's recorded works not
        launched (works_held_back): the host's own work of a replayed step."""
        with works_held_back(rt):
            started = time.perf_counter()
            for _ in range(steps):
                self.run()
            return (time.perf_counter() - started) * 1e6 / steps


@contextlib.contextmanager
def works_held_back(rt):
    """Inside, the runtime's recorded works (those recorded so far) are not launched: their
    replay() does nothing, so a replayed step's time is its host's own work. The GPU is
    synchronized on entry and exit."""
    works = [w for step in replayed_step.recorded_works(rt) for w in step]
    for work in works:
        work.replay = _not_launched
    try:
        rt.backend.synchronize()
        yield
    finally:
        for work in works:
            del work.replay
        rt.backend.synchronize()


def _not_launched():
    return None


def report(names, calls, top):
    """Lines comparing the workloads' calls per step: totals, modules, the functions whose
    counts differ most between the first workload and the last."""
    first, last = names[0], names[-1]
    lines = ["calls per step: " + ", ".join("%s %.0f" % (n, sum(calls[n][0].values()))
                                            for n in names)]
    for part, title in ((0, "module"), (1, "function")):
        keys = set().union(*[calls[n][part] for n in names])
        rows = sorted(keys, key=lambda k: -abs(calls[last][part].get(k, 0) -
                                               calls[first][part].get(k, 0)))
        lines.append("%-60s " % title + " ".join("%9s" % n for n in names) + "  difference")
        for key in rows[:top if part else len(rows)]:
            counts = [calls[n][part].get(key, 0.0) for n in names]
            if part and counts[-1] == counts[0]:
                continue
            lines.append("%-60s " % key[-60:] + " ".join("%9.1f" % c for c in counts)
                         + "  %+9.1f" % (counts[-1] - counts[0]))
    return lines


def main(argv):
    args = parse_args(argv)
    if args.replayed:
        os.environ[bounded_step.ENV] = "1"
    rt = harness.start_engine(args.backend)
    names = args.workloads.split(",")
    cases = {name: Case(rt, name, args.scale, args.features, args.segment_ids, args.hashed,
                        args.replayed)
             for name in names}
    profiles = {name: cases[name].profile(args.steps) for name in names}
    calls = {name: calls_per_step(profiles[name], args.steps) for name in names}
    if args.stats and rt.rank == 0:
        write_stats(args.stats, profiles, args.steps)
    for line in report(names, calls, args.top):
        harness.say(line)
    times = {name: [] for name in names}
    for name in names:
        cases[name].time_ms(WARMUP_STEPS, rt.backend.synchronize)
    for _ in range(args.repeats):
        for name in names:
            harness.barrier()
            times[name].append(cases[name].time_ms(args.steps, rt.backend.synchronize))
    result = {"ranks": rt.size, "backend": args.backend, "scale": args.scale,
              "features": args.features, "segment_ids": args.segment_ids,
              "hashed": args.hashed, "replayed": args.replayed,
              "steps_per_repeat": args.steps, "repeats": args.repeats, "workloads": {},
              "environment": harness.environment({"load": os.getloadavg()})}
    host = {name: [] for name in names}
    if args.replayed:
        for _ in range(args.repeats):
            for name in names:
                harness.barrier()
                host[name].append(harness.job_max(cases[name].host_us(rt, args.steps)))
    for name in names:
        wall = [harness.job_max(t[0]) for t in times[name]]
        cpu = [harness.job_max(t[1]) for t in times[name]]
        entry = {"tables": len(cases[name].names),
                 "keys_per_rank": int(cases[name].keys[0][0].size),
                 "calls_per_step": sum(calls[name][0].values()),
                 "calls_per_step_by_module": calls[name][0]}
        entry.update(harness.summary(wall, ("wall_ms", "wall_ms_min", "wall_ms_max",
                                            "wall_ms_repeats")))
        entry.update(harness.summary(cpu, ("cpu_ms", "cpu_ms_min", "cpu_ms_max",
                                           "cpu_ms_repeats")))
        if host[name]:
            entry.update(harness.summary(host[name], ("host_us", "host_us_min", "host_us_max",
                                                      "host_us_repeats")))
            harness.say("%-7s host_us (recorded works not launched) %.0f (%.0f-%.0f)" % (
                name, entry["host_us"], entry["host_us_min"], entry["host_us_max"]))
        result["workloads"][name] = entry
        harness.say("%-7s %2d tables: %6.0f calls/step, wall %.3f ms/step (%.3f-%.3f), "
                    "cpu %.3f ms/step (%.3f-%.3f)" % (
                        name, entry["tables"], entry["calls_per_step"], entry["wall_ms"],
                        entry["wall_ms_min"], entry["wall_ms_max"], entry["cpu_ms"],
                        entry["cpu_ms_min"], entry["cpu_ms_max"]))
    if args.out:
        harness.write_json(args.out, result)
    harness.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
