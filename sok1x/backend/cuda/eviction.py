"""The victims of full DynamicVariable shards, chosen on the GPU per bucket by score for every
member of a table group at once (cuda_kernels/eviction.cu; backend/cpu/eviction.py is the NumPy
twin, with the docstrings)."""
import numpy as np

from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.kernel_launch import (
    empty,
    exclusive_scan,
    fill_bytes,
    index_array,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_view,
    to_device,
)

_WARPS_PER_BLOCK = 8


@memoised_per_context
def _eviction_kernels():
    return {
        "counts": prepared("eviction.cu", "evict_bucket_counts", "PPPPqP"),
        "scatter": prepared("eviction.cu", "evict_bucket_scatter", "PPPPqPPPP"),
        "distinct": prepared("eviction.cu", "evict_bucket_distinct", "PqPPP"),
        "pick": prepared("eviction.cu", "evict_pick", "PqPqPqqPPPP"),
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
def pick_victims(indexes, statistics, row_starts, keys, tags, found, counts, bits, step, lfu):
    """As backend/cpu/eviction.py's: (victim_keys, victim_rows, victim_records [m, 2]) int64
    GPUArrays, queued (no wait). Sized by the keys and the host's counts: a segment per bucket
    of each evicting member (2^bits of them, about a 64th of its rows), then one warp per
    segment and one per member for the keys whose bucket was used up."""
    counts = np.asarray(counts, dtype=np.int64)
    bits = np.asarray(bits, dtype=np.int64)
    m = int(counts.sum())
    victim_keys = fill_bytes(empty((m,), np.int64), 0xFF)
    victim_rows = fill_bytes(empty((m,), np.int64), 0xFF)
    victim_records = fill_bytes(empty((m, 2), np.int64), 0)
    keys, tags, found = (index_array(a, what) for a, what in
                         ((keys, "keys"), (tags, "tags"), (found, "found")))
    n = keys.shape[0]
    if m == 0 or n == 0:
        return victim_keys, victim_rows, victim_records
    segments = np.where(counts > 0, np.left_shift(1, bits), 0)
    first_segment = np.concatenate([[0], np.cumsum(segments)[:-1]])
    first_victim = np.concatenate([[0], np.cumsum(counts)[:-1]])
    listing = np.array([[int(index._slots.gpudata), index.slot_count, int(start), int(b),
                         int(c), int(v), int(s), int(bool(f))]
                        for index, start, b, c, v, s, f in zip(
                            indexes, row_starts, bits, counts, first_victim, first_segment,
                            lfu)], dtype=np.int64)
    members = to_device(listing.reshape(-1))
    total = int(segments.sum())
    kernels = _eviction_kernels()
    # per segment: new keys, places taken, distinct keys; then the pick's counter
    zeroed = fill_bytes(empty((3 * total + 1,), np.int64), 0)
    counted, taken = row_view(zeroed, 0, total), row_view(zeroed, total, 2 * total)
    distinct = row_view(zeroed, 2 * total, 3 * total)
    left = ptr(zeroed) + 8 * 3 * total
    common = (ptr(members), ptr(keys), ptr(tags), ptr(found), n)
    launch(kernels["counts"], n, *common, ptr(counted))
    starts = exclusive_scan(counted, total)
    entry_keys, entry_segments = empty((n,), np.int64), empty((n,), np.int64)
    launch(kernels["scatter"], n, *common, ptr(starts), ptr(taken), ptr(entry_keys),
           ptr(entry_segments))
    launch(kernels["distinct"], n, ptr(starts), total, ptr(entry_keys), ptr(entry_segments),
           ptr(distinct))
    distinct_starts = exclusive_scan(distinct, total)
    outputs = (left, ptr(victim_keys), ptr(victim_rows), ptr(victim_records))
    head = (ptr(members), len(indexes), ptr(statistics), int(step), ptr(distinct_starts))
    for items, rest in ((total, 0), (len(indexes), 1)):
        blocks = -(-items // _WARPS_PER_BLOCK)
        launch(kernels["pick"], 32 * items, *(head + (items, rest) + outputs),
               block=32 * _WARPS_PER_BLOCK, blocks=blocks)
    return victim_keys, victim_rows, victim_records
