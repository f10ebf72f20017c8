"""A replayed step's own host work: the step with its recorded works not launched, timed in one
process, so that no wait on the GPU and no launch blocked behind it counts.

    python bench/host_work.py --backend cuda --workloads dlrm26_hash --out hw.json
    python bench/host_work.py --backend cpu --scale 64 --workloads dlrm26_hybrid --profile 300
    python bench/host_work.py --summarize before_*.json after_*.json     # an A/B's processes

Per workload (workloads.py; step_calls.Case: framework_step.py's sok1x_replayed on engine arrays,
one rank), after --warmup steps: --repeats repeats of --steps steps, each timed by the wall clock
(host_us a step; the median and the min-max are printed and written). One process gives steady
repeats, while the processes of one tree can differ 1.5-2x on the GPU hosts (2026-11-29, one
H200: 199-406 us for the same dlrm26_hash step in seven processes pinned to one core), so an A/B
needs many processes a tree, interleaved: bench/pass.sh's host-ab stage runs them and
--summarize compares them as distributions. --profile N adds a cProfile of N steps: own and
cumulative microseconds a step per function (under the profiler), and the Python calls a step.
"""
import cProfile
import json
import os
import pstats
import sys
import time

import harness
import step_calls
from sok1x.engine.lookup import bounded_step


def parse_args(argv):
    parser = harness.parser(__doc__, out={"required": False, "default": None},
                            backend={"default": "cuda"}, scale=1, steps=300, repeats=7)
    parser.add_argument("--workloads", default="dlrm26_hash")
    parser.add_argument("--warmup", type=int, default=40,
                        help="steps before the works are held back (an evicting class is "
                             "recorded after its first steps)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also a cProfile of N steps")
    parser.add_argument("--tree", default="",
                        help="a label written with the figures (pass.sh: before / after)")
    parser.add_argument("--summarize", nargs="*", default=None, metavar="JSON",
                        help="compare the JSON files of several processes and exit")
    return parser.parse_args(argv)


def measure(rt, name, args):
    """{"host_us": [a step, each repeat], "median", "min", "max"[, "calls", "profile"]} of one
    workload's replayed step with its recorded works held back."""
    case = step_calls.Case(rt, name, args.scale, replayed=True)
    for _ in range(args.warmup):
        case.run()
    with step_calls.works_held_back(rt):
        for _ in range(5):
            case.run()
        repeats = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            for _ in range(args.steps):
                case.run()
            repeats.append((time.perf_counter() - started) * 1e6 / args.steps)
        ordered = sorted(repeats)
        got = {"host_us": repeats, "median": ordered[len(ordered) // 2],
               "min": ordered[0], "max": ordered[-1]}
        if args.profile:
            got.update(_profiled(case, args.profile))
        return got


def _profiled(case, steps):
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        case.run()
    profiler.disable()
    stats = pstats.Stats(profiler).stats

    def label(key):
        path, line, function = key
        return "%s:%d(%s)" % (path.rsplit("/sok1x/", 1)[-1].rsplit("/bench/", 1)[-1], line,
                              function)

    rows = [(label(key), calls / steps, own * 1e6 / steps, cumulative * 1e6 / steps)
            for key, (_, calls, own, cumulative, _) in stats.items()]
    return {"calls": sum(row[1] for row in rows),
            "profile": sorted(rows, key=lambda row: -row[2])[:60]}


def summarize(paths):
    """Lines comparing the processes of JSON files (each host_work.py's --out, --tree set):
    per workload and tree, each process's median in file order, the median of those and their
    range, and in how many rounds (the n-th file of each tree) after ran faster."""
    by, paced = {}, {}
    for path in paths:
        with open(path) as handle:
            got = json.load(handle)
        for name, figures in got["workloads"].items():
            by.setdefault(name, {}).setdefault(got.get("tree", ""), []).append(figures["median"])
            if "pace_us" in figures:
                paced.setdefault(name, {}).setdefault(got.get("tree", ""), []).append(
                    figures["median"] / figures["pace_us"] * 1e3)
    lines = []
    for name, trees in by.items():
        for tree, medians in trees.items():
            ordered = sorted(medians)
            lines.append("%s %-7s processes %s; median %.1f (%.1f-%.1f) us a step" % (
                name, tree, ", ".join("%.0f" % m for m in medians),
                ordered[len(ordered) // 2], ordered[0], ordered[-1]))
            ratios = sorted(paced.get(name, {}).get(tree, []))
            if len(ratios) == len(medians):  # per 1000 us of the host's pace
                lines.append("%s %-7s per 1000 us of the host's pace: %s; median %.2f "
                             "(%.2f-%.2f)" % (name, tree, ", ".join(
                                 "%.2f" % r for r in paced[name][tree]),
                                 ratios[len(ratios) // 2], ratios[0], ratios[-1]))
        if "before" in trees and "after" in trees:
            pairs = list(zip(trees["before"], trees["after"]))
            faster = sum(after < before for before, after in pairs)
            lines.append("%s after faster in %d of %d rounds" % (name, faster, len(pairs)))
    return lines


def main(argv):
    args = parse_args(argv)
    if args.summarize is not None:
        print("\n".join(summarize(args.summarize)))
        return
    os.environ[bounded_step.ENV] = "1"
    rt = harness.start_engine(args.backend)
    result = {"backend": args.backend, "scale": args.scale, "steps": args.steps,
              "repeats": args.repeats, "tree": args.tree, "workloads": {}}
    for name in args.workloads.split(","):
        got = result["workloads"][name] = measure(rt, name, args)
        # the host's pace right after, as a yardstick between processes (harness.host_pace_us)
        got["pace_us"] = harness.host_pace_us()
        print("%s %s host_us median of %d x %d steps: %.1f (%.1f-%.1f); the host's pace %.0f us"
              % (args.tree, name, args.repeats, args.steps, got["median"], got["min"],
                 got["max"], got["pace_us"]))
        if args.profile:
            print("%s calls a step %.1f; own us a step (profiled), calls, cumulative us:"
                  % (name, got["calls"]))
            for label, calls, own, cumulative in got["profile"][:40]:
                print("  %8.2f %7.1f %9.2f %s" % (own, calls, cumulative, label))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
