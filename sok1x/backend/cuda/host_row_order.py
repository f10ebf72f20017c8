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
    BLOCK,
    elements,
    empty,
    exclusive_scan,
    fill_bytes,
    is_split,
    launch,
    memoised_per_context,
    prepared,
    ptr,
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

# The host part is cut into regions of a power of two of rows, each at least REGION_BYTES long
# (SOK1X_HOST_ORDER_REGION_BYTES), at most MAX_REGIONS of them; inside a region the walk is free.
# What counts is how far apart the host rows in flight at once lie: random mapped reads from a
# quarter GiB already run at the ordered rate, from gigabytes at a third of it (bench/NOTES.md).
# Until 2026-11-28 a part was cut into at most 2,045 regions (one scan tile): 8 MiB regions in a
# 12 GiB part.
REGION_BYTES = int(os.environ.get("SOK1X_HOST_ORDER_REGION_BYTES", 256 << 10))
MAX_REGIONS = 1 << 20  # an int64 count and scan entry each: 16 MiB at most
# Blocks of a row kernel that walks a batch in this order (SOK1X_HOST_WALK_BLOCKS): 0, a thread
# for every work item; -1, as launch() sizes any kernel (a grid-stride loop over at most 16
# blocks a multiprocessor); n > 0, at most n. Blocks start in the order of their indices, so a
# grid of a thread an item has a window of the walk in flight, its host rows close together; a
# grid-stride loop's warps drift apart, their host rows in flight spread over the host part.
# A call's 470k host rows in ascending order, 26 KiB apart in a 12 GiB part, read at 26.9 GiB/s
# with a thread a word and at 20.9 in a grid-stride loop (one H200, 2026-11-28, bench/NOTES.md).
WALK_BLOCKS = int(os.environ.get("SOK1X_HOST_WALK_BLOCKS", 0))


@memoised_per_context
def _kernels():
    return (prepared("host_order.cu", "host_region_counts", "PqPqqPqiP"),
            prepared("host_order.cu", "host_region_scatter", "PqPqqPqiPP"))


def _region_shift(host_rows, row_bytes):
    """log2 of the rows per region: the smallest whose regions span REGION_BYTES and number
    fewer than MAX_REGIONS."""
    shift, row_bytes = 0, max(int(row_bytes), 1)
    while (row_bytes << shift) < REGION_BYTES or (host_rows >> shift) >= MAX_REGIONS - 1:
        shift += 1
    return shift


def _region_count(host_rows, shift):
    """Regions a host part of host_rows is cut into, region 0 (no host row) included."""
    return 2 + ((max(host_rows, 1) - 1) >> shift)


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
    shift = _region_shift(host_rows, _row_bytes(table))
    regions = _region_count(host_rows, shift)
    shape = (table_rows, *split_pieces(table, 1), shift, int(bool(zero_negative)))
    counts = fill_bytes(empty((regions,), np.int64), 0)
    launch(counts_kernel, n, ptr(rows), n, count_ptr, *shape, ptr(counts))
    offsets = exclusive_scan(counts, regions)
    order = empty((n,), np.int64)
    # the scatter advances each region's offset to its end: offsets[0] ends where host rows start
    launch(scatter_kernel, n, ptr(rows), n, count_ptr, *shape, ptr(offsets), ptr(order))
    return order, offsets


@contextlib.contextmanager
def _setting(name, value):
    """Inside the block this module's setting `name` is `value`; the one before is restored."""
    before, globals()[name] = globals()[name], value
    try:
        yield
    finally:
        globals()[name] = before


def walked_as_given():
    """Inside the block the row kernels walk every batch as given, as with SOK1X_HOST_ORDER=0
    (the benchmarks' and tests' before/after switch)."""
    return _setting("ENABLED", False)


def regions_of(region_bytes):
    """Inside the block host parts are cut into regions of at least `region_bytes` (as with
    SOK1X_HOST_ORDER_REGION_BYTES; the benchmarks' sweep)."""
    return _setting("REGION_BYTES", int(region_bytes))


def walked_by(blocks):
    """Inside the block the ordered walks launch as WALK_BLOCKS = `blocks` says (0: a thread an
    item, -1: launch()'s grid, n: at most n; as SOK1X_HOST_WALK_BLOCKS; the benchmarks' sweep)."""
    return _setting("WALK_BLOCKS", int(blocks))


def walk_blocks(order, work_items):
    """The `blocks` argument of launch() for a grid-stride row kernel of `work_items` threads
    that walks `order` (host_order's, or None): None (launch() sizes it) without an order, else
    as WALK_BLOCKS says."""
    if order is None or WALK_BLOCKS < 0:
        return None
    blocks = max(1, -(-int(work_items) // BLOCK))
    return min(WALK_BLOCKS, blocks) if WALK_BLOCKS else blocks


def _row_bytes(table):
    return table.dtype.itemsize * elements(table.shape[1:])


def ordered(table):
    """True when the row kernels walk `table`'s batches in host_order's order."""
    if not ENABLED or not is_split(table) or table.hbm_rows >= table.shape[0]:
        return False
    host_rows = int(table.shape[0]) - int(table.hbm_rows)
    row_bytes = _row_bytes(table)
    return row_bytes > 0 and host_rows * row_bytes >= MIN_HOST_BYTES
