"""dlrm's forward gather, kernel against kernel: rows.cu's take_rows_w16 over dlrm's keys (26 x
16384 power-law keys of one table of 26 x 2^20 rows, dim 128, bench/workloads.py), each variant
launched as the backend launches it (launch()'s grid from its own registers, a zero row for an
index outside the table):

    this tree                 the kernel the backend runs
    --baseline FILE           another tree's rows.cu (its kernel of the same name and arguments),
                              compiled here against the installed headers
    take_rows                 backend.take_rows, the call with its allocation

timed in turn for --rounds rounds of --repeats launches each (us: median, min, max over all), with
the rate of the output's and the distinct rows' bytes. Before any timing every variant gathers
once from a table whose used rows hold random values, and its output must equal NumPy's gather
of the same rows bit for bit (else the script fails).

    python3 bench/gather_grid.py --out results/gather_grid.json [--baseline OTHER/rows.cu]
"""
import sys

import numpy as np

import harness
import workloads

KERNEL = "take_rows_w16"
ARG_TYPES = "PPqPqPqqiPP"  # cuda rows._row_copy_kernels' take


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=15)
    parser.add_argument("--rounds", type=int, default=3, help="turns of every variant")
    parser.add_argument("--baseline", default=None, help="another tree's rows.cu")
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    from sok1x.backend.cuda import context as cuda_context
    from sok1x.backend.cuda import rows as cuda_rows
    from sok1x.backend.cuda.kernel_launch import launch, ptr, split_args
    w = workloads.workload("dlrm", 1)
    keys = workloads.Batches(w, 0, 1, 1).keys[0].reshape(-1)
    distinct = np.unique(keys)
    dim, words, n = w.dim, w.dim * 4 // 16, keys.shape[0]
    values = np.random.default_rng(3).standard_normal((distinct.shape[0], dim)).astype(
        np.float32)
    expected = values[np.searchsorted(distinct, keys)]
    timer = harness.StreamTimer(backend)
    results = {"environment": harness.environment(), "keys": int(n),
               "distinct": int(distinct.shape[0]), "parts": {}, "registers": {}}
    with backend.device_context():
        table = backend.zeros((w.vocab * w.slots, dim), np.float32)
        backend.put_rows(table, backend.asarray(distinct), backend.asarray(values))
        index = backend.asarray(keys)
        out = backend.zeros((n, dim), np.float32)
        variants = [("this tree", cuda_rows._row_copy_kernels(16)[0])]
        if args.baseline:
            variants.append(("baseline", harness.kernels_from(args.baseline,
                                                              {KERNEL: ARG_TYPES})[KERNEL]))
        with cuda_context.entered():
            for name, kernel in variants:
                results["registers"][name] = int(kernel.num_regs)

        def launched(kernel):
            def run():
                launch(kernel, n * words, *split_args(table, words), table.shape[0], ptr(index),
                       n, words, 1, ptr(out), 0)
            return run

        for name, kernel in variants:
            backend.fill_value(out, np.nan)
            launched(kernel)()
            got = backend.to_host(out)
            if not np.array_equal(got.view(np.uint32), expected.view(np.uint32)):
                raise SystemExit("%s's gather differs from NumPy's" % name)
        harness.log("every variant's gather equals NumPy's bit for bit")
        results["checked"] = True
        moved = (n + distinct.shape[0]) * dim * 4
        parts = [(name, launched(kernel)) for name, kernel in variants]
        parts.append(("take_rows", lambda: backend.take_rows(table, index)))
        results["parts"] = harness.interleaved_parts(timer, parts, args.rounds, args.repeats,
                                                     moved)
        backend.synchronize()
    harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
