"""New rows' initial values on the device (cuda_kernels/random_init.cu, DESIGN D10): a table's
(init_rows) and a hash group's flat rows (init_rows_tagged), each value a function of (seed,
table id, key, column) alone, as the cpu backend's NumPy twin computes it (cpu/rows.py).

A group's new rows may be rows an eviction freed, whose slots still hold their last key's
values: init_rows_tagged resets up to SLOT_RESETS slots in the pass that writes the vectors
(one launch where a dlrm26_full step took three: bench/NOTES.md, 2026-11-28).
"""
import numpy as np

from sok1x.backend import random_init as recipe
from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.groups import device_constant
from sok1x.backend.cuda.host_row_order import host_order, walk_blocks
from sok1x.backend.cuda.kernel_launch import (
    count_array,
    index_array,
    is_split,
    lane_shift,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    split_args,
)

SLOT_RESETS = 2  # slots init_rows_tagged_float32 writes beside the vectors
# log2 of the most threads a group's new row takes: each row's loads (its row, key, tag and
# table id, one after the other) are what the kernel waits on, and fewer threads a row keep
# more rows in flight. 83,000 new rows of dim 128 and two slots on one H200 (new_rows_init.py,
# 2026-11-28): 97 us at 32 threads a row, 59 at 16, 55 at 8, 165 at 4 (a row's 32-byte sector
# then takes two stores).
TAGGED_LANES_LOG2 = 3


@memoised_per_context
def _kernels():
    return {"plain": prepared("random_init.cu", "init_rows_float32", "PPqPPPqPqiiQQddP"),
            "tagged": prepared("random_init.cu", "init_rows_tagged_float32",
                               "PPqPPPPqPqiiQPdddd" + "PPqP" * SLOT_RESETS + "i")}


@uses_context
def init_rows(table, rows, keys, spec, table_id, count=None):
    """Writes the initial vectors of `keys` (random_init's recipe) into table[rows]; table is a
    float32 [rows, dim] GPUArray or a split array of them. count: None, or a uint64 [1] device
    array: only the first count[0] rows are written (HashIndex.find_or_insert's queue_first),
    negative rows skipped."""
    _check_table("init_rows", table)
    rows = index_array(rows, "rows")
    keys = index_array(keys, "keys")
    if rows.shape != keys.shape:
        raise ValueError("init_rows: %d rows for %d keys" % (rows.shape[0], keys.shape[0]))
    dim = table.shape[1]
    if rows.shape[0] == 0 or dim == 0:
        return
    kind, seed, table_id, a, b = recipe.kernel_arguments(spec, table_id)
    shift = lane_shift(dim)
    count = count_array(count)  # held until the launch: the order allocates in between
    count_ptr = 0 if count is None else ptr(count)
    order = host_order(table, rows, zero_negative=True, count_ptr=count_ptr)
    work = rows.shape[0] << shift
    launch(_kernels()["plain"], work, *split_args(table, dim), ptr(rows),
           ptr(keys), rows.shape[0], count_ptr, dim, shift, kind, seed, table_id, a, b,
           0 if order is None else ptr(order), blocks=walk_blocks(order, work))


@uses_context
def init_rows_tagged(table, rows, keys, tags, spec, table_ids, count=None, slots=()):
    """init_rows of a hash group's flat rows: key i is initialised as a key of table
    table_ids[tags[i]] (host uint64 [T]); count: None or a uint64 [1] device array, only the
    first count[0] rows written; negative rows skipped. slots: (array, value) pairs, float32
    arrays shaped as `table` whose same rows take the constant `value` (the reset of a freed
    row's slots). One launch where the slots are at most SLOT_RESETS and none is split (a
    split one is walked in its host part's order by init_rows, one launch each)."""
    _check_table("init_rows_tagged", table)
    for slot, _ in slots:
        if slot.dtype != np.float32 or tuple(slot.shape) != tuple(table.shape):
            raise TypeError("init_rows_tagged: a slot must be float32 %s as its table is, got "
                            "%s %s" % (list(table.shape), slot.dtype, list(slot.shape)))
    rows, keys, tags = (index_array(a, what) for a, what in
                        ((rows, "rows"), (keys, "keys"), (tags, "tags")))
    dim = int(table.shape[1])
    if rows.shape[0] == 0 or dim == 0:
        return
    together = len(slots) <= SLOT_RESETS and not any(is_split(slot) for slot, _ in slots)
    resets = list(slots) if together else []
    kind, seed, _, a, b = recipe.kernel_arguments(spec, 0)
    shift = min(lane_shift(dim), TAGGED_LANES_LOG2)
    ids = device_constant(np.asarray(table_ids, dtype=np.uint64).view(np.int64))
    count = count_array(count)
    padded = resets + [(None, 0.0)] * (SLOT_RESETS - len(resets))
    launch(_kernels()["tagged"], rows.shape[0] << shift, *split_args(table, dim), ptr(rows),
           ptr(keys), ptr(tags), rows.shape[0], 0 if count is None else ptr(count), dim, shift,
           kind, seed, ptr(ids), a, b, *[float(value) for _, value in padded],
           *[arg for slot, _ in padded for arg in split_args(slot, dim)], len(resets))
    if not together:
        for slot, value in slots:
            init_rows(slot, rows, keys, recipe.make_spec("constant", value), 0, count)


def _check_table(what, table):
    if table.dtype != np.float32 or table.ndim != 2:
        raise TypeError("%s needs a float32 [rows, dim] table, got %s %s" % (
            what, table.dtype, table.shape))
