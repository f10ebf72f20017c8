"""Runs each kernel of a training step once at a benchmark size, for Nsight Compute:

    ncu --clock-control none --section SpeedOfLight --section Occupancy \
        -k regex:'take_rows|add_rows|hash_|unique_claim|owner_|update_lazy' \
        python3 bench/profile_kernels.py [--candidate bench/kernels/rows_candidate.cu]

Order of launches (the report lists them in this order): gather dim 16 and 128, scatter-add dim 16
and 128 (each current, then candidate when given), then on a 2^24-slot table at load 0.5 with 1M
keys (60% held): hash_count_missing, hash_find_or_insert, hash_find; unique of 1M owner rows;
bucket_by_owner of 1M keys over 4 owners; the LazyAdam update of 1M rows of dim 128.
"""
import sys

import numpy as np

import harness
import hash_table
import rows as rows_bench


def main(argv):
    parser = harness.parser(__doc__)
    parser.add_argument("--candidate", default=None)
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    rng = np.random.default_rng(2)
    variants = [backend]
    if args.candidate:
        variants.append(rows_bench.RowKernels(args.candidate))
    for dim, table_rows in ((16, 1 << 22), (128, 1 << 21)):
        n = (128 << 20) // (4 * dim)
        table = rows_bench.random_table(backend, table_rows, dim, 1)
        index = backend.asarray(rng.integers(0, table_rows, size=n))
        values = rows_bench.random_table(backend, n, dim, 2)
        for ops in variants:
            ops.gather_rows(table, index)
        for ops in variants:
            ops.scatter_add_rows(table, index, values)
        backend.synchronize()
        del table, index, values
    slots, n = 1 << 24, 1 << 20
    index = hash_table.new_index(backend, slots)
    hash_table.fill(backend, index, slots // 2)
    finds, inserts = hash_table.query_sets(slots // 2, n, rng, sets=1)
    index.find_or_insert(backend.asarray(inserts[0]))
    index.find(backend.asarray(finds[0]))
    backend.unique(backend.asarray(rng.integers(0, 1 << 22, size=n)))
    backend.bucket_by_owner(backend.asarray(rng.integers(0, 1 << 40, size=n)), 4)
    from sok1x.backend.cuda import optimizers as cuda_optimizers
    dim = 128
    var = rows_bench.random_table(backend, 1 << 22, dim, 3)
    m, v = backend.zeros(var.shape, np.float32), backend.zeros(var.shape, np.float32)
    update_rows = backend.asarray(rng.choice(1 << 22, size=n, replace=False))
    grads = rows_bench.random_table(backend, n, dim, 4)
    cuda_optimizers.update_lazy_adam(var, m, v, update_rows, grads, 1e-3, 0.9, 0.999, 1e-8)
    backend.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
