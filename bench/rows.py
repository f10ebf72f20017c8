"""Forward gather and backward scatter-add of embedding rows against a device-to-device copy.

    python3 bench/rows.py --out results/rows.json [--candidate bench/kernels/rows_candidate.cu]

Effective bytes are the fewest an op must move: gather n rows reads n * (8 + row bytes) and writes
n * row bytes; scatter-add reads n * (8 + row bytes) and reads and writes n table rows. The copy
is one cuMemcpyDtoD of 2 GiB, counting bytes read plus written. Rows are picked uniformly from a
table of 2^24 rows (far larger than L2), n so that the gathered rows fill 512 MiB.

--candidate times another version of cuda_kernels/rows.cu (same kernel names and arguments) beside
the installed one on the same inputs, and checks that both give the same results.
"""
import sys

import numpy as np

import harness

DIMS = (16, 64, 128)
TABLE_ROWS = 1 << 24
GATHERED_BYTES = 512 << 20
COPY_BYTES = 2 << 30


def parse_args(argv):
    parser = harness.parser(__doc__, backend=True, out=True, scale=True, repeats=10)
    parser.add_argument("--candidate", default=None, help="another rows.cu to time beside")
    parser.add_argument("--candidate-label", default="candidate", help="its name in the results")
    return parser.parse_args(argv)


class RowKernels:
    """gather_rows / scatter_add_rows with the kernels of one rows.cu text (cuda only)."""

    def __init__(self, path):
        kernels = harness.kernels_from(path, {"take_rows_w16": "PqPqqiP",
                                              "add_rows_float32": "PPqqP"})
        self.take, self.add = kernels["take_rows_w16"], kernels["add_rows_float32"]

    def gather_rows(self, table, rows):
        from sok1x.backend.cuda import context as cuda_context
        from sok1x.backend.cuda.kernel_launch import empty, launch, ptr
        with cuda_context.entered():
            out = empty((rows.shape[0], table.shape[1]), np.float32)
            words = table.shape[1] // 4
            assert table.shape[1] % 4 == 0 and ptr(table) % 16 == 0 and ptr(out) % 16 == 0
            launch(self.take, rows.shape[0] * words, ptr(table), table.shape[0], ptr(rows),
                   rows.shape[0], words, 1, ptr(out))
            return out

    def scatter_add_rows(self, table, rows, values):
        from sok1x.backend.cuda import context as cuda_context
        from sok1x.backend.cuda.kernel_launch import launch, ptr
        with cuda_context.entered():
            launch(self.add, values.size, ptr(table), ptr(rows), rows.shape[0], table.shape[1],
                   ptr(values))


def random_table(backend, rows, dim, seed):
    """A [rows, dim] float32 table of uniform values in [-1, 1), drawn on the device by the
    backend's init_rows (2^22 rows at a time)."""
    from sok1x.backend import random_init
    spec = random_init.make_spec("uniform", -1.0, 1.0, seed=seed)
    table = backend.empty((rows, dim), np.float32)
    piece = 1 << 22
    for first in range(0, rows, piece):
        numbers = backend.asarray(np.arange(first, min(rows, first + piece), dtype=np.int64))
        backend.init_rows(table, numbers, numbers, spec, 1)
    return table


def copy_ms(backend, timer, nbytes, repeats):
    """Median ms of one device-to-device copy of nbytes (a host memcpy on cpu)."""
    count = nbytes // 4
    dst = backend.empty((count,), np.float32)
    if backend.NAME == "cuda":
        import pycuda.driver as driver
        from sok1x.backend.cuda import context as cuda_context
        from sok1x.backend.cuda.kernel_launch import fill_bytes
        with cuda_context.entered():
            src = fill_bytes(backend.empty((count,), np.float32), 0x3C)

        def run():
            driver.memcpy_dtod_async(dst.gpudata, src.gpudata, nbytes, cuda_context.stream())
    else:
        src = np.ones(count, np.float32)

        def run():
            np.copyto(dst, src)
    return harness.median(timer.time_ms(run, repeats))


def check_candidate(backend, current, candidate, dim, rng):
    """Largest differences (gather, scatter-add) between the installed and candidate kernels on a
    small table with many repeated rows."""
    rows_count, n = 1 << 16, 1 << 18
    table = random_table(backend, rows_count, dim, 1)
    rows = backend.asarray(rng.integers(-1, rows_count, size=n))
    gather_diff = float(np.max(np.abs(backend.to_host(current.gather_rows(table, rows))
                                      - backend.to_host(candidate.gather_rows(table, rows)))))
    values = random_table(backend, n, dim, 2)
    positive = backend.asarray(rng.integers(0, rows_count, size=n))
    first, second = random_table(backend, rows_count, dim, 3), random_table(backend, rows_count,
                                                                               dim, 3)
    current.scatter_add_rows(first, positive, values)
    candidate.scatter_add_rows(second, positive, values)
    add_diff = float(np.max(np.abs(backend.to_host(first) - backend.to_host(second))))
    return gather_diff, add_diff


def time_ops(timer, ops, table, rows, values, repeats):
    """Median ms of ops.gather_rows(table, rows) and ops.scatter_add_rows(table, rows, values)."""
    return {"gather": harness.median(timer.time_ms(lambda: ops.gather_rows(table, rows),
                                                   repeats)),
            "scatter_add": harness.median(timer.time_ms(
                lambda: ops.scatter_add_rows(table, rows, values), repeats))}


def main(argv):
    args = parse_args(argv)
    backend = harness.backend_module(args.backend)
    timer = harness.StreamTimer(backend)
    rng = np.random.default_rng(11)
    copy_bytes = COPY_BYTES // args.scale
    copy = copy_ms(backend, timer, copy_bytes, args.repeats)
    copy_gbps = 2 * copy_bytes / copy / 1e6
    harness.log("device-to-device copy: %.3f ms for %d MiB: %.0f GB/s (read + write)"
               % (copy, copy_bytes >> 20, copy_gbps))
    kernels = {"installed": backend}
    if args.candidate:
        kernels[args.candidate_label] = RowKernels(args.candidate)
    results = {"copy": {"bytes": copy_bytes, "ms": copy, "gbps": copy_gbps}, "ops": [],
               "environment": harness.environment()}
    for dim in DIMS:
        table_rows = TABLE_ROWS // args.scale
        n = GATHERED_BYTES // args.scale // (4 * dim)
        table = random_table(backend, table_rows, dim, 4)
        rows = backend.asarray(rng.integers(0, table_rows, size=n))
        values = random_table(backend, n, dim, 5)
        row_bytes = 4 * dim
        moved = {"gather": n * (8 + 2 * row_bytes), "scatter_add": n * (8 + 3 * row_bytes)}
        for name, ops in kernels.items():
            for op, ms in time_ops(timer, ops, table, rows, values, args.repeats).items():
                gbps = moved[op] / ms / 1e6
                results["ops"].append({"op": op, "kernels": name, "dim": dim, "n": n,
                                       "table_rows": table_rows, "bytes": moved[op], "ms": ms,
                                       "gbps": gbps, "of_copy": gbps / copy_gbps})
                harness.log("%-11s dim %3d %-9s %.3f ms  %5.0f GB/s  %3.0f%% of copy"
                           % (op, dim, name, ms, gbps, 100 * gbps / copy_gbps))
        if args.candidate:
            gather_diff, add_diff = check_candidate(backend, backend,
                                                    kernels[args.candidate_label], dim, rng)
            results.setdefault("candidate_check", []).append(
                {"dim": dim, "gather_max_diff": gather_diff, "scatter_add_max_diff": add_diff})
            harness.log("candidate check dim %d: gather diff %g, scatter-add diff %g"
                       % (dim, gather_diff, add_diff))
        harness.release_memory(backend)
    harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
