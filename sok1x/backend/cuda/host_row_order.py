"""The order in which the row kernels walk a batch of a split (hybrid) table's rows: device rows
first, then host rows region by region in ascending address order (cuda_kernels/host_order.cu
says why: random mapped reads over gigabytes of host memory run at a third of the ordered rate).

host_order() gives the order for take_rows, put_rows and init_rows (their `order` argument), and
the optimizer updates permute their rows and gradients by it (cuda_optimizers). No result
changes: rows are distinct wherever order matters, and a gather writes each position's own row.
A table that is not split gets no order (None) and the kernels walk the batch as given.
"""
import contextlib
import os

import numpy as np

from sok1x.backend.cuda.kernel_launch import (
    elements,
    empty,
    exclusive_scan,
    fill_bytes,
    is_split,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    SCAN_TILE,
    split_pieces,
)

# SOK1X_HOST_ORDER=0 walks split tables' batches as given (the benchmarks' before/after switch).
ENABLED = os.environ.get("SOK1X_HOST_ORDER", "1") != "0"
# Host parts smaller than this are walked as given: random mapped reads from a quarter GiB run
# at the ordered rate already (one H100, bench/NOTES.md), and a small part is not worth the
# order's launches (dlrm_dynamic's step, whose host part is 0.3 GiB, ran 3-8% slower ordered).
# SOK1X_HOST_ORDER_MIN_BYTES changes it (tests/gpu/run_all.sh: 0, so every split table of the GPU
# tests is ordered).
MIN_HOST_BYTES = int(os.environ.get("SOK1X_HOST_ORDER_MIN_BYTES", 512 << 20))

# Regions, region 0 (device rows) included: one scan tile, so the scan is one launch. A region is
# a power of two of rows, the smallest that cuts the host part into at most 2,045 of them (a
# 2 GiB part of 256-byte rows: 1,024 regions of 2 MiB); the rate of random reads inside a quarter
# GiB is already the ordered one (bench/NOTES.md), so coarse regions lose nothing that matters.
_REGIONS = SCAN_TILE - 1


@memoised_per_context
def _kernels():
    return (prepared("host_order.cu", "host_region_counts", "PqPqqPqiP"),
            prepared("host_order.cu", "host_region_scatter", "PqPqqPqiPP"))


def _region_shift(host_rows):
    """log2 of the rows per region: the smallest that cuts host_rows into _REGIONS - 1 regions."""
    shift = 0
    while (host_rows >> shift) >= _REGIONS - 1:
        shift += 1
    return shift


def host_order(table, rows, zero_negative=False, count_ptr=0):
    """Returns the order (an int64 GPUArray [len(rows)], a permutation of the positions) in which
    to walk `rows` of `table`, or None when the table is not split, its host part is smaller than
    MIN_HOST_BYTES or ordering is off. rows: a checked int64 GPUArray; zero_negative: a negative
    row names no row (a gather's zero row), else it counts from the end; count_ptr: 0, or the
    address of a uint64 device count of the leading rows that name rows (the rest go among the
    device rows, in any order). Queued, no wait."""
    ordered = host_order_and_start(table, rows, zero_negative, count_ptr)
    return None if ordered is None else ordered[0]


def host_order_and_start(table, rows, zero_negative=False, count_ptr=0):
    """host_order()'s order and where its host rows start: (order, start), start an int64
    GPUArray whose first element is the number of positions before the first host row; or
    None as host_order gives None."""
    n = rows.shape[0]
    if not ordered(table) or n == 0:
        return None
    table_rows, host_rows = int(table.shape[0]), int(table.shape[0]) - int(table.hbm_rows)
    counts_kernel, scatter_kernel = _kernels()
    shape = (table_rows, *split_pieces(table, 1), _region_shift(host_rows),
             int(bool(zero_negative)))
    counts = fill_bytes(empty((_REGIONS,), np.int64), 0)
    launch(counts_kernel, n, ptr(rows), n, count_ptr, *shape, ptr(counts))
    offsets = exclusive_scan(counts, _REGIONS)
    order = empty((n,), np.int64)
    # the scatter advances each region's offset to its end: offsets[0] ends where host rows start
    launch(scatter_kernel, n, ptr(rows), n, count_ptr, *shape, ptr(offsets), ptr(order))
    return order, offsets


@contextlib.contextmanager
def walked_as_given():
    """Inside the block the row kernels walk every batch as given, as with SOK1X_HOST_ORDER=0
    (the benchmarks' and tests' before/after switch); the setting before it is restored after."""
    global ENABLED
    before, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = before


def ordered(table):
    """True when the row kernels walk `table`'s batches in host_order's order."""
    if not ENABLED or not is_split(table) or table.hbm_rows >= table.shape[0]:
        return False
    host_rows = int(table.shape[0]) - int(table.hbm_rows)
    row_bytes = table.dtype.itemsize * elements(table.shape[1:])
    return row_bytes > 0 and host_rows * row_bytes >= MIN_HOST_BYTES
