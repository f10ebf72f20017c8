"""What one CUDA driver call costs the host on this machine, and how many a replayed step makes:
the floor under a replayed step's host time that no Python trimming moves.

    python bench/driver_calls.py --out dc.json --workloads ""        # part 1 alone, one GPU
    python bench/driver_calls.py --out dc_dlrm.json --workloads dlrm --costs dc.json

Part 1, each call alone (the engine's own way of making it, on the sok1x stream, inside the
context; --calls calls a repeat, median of --repeats with min-max, microseconds a call): a kernel
launch (a one-element fill, kernel_launch.launch), a 64-byte device copy, a 64-byte copy to
page-locked memory with its event recorded (staging's small read), the query of a done event, a
graph launch (CapturedGraph.replay of one fill), the context pushed and popped (an outermost
cuda_context.entered()), and as baselines an empty Python call and an empty ctypes call.
The GPU is synchronized every 256 queued calls, so that no call waits for a full queue.

Part 2, per workload (step_calls.Case: framework_step.py's sok1x_replayed on engine arrays, one
rank): the driver calls a replayed step makes, counted by wrapping the PyCUDA entry points the
cuda backend calls (copies, event records, queries and waits, stream waits, context pushes and
pops), CapturedGraph.replay (graph launches) and kernel_launch's own count of launches, over
--steps steps after --warmup (ctypes calls other than a graph's launch, stream_orders' event
records and waits among them, are not counted: the replayed step here makes none); the step's
host microseconds with its recorded works held back (host_work.py's figure); and the host's
pace (harness.host_pace_us). Copies to the device are counted, not costed (part 1 has none).
One GPU holds one workload's tables at a time: run a process a workload, each taking part 1's
costs from its --out (--costs), as pass.sh's driver-calls stage does. Their product with part
1's costs says how much of that host time the driver takes. On the GPU hosts here (gVisor:
every driver call is a trip through its sentry) this is not small.
"""
import ctypes
import functools
import inspect
import json
import os
import sys
import time

import numpy as np

import harness
import step_calls
from sok1x.engine.lookup import bounded_step


def parse_args(argv):
    parser = harness.parser(__doc__, out={"required": False, "default": None}, repeats=7,
                            steps=200, scale=1)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--workloads", default="dlrm,dlrm26,dlrm26_hash,dlrm26_hybrid")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--costs", default=None, metavar="JSON",
                        help="take part 1's costs from this earlier --out (part 1 is not run): "
                             "one GPU holds one workload's tables at a time, so part 2 runs a "
                             "process a workload")
    return parser.parse_args(argv)


def _timed_us(call, calls, repeats, sync):
    """Median, min and max microseconds a call of call() over `repeats` repeats of `calls`."""
    per_call = []
    for _ in range(repeats):
        sync()
        spent = 0.0
        done = 0
        while done < calls:
            batch = min(256, calls - done)
            started = time.perf_counter()
            for _ in range(batch):
                call()
            spent += time.perf_counter() - started
            done += batch
            sync()
        per_call.append(spent * 1e6 / calls)
    return harness.summary(per_call, ("median", "min", "max"))


def single_calls(rt, calls, repeats):
    """{call: timing} of part 1."""
    import pycuda.driver as driver
    from sok1x.backend.cuda import captured_graph, context as cuda_context, kernel_launch
    from sok1x.backend.cuda import staging

    backend = rt.backend
    libc = ctypes.CDLL(None)
    getpid = libc.getpid
    results = {}

    def empty():
        return None

    results["python call (baseline)"] = _timed_us(empty, calls, repeats, lambda: None)
    results["ctypes call, getpid (baseline)"] = _timed_us(getpid, calls, repeats, lambda: None)

    def push_pop():
        with cuda_context.entered():
            pass
    results["context push + pop"] = _timed_us(push_pop, calls, repeats, backend.synchronize)

    with cuda_context.entered():
        one = backend.zeros((1,), np.float32)
        small_src = backend.zeros((16,), np.float32)
        small_dst = backend.zeros((16,), np.float32)
        results["kernel launch (a fill)"] = _timed_us(
            functools.partial(backend.fill_value, one, 1.0), calls, repeats, backend.synchronize)
        results["device copy, 64 B"] = _timed_us(
            functools.partial(kernel_launch.copy_array, small_dst, small_src), calls, repeats,
            backend.synchronize)
        stream = cuda_context.stream()
        pinned = driver.pagelocked_empty((16,), np.float32)
        results["copy to page-locked, 64 B"] = _timed_us(
            lambda: driver.memcpy_dtoh_async(pinned, int(small_src.gpudata), stream), calls,
            repeats, backend.synchronize)
        event = driver.Event(flags=driver.event_flags.DISABLE_TIMING)
        results["event record"] = _timed_us(lambda: event.record(stream), calls, repeats,
                                            backend.synchronize)
        backend.synchronize()
        results["event query (done)"] = _timed_us(event.query, calls, repeats, lambda: None)

        def small_read():
            collect = staging.read_small_later(small_src, "driver_calls' small read")
            collect()
        results["small read queued and collected"] = _timed_us(small_read, calls // 4 or 1,
                                                               repeats, backend.synchronize)
        graph = captured_graph.CapturedGraph()
        with graph.capture():
            backend.fill_value(one, 2.0)
        results["graph launch (one fill)"] = _timed_us(graph.replay, calls, repeats,
                                                       backend.synchronize)
        graph.free()
    return results


class DriverCounter:
    """Counts the driver calls the cuda backend makes while installed, by wrapping the entry
    points it calls through: kernel launches (kernel_launch.COUNTS), device copies, copies to
    the host, event records and queries, context pushes and graph launches."""

    def __init__(self):
        import pycuda.driver as driver
        from sok1x.backend.cuda import captured_graph
        self.counts = {}
        self._undo = []
        for owner, name, label in (
                (driver, "memcpy_dtod_async", "device copies"),
                (driver, "memcpy_dtoh_async", "copies to the host"),
                (driver, "memcpy_htod_async", "copies to the device"),
                (driver.Event, "record", "event records"),
                (driver.Event, "query", "event queries"),
                (driver.Event, "synchronize", "event waits"),
                (driver.Stream, "wait_for_event", "stream waits"),
                (driver.Context, "push", "context pushes"),
                (driver.Context, "pop", "context pops")):
            self._wrap(owner, name, label)
        self._replay = captured_graph.CapturedGraph.replay
        counts = self.counts

        def replay(graph):
            counts["graph launches"] = counts.get("graph launches", 0) + 1
            return self._replay(graph)
        captured_graph.CapturedGraph.replay = replay
        self._undo.append(lambda: setattr(captured_graph.CapturedGraph, "replay", self._replay))

    def _wrap(self, owner, name, label):
        raw = inspect.getattr_static(owner, name)  # as stored: a static method stays one
        original = getattr(owner, name)
        counts = self.counts

        def counted(*args, **kwargs):
            counts[label] = counts.get(label, 0) + 1
            return original(*args, **kwargs)
        try:
            setattr(owner, name, staticmethod(counted) if isinstance(raw, staticmethod)
                    else counted)
        except (AttributeError, TypeError) as exc:
            print("driver_calls: %s.%s not counted (%s): its kind reads 0"
                  % (getattr(owner, "__name__", owner), name, exc))
            return
        self._undo.append(lambda: setattr(owner, name, raw))

    def remove(self):
        for undo in reversed(self._undo):
            undo()


def step_counts(rt, name, args):
    """{"driver calls a step": {kind: count}, "host_us", "host_us_min", "host_us_max": the
    step with its recorded works held back, over --repeats repeats}."""
    from sok1x.backend.cuda.kernel_launch import COUNTS
    case = step_calls.Case(rt, name, args.scale, replayed=True)
    for _ in range(args.warmup):
        case.run()
    rt.backend.synchronize()
    launches = COUNTS.get("launches", 0)
    counter = DriverCounter()
    try:
        for _ in range(args.steps):
            case.run()
        rt.backend.synchronize()
    finally:
        counter.remove()
    counts = {kind: n / args.steps for kind, n in sorted(counter.counts.items())}
    counts["kernel launches"] = (COUNTS.get("launches", 0) - launches) / args.steps
    got = harness.summary([case.host_us(rt, args.steps) for _ in range(args.repeats)],
                          ("host_us", "host_us_min", "host_us_max"))
    got["driver calls a step"] = counts
    return got


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ[bounded_step.ENV] = "1"  # the replayed step (step_calls.Case's replayed=True)
    rt = harness.start_engine("cuda")
    if args.costs:
        with open(args.costs) as handle:
            singles = json.load(handle)["single_calls_us"]
    else:
        singles = single_calls(rt, args.calls, args.repeats)
        print("microseconds a call (median of %d x %d calls, min-max):"
              % (args.repeats, args.calls))
        for call, timing in singles.items():
            print("  %-38s %7.2f (%.2f-%.2f)" % (call, timing["median"], timing["min"],
                                                 timing["max"]))
    pace = harness.host_pace_us()
    print("the host's pace (harness.host_pace_us): %.0f us" % pace)
    cost = {  # what each counted kind costs, from part 1
        "kernel launches": singles["kernel launch (a fill)"]["median"],
        "device copies": singles["device copy, 64 B"]["median"],
        "copies to the host": singles["copy to page-locked, 64 B"]["median"],
        "event records": singles["event record"]["median"],
        "event queries": singles["event query (done)"]["median"],
        "graph launches": singles["graph launch (one fill)"]["median"],
        "context pushes": singles["context push + pop"]["median"],
    }
    steps = {}
    for name in [name for name in args.workloads.split(",") if name]:
        got = step_counts(rt, name, args)
        driver_us = sum(cost.get(kind, 0.0) * n for kind, n in
                        got["driver calls a step"].items())
        got["driver_us_estimate"] = driver_us
        steps[name] = got
        print("%-14s host_us %.1f (%.1f-%.1f); driver calls a step: %s; about %.1f us of them"
              % (name, got["host_us"], got["host_us_min"], got["host_us_max"],
                 ", ".join("%s %.2f" % kv for kv in got["driver calls a step"].items()),
                 driver_us))
    if args.out:
        harness.write_json(args.out, {"environment": harness.environment(),
                                      "single_calls_us": singles, "steps": steps,
                                      "pace_us": pace})
    harness.finish()


if __name__ == "__main__":
    main()
