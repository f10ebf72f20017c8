"""Whether the row kernels of a dense step wait on their grid: dlrm's forward gather (26 x 16384
keys of one table of 26 x 2^20 rows, dim 128, power-law keys, bench/workloads.py) by rows.cu's
take_rows_w16, launched as the backend launches it (launch()'s grid: at most 16 blocks a
multiprocessor, a grid-stride loop) and with a thread for every 16-byte word (as the ordered
host walks launch since 6ee70ea, where it read host rows 29% faster).

    python3 bench/gather_grid.py --out results/gather_grid.json

Timed on the sok1x stream, medians of --repeats with min and max (us), and the rate of the
output's and the distinct rows' bytes.
"""
import sys

import numpy as np

import harness
import workloads


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=15)
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    from sok1x.backend.cuda import rows as cuda_rows
    from sok1x.backend.cuda.kernel_launch import BLOCK, launch, ptr, split_args
    w = workloads.workload("dlrm", 1)
    keys = workloads.Batches(w, 0, 1, 1).keys[0].reshape(-1)
    timer = harness.StreamTimer(backend)
    dim, words = w.dim, w.dim * 4 // 16
    results = {"environment": harness.environment(), "keys": int(keys.shape[0]),
               "distinct": int(np.unique(keys).shape[0]), "parts": {}}
    with backend.device_context():
        table = backend.zeros((w.vocab * w.slots, dim), np.float32)
        index = backend.asarray(keys)
        out = backend.zeros((keys.shape[0], dim), np.float32)
        take = cuda_rows._row_copy_kernels(16)[0]
        work = keys.shape[0] * words

        def launched(full):
            def run():
                launch(take, work, *split_args(table, words), table.shape[0], ptr(index),
                       keys.shape[0], words, 1, ptr(out), 0,
                       blocks=-(-work // BLOCK) if full else None)
            return run
        moved = (keys.shape[0] + results["distinct"]) * dim * 4
        for name, run in (("take_rows", lambda: backend.take_rows(table, index)),
                          ("grid_stride", launched(False)), ("thread_a_word", launched(True))):
            results["parts"][name] = timer.part_us(name, run, args.repeats, moved)
        backend.synchronize()
    harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
