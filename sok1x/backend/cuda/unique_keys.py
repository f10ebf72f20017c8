"""unique() on the GPU (cuda_kernels/unique.cu), whole or in two halves around the host's wait
for the distinct counts, so an op header can read those counts with its own (unique_many_start,
then unique_many_finish with the host counts, or unique_many_padded without them)."""
import numpy as np

from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.kernel_launch import (
    copy_rows_async,
    empty,
    exclusive_scan,
    fill_bytes,
    index_array,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_view,
    to_host,
)


@memoised_per_context
def _unique_kernels():
    return (prepared("unique.cu", "unique_claim", "PqPPQP"),
            prepared("unique.cu", "unique_flags", "PPqP"),
            prepared("unique.cu", "unique_emit", "PPPPqPP"),
            prepared("unique.cu", "unique_inverse", "PPqP"),
            prepared("unique.cu", "unique_claim_tagged", "PPqPPQP"))


@uses_context
def unique(keys, ordered=True):
    """Returns (unique_keys, inverse): distinct int64 keys in first-occurrence order (tf.unique;
    also with ordered=False, which allows any order) and, per key, its position in unique_keys.
    Waits for the number of distinct keys."""
    return unique_many([keys], ordered)[0]


@uses_context
def unique_many(keys_list, ordered=True):
    """unique() of each array of `keys_list`, with one wait for all their distinct counts (a
    fused lookup of many tables waits once, not once per table). Returns a list of pairs."""
    started, counts = unique_many_start(keys_list, ordered)
    return unique_many_finish(started, to_host(counts))


@uses_context
def unique_many_start(keys_list, ordered=False, tags_list=None):
    """The first half of unique_many(), queued without a wait: returns (started, counts), counts
    an int64 GPUArray [len(keys_list)] of distinct counts for the host to read (alone, or with
    an op header) and pass to unique_many_finish(started, host_counts). tags_list: None, or per
    array None or int64 tags [n] (a hash group's members): its keys are de-duplicated per
    (tag, key) (the scratch table's slots hold a position, whose key and tag a key matches)."""
    claim, flags, _, _, claim_tagged = _unique_kernels()
    arrays = [index_array(keys, "keys") for keys in keys_list]
    tags_list = tags_list or [None] * len(arrays)
    counts = fill_bytes(empty((max(len(arrays), 1),), np.int64), 0)
    pending = []
    for i, (keys, tags) in enumerate(zip(arrays, tags_list)):
        n = keys.shape[0]
        if n == 0:
            pending.append(None)
            continue
        slot_count = 2 * n + 32
        slot_keys = fill_bytes(empty((slot_count,), np.int64), 0xFF)
        slot_first = fill_bytes(empty((slot_count,), np.int64), 0x7F)
        slot_of = empty((n,), np.int64)
        if tags is None:
            launch(claim, n, ptr(keys), n, ptr(slot_keys), ptr(slot_first), slot_count,
                   ptr(slot_of))
        else:
            tags = index_array(tags, "tags")
            launch(claim_tagged, n, ptr(keys), ptr(tags), n, ptr(slot_keys), ptr(slot_first),
                   slot_count, ptr(slot_of))
        is_first = empty((n,), np.int64)
        launch(flags, n, ptr(slot_of), ptr(slot_first), n, ptr(is_first))
        positions = exclusive_scan(is_first, n)
        copy_rows_async(counts, i, positions, n, 1)
        pending.append((slot_first, slot_of, is_first, positions))
    return (arrays, pending), row_view(counts, 0, len(arrays))


@uses_context
def unique_many_finish(started, host_counts):
    """The second half of unique_many(): host_counts, the host copy of unique_many_start's
    counts. Returns the list of (unique_keys, inverse)."""
    return _unique_emit(started, host_counts)


@uses_context
def unique_many_padded(started):
    """The second half of unique_many() without the counts: returns the list of (unique_keys,
    inverse), unique_keys as long as the keys, the first counts[i] of them meaningful (the
    start's device counts say how many; bucket_by_owner_many_deferred takes them)."""
    return _unique_emit(started, None)


def _unique_emit(started, host_counts):
    _, _, emit, inverse_kernel, _ = _unique_kernels()
    arrays, pending = started
    results = []
    for i, (keys, state) in enumerate(zip(arrays, pending)):
        if state is None:
            results.append((empty((0,), np.int64), empty((0,), np.int64)))
            continue
        slot_first, slot_of, is_first, positions = state
        n = keys.shape[0]
        unique_keys = empty((n if host_counts is None else int(host_counts[i]),),
                                    np.int64)
        launch(emit, n, ptr(keys), ptr(slot_of), ptr(is_first), ptr(positions), n,
               ptr(unique_keys), ptr(slot_first))
        inverse = empty((n,), np.int64)
        launch(inverse_kernel, n, ptr(slot_of), ptr(slot_first), n, ptr(inverse))
        results.append((unique_keys, inverse))
    return results
