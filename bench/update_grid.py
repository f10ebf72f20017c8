"""Whether dlrm's LazyAdam update waits on its grid: optimizers.cu's update_lazy_adam_x4 over
dlrm's distinct rows (one batch of 26 x 16384 power-law keys of one table of 26 x 2^20 rows, dim
128, bench/workloads.py), padded with -1 to the batch's keys as a replayed backward hands them
over, launched at several grids: launch()'s (16 blocks a multiprocessor), one wave of the blocks
a multiprocessor holds (the kernel's registers allow 6 of 256 threads on an H200), two and three
waves, and a thread for every four elements. Nsight Compute put it at 70% of DRAM bandwidth, as
2.67 waves of launch()'s grid with the last a third idle (2026-11-28). The stamp after it
(fill_rows_float64) is timed alone beside it.

    python3 bench/update_grid.py --out results/update_grid.json

Timed on the sok1x stream, medians of --repeats with min and max (us), and the rate of the
update's bytes (each distinct row's vector, two slots and gradient read, three rows written).
"""
import sys

import numpy as np

import harness
import workloads

HYPER = (0.001, 0.9, 0.999, 1e-8)


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=15)
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    from sok1x.backend.cuda import context as cuda_context
    from sok1x.backend.cuda import optimizers as cuda_optimizers
    from sok1x.backend.cuda.kernel_launch import BLOCK, launch, ptr, split_args
    w = workloads.workload("dlrm", 1)
    keys = workloads.Batches(w, 0, 1, 1).keys[0].reshape(-1)
    distinct = np.unique(keys)
    padded = np.full(keys.shape[0], -1, np.int64)
    padded[:distinct.shape[0]] = distinct
    timer = harness.StreamTimer(backend)
    dim = w.dim
    results = {"environment": harness.environment(), "keys": int(keys.shape[0]),
               "distinct": int(distinct.shape[0]), "parts": {}}
    with backend.device_context():
        shape = (w.vocab * w.slots, dim)
        var, m, v = (backend.zeros(shape, np.float32) for _ in range(3))
        times = backend.zeros((shape[0],), np.float64)
        rows = backend.asarray(padded)
        grads = backend.asarray(np.random.default_rng(3).standard_normal(
            (keys.shape[0], dim)).astype(np.float32))
        kernel = cuda_optimizers._kernel("update_lazy_adam_x4", cuda_optimizers._STATE * 3 +
                                         cuda_optimizers._ROWS_ARGS + cuda_optimizers._HYPER)
        with cuda_context.entered():
            registers = kernel.num_regs
        multiprocessors = cuda_context.multiprocessor_count()
        n, work = keys.shape[0], keys.shape[0] * dim // 4
        results["registers"], results["multiprocessors"] = int(registers), multiprocessors

        def launched(blocks):
            def run():
                launch(kernel, work, *split_args(var, dim), *split_args(m, dim),
                       *split_args(v, dim), ptr(rows), ptr(grads), n, dim, 0, *HYPER, 0.0,
                       0.0, blocks=blocks)
            return run
        grids = [("launch()'s grid", None)] + [
            ("%d blocks a multiprocessor" % k, k * multiprocessors) for k in (6, 12, 18, 24)] + [
            ("a thread a four elements", -(-work // BLOCK))]
        moved = distinct.shape[0] * dim * 4 * 7
        for name, blocks in grids:
            figures = results["parts"][name] = timer.part_us(name, launched(blocks),
                                                             args.repeats, moved)
            figures["blocks"] = blocks
        results["parts"]["the stamp (fill_rows)"] = timer.part_us(
            "the stamp (fill_rows)", lambda: backend.fill_rows(times, rows, 1.7e9), args.repeats)
        backend.synchronize()
    harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
