"""dlrm's LazyAdam update, kernel against kernel: optimizers.cu's update_lazy_adam_x4 over dlrm's
distinct rows (one batch of 26 x 16384 power-law keys of one table of 26 x 2^20 rows, dim 128,
bench/workloads.py), padded with -1 to the batch's keys as a replayed backward hands them over,
each variant launched as the backend launches it (launch()'s grid from its own registers):

    this tree                 the kernel the backend runs
    ROW_MIN_BLOCKS=k          the same source with its registers capped to fit k blocks of 256
                              threads a multiprocessor (--min-blocks, default 1 (uncapped), 8)
    --baseline FILE           another tree's optimizers.cu (its kernel of the same name and
                              arguments), compiled here against the installed headers

timed in turn for --rounds rounds of --repeats launches each (us: median, min, max over all), with
the rate of the update's bytes (each distinct row's vector, two slots and gradient read, three rows
written). Before any timing every variant updates the same states once, and its distinct rows'
var, m and v must equal this tree's bit for bit (else the script fails), and this tree's must
agree with a NumPy LazyAdam within float32 rounding. The stamp after the update (fill_rows) is
timed alone beside them.

    python3 bench/update_grid.py --out results/update_grid.json [--baseline OTHER/optimizers.cu]
"""
import os
import sys

import numpy as np

import harness
import workloads

HYPER = (0.001, 0.9, 0.999, 1e-8)
KERNEL = "update_lazy_adam_x4"


def numpy_lazy_adam(var, m, v, grads):
    """The LazyAdam rows (cpu_optimizers' formula) of var, m, v [u, dim] with grads [u, dim]."""
    lr_t, beta1, beta2, epsilon = (np.float32(x) for x in HYPER)
    m = m * beta1 + grads * (np.float32(1) - beta1)
    v = v * beta2 + grads * grads * (np.float32(1) - beta2)
    return var - lr_t * m / (np.sqrt(v) + epsilon), m, v


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=15)
    parser.add_argument("--rounds", type=int, default=3, help="turns of every variant")
    parser.add_argument("--baseline", default=None, help="another tree's optimizers.cu")
    parser.add_argument("--min-blocks", default="1,8",
                        help="ROW_MIN_BLOCKS values this tree's source is compiled with beside")
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    from sok1x.backend.cuda import context as cuda_context
    from sok1x.backend.cuda import optimizers as cuda_optimizers
    from sok1x.backend.cuda.kernel_launch import launch, ptr, split_args
    from sok1x.cuda_kernels import compiler
    w = workloads.workload("dlrm", 1)
    keys = workloads.Batches(w, 0, 1, 1).keys[0].reshape(-1)
    distinct = np.unique(keys)
    u, n, dim = distinct.shape[0], keys.shape[0], w.dim
    padded = np.full(n, -1, np.int64)
    padded[:u] = distinct
    rng = np.random.default_rng(3)
    start = [rng.standard_normal((u, dim)).astype(np.float32) for _ in range(2)]
    start.append(np.abs(rng.standard_normal((u, dim))).astype(np.float32))
    host_grads = rng.standard_normal((n, dim)).astype(np.float32)
    host_grads[u:] = np.nan  # a padded position's gradient must never be read
    timer = harness.StreamTimer(backend)
    results = {"environment": harness.environment(), "keys": int(n), "distinct": int(u),
               "parts": {}, "registers": {}}
    arg_types = cuda_optimizers._STATE * 3 + cuda_optimizers._ROWS_ARGS + cuda_optimizers._HYPER
    with backend.device_context():
        shape = (w.vocab * w.slots, dim)
        states = [backend.zeros(shape, np.float32) for _ in range(3)]
        times = backend.zeros((shape[0],), np.float64)
        rows, distinct_rows = backend.asarray(padded), backend.asarray(distinct)
        grads = backend.asarray(host_grads)
        variants = [("this tree", cuda_optimizers._kernel(KERNEL, arg_types))]
        source = os.path.join(os.path.dirname(compiler.__file__), "optimizers.cu")
        for blocks in filter(None, args.min_blocks.split(",")):
            define = "ROW_MIN_BLOCKS=%d" % int(blocks)
            variants.append((define, harness.kernels_from(source, {KERNEL: arg_types},
                                                          ("-D" + define,))[KERNEL]))
        if args.baseline:
            variants.append(("baseline", harness.kernels_from(args.baseline,
                                                              {KERNEL: arg_types})[KERNEL]))
        with cuda_context.entered():
            for name, kernel in variants:
                results["registers"][name] = int(kernel.num_regs)
        results["multiprocessors"] = cuda_context.multiprocessor_count()

        def launched(kernel):
            def run():
                launch(kernel, n * dim // 4, *(a for s in states for a in split_args(s, dim)),
                       ptr(rows), ptr(grads), n, dim, 0, *HYPER, 0.0, 0.0)
            return run

        updated = {}
        for name, kernel in variants:  # each from the same start, once
            for state, values in zip(states, start):
                backend.put_rows(state, distinct_rows, backend.asarray(values))
            launched(kernel)()
            updated[name] = [backend.to_host(backend.take_rows(s, distinct_rows))
                             for s in states]
        expected = numpy_lazy_adam(start[0], start[1], start[2], host_grads[:u])
        for got, want, what in zip(updated["this tree"], expected, ("var", "m", "v")):
            if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                raise SystemExit("this tree's %s differs from NumPy's LazyAdam by %g"
                                 % (what, np.abs(got - want).max()))
        for name, _ in variants[1:]:
            for got, want, what in zip(updated[name], updated["this tree"], ("var", "m", "v")):
                if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                    raise SystemExit("%s's %s differs from this tree's" % (name, what))
        harness.log("every variant's rows equal this tree's bit for bit; this tree's agree with "
                    "NumPy")
        results["checked"] = True
        moved = u * dim * 4 * 7
        results["parts"] = harness.interleaved_parts(
            timer, [(name, launched(kernel)) for name, kernel in variants], args.rounds,
            args.repeats, moved)
        results["parts"]["the stamp (fill_rows)"] = timer.part_us(
            "the stamp (fill_rows)", lambda: backend.fill_rows(times, rows, 1.7e9), args.repeats)
        backend.synchronize()
    harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
