"""The cuda backend's ops for table groups (engine/lookup/table_group.py), on the kernels of
cuda_kernels/table_groups.cu: several arrays joined in one launch, the bounds of several arrays in
one launch, and the distinct rows of a bounded index in ascending order with their counts per
table in one wait.

A set of arrays travels to a kernel as one small int64 "part list" (addresses, start positions,
offsets). The memory pool hands the same blocks out step after step, so the list is usually the
same as a recent one: its device copy is kept (a few dozen, newest last) and not uploaded again.
"""
import collections

import numpy as np

from sok1x.backend.cuda import context as cuda_context
from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.kernel_launch import (
    BLOCK,
    copy_rows_async,
    device_array,
    elements,
    empty,
    exclusive_scan,
    fill_bytes,
    index_array,
    lane_shift,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_view,
    to_device,
    to_host,
    zeros_and_scan_scratch,
)
from sok1x.backend.cuts import cut_points

_KEPT_LISTS = 64
_uploaded = collections.OrderedDict()  # part list bytes -> its device copy
_BOUNDS_ITEMS = 4  # elements of a part a thread of part_bounds reduces, about
_BOUNDS_START = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min], dtype=np.int64)


@memoised_per_context
def _kernels():
    source = "table_groups.cu"
    return {"join_int64": prepared(source, "join_int64_parts", "PqP"),
            "join_words": prepared(source, "join_word_rows", "PqqPii"),
            "bounds": prepared(source, "part_bounds", "PqqP"),
            "mark": prepared(source, "mark_rows", "PqP"),
            "inverse": prepared(source, "emit_inverse", "PqPPqP"),
            "emit": prepared(source, "emit_distinct_rows", "PPqP"),
            "ranks": prepared(source, "ranks_at", "PPqPqP"),
            "local": prepared(source, "local_rows", "PqPqPP"),
            "mark_below": prepared(source, "mark_rows_below", "PqqP"),
            "padded_inverse": prepared(source, "emit_padded_inverse", "PqqPPqPPqPPP"),
            "emit_padded": prepared(source, "emit_padded_rows", "PPqPPqPPP"),
            "tags": prepared(source, "part_tags", "PqP"),
            "rotate": prepared(source, "rotate_parts", "PPqPPPP"),
            "sequence": prepared(source, "row_sequence", "qqP")}


def device_constant(host_values):
    """A device copy of int64 `host_values`, uploaded once while it stays among the recent."""
    host_values = np.ascontiguousarray(host_values, dtype=np.int64)
    key = host_values.tobytes()
    array = _uploaded.get(key)
    if array is None:
        array = to_device(host_values)
        _uploaded[key] = array
        if len(_uploaded) > _KEPT_LISTS:
            _uploaded.popitem(last=False)
    else:
        _uploaded.move_to_end(key)
        recorder = cuda_context.capture_recorder()
        if recorder is not None:  # a captured graph reads it at every replay: keep it alive
            recorder.append((array, 0))
    return array


def _part_list(arrays, offsets=None):
    """Returns (device part list, total rows) for device arrays joined along axis 0."""
    lengths = [int(a.shape[0]) for a in arrays]
    starts = cut_points(lengths)
    offsets = np.zeros(len(arrays), np.int64) if offsets is None else offsets
    listing = np.concatenate([[ptr(a) for a in arrays], starts,
                              np.asarray(offsets, dtype=np.int64)])
    return device_constant(listing), int(starts[-1])


def _cut_part_list(arrays, cuts, offsets=None):
    """Returns (device part list, parts) for int64 device arrays each cut at host `cuts`
    [P + 1] into P parts (array after array), made from the cuts without a Python object per
    part."""
    cuts = np.asarray(cuts, dtype=np.int64)
    total, parts = int(cuts[-1]), cuts.shape[0] - 1
    addresses = np.concatenate([ptr(a) + 8 * cuts[:-1] for a in arrays])
    starts = np.concatenate([j * total + cuts[:-1] for j in range(len(arrays))]
                            + [[len(arrays) * total]])
    offsets = np.zeros(len(arrays) * parts, np.int64) if offsets is None else offsets
    listing = np.concatenate([addresses, starts, np.asarray(offsets, dtype=np.int64)])
    return device_constant(listing), len(arrays) * parts


@uses_context
def offset_parts(array, cuts, offsets, out=None):
    """Returns int64 [n]: each element of part t of int `array` (cut at host `cuts` [P + 1])
    plus host offsets[t], in one launch (into `out`, int64 [n], where given)."""
    return offset_parts_many([array], cuts, [offsets], out)[0]


@uses_context
def offset_parts_many(arrays, cuts, offsets, out=None):
    """offset_parts() of several int arrays of one length cut at the same host `cuts`, array j
    with host offsets[j] [P]: returns int64 [n] each (views of one output, `out` where given:
    int64 [arrays * n]), in one launch."""
    arrays = [index_array(a, "keys") for a in arrays]
    n = int(arrays[0].shape[0]) if arrays else 0
    if out is None:
        out = empty((len(arrays) * n,), np.int64)
    elif out.dtype != np.int64 or tuple(out.shape) != (len(arrays) * n,):
        raise ValueError("offset_parts: %d rows into a %s %s array" % (
            len(arrays) * n, out.dtype, list(out.shape)))
    if n:
        parts, count = _cut_part_list(arrays, cuts, np.concatenate(
            [np.asarray(o, dtype=np.int64) for o in offsets]))
        launch(_kernels()["join_int64"], out.shape[0], ptr(parts), count, ptr(out))
    return [row_view(out, j * n, (j + 1) * n) for j in range(len(arrays))]


@uses_context
def rotate_parts(out, before, cuts, back, back_cuts, counts):
    """Writes into int64 `out` each part t of int64 `before` (both cut at host `cuts` [P + 1])
    rotated by k = counts[t] (device int64 [P], clamped to the part's length): the part from
    row k on, then the first k rows of part t of int64 `back` (cut at host `back_cuts`). One
    launch, no wait; `out` and `before` must not overlap."""
    cuts = np.asarray(cuts, dtype=np.int64)
    if int(cuts[-1]):
        launch(_kernels()["rotate"], int(cuts[-1]), ptr(index_array(before, "keys")),
               ptr(device_constant(cuts)), cuts.shape[0] - 1, ptr(index_array(back, "keys")),
               ptr(device_constant(back_cuts)), ptr(index_array(counts, "keys")), ptr(out))


@uses_context
def row_sequence(first, stop):
    """Returns int64 [stop - first]: first, first + 1, ..., stop - 1, written on the device
    (no upload)."""
    out = empty((max(int(stop) - int(first), 0),), np.int64)
    if out.shape[0]:
        launch(_kernels()["sequence"], out.shape[0], int(first), out.shape[0], ptr(out))
    return out


@uses_context
def part_tags(cuts):
    """Returns int64 [cuts[-1]]: the part t of each position of an array cut at host `cuts`
    [P + 1] (a hash group's member of each key), in one launch."""
    cuts = np.asarray(cuts, dtype=np.int64)
    tags = empty((int(cuts[-1]),), np.int64)
    if tags.shape[0]:
        launch(_kernels()["tags"], tags.shape[0], ptr(device_constant(cuts)), cuts.shape[0] - 1,
               ptr(tags))
    return tags


@uses_context
def part_bounds(arrays, cuts):
    """Returns host int64 [len(arrays) * P, 2]: (min, max) of each part of each array (cut at
    host `cuts` [P + 1]), (INT64_MAX, INT64_MIN) for an empty part: one launch, one wait."""
    return to_host(part_bounds_deferred(arrays, cuts))


@uses_context
def part_bounds_deferred(arrays, cuts):
    """part_bounds() left on the device (int64 GPUArray [len(arrays) * P, 2])."""
    arrays = [index_array(a, "indices") for a in arrays]
    count = len(arrays) * (len(cuts) - 1)
    bounds = empty((max(count, 1), 2), np.int64)
    if not count:
        return row_view(bounds, 0, 0)
    starts = device_constant(np.tile(_BOUNDS_START, (count, 1)).reshape(-1))
    copy_rows_async(bounds, 0, starts, 0, count)  # rows of 2 int64 on both sides
    total = sum(int(a.shape[0]) for a in arrays)
    if total:
        parts, count = _cut_part_list(arrays, cuts)
        _launch_bounds(parts, count, total, bounds)
    return bounds


def _launch_bounds(parts, count, total, bounds):
    """part_bounds over a part list of `count` parts of `total` elements: enough blocks a part
    that each thread reduces about _BOUNDS_ITEMS elements of a part of average length (a longer
    part's threads reduce more)."""
    per_part = max(1, -(-total // (count * BLOCK * _BOUNDS_ITEMS)))
    launch(_kernels()["bounds"], 0, ptr(parts), count, per_part, ptr(bounds),
           blocks=count * per_part)


@uses_context
def join_keys(arrays, offsets):
    """Returns int64 [sum n_t]: each int array t plus offsets[t], joined in order, in one
    launch (int32 parts are widened first)."""
    arrays = [index_array(a, "keys") for a in arrays]
    parts, total = _part_list(arrays, offsets)
    out = empty((total,), np.int64)
    if total:
        launch(_kernels()["join_int64"], total, ptr(parts), len(arrays), ptr(out))
    return out


@uses_context
def join_rows(arrays):
    """Returns float32 [sum n_t, *row]: the float32 arrays joined along axis 0, in one launch."""
    arrays = [device_array(a, "rows", np.float32) for a in arrays]
    row_shape = tuple(arrays[0].shape[1:])
    width = elements(row_shape)
    parts, total = _part_list(arrays)
    out = empty((total,) + row_shape, np.float32)
    if total and width:
        # 16 bytes a load where every row starts 16-byte aligned (a part's view may not; an
        # empty part is read from nowhere)
        aligned = not (ptr(out) % 16 or any(ptr(a) % 16 for a in arrays if a.size))
        vector = 4 if width % 4 == 0 and aligned else 1
        shift = lane_shift(width // vector)
        launch(_kernels()["join_words"], total << shift, ptr(parts), len(arrays), width, ptr(out),
               shift, vector)
    return out


@uses_context
def index_bounds(arrays):
    """Returns host int64 [len(arrays), 2]: (min, max) of each integer array, (INT64_MAX,
    INT64_MIN) for an empty one: one launch and one wait for all of them."""
    if not arrays:
        return np.zeros((0, 2), np.int64)
    return to_host(index_bounds_deferred(arrays))


@uses_context
def index_bounds_deferred(arrays):
    """index_bounds() left on the device (int64 GPUArray [len(arrays), 2]), for the host to
    read with other sizes in one wait."""
    count = len(arrays)
    arrays = [index_array(a, "indices") for a in arrays]
    bounds = empty((max(count, 1), 2), np.int64)
    if not count:
        return row_view(bounds, 0, 0)
    starts = device_constant(np.tile(_BOUNDS_START, (count, 1)).reshape(-1))
    copy_rows_async(bounds, 0, starts, 0, count)  # rows of 2 int64 on both sides
    parts, total = _part_list(arrays)
    if total:
        _launch_bounds(parts, count, total, bounds)
    return bounds


@uses_context
def distinct_rows_many(items):
    """items: (rows int64 [n] in [0, bound), bound, boundaries host int64 [k] ascending in
    [0, bound], the last one bound). Returns per item (distinct rows ascending [u], inverse [n],
    host int64 [k]: how many distinct rows lie below each boundary), with one wait for all
    items."""
    started, sizes = distinct_rows_many_start(items)
    return distinct_rows_many_finish(started, to_host(sizes))


@uses_context
def distinct_rows_many_start(items):
    """The first half of distinct_rows_many(), queued without a wait: returns (started, sizes),
    sizes an int64 GPUArray for the host to read (alone, or with an op header) and hand to
    distinct_rows_many_finish(started, host_sizes)."""
    kernels = _kernels()
    states, spans, position = [], [], 0
    for rows, bound, boundaries in items:
        rows = index_array(rows, "rows")
        boundaries = np.asarray(boundaries, dtype=np.int64)
        words = (int(bound) + 31) // 32 + 1
        bits, scratch = zeros_and_scan_scratch(words, np.uint32, words)
        if rows.shape[0]:
            launch(kernels["mark"], rows.shape[0], ptr(rows), rows.shape[0], ptr(bits))
        word_ranks = exclusive_scan(bits, words, scratch, popcounts=True)
        states.append((rows, bits, word_ranks, words))
        spans.append((position, boundaries.shape[0]))
        position += boundaries.shape[0]
    ranks = empty((max(position, 1),), np.int64)
    for (_, bits, word_ranks, words), (start, count), (_, _, boundaries) in zip(
            states, spans, items):
        if count:
            launch(kernels["ranks"], count, ptr(bits), ptr(word_ranks), words,
                   ptr(device_constant(boundaries)), count, ptr(ranks) + 8 * start)
    return (states, spans), row_view(ranks, 0, position)


@uses_context
def distinct_rows_many_finish(started, host_ranks):
    """The second half of distinct_rows_many(): host_ranks, the host copy of the start's
    sizes. Returns per item (distinct, inverse, host ranks)."""
    kernels = _kernels()
    states, spans = started
    out = []
    for (rows, bits, word_ranks, words), (start, count) in zip(states, spans):
        n = rows.shape[0]
        total = int(host_ranks[start + count - 1]) if count else 0
        distinct, inverse = empty((total,), np.int64), empty((n,), np.int64)
        if n:
            launch(kernels["inverse"], n, ptr(rows), n, ptr(bits), ptr(word_ranks), words,
                   ptr(inverse))
            launch(kernels["emit"], words, ptr(bits), ptr(word_ranks), words, ptr(distinct))
        out.append((distinct, inverse, np.asarray(host_ranks[start:start + count]).copy()))
    return out


@uses_context
def distinct_rows_padded(rows, bound, row_starts, piece_starts, counted=False):
    """The distinct rows of `rows` (int64 [n], any values) laid out in pieces sized before the
    step, queued without a wait: the rows in [row_starts[t], row_starts[t + 1]) ascending in
    piece t, from piece_starts[t] on (host int64 [T + 1] both). Returns (flat, local, inverse):
    flat and local int64 [piece_starts[-1]], each row and the row less its range's start, -1
    where no row is; inverse int64 [n], each row's place, -1 for a row outside [0, bound) or
    one that does not fit its piece; counted: and a fourth, for one segment_sum(..., counts)
    of this inverse, which consumes it: the pair (how many rows have each place, int64
    [piece_starts[-1]]; the zeroed scratch of their scan, or None where the scan needs none),
    counted by the pass that finds the places (wasted where that sum goes by add_rows: too
    few ids or too narrow rows for its sorted path)."""
    kernels = _kernels()
    rows = index_array(rows, "rows")
    starts = np.asarray(row_starts, dtype=np.int64)
    pieces = np.asarray(piece_starts, dtype=np.int64)
    n, count, length = rows.shape[0], starts.shape[0] - 1, int(pieces[-1])
    flat = fill_bytes(empty((length,), np.int64), 0xFF)
    local = fill_bytes(empty((length,), np.int64), 0xFF)
    inverse = empty((n,), np.int64)
    counts = zeros_and_scan_scratch(length, np.int64, length) if counted else None
    if not n:
        return (flat, local, inverse, counts) if counted else (flat, local, inverse)
    words = (int(bound) + 31) // 32 + 1
    bits, scratch = zeros_and_scan_scratch(words, np.uint32, words)
    launch(kernels["mark_below"], n, ptr(rows), n, int(bound), ptr(bits))
    word_ranks = exclusive_scan(bits, words, scratch, popcounts=True)
    first_ranks = empty((count,), np.int64)
    launch(kernels["ranks"], count, ptr(bits), ptr(word_ranks), words,
           ptr(device_constant(starts[:-1])), count, ptr(first_ranks))
    row_starts, piece_starts = ptr(device_constant(starts)), ptr(device_constant(pieces))
    launch(kernels["padded_inverse"], n, ptr(rows), n, int(bound), ptr(bits), ptr(word_ranks),
           words, row_starts, piece_starts, count, ptr(first_ranks), ptr(inverse),
           ptr(counts[0]) if counted else 0)
    launch(kernels["emit_padded"], words, ptr(bits), ptr(word_ranks), words, row_starts,
           piece_starts, count, ptr(first_ranks), ptr(flat), ptr(local))
    return (flat, local, inverse, counts) if counted else (flat, local, inverse)


@uses_context
def local_rows(rows, row_starts, moves, length):
    """Returns int64 [length]: for distinct rows ascending, out[i + moves[t]] = rows[i] -
    row_starts[t] for the range t (row_starts: host int64 [T + 1]) holding rows[i]; moves: host
    int64 [T], how far table t's piece moves (to start at an aligned place); places between
    pieces are left as they are."""
    rows = index_array(rows, "rows")
    starts = np.asarray(row_starts, dtype=np.int64)
    out = empty((int(length),), np.int64)
    if rows.shape[0]:
        launch(_kernels()["local"], rows.shape[0], ptr(rows), rows.shape[0],
               ptr(device_constant(starts)), starts.shape[0] - 1,
               ptr(device_constant(moves)), ptr(out))
    return out
