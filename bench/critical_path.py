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
import functools
import os
import sys
import time

import numpy as np

from sok1x.engine import api
from sok1x.engine.lookup import bounded_step, table_group

import harness
import step_calls

MARKS = ("wake", "counts", "backward", "update_start", "update_end", "forward_start", "ready",
         "arm", "launch")


def parse_args(argv):
    parser = harness.parser(__doc__, out={"required": False, "default": None}, backend=True,
                            scale=True, steps=50, repeats=5)
    parser.add_argument("--workloads", default="dlrm26_full,dlrm26")
    return parser.parse_args(argv)


class Stamps:
    """The host clock at each mark of the step being run ({mark: seconds}), a list per step."""

    def __init__(self):
        self.steps = []
        self.on = False

    def mark(self, name):
        if self.on:
            self.steps[-1][name] = time.perf_counter()

    def new_step(self):
        self.steps.append({})


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


def stamp_all(rt, stamps):
    """Wraps what the marks stamp; returns a function undoing it all."""
    undo = [
        _wrap_counts_read(stamps),
        # a step without counts wakes when its checks are read (the flag's wait)
        _wrap(bounded_step, "raise_if_set", stamps, after="checks"),
        _wrap(api, "keyed_lookup_grad", stamps, after="backward"),
        _wrap(api, "apply_keyed_update", stamps, before="update_start", after="update_end"),
        _wrap(api, "keyed_lookup", stamps, before="forward_start"),
        _wrap(table_group.ReplayedInsert, "ready", stamps, after="ready"),
        _wrap(table_group.ReplayedInsert, "arm", stamps, after="arm"),
        _wrap_forward_works(rt, stamps),
    ]
    return lambda: [u() for u in reversed(undo)]


def gaps(steps):
    """{segment: [microseconds]} between consecutive marks, from one step's wake to the next
    step's launch (a step without "wake" wakes at its last "checks")."""
    found = {}
    for this, following in zip(steps[:-1], steps[1:]):
        wake = this.get("wake", this.get("checks"))
        times = [("wake", wake)] + [(m, this.get(m)) for m in MARKS[1:5]] + [
            (m, following.get(m)) for m in MARKS[5:]]
        times = [(m, t) for m, t in times if t is not None]
        if wake is None or times[-1][0] != "launch":
            continue
        for (m0, t0), (m1, t1) in zip(times[:-1], times[1:]):
            found.setdefault("%s->%s" % (m0, m1), []).append((t1 - t0) * 1e6)
        found.setdefault("path_us", []).append((times[-1][1] - wake) * 1e6)
    return found


def measure(rt, case, steps, repeats):
    """({segment: median us}, [step ms per repeat]) of `case` (step_calls.Case)."""
    stamps = Stamps()
    for _ in range(step_calls.WARMUP_STEPS * 10):
        case.run()
    undo = stamp_all(rt, stamps)
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
        medians, step_ms = measure(rt, case, args.steps, args.repeats)
        result["workloads"][name] = dict(segments_us=medians, **harness.summary(
            step_ms, ("step_ms", "step_ms_min", "step_ms_max", "step_ms_repeats")))
        harness.say("%s: step %.3f ms (%.3f-%.3f), host path wake -> next launch %.0f us" % (
            name, np.median(step_ms), min(step_ms), max(step_ms), medians.get("path_us", -1)))
        for segment, us in medians.items():
            if segment != "path_us":
                harness.say("  %-28s %7.1f us" % (segment, us))
        del case
        harness.release_memory(rt.backend)
    if args.out:
        harness.write_json(args.out, result)


if __name__ == "__main__":
    main(sys.argv[1:])
