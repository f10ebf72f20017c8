"""Where a one-rank engine step's GPU time goes, kernel by kernel, under Nsight Compute:

    ncu --clock-control none --profile-from-start off --csv --page raw \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        python3 bench/step_kernels.py --workloads dlrm,seed > kernels.csv
    python3 bench/step_kernels.py --summarize kernels.csv

The first runs, per workload (workloads.py), framework_step.py's sok1x_bounded step
(sok_steps.EngineStep, SOK1X_BOUNDED_STEP=1: the kernels a replayed step records, launched one by
one) on the cuda backend: warm-up steps, then --steps steps between cuProfilerStart and
cuProfilerStop, so the profiler sees those steps' kernels alone. The second reads ncu's CSV and
prints, per workload and kernel in launch order, its launches a step, microseconds a step and
DRAM bytes a step (read + written) with the rate they make.
"""
import csv
import ctypes
import os
import sys

from sok1x.engine import runtime

import harness
import step_calls

WARMUP_STEPS = 3


def parse_args(argv):
    parser = harness.parser(__doc__, scale=1, steps=3)
    parser.add_argument("--workloads", default="dlrm,seed")
    parser.add_argument("--warmup", type=int, default=WARMUP_STEPS,
                        help="steps before the profiled ones (a full table's steady state "
                             "comes after its first steps)")
    parser.add_argument("--replayed", action="store_true",
                        help="the replayed step (its graphs' kernels, node by node)")
    parser.add_argument("--summarize", default=None,
                        help="FILE: ncu's CSV (--page raw) of a run of this script; prints the "
                             "kernels' table and exits")
    return parser.parse_args(argv)


def profile_steps(workloads, scale, steps, warmup=WARMUP_STEPS, replayed=False):
    """Runs each workload's bounded step (replayed: replayed, its graphs' kernel nodes profiled
    one by one), `warmup` steps, then `steps` steps inside the profiler's range; prints one
    marker line per workload (the CSV's kernels follow in the same order)."""
    from sok1x.engine.lookup import bounded_step
    os.environ[bounded_step.ENV] = "1"
    rt = harness.start_engine("cuda")
    driver = ctypes.CDLL("libcuda.so.1")
    for name in workloads:
        case = step_calls.Case(rt, name, scale, replayed=replayed)
        for _ in range(warmup):
            case.run()
        rt.backend.synchronize()
        print("workload %s steps %d" % (name, steps), flush=True)
        with runtime.entered():  # the profiler's range is the current context's
            _checked(driver.cuProfilerStart(), "cuProfilerStart")
            for _ in range(steps):
                case.run()
            rt.backend.synchronize()
            _checked(driver.cuProfilerStop(), "cuProfilerStop")
        del case
    harness.finish()


def _checked(status, call):
    if status:
        raise RuntimeError("%s failed: CUresult %d" % (call, status))


def summarize(path, workloads, steps):
    """Lines of the table: per workload (ncu lists the workloads' ranges in the order they ran)
    each launch of a step in order, averaged over the steps. Memsets are not kernels, so ncu
    leaves them out: the step's time less the kernels' is theirs and the gaps'."""
    with open(path) as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    header, units, data = rows[0], rows[1], rows[2:]
    at = {name: header.index(name) for name in (
        "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum",
        "dram__bytes_write.sum")}
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
             "msecond": 1e3, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}

    def value(row, name):
        return float(row[at[name]].replace(",", "")) * scale.get(units[at[name]], 1.0)

    if len(workloads) > 1 and len(data) % (len(workloads) * steps):
        raise SystemExit("%d launches do not cut into %d workloads of %d steps: profile one "
                         "workload a run (their steps launch different numbers of kernels)"
                         % (len(data), len(workloads), steps))
    per_workload = len(data) // len(workloads)
    launches = per_workload // steps
    lines = []
    for w, name in enumerate(workloads):
        ours = data[w * per_workload:(w + 1) * per_workload]
        total = sum(value(r, "gpu__time_duration.sum") for r in ours) / steps
        lines.append("%s: kernels %.1f us a step in %d launches" % (name, total, launches))
        for i in range(launches):
            runs = ours[i::launches]
            us = sum(value(r, "gpu__time_duration.sum") for r in runs) / steps
            dram = sum(value(r, "dram__bytes_read.sum") + value(r, "dram__bytes_write.sum")
                       for r in runs) / steps
            lines.append("  %2d %-36s %8.1f us %8.1f MB %6.2f TB/s" % (
                i, runs[0][at["Kernel Name"]].split("(")[0][:36], us, dram / 1e6,
                dram / max(us, 1e-9) / 1e6))
    return lines


def main(argv):
    args = parse_args(argv)
    workloads = args.workloads.split(",")
    if args.summarize:
        for line in summarize(args.summarize, workloads, args.steps):
            print(line)
        return
    profile_steps(workloads, args.scale, args.steps, args.warmup, args.replayed)


if __name__ == "__main__":
    main(sys.argv[1:])
