"""Mapped host rows by how they are allocated (sok1x/backend/cuda/host_rows.py) and how large the
region is: the read and write rates that bound a hybrid DynamicVariable's host part.

    python3 bench/host_rows.py --out results/host_rows.json [--sizes-gib 0.25,1,2,4] [--dims 64]

For each way (vmm, thp, slices, pinned), each region size and each dim: a gather of 2^20 random rows
of `dim` floats from the region (backend.gather_rows, the kernel hybrid lookups use) and a scatter
into it (put_rows), in GiB/s of row bytes: the median of --repeats calls with min and max. Each way
runs in a process of its own, so a way the system refuses (it falls back to the next, and the JSON
says which one it got) or one that faults cannot spoil the others. Before timing, a check that the
CPU and the kernels see the same bytes: rows the host view writes are gathered back, and rows
put_rows writes are read through the host view.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

import harness

WAYS = ("vmm", "thp", "slices", "pinned")
ROWS_PER_CALL = 1 << 20


def measure_way(way, sizes_gib, dims, repeats):
    """One way's figures (run in a child process with SOK1X_HOST_ROWS=way)."""
    backend = harness.backend_module("cuda")
    timer = harness.StreamTimer(backend)
    rng = harness.seeded_rng()
    entries = []
    for dim in dims:
        for size_gib in sizes_gib:
            with backend.device_context():
                entries.append(measure_region(backend, timer, rng, way, dim, size_gib,
                                              repeats))
            harness.release_memory(backend)
    return entries


def measure_region(backend, timer, rng, way, dim, size_gib, repeats):
    """Checks and times one region of size_gib GiB of host rows of `dim` floats."""
    rows = int(size_gib * 2 ** 30) // (4 * dim)
    host = backend.host_mapped_zeros((rows, dim), np.float32)
    block, view = host.sok1x_host_block, host.sok1x_host_memory
    probe = rng.choice(rows, 64, replace=False).astype(np.int64)
    view[probe] = np.arange(64 * dim, dtype=np.float32).reshape(64, dim)
    seen = backend.to_host(backend.gather_rows(host, backend.asarray(probe)))
    backend.put_rows(host, backend.asarray(probe),
                     backend.asarray(np.full((64, dim), 3.5, np.float32)))
    backend.synchronize()
    agree = bool(np.array_equal(seen.reshape(-1), np.arange(64 * dim, dtype=np.float32))
                 and np.all(view[probe] == 3.5))
    index = backend.asarray(rng.choice(rows, min(ROWS_PER_CALL, rows),
                                       replace=False).astype(np.int64))
    src = backend.zeros((index.shape[0], dim), np.float32)
    gib = index.shape[0] * dim * 4 / 2 ** 30
    read = timer.time_ms(lambda: backend.gather_rows(host, index), repeats)
    write = timer.time_ms(lambda: backend.put_rows(host, index, src), repeats)
    entry = {"way": way, "got": block.method, "huge_bytes": block.huge_bytes, "dim": dim,
             "size_gib": size_gib, "rows": rows, "cpu_agrees": agree}
    for name, ms in (("read", read), ("write", write)):
        entry[name] = dict(harness.summary(ms, ("ms", "ms_min", "ms_max")),
                           gib_per_s=gib / harness.median(ms) * 1e3,
                           gib_per_s_min=gib / max(ms) * 1e3, gib_per_s_max=gib / min(ms) * 1e3)
    harness.log("%-6s (got %-6s, %5.2f GiB on huge pages) dim %3d, %5.2f GiB: read %5.1f GiB/s "
                "[%5.1f-%5.1f], write %5.1f GiB/s; cpu view agrees: %s" % (
                    way, block.method, block.huge_bytes / 2 ** 30, dim, size_gib,
                    entry["read"]["gib_per_s"], entry["read"]["gib_per_s_min"],
                    entry["read"]["gib_per_s_max"], entry["write"]["gib_per_s"], agree))
    return entry


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=7)
    parser.add_argument("--sizes-gib", default="0.25,1,2,4")
    parser.add_argument("--dims", default="64")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [float(v) for v in args.sizes_gib.split(",")]
    dims = [int(v) for v in args.dims.split(",")]
    if args.child:
        with open(args.out, "w") as out:
            json.dump(measure_way(args.child, sizes, dims, args.repeats), out)
        return
    results = {"grid": [], "failed": {}, "environment": harness.environment()}
    for way in args.ways.split(","):
        part = args.out + "." + way
        command = [sys.executable, os.path.abspath(__file__), "--out", part, "--child", way,
                   "--sizes-gib", args.sizes_gib, "--dims", args.dims,
                   "--repeats", str(args.repeats)]
        done = subprocess.run(command, env=dict(os.environ, SOK1X_HOST_ROWS=way))
        if done.returncode == 0 and os.path.exists(part):
            with open(part) as source:
                results["grid"] += json.load(source)
            os.remove(part)
        else:
            results["failed"][way] = done.returncode
            harness.log("%s: the child process ended with %d" % (way, done.returncode))
        harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
