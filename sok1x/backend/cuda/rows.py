"""Row movement on the GPU (cuda_kernels/rows.cu): take_rows, gather_rows and put_rows, on
GPUArrays or split (hybrid) arrays, whose host rows the kernels walk in host_order's order."""

import numpy as np

from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.host_row_order import host_order, walk_blocks
from sok1x.backend.cuda.kernel_launch import (
    device_array,
    elements,
    empty,
    index_array,
    is_split,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_bases,
    split_args,
)

_ROW_WORDS = (16, 8, 4, 1)  # bytes per word of the row copy kernels, widest first
# what take_rows (rows.cu) makes of a negative index: counted from the end (NumPy's rule), a
# zero row, or no write at all (a place no one reads)
_FROM_END, _ZERO_ROW, _UNWRITTEN = 0, 1, 2


def _row_shape(array, what):
    """Returns (shape of one row, bytes of one row) of an array indexed along axis 0."""
    if array.ndim < 1:
        raise TypeError("%s must have at least one dimension" % what)
    row_shape = tuple(array.shape[1:])
    return row_shape, array.dtype.itemsize * elements(row_shape)


def _word_bytes(row_bytes, *arrays):
    bases = [base for array in arrays for base in row_bases(array)]
    for word in _ROW_WORDS:
        if row_bytes % word == 0 and all(base % word == 0 for base in bases):
            return word
    return 1


@memoised_per_context
def _row_copy_kernels(word_bytes):
    """(take, put) kernels moving rows in words of `word_bytes` bytes; the table side is a
    SplitRows (PPqP), then the order (P, 0 for none)."""
    suffix = "w%d" % word_bytes
    return (prepared("rows.cu", "take_rows_" + suffix, "PPqPqPqqiPP"),
            prepared("rows.cu", "put_rows_" + suffix, "PPqPqPqqPP"),
            prepared("rows.cu", "move_rows_" + suffix, "PPPPqq"))


def _row_table(array, what):
    """A row table argument: a split array (read in place, both parts) or a device array."""
    return array if is_split(array) else device_array(array, what)


def _order_ptr(order):
    return 0 if order is None else ptr(order)


def _take(array, index, negative):
    array = _row_table(array, "array")
    index = index_array(index, "index")
    row_shape, row_bytes = _row_shape(array, "array")
    out = empty((index.shape[0],) + row_shape, array.dtype)
    if out.size:
        word = _word_bytes(row_bytes, array, out)
        take = _row_copy_kernels(word)[0]
        words_per_row = row_bytes // word
        order = host_order(array, index, negative != _FROM_END)  # held until the launch
        work = index.shape[0] * words_per_row
        launch(take, work, *split_args(array, words_per_row),
               array.shape[0], ptr(index), index.shape[0], words_per_row, negative,
               ptr(out), _order_ptr(order), blocks=walk_blocks(order, work))
    return out


@uses_context
def take_rows(array, index):
    """Returns array[index] along axis 0 (negative indices count from the end, as in NumPy)."""
    return _take(array, index, _FROM_END)


@uses_context
def gather_rows(table, rows, fill=True):
    """Returns table[rows] with a zero vector where rows == -1 (fill=False: such places are left
    unwritten, for a gather whose -1 places no one reads); table may be a split array."""
    return _take(table, rows, _ZERO_ROW if fill else _UNWRITTEN)


@memoised_per_context
def _gather_many_kernel():
    return prepared("rows.cu", "gather_rows_many_w16", "PPPP" + "PPPP" + "iqPqqi")


_GATHER_MANY = 4  # rows.cu's GATHER_MANY: the arrays one launch gathers


@uses_context
def gather_rows_many(tables, rows, fill=True):
    """[gather_rows(table, rows, fill) for table in tables]: tables of one dtype, row shape and
    row count; up to _GATHER_MANY of them in device memory whose rows are whole 16-byte words
    take one launch (the index read once for all: an eviction's victims' vectors and slots),
    any other set one gather each."""
    tables = list(tables)
    if not tables:
        return []
    first = tables[0]
    fits = (len(tables) <= _GATHER_MANY and not any(is_split(t) for t in tables)
            and first.ndim >= 1 and all(t.dtype == first.dtype and t.shape == first.shape
                                        for t in tables))
    if fits:  # (new arrays from the pool start 256-byte aligned: the tables decide the words)
        arrays = [device_array(t, "table") for t in tables]
        row_shape, row_bytes = _row_shape(first, "table")
        fits = _word_bytes(row_bytes, *arrays) == 16
    if not fits:
        return [gather_rows(t, rows, fill) for t in tables]
    index = index_array(rows, "rows")
    outs = [empty((index.shape[0],) + row_shape, first.dtype) for _ in arrays]
    words_per_row = row_bytes // 16
    work = int(index.shape[0]) * words_per_row
    if work:
        spare = [0] * (_GATHER_MANY - len(arrays))
        launch(_gather_many_kernel(), work, *[ptr(a) for a in arrays], *spare,
               *[ptr(o) for o in outs], *spare, len(arrays), int(first.shape[0]), ptr(index),
               int(index.shape[0]), words_per_row, _ZERO_ROW if fill else _UNWRITTEN)
    return outs


@uses_context
def put_rows(dst, index, src):
    """dst[index] = src along axis 0 (`index` has no repeats); dst may be a split array."""
    dst = _row_table(dst, "dst")
    index = index_array(index, "index")
    src = device_array(src, "src", dst.dtype)
    row_shape, row_bytes = _row_shape(dst, "dst")
    if src.shape != (index.shape[0],) + row_shape:
        raise ValueError("put_rows: src has shape %s, expected %s" % (
            src.shape, (index.shape[0],) + row_shape))
    if src.size:
        word = _word_bytes(row_bytes, dst, src)
        put = _row_copy_kernels(word)[1]
        words_per_row = row_bytes // word
        order = host_order(dst, index)  # held until the launch is queued
        work = index.shape[0] * words_per_row
        launch(put, work, *split_args(dst, words_per_row),
               dst.shape[0], ptr(index), index.shape[0], words_per_row, ptr(src),
               _order_ptr(order), blocks=walk_blocks(order, work))


@uses_context
def move_rows(src, src_index, dst, dst_index):
    """dst[dst_index[i]] = src[src_index[i]] along axis 0 for every i where both indices are >= 0
    (device arrays of one dtype and row shape; dst_index without repeats among those i): packs
    rows into a per-peer capacity buffer and back out (lookup/peer_capacity.py). In place."""
    src = device_array(src, "src")
    dst = device_array(dst, "dst", src.dtype)
    src_index, dst_index = index_array(src_index, "src_index"), index_array(dst_index, "dst_index")
    row_shape, row_bytes = _row_shape(src, "src")
    if tuple(dst.shape[1:]) != row_shape or src_index.shape != dst_index.shape:
        raise ValueError("move_rows: rows of %s into %s by %d and %d indices" % (
            src.shape, dst.shape, src_index.shape[0], dst_index.shape[0]))
    n = int(src_index.shape[0])
    if n and row_bytes:
        word = _word_bytes(row_bytes, src, dst)
        words_per_row = row_bytes // word
        launch(_row_copy_kernels(word)[2], n * words_per_row, ptr(src), ptr(src_index),
               ptr(dst), ptr(dst_index), n, words_per_row)


@memoised_per_context
def _drop_kernel():
    return prepared("rows.cu", "drop_rows_if_failed", "PqPPq")


@uses_context
def drop_rows_if_failed(rows, flag, parts=None):
    """rows[:] = -1 (int64, in place), queued, where the device finds the step failed when the
    work runs: flag (int64 [1], a step's key checks) is not 0, or parts (None, or int64 [T]:
    each member's new keys left without a victim) holds a count above 0. What a replayed
    update runs first, so that a step whose checks fail updates no row."""
    rows = device_array(rows, "rows", np.int64)
    n = int(rows.shape[0])
    if n:
        launch(_drop_kernel(), n, ptr(rows), n, ptr(device_array(flag, "flag", np.int64)),
               0 if parts is None else ptr(device_array(parts, "parts", np.int64)),
               0 if parts is None else int(parts.shape[0]))
