"""Random-row reads from mapped host memory held as one allocation or as separate 128 MiB
slices (HierarchicalKV's layout: each slice of its host vectors is its own cudaHostAlloc), at
several region sizes: does the layout decide the rate that falls with the region's size?

    python3 bench/host_slices.py --out results/host_slices.json [--sizes-gib 1,2,4] [--dim 64]

Both layouts are read by one kernel (bench/kernels/slice_gather.cu: a table of slice base
addresses, one thread per 16-byte word), 2^20 distinct random rows of `dim` floats per call,
in GiB/s of row bytes: the median of --repeats calls with min and max. `one_block`: one
cuMemHostAlloc(DEVICEMAP) of the whole region, the table pointing into it every 128 MiB (the
control: sok1x's "pinned" host rows); `slices`: one cuMemHostAlloc(DEVICEMAP) per 128 MiB.
"""
import os
import sys

import numpy as np

import harness

SLICE_BYTES = 128 << 20
ROWS_PER_CALL = 1 << 20
KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "slice_gather.cu")


def gather_kernel():
    """slice_gather.cu's kernel, prepared for sok1x's launch()."""
    import pycuda.driver as driver
    from pycuda.compiler import SourceModule
    major, minor = driver.Context.get_device().compute_capability()
    with open(KERNEL) as source:
        module = SourceModule(source.read(), no_extern_c=True, arch="sm_%d%d" % (major, minor))
    function = module.get_function("gather_slices")
    function.prepare("PqPqqP")
    function.sok1x_module = module
    return function


def measure(backend, timer, kernel, layout, size_gib, dim, repeats, rng):
    """Times the gather from one region laid out as `layout`."""
    import pycuda.driver as driver
    from sok1x.backend.cuda.kernel_launch import launch, ptr
    from sok1x.backend.cuda.staging import allocate_page_locked
    flags = driver.host_alloc_flags.DEVICEMAP
    row_bytes = 4 * dim
    rows = int(size_gib * 2 ** 30) // row_bytes
    rows_per_slice = SLICE_BYTES // row_bytes
    slices = -(-rows // rows_per_slice)
    if layout == "one_block":
        blocks = [allocate_page_locked((rows * row_bytes,), np.uint8, mem_flags=flags)]
        base = blocks[0].base.get_device_pointer()
        pointers = [base + s * SLICE_BYTES for s in range(slices)]
    else:
        blocks = [allocate_page_locked((SLICE_BYTES,), np.uint8, mem_flags=flags)
                  for _ in range(slices)]
        pointers = [block.base.get_device_pointer() for block in blocks]
    table = backend.asarray(np.array(pointers, np.uint64).view(np.int64))
    index = backend.asarray(rng.choice(rows, min(ROWS_PER_CALL, rows),
                                       replace=False).astype(np.int64))
    n, words = int(index.shape[0]), row_bytes // 16
    out = backend.zeros((n, dim), np.float32)

    def gather():
        launch(kernel, n * words, ptr(table), rows_per_slice, ptr(index), n, words, ptr(out))

    ms = timer.time_ms(gather, repeats)
    gib = n * row_bytes / 2 ** 30
    entry = {"layout": layout, "size_gib": size_gib, "dim": dim, "slices": slices,
             "read": dict(harness.summary(ms, ("ms", "ms_min", "ms_max")),
                          gib_per_s=gib / harness.median(ms) * 1e3,
                          gib_per_s_min=gib / max(ms) * 1e3, gib_per_s_max=gib / min(ms) * 1e3)}
    harness.log("%-9s %5.2f GiB (%3d slices) dim %d: read %5.1f GiB/s [%5.1f-%5.1f]" % (
        layout, size_gib, slices, dim, entry["read"]["gib_per_s"],
        entry["read"]["gib_per_s_min"], entry["read"]["gib_per_s_max"]))
    del blocks
    return entry


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=7)
    parser.add_argument("--sizes-gib", default="1,2,4")
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    from sok1x.backend.cuda import context as cuda_context
    timer = harness.StreamTimer(backend)
    rng = harness.seeded_rng()
    results = {"grid": [], "environment": harness.environment()}
    with cuda_context.entered():
        kernel = gather_kernel()
    for size_gib in (float(v) for v in args.sizes_gib.split(",")):
        for layout in ("one_block", "slices"):
            with backend.device_context():
                results["grid"].append(measure(backend, timer, kernel, layout, size_gib,
                                               args.dim, args.repeats, rng))
            harness.release_memory(backend)
            harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
