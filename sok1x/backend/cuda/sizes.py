"""The cuda backend's part of the op header (lookup/exchange_header.py): kernels that write the
header's records and input-error flags on the device, so counts and flags that kernels produced
reach the other ranks without a host copy first. The host reads them once, after the exchange.
Also the slots of per-peer capacity buffers (lookup/peer_capacity.py), whose overflow flag rides
in the header as an input error's does."""
import numpy as np

from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.kernel_launch import (
    empty,
    fill_bytes,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_view,
    to_device,
)
from sok1x.backend.cuda.groups import device_constant
from sok1x.backend.cuts import cut_points


@memoised_per_context
def _header_kernels():
    return (prepared("header.cu", "header_records", "qqqqqqPPPqqqqP"),
            prepared("header.cu", "flag_outside", "PPqP"),
            prepared("routing.cu", "peer_slots", "PPPqqPqPP"))


@uses_context
def header_records(fields, size, counts, flag, width, shared=None, shared_at=0):
    """Returns int64 GPUArray [size, width]: per peer j, the 6 host `fields` (op, tower, call,
    place, error, tables; error or-ed with flag[0]), then counts[t, j] for t < tables (counts:
    int64 GPUArray [tables, size] or None; flag: int64 GPUArray [1] or None), and from field
    shared_at on the host int64 values `shared` (or None), the same for every peer. No wait."""
    op, tower, call, place, error, tables = (int(f) for f in fields)
    records = empty((int(size), int(width)), np.int64)
    shared_len = 0 if shared is None else int(len(shared))
    shared_values = to_device(np.asarray(shared, dtype=np.int64)) if shared_len else None
    launch(_header_kernels()[0], int(size) * int(width), op, tower, call, place, error,
           tables if counts is not None else 0, 0 if counts is None else ptr(counts),
           0 if flag is None else ptr(flag), 0 if shared_values is None else ptr(shared_values),
           int(shared_at), shared_len, int(size), int(width), ptr(records))
    return records


@uses_context
def flag_outside(bounds, ranges):
    """Returns an int64 GPUArray [1]: 1 if a (min, max) row of bounds (int64 GPUArray [n, 2], as
    index_bounds_deferred makes) falls outside its row of `ranges` (host int64 [n, 2], lowest and
    highest allowed), else 0. One launch, no wait (the ranges are uploaded once per content)."""
    flag = fill_bytes(empty((1,), np.int64), 0)
    count = int(bounds.shape[0])
    if count:
        launch(_header_kernels()[1], count, ptr(bounds), ptr(device_constant(ranges)), count,
               ptr(flag))
    return flag


@uses_context
def peer_slots_many(counts, caps, lengths, flag, bit):
    """Slots in per-peer capacity buffers, one launch for every table: counts, int64 GPUArray
    [tables, size] (keys bucketed to each owner, bucket_by_owner_many_deferred's); caps, host
    int64 [tables, size] (slots for each owner); lengths, each table's bucketed positions.
    Returns (slots, flag_out): per table an int64 GPUArray [lengths[t]], the i-th key bucketed to
    owner o at sum(caps[t, :o]) + i, -1 past its cap or the keys; flag_out an int64 GPUArray
    [1], flag[0] (flag may be None) with `bit` set where a count exceeds its cap. No wait."""
    caps = np.ascontiguousarray(caps, dtype=np.int64)
    tables, size = int(counts.shape[0]), int(counts.shape[1])
    starts = cut_points(lengths)
    slots = empty((max(int(starts[-1]), 1),), np.int64)
    flag_out = fill_bytes(empty((1,), np.int64), 0)
    launch(_header_kernels()[2], max(int(starts[-1]), tables * size), ptr(counts),
           ptr(device_constant(caps.reshape(-1))), ptr(device_constant(starts)), tables, size,
           0 if flag is None else ptr(flag), int(bit), ptr(slots), ptr(flag_out))
    return [row_view(slots, int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])], flag_out
