"""Where a replayed step's host time goes between the wake from its one wait and the next
forward's launch: the host's critical path, the part of a step the GPU waits for whenever it
exceeds the GPU work still queued at the wake (the backward's and the update's).

    python bench/critical_path.py --workloads dlrm26_full,dlrm26 --steps 50
    python bench/critical_path.py --backend cpu --scale 64      # the same on cpu (no GPU)

Per workload (workloads.py, framework_step.py's sok1x_replayed step through step_calls.Case),
after warm-up steps, each step's host is stamped at: the wake (the forward's checks or, in an
evicting group, its counts read: ReplayedInsert._read_counts' read returns), the counts handed
over, the backward's return, the update's start and end, the next forward's start, its hooks'
ready() and arm() ends, and its recorded work's replay. The stamps' gaps (medians over the
steps of all repeats, microseconds) say which part of the path costs what; `path_us` is the
wake to the next forward's launch, `step_ms` the wall ms a step of the same steps (synchronized
at the end of each repeat). The stamps are the bench's own wrappers around engine functions,
each a few hundred nanoseconds.
"""
import collections
import functools
import importlib
import os
import sys
import time

import numpy as np

from sok1x.engine import api
from sok1x.engine.lookup import bounded_step, replayed_step, table_group

import harness
import step_calls

def parse_args(argv):
    parser = harness.parser(__doc__, out={"required": False, "default": None}, backend=True,
                            scale=True, steps=50, repeats=5)
    parser.add_argument("--workloads", default="dlrm26_full,dlrm26")
    parser.add_argument("--marks", default=os.environ.get("SOK1X_CRITICAL_MARKS", ""),
                        help="more functions stamped on entry (NAME<) and return (NAME>), "
                             "comma-separated module:attribute paths, e.g. "
                             "sok1x.engine.lookup.table_group:ReplayedInsert._read_counts")
    return parser.parse_args(argv)


class Stamps:
    """The host clock at each mark of the steps run: a list of (mark, seconds) per step."""

    def __init__(self):
        self.steps = []
        self.on = False

    def mark(self, name):
        if self.on:
            self.steps[-1].append((name, time.perf_counter()))

    def new_step(self):
        self.steps.append([])


def _wrap(owner, name, stamps, before=None, after=None):
    """Replaces owner.name by a wrapper stamping `before` on entry and `after` on return;
    returns a function that puts the original back."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if before:
            stamps.mark(before)
        result = original(*args, **kwargs)
        if after:
            stamps.mark(after)
        return result
    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def _wrap_counts_read(stamps):
    """Stamps "wake" when an evicting group's counts' read returns (inside _read_counts) and
    "counts" when _read_counts does."""
    original = table_group.ReplayedInsert._read_counts

    def read_counts(self):
        counted = self._counted
        read = counted[3]
        if read is not None:
            def stamped():
                host = read()
                stamps.mark("wake")
                return host
            counted[3] = stamped
        result = original(self)
        stamps.mark("counts")
        return result
    table_group.ReplayedInsert._read_counts = read_counts
    return lambda: setattr(table_group.ReplayedInsert, "_read_counts", original)


def _wrap_forward_works(rt, stamps):
    """Stamps "launch" when a recorded forward replays; returns the undo."""
    undo = []
    for entry in rt.replays.forwards.values():
        work = entry.work
        if work is None:
            continue
        original = work.replay

        def replay(original=original):
            stamps.mark("launch")
            return original()
        work.replay = replay
        undo.append(lambda work=work: delattr(work, "replay"))
    return lambda: [u() for u in undo]


def _wrap_named(path, stamps):
    """_wrap of "module:Owner.attribute" (or "module:function"), stamped NAME< and NAME>."""
    module, _, attribute = path.partition(":")
    owner = importlib.import_module(module)
    *parents, name = attribute.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return _wrap(owner, name, stamps, before=name + "<", after=name + ">")


def _wrap_works(rt, stamps):
    """Stamps "replay<" and "replay>" around every recorded work's replay but the forwards'."""
    forwards = {id(entry.work) for entry in rt.replays.forwards.values()}
    undo = []
    for step in replayed_step.recorded_works(rt):
        for work in step:
            if id(work) in forwards or "replay" in vars(work):
                continue
            original = work.replay

            def replay(original=original):
                stamps.mark("replay<")
                result = original()
                stamps.mark("replay>")
                return result
            work.replay = replay
            undo.append(lambda work=work: delattr(work, "replay"))
    return lambda: [u() for u in undo]


def stamp_all(rt, stamps, marks=()):
    """Wraps what the marks stamp (and the functions named in `marks`); returns a function
    undoing it all."""
    undo = [_wrap_named(path, stamps) for path in marks] + [
        _wrap_counts_read(stamps),
        # a step without counts wakes when its checks are read (the flag's wait)
        _wrap(bounded_step, "raise_if_set", stamps, after="checks"),
        _wrap(api, "keyed_lookup_grad", stamps, after="backward"),
        _wrap(api, "apply_keyed_update", stamps, before="update_start", after="update_end"),
        _wrap(api, "keyed_lookup", stamps, before="forward_start"),
        _wrap(table_group.ReplayedInsert, "ready", stamps, after="ready"),
        _wrap(table_group.ReplayedInsert, "arm", stamps, after="arm"),
        _wrap_forward_works(rt, stamps),
        _wrap_works(rt, stamps),
    ]
    return lambda: [u() for u in reversed(undo)]


def gaps(steps):
    """{segment: [microseconds]} between consecutive marks from one step's wake (its counts'
    read, else its last checks' read) to the next step's first launch, numbered in their order,
    over the steps whose marks come in the most common order; "path_us": the whole path."""
    paths = []
    for this, following in zip(steps[:-1], steps[1:]):
        woke = [i for i, (m, _) in enumerate(this) if m == "wake"] or [
            i for i, (m, _) in enumerate(this) if m == "checks"]
        launch = [i for i, (m, _) in enumerate(following) if m == "launch"]
        if woke and launch:
            paths.append(this[woke[-1]:] + following[:launch[0] + 1])
    if not paths:
        return {}
    orders = collections.Counter(tuple(m for m, _ in path) for path in paths)
    common = orders.most_common(1)[0][0]
    found = {}
    for path in paths:
        if tuple(m for m, _ in path) != common:
            continue
        for i, ((m0, t0), (m1, t1)) in enumerate(zip(path[:-1], path[1:])):
            found.setdefault("%02d %s->%s" % (i, m0, m1), []).append((t1 - t0) * 1e6)
        found.setdefault("path_us", []).append((path[-1][1] - path[0][1]) * 1e6)
    return found


def measure(rt, case, steps, repeats, marks=()):
    """({segment: median us}, [step ms per repeat]) of `case` (step_calls.Case); marks: more
    functions stamped (stamp_all)."""
    stamps = Stamps()
    for _ in range(step_calls.WARMUP_STEPS * 10):
        case.run()
    undo = stamp_all(rt, stamps, marks)
    step_ms = []
    try:
        stamps.on = True
        for _ in range(repeats):
            rt.backend.synchronize()
            started = time.perf_counter()
            for _ in range(steps):
                stamps.new_step()
                case.run()
            rt.backend.synchronize()
            step_ms.append((time.perf_counter() - started) * 1e3 / steps)
    finally:
        stamps.on = False
        undo()
    found = gaps(stamps.steps)
    return {k: float(np.median(v)) for k, v in found.items()}, step_ms


def main(argv=None):
    args = parse_args(argv)
    os.environ[bounded_step.ENV] = "1"
    rt = harness.start_engine(args.backend)
    result = {"backend": args.backend, "scale": args.scale, "steps": args.steps,
              "repeats": args.repeats, "workloads": {},
              "environment": harness.environment({"load": os.getloadavg()})}
    for name in args.workloads.split(","):
        case = step_calls.Case(rt, name, args.scale, replayed=True)
        marks = [m for m in args.marks.split(",") if m]
        medians, step_ms = measure(rt, case, args.steps, args.repeats, marks)
        result["workloads"][name] = dict(segments_us=medians, **harness.summary(
            step_ms, ("step_ms", "step_ms_min", "step_ms_max", "step_ms_repeats")))
        harness.say("%s: step %.3f ms (%.3f-%.3f), host path wake -> next launch %.0f us" % (
            name, np.median(step_ms), min(step_ms), max(step_ms), medians.get("path_us", -1)))
        for segment, us in sorted(medians.items()):
            if segment != "path_us":
                harness.say("  %-28s %7.1f us" % (segment, us))
        del case
        harness.release_memory(rt.backend)
    if args.out:
        harness.write_json(args.out, result)


if __name__ == "__main__":
    main(sys.argv[1:])
