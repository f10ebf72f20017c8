"""The victims of a full DynamicVariable shard, chosen on the GPU per bucket by score
(cuda_kernels/eviction.cu; backend/cpu/eviction.py is the NumPy twin, with the docstrings)."""
import numpy as np

from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.kernel_launch import (
    empty,
    fill_bytes,
    index_array,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_view,
)

_WARPS_PER_BLOCK = 8


@memoised_per_context
def _eviction_kernels():
    return {
        "pick": prepared("eviction.cu", "evict_pick", "PQPqqqPPqqPPPP"),
        "stamp": prepared("eviction.cu", "stamp_last_step", "PPqq"),
    }


@uses_context
def stamp_last_step(statistics, rows, step):
    """statistics[row, 0] = step for every row >= 0 of `rows` (queued)."""
    rows = index_array(rows, "rows")
    if rows.shape[0]:
        launch(_eviction_kernels()["stamp"], rows.shape[0], ptr(statistics), ptr(rows),
               rows.shape[0], int(step))


@uses_context
def pick_victims(index, statistics, buckets, starts, bits, step, lfu):
    """As backend/cpu/eviction.py's: (victim_keys, victim_rows, victim_records [m, 2]) int64
    GPUArrays, queued (no wait): one warp per bucket segment, then one warp for the keys whose
    bucket was used up."""
    host_starts = np.asarray(starts, dtype=np.int64)
    m, segments = int(host_starts[-1]), host_starts.shape[0] - 1
    # one upload: the runs' starts, [0, m] (the second pass's one run), the runs' buckets
    joined = index_array(np.concatenate([host_starts, [0, m], np.asarray(buckets, np.int64)]),
                         "starts")
    starts, whole = joined, row_view(joined, segments + 1, segments + 3)
    buckets = row_view(joined, segments + 3, 2 * segments + 3)
    victim_keys = fill_bytes(empty((m,), np.int64), 0xFF)
    victim_rows = fill_bytes(empty((m,), np.int64), 0xFF)
    victim_records = fill_bytes(empty((m, 2), np.int64), 0)
    if m == 0:
        return victim_keys, victim_rows, victim_records
    pick = _eviction_kernels()["pick"]
    common = (ptr(index._slots), index.slot_count, ptr(statistics), int(step), int(bool(lfu)),
              int(bits), ptr(buckets))
    left = fill_bytes(empty((1,), np.uint64), 0)
    outputs = (ptr(left), ptr(victim_keys), ptr(victim_rows), ptr(victim_records))
    blocks = -(-segments // _WARPS_PER_BLOCK)
    launch(pick, 32 * segments, *(common + (ptr(starts), segments, 0) + outputs),
           block=32 * _WARPS_PER_BLOCK, blocks=blocks)
    launch(pick, 32, *(common + (ptr(whole), 1, 1) + outputs), block=32, blocks=1)
    return victim_keys, victim_rows, victim_records
