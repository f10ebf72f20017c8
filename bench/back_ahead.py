"""How fast the helper thread backs a growing group's next rows (reserved_rows.back_rows_ahead)
while the main thread works, and what slows it: the GIL its driver calls hand back, or the
driver itself (issue 46: the doubling step waited for the helper when the fill's steps outran it).

    python3 bench/back_ahead.py --out results/back_ahead.json      (cuda only)

A group of --members members, each with --rows rows of the flat arrays a growth extends (values
and two slots of --dim floats, update times of one int64), has its next doubling backed and
filled ahead: one helper job a member, all submitted at once, as HashGroup._back_ahead submits
them. Per repeat and case, the wall time from the first submit to the last job's end, the jobs'
own time, and the helper's driver calls' time (each measured around its ctypes call, so with
the GIL's hand-back where the call releases it). The main thread meanwhile:
    idle        waits on the futures (its GIL released)
    python      runs Python that holds the GIL (a busy loop)
    launches    queues small kernels through sok1x's backend (fill_value) and waits every 64,
                as a step's host does
The helper's driver calls go through:
    native      one call of back_pieces.c a job (the library's way): the GIL let go once
    cdll        ctypes.CDLL a driver call at a time (SOK1X_BACK_AHEAD_NATIVE=0's way): each call
                lets go of the GIL and takes it back
    pydll       ctypes.PyDLL a driver call at a time: the GIL held through each call (the main
                thread waits meanwhile)
Where cdll beside python or launches is much slower than cdll idle and pydll is not, the GIL's
hand-back is what the helper waits for (2026-11-28, one H200: 63.6 ms beside launches, 10.2 idle,
15.3 through pydll); native takes it away without holding the main thread.
"""
import argparse
import ctypes
import importlib
import json
import statistics
import threading
import time

import numpy as np

from sok1x.backend.cuda import memory_driver

import harness

# (the module: the package's attribute of that name is its reserved_rows function)
reserved_rows = importlib.import_module("sok1x.backend.cuda.reserved_rows")

backend = None  # the cuda backend module, its GPU made current (main)


class DriverTimer:
    """Wraps memory_driver.call, adding each call's seconds on the helper thread."""

    def __init__(self):
        self.seconds, self.calls, self._call = 0.0, 0, memory_driver.call
        self._main = threading.get_ident()

    def __call__(self, name, *args):
        if threading.get_ident() == self._main:
            return self._call(name, *args)
        start = time.perf_counter()
        try:
            return self._call(name, *args)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def use_library(kind):
    """Has the helper call the driver through back_pieces.c (kind "native"), or a call at a time
    through ctypes.CDLL ("cdll") or PyDLL ("pydll")."""
    memory_driver._library.clear()
    reserved_rows._CLASS.pop("native", None)
    if kind != "native":
        reserved_rows._CLASS["native"] = None
    library = memory_driver._driver()
    if kind == "pydll":
        library = ctypes.PyDLL("libcuda.so.1")
        for name, argtypes in memory_driver._PROTOTYPES:
            getattr(library, name).argtypes = argtypes
            getattr(library, name).restype = ctypes.c_int
        memory_driver._library["cuda"] = library


def flat_arrays(members, rows, dim):
    """The group's flat arrays, reserved for every member's doubled rows, and their initial
    values: (array, initial) as HashGroup._growing_arrays gives them."""
    total = members * 2 * rows
    return [(reserved_rows.reserved_rows((total, dim), np.float32), 0.0),
            (reserved_rows.reserved_rows((total,), np.int64), 0.0),
            (reserved_rows.reserved_rows((total, dim), np.float32), 0.0),
            (reserved_rows.reserved_rows((total, dim), np.float32), 0.0)]


def main_work(mode, futures, scratch):
    """Runs the main thread's `mode` until every future is done; returns its iterations."""
    done = 0
    if mode == "idle":
        for future in futures:
            future.result()
        return 0
    while not all(future.done() for future in futures):
        if mode == "python":
            total = 0
            for i in range(2000):
                total += i * i
        else:
            for _ in range(64):
                backend.fill_value(scratch, 1.0)
            backend.synchronize()
        done += 1
    return done


def one_case(args, mode, library, scratch, timer):
    use_library(library)
    arrays = flat_arrays(args.members, args.rows, args.dim)
    backend.synchronize()
    timer.seconds, timer.calls = 0.0, 0
    reserved_rows.AHEAD_LOG.clear()
    start = time.perf_counter()
    futures = []
    for t in range(args.members):
        first = t * 2 * args.rows + args.rows
        futures.append(reserved_rows.back_rows_ahead(
            [(flat, first, first + args.rows, initial) for flat, initial in arrays]))
    iterations = main_work(mode, futures, scratch)
    for future in futures:
        reserved_rows.join_ahead(future)
    log = list(reserved_rows.AHEAD_LOG)
    wall = max(end for _, end, _ in log) - start
    own = sum(end - begin for begin, end, _ in log)
    gib = sum(nbytes for _, _, nbytes in log) / 2.0 ** 30
    backend.synchronize()
    del arrays, futures
    return {"wall_ms": wall * 1e3, "jobs_ms": own * 1e3, "driver_ms": timer.seconds * 1e3,
            "driver_calls": timer.calls, "gib": gib, "main_iterations": iterations}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=26)
    parser.add_argument("--rows", type=int, default=1 << 18)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="idle,python,launches")
    parser.add_argument("--libraries", default="native,cdll,pydll")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    global backend
    backend = harness.backend_module("cuda")
    timer = DriverTimer()
    memory_driver.call = timer
    scratch = backend.zeros((1024,), np.float32)
    cases = [(m, lib) for m in args.modes.split(",") for lib in args.libraries.split(",")]
    for library in args.libraries.split(","):  # warm: the helper thread, its stream, the build
        one_case(args, "idle", library, scratch, timer)
    results = {"%s/%s" % case: [] for case in cases}
    for _ in range(args.repeats):
        for mode, library in cases:  # interleaved: the host's drift lands on every case
            results["%s/%s" % (mode, library)].append(one_case(args, mode, library, scratch,
                                                                timer))
    summary = {}
    print("%-18s %24s %24s %24s %8s" % ("case", "wall ms", "jobs ms", "driver ms", "calls"))
    for name, runs in results.items():
        row = {}
        for key in ("wall_ms", "jobs_ms", "driver_ms"):
            values = [run[key] for run in runs]
            row[key] = (statistics.median(values), min(values), max(values))
        row["driver_calls"] = runs[0]["driver_calls"]
        row["gib"] = runs[0]["gib"]
        summary[name] = row
        print("%-18s %24s %24s %24s %8d" % (name, *("%.1f (%.1f-%.1f)" % row[key] for key in (
            "wall_ms", "jobs_ms", "driver_ms")), row["driver_calls"]))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"args": vars(args), "summary": summary, "runs": results}, handle,
                      indent=1)


if __name__ == "__main__":
    main()
