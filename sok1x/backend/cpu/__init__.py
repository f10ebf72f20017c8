"""The cpu backend: the op set of sok1x.backend on NumPy arrays. It is the reference for cuda.

COUNTS["host_waits"] counts the calls at which the cuda backend's host waits for the device (the
ops that return sizes or bounds, to_host_many, synchronize), so the CPU tests check how often a
step would wait on a GPU.
"""
import contextlib
import functools

import numpy as np

from sok1x.backend.cpu.hash import (  # noqa: F401  (part of the op set)
    HashIndex,
    hash_erase_counted,
    hash_erase_many,
    hash_find_many,
    hash_insert_many,
    hash_insert_many_done,
    hash_insert_members,
    hash_members_advance,
    hash_settle_sizes,
    hash_sizes,
    hash_tombstones,
    hash_rehash_many,
    rebuild_flags,
    scramble,
)
from sok1x.backend.cpu import optimizers as cpu_optimizers
from sok1x.backend.cpu.aligned import exportable  # noqa: F401  (part of the op set)
from sok1x.backend import given_hyper
from sok1x.backend import kept_sums
from sok1x.backend.kept_sums import sums_kept  # noqa: F401  (op set: D14; cpu zeros every row)
from sok1x.backend.copies import copy_array_error
from sok1x.backend.given_hyper import (  # noqa: F401  (op set: D14)
    hyper_given,
    step_given,
    time_given,
)
from sok1x.backend.cpu.rerun import captured_work  # noqa: F401  (part of the op set: D14)
from sok1x.backend.cpu.reserved_rows import (  # noqa: F401  (op set: groups that grow)
    back_rows,
    back_rows_ahead,
    backed_bytes,
    join_ahead,
    reserved_rows,
    unback_rows,
)
from sok1x.backend.cpu.eviction import (  # noqa: F401  (part of the op set)
    count_evictable,
    count_new_keys,
    count_new_keys_segmented,
    pick_victims,
    stamp_last_step,
)
from sok1x.backend import dlpack
from sok1x.backend.owner_rules import OWNER_FIXED, OWNER_HASH, OWNER_MOD
from sok1x.backend.cpu.rows import (  # noqa: F401  (part of the op set)
    COUNTS,
    drop_rows_if_failed,
    fill_rows,
    gather_rows,
    gather_rows_many,
    init_rows,
    init_rows_tagged,
    touch_rows,
    whole_rows as _rows,
)

NAME = "cpu"


def counts():
    """Returns a copy of COUNTS (what this process's steps did, since it started)."""
    return dict(COUNTS)


def asarray(host_array):
    """Returns a C-contiguous NumPy array (the cpu 'device' is the host)."""
    return np.ascontiguousarray(host_array)


def to_host(array):
    """Returns `array` as a NumPy array."""
    return np.asarray(array)


def empty(shape, dtype):
    return np.empty(shape, dtype=dtype)


def zeros(shape, dtype):
    return np.zeros(shape, dtype=dtype)


def fill_value(array, value):
    """Sets every element of `array` to `value`."""
    array.fill(value)
    return array


def host_mapped_zeros(shape, dtype):
    """Zeros in 'host memory the device reads': on cpu, an ordinary array."""
    return np.zeros(shape, dtype=dtype)


def to_host_many(arrays):
    """Returns each array as a NumPy array: where cuda waits once for all of them."""
    COUNTS["host_waits"] += 1
    return [np.asarray(array) for array in arrays]


def read_later(array):
    """Returns a function that returns `array` as a NumPy copy, the same one at every call
    (its first counted as a wait): where cuda queues the copy now and waits for it alone when
    first called."""
    host = np.array(array, copy=True)
    waited = []

    def collect():
        if not waited:
            COUNTS["host_waits"] += 1
            waited.append(True)
        return host
    return collect


def read_many_later(arrays):
    """read_later of several arrays: NumPy copies made now, handed out by collect() (counted as
    one wait), where cuda queues the copies now and waits for them alone when called."""
    hosts = [np.array(array, copy=True) for array in arrays]
    waited = []

    def collect():
        # (cuda waits for none where every one is empty, and once however often called)
        if not waited and any(host.size for host in hosts):
            COUNTS["host_waits"] += 1
            waited.append(True)
        return hosts
    return collect


def copy_array(dst, src):
    """dst = src: arrays of one dtype and size, both C-contiguous (any shapes)."""
    src = np.asarray(src)
    error = copy_array_error(dst, src, dst.flags.c_contiguous and src.flags.c_contiguous)
    if error is not None:
        raise error
    np.copyto(dst.reshape(-1), src.reshape(-1))


def split_zeros(shape, dtype, hbm_rows):
    """Zeros [shape] split at row hbm_rows: ([device part, host part], whole). On cpu both
    parts are views of `whole`, the one array every row op indexes (a row is where its index
    says, in either part)."""
    whole = np.zeros(shape, dtype=dtype)
    return [whole[:hbm_rows], whole[hbm_rows:]], whole


def _on_rows(update):
    """An optimizer update of cpu_optimizers that also takes split state arrays."""
    @functools.wraps(update)
    def on_rows(*args):
        return update(*(_rows(arg) for arg in args))
    return on_rows


update_adadelta = _on_rows(cpu_optimizers.update_adadelta)
update_adagrad = _on_rows(cpu_optimizers.update_adagrad)
update_adam_all_rows = _on_rows(cpu_optimizers.update_adam_all_rows)
update_adamax = _on_rows(cpu_optimizers.update_adamax)
update_ftrl = _on_rows(cpu_optimizers.update_ftrl)
update_keras_momentum = _on_rows(cpu_optimizers.update_keras_momentum)
update_keras_rmsprop_all_rows = _on_rows(cpu_optimizers.update_keras_rmsprop_all_rows)
update_lazy_adam = _on_rows(cpu_optimizers.update_lazy_adam)
update_momentum = _on_rows(cpu_optimizers.update_momentum)
update_rmsprop = _on_rows(cpu_optimizers.update_rmsprop)
update_sgd = _on_rows(cpu_optimizers.update_sgd)


def write_given(array, values, clock=None, now=0.0, step=None):
    """array[:] = values: the hyper-parameters an update reads from `array`, and clock[0] = now
    where a clock (float64 [1] or [2]) is given: the time a replayed stamp writes
    (given_hyper.py); step: None, or the training step written into clock[1] (a clock of two:
    given_hyper.step_given's)."""
    values = given_hyper.written(array, values)
    given_hyper.checked_clock(clock, sizes=(1, 2) if step is None else (2,))
    array[...] = values
    if clock is not None:
        clock[0] = now
        if step is not None:
            clock[1] = step


def release_unused():
    """NumPy gives memory back by itself; counted as the wait it is on cuda."""
    COUNTS["host_waits"] += 1


def synchronize():
    """Nothing is queued on the host."""
    COUNTS["host_waits"] += 1


def device_context():
    """The host needs no device context: a context manager that does nothing."""
    return contextlib.nullcontext()


def owners_of(keys, world_size, owner_rule=OWNER_MOD, fixed_rank=0):
    """Returns each key's owner rank (int64): key % world_size (OWNER_MOD), fixed_rank
    (OWNER_FIXED) or scramble(key) % world_size (OWNER_HASH, the hash of cuda_kernels)."""
    keys = np.asarray(keys, dtype=np.int64)
    if owner_rule == OWNER_FIXED:
        return np.full(keys.shape, int(fixed_rank), dtype=np.int64)
    if owner_rule == OWNER_HASH:
        return (scramble(keys) % np.uint64(world_size)).astype(np.int64)
    return keys % world_size


def bucket_by_owner(keys, world_size, owner_rule=OWNER_MOD, fixed_rank=0):
    """Returns (perm, counts): keys[perm] grouped by owner (owners_of), stable inside an owner;
    counts per owner."""
    keys = np.asarray(keys, dtype=np.int64)
    if world_size == 1:
        return np.arange(keys.shape[0], dtype=np.int64), np.array([keys.shape[0]], np.int64)
    owners = owners_of(keys, world_size, owner_rule, fixed_rank)
    perm = np.argsort(owners, kind="stable")
    counts = np.bincount(owners, minlength=world_size).astype(np.int64)
    return perm, counts


def bucket_by_owner_many(keys_list, world_size, owner_rules):
    """bucket_by_owner() of each array, owner_rules one (rule, fixed_rank) each."""
    COUNTS["host_waits"] += 1
    return [bucket_by_owner(keys, world_size, rule, fixed)
            for keys, (rule, fixed) in zip(keys_list, owner_rules)]


def bucket_by_owner_many_deferred(keys_list, world_size, owner_rules, valid_counts=None):
    """bucket_by_owner_many() leaving the counts where cuda leaves them, for an op header:
    returns (perms, counts int64 [len(keys_list), world_size]). valid_counts: None, or how many
    leading keys of each array to bucket (unique_many_padded's output); perm i then has one
    entry per key, the first sum(counts[i]) of them meaningful and the rest 0."""
    perms = []
    counts = np.zeros((len(keys_list), int(world_size)), dtype=np.int64)
    for i, (keys, (rule, fixed)) in enumerate(zip(keys_list, owner_rules)):
        keys = np.asarray(keys, dtype=np.int64)
        valid = keys.shape[0] if valid_counts is None else int(valid_counts[i])
        perm, counts[i] = bucket_by_owner(keys[:valid], world_size, rule, fixed)
        padded = np.zeros(keys.shape[0], dtype=np.int64)
        padded[:valid] = perm
        perms.append(padded)
    return perms, counts


def unique_many(keys_list, ordered=True):
    """unique() of each array."""
    COUNTS["host_waits"] += 1
    return [_unique(keys, ordered) for keys in keys_list]


def unique_many_start(keys_list, ordered=False, tags_list=None):
    """unique_many() in two halves, as cuda waits between them: returns (started, counts int64
    [len(keys_list)] of distinct counts) for unique_many_finish(started, counts). tags_list:
    None, or per array None or int tags [n] (a hash group's): its keys are de-duplicated per
    (tag, key), in any order."""
    tags_list = tags_list or [None] * len(keys_list)
    results = [_unique(keys, ordered) if tags is None else _unique_pairs(keys, tags)
               for keys, tags in zip(keys_list, tags_list)]
    return results, np.array([keys.shape[0] for keys, _ in results], dtype=np.int64)


def _unique_pairs(keys, tags):
    """(a key of each distinct (tag, key), inverse)."""
    keys = np.asarray(keys, dtype=np.int64)
    if not keys.size:
        return keys[:0], keys[:0]
    pairs = np.stack([np.asarray(tags, dtype=np.int64), keys], axis=1)
    _, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
    return keys[first], inverse.reshape(-1).astype(np.int64)


def row_sequence(first, stop):
    """Returns int64 [stop - first]: first, first + 1, ..., stop - 1."""
    return np.arange(int(first), max(int(stop), int(first)), dtype=np.int64)


def part_tags(cuts):
    """Returns int64 [cuts[-1]]: the part t of each position of an array cut at host `cuts`
    [P + 1] (a hash group's member of each key)."""
    counts = np.diff(np.asarray(cuts, dtype=np.int64))
    return np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)


def unique_many_finish(started, host_counts):
    """Returns unique_many_start's list of (unique_keys, inverse)."""
    return started


def unique_many_padded(started):
    """unique_many_start's list of (unique_keys, inverse), unique_keys padded with zeros to the
    length of the keys, as cuda makes them without reading the counts."""
    out = []
    for unique_keys, inverse in started:
        padded = np.zeros(inverse.shape[0], dtype=np.int64)
        padded[:unique_keys.shape[0]] = unique_keys
        out.append((padded, inverse))
    return out


def header_records(fields, size, counts, flag, width, shared=None, shared_at=0):
    """Returns int64 [size, width]: per peer j, the 6 `fields` (op, tower, call, place, error,
    tables; error or-ed with flag[0]: bit 0 an input error, bit 2 a capacity's overflow), then
    counts[t, j] for t < tables (counts [tables, size] or None; flag int64 [1] or None), and from
    field shared_at on the values `shared` (or None), the same for every peer."""
    records = np.zeros((int(size), int(width)), dtype=np.int64)
    records[:, :6] = np.asarray(fields, dtype=np.int64)[:6]
    if flag is not None:
        records[:, 4] |= int(flag[0])  # bit 0 an input error, bit 2 an overflow (other bits kept)
    if counts is None:
        records[:, 5] = 0
    else:
        inline = min(counts.shape[0], (int(shared_at) or int(width)) - 6)
        records[:, 6:6 + inline] = np.asarray(counts, dtype=np.int64)[:inline].T
    if shared is not None and len(shared):
        records[:, shared_at:shared_at + len(shared)] = np.asarray(shared, dtype=np.int64)
    return records


def peer_slots_many(counts, caps, lengths, flag, bit):
    """Slots in per-peer capacity buffers: counts int64 [tables, size] (keys bucketed to each
    owner); caps host int64 [tables, size] (slots for each owner); lengths, each table's
    bucketed positions. Returns (slots, flag_out): per table int64 [lengths[t]], the i-th key
    bucketed to owner o at sum(caps[t, :o]) + i, -1 past its cap or the keys; flag_out int64
    [1], flag[0] (flag may be None) with `bit` set where a count exceeds its cap."""
    counts = np.asarray(counts, dtype=np.int64)
    caps = np.asarray(caps, dtype=np.int64).reshape(counts.shape)
    slots = []
    for own, cap, length in zip(counts, caps, lengths):
        owner = np.repeat(np.arange(own.shape[0], dtype=np.int64), own)
        within = np.arange(owner.shape[0], dtype=np.int64) - (np.cumsum(own) - own)[owner]
        out = np.full(int(length), -1, dtype=np.int64)
        out[:owner.shape[0]] = np.where(within < cap[owner],
                                        (np.cumsum(cap) - cap)[owner] + within, -1)
        slots.append(out)
    flag_out = np.zeros(1, dtype=np.int64)
    flag_out[0] = (0 if flag is None else int(flag[0])) | (
        int(bit) if (counts > caps).any() else 0)
    return slots, flag_out


def flag_outside(bounds, ranges):
    """Returns int64 [1]: 1 if a (min, max) row of bounds falls outside its row of ranges
    (lowest, highest allowed), else 0; an empty array's (INT64_MAX, INT64_MIN) never does."""
    bounds = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
    ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    filled = bounds[:, 0] <= bounds[:, 1]
    outside = (bounds[:, 0] < ranges[:, 0]) | (bounds[:, 1] > ranges[:, 1])
    return np.array([int(np.any(filled & outside))], dtype=np.int64)


def index_bounds(arrays):
    """Returns int64 [len(arrays), 2]: (min, max) of each integer array, (INT64_MAX, INT64_MIN)
    for an empty one: one look at the data for all of a step's keys and indices."""
    COUNTS["host_waits"] += 1
    return index_bounds_deferred(arrays)


def index_bounds_deferred(arrays):
    """index_bounds() where cuda leaves it on the device, for one read with other sizes."""
    if not arrays:
        return np.zeros((0, 2), dtype=np.int64)
    flat = [np.asarray(array, dtype=np.int64).reshape(-1) for array in arrays]
    cuts = np.concatenate([[0], np.cumsum([a.shape[0] for a in flat])]).astype(np.int64)
    return part_bounds_deferred([np.concatenate(flat)], cuts)  # two reductions for all


def part_bounds(arrays, cuts):
    """Returns host int64 [len(arrays) * P, 2]: the (min, max) of each part of each array, the
    arrays all cut at host `cuts` [P + 1] (ascending, the last one their length); (INT64_MAX,
    INT64_MIN) for an empty part. One wait for all."""
    COUNTS["host_waits"] += 1
    return part_bounds_deferred(arrays, cuts)


def part_bounds_deferred(arrays, cuts):
    """part_bounds() where cuda leaves it on the device (no wait)."""
    cuts = np.asarray(cuts, dtype=np.int64)
    parts = cuts.shape[0] - 1
    bounds = np.empty((len(arrays) * parts, 2), dtype=np.int64)
    bounds[:, 0], bounds[:, 1] = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    filled = np.flatnonzero(np.diff(cuts) > 0)
    if filled.size:
        for j, array in enumerate(arrays):
            array = np.asarray(array, dtype=np.int64)
            rows = j * parts + filled
            bounds[rows, 0] = np.minimum.reduceat(array, cuts[filled])
            bounds[rows, 1] = np.maximum.reduceat(array, cuts[filled])
    return bounds


def offset_parts(array, cuts, offsets, out=None):
    """Returns int64 [n]: each element of part t of int `array` (cut at host `cuts` [P + 1])
    plus host offsets[t]: the keys of several tables, given as one array, in a group's id
    space; a negative element stays as it is (join_keys). out: None, or int64 [n] to write."""
    counts = np.diff(np.asarray(cuts, dtype=np.int64))
    offset = _offset(np.asarray(array, dtype=np.int64),
                     np.repeat(np.asarray(offsets, dtype=np.int64), counts))
    if out is None:
        return offset
    out[...] = offset
    return out


def rotate_parts(out, before, cuts, back, back_cuts, counts):
    """Writes into int64 `out` each part t of int64 `before` (both cut at `cuts` [P + 1]) rotated
    by k = counts[t] (int64 [P], clamped to the part's length): the part from row k on, then the
    first k rows of part t of int64 `back` (cut at `back_cuts`). `out` and `before` must not
    overlap."""
    before, back = np.asarray(before).reshape(-1), np.asarray(back).reshape(-1)
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    for t in range(len(cuts) - 1):
        start, stop, first = int(cuts[t]), int(cuts[t + 1]), int(back_cuts[t])
        taken = min(max(int(counts[t]), 0), stop - start)
        kept = stop - start - taken
        out[start:start + kept] = before[start + taken:stop]
        out[start + kept:stop] = back[first:first + taken]


def offset_parts_many(arrays, cuts, offsets):
    """offset_parts() of several arrays of one length cut at the same `cuts`, array j with
    offsets[j]; returns a list of int64 [n]."""
    return [offset_parts(array, cuts, offs) for array, offs in zip(arrays, offsets)]


def row_view(array, start, stop):
    """Returns rows [start, stop) of `array` as a view sharing its memory."""
    return array[start:stop]


def row_views(array, cuts, stops=None):
    """Returns rows [cuts[t], cuts[t + 1]) of `array` for each t (with stops, cuts are the
    starts: rows [cuts[t], stops[t]) for each t, as many as stops), views sharing its memory."""
    spans = zip(cuts, stops) if stops is not None else zip(cuts[:-1], cuts[1:])
    return [array[int(start):int(stop)] for start, stop in spans]


def reshape(array, shape):
    """Returns `array` in `shape` (NumPy's rules: one -1 allowed)."""
    return np.reshape(array, shape)


def join_keys(arrays, offsets):
    """Returns int64 [sum n_t]: each int array t plus offsets[t], joined in order; a negative
    element (a padded row -1, or a key its checks reject) stays as it is."""
    if not arrays:
        return np.zeros(0, np.int64)
    return np.concatenate([_offset(np.asarray(a, dtype=np.int64), np.int64(o))
                           for a, o in zip(arrays, offsets)])


def _offset(values, offsets):
    """values + offsets where values >= 0, values elsewhere."""
    return np.where(values >= 0, values + offsets, values)


def join_rows(arrays):
    """Returns float32 [sum n_t, *row]: the arrays joined along axis 0."""
    return np.concatenate([np.asarray(a, dtype=np.float32) for a in arrays])


def distinct_rows_many(items):
    """items: (rows int64 [n] in [0, bound), or -1: no row, whose inverse is -1; bound, boundaries
    int64 [k] ascending, the last one bound). Returns per item (distinct rows ascending [u], inverse
    [n], int64 [k]: how many distinct rows lie below each boundary)."""
    COUNTS["host_waits"] += 1
    return distinct_rows_many_start(items)[0]


def distinct_rows_many_start(items):
    """distinct_rows_many() in two halves, as cuda waits between them: returns (started, sizes
    int64 [sum k]) for distinct_rows_many_finish(started, sizes)."""
    out = []
    for rows, _, boundaries in items:
        rows = np.asarray(rows, dtype=np.int64)
        present = rows >= 0
        if present.all():
            distinct, inverse = _unique_ascending(rows) if rows.size else (rows[:0], rows[:0])
        else:  # padded slots of a per-peer buffer: no row
            distinct, found = _unique_ascending(rows[present]) if present.any() else (
                rows[:0], rows[:0])
            inverse = np.full(rows.shape[0], -1, dtype=np.int64)
            inverse[present] = found
        ranks = np.searchsorted(distinct, np.asarray(boundaries, dtype=np.int64))
        out.append((distinct, inverse.astype(np.int64, copy=False), ranks.astype(np.int64)))
    sizes = np.concatenate([ranks for _, _, ranks in out]) if out else np.zeros(0, np.int64)
    return out, sizes


def distinct_rows_many_finish(started, host_sizes):
    """Returns distinct_rows_many_start's list of (distinct, inverse, ranks)."""
    return started


def distinct_rows_padded(rows, bound, row_starts, piece_starts, counted=False):
    """The distinct rows of `rows` laid out in pieces sized before the step: the rows in
    [row_starts[t], row_starts[t + 1]) ascending in piece t, from piece_starts[t] on. Returns
    (flat, local, inverse): flat and local int64 [piece_starts[-1]], each row and the row less
    its range's start, -1 where no row is; inverse int64 [n], each row's place, -1 for a row
    outside [0, bound) or one that does not fit its piece; counted: and None (cuda's counts of
    the places, which segment_sum here does not need)."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = np.asarray(row_starts, dtype=np.int64)
    pieces = np.asarray(piece_starts, dtype=np.int64)
    flat = np.full(int(pieces[-1]), -1, dtype=np.int64)
    local = flat.copy()
    inverse = np.full(rows.shape[0], -1, dtype=np.int64)
    kept = (rows >= 0) & (rows < min(int(bound), int(starts[-1])))
    distinct, found = _unique_ascending(rows[kept]) if kept.any() else (rows[:0], rows[:0])
    part = np.searchsorted(starts[:-1], distinct, side="right") - 1
    places = pieces[part] + np.arange(distinct.shape[0]) - np.searchsorted(distinct,
                                                                             starts[:-1])[part]
    fits = places < pieces[part + 1]
    flat[places[fits]] = distinct[fits]
    local[places[fits]] = distinct[fits] - starts[part[fits]]
    inverse[kept] = np.where(fits, places, -1)[found]
    return (flat, local, inverse, None) if counted else (flat, local, inverse)


def local_rows(rows, row_starts, moves, length):
    """Returns int64 [length]: for distinct rows ascending, out[i + moves[t]] = rows[i] -
    row_starts[t] for the range t (row_starts: int64 [T + 1]) holding rows[i]; moves: int64 [T],
    how far table t's piece moves; places between pieces are zeros."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = np.asarray(row_starts, dtype=np.int64)
    table = np.searchsorted(starts[:-1], rows, side="right") - 1
    out = np.zeros(int(length), np.int64)
    out[np.arange(rows.shape[0]) + np.asarray(moves, dtype=np.int64)[table]] = rows - starts[table]
    return out


def column(matrix, index):
    """Returns column `index` of an int64 [n, k] matrix as a contiguous [n] array."""
    return np.ascontiguousarray(np.asarray(matrix)[:, index], dtype=np.int64)


def segment_counts(segment_ids, num_segments):
    """Returns float32 [num_segments]: how many ids fall in each segment."""
    return np.bincount(np.asarray(segment_ids, dtype=np.int64),
                       minlength=int(num_segments)).astype(np.float32)


def scale_rows(values, factors, divide=False):
    """Returns values [n, ...] times (or, divide=True, over) float32 factors [n] per row; a row
    divided by 0 gives zeros (tf.math.divide_no_nan)."""
    values = np.asarray(values, dtype=np.float32)
    factors = np.asarray(factors, dtype=np.float32).reshape((-1,) + (1,) * (values.ndim - 1))
    if not divide:
        return values * factors
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(factors == 0, np.float32(0), values / np.where(factors == 0, 1, factors))


def floor_divide(keys, divisor):
    """Returns keys // divisor (int64), the row of each key in a table without a hash table."""
    return np.asarray(keys, dtype=np.int64) // int(divisor)


def take_rows(array, index):
    """Returns array[index] along axis 0."""
    return _rows(array)[index]


def put_rows(dst, index, src):
    """dst[index] = src along axis 0 (`index` has no repeats)."""
    _rows(dst)[index] = src


def move_rows(src, src_index, dst, dst_index):
    """dst[dst_index[i]] = src[src_index[i]] along axis 0 where both indices are >= 0 (in
    place; no repeats among those dst_index)."""
    src_index = np.asarray(src_index, dtype=np.int64)
    dst_index = np.asarray(dst_index, dtype=np.int64)
    moving = (src_index >= 0) & (dst_index >= 0)
    _rows(dst)[dst_index[moving]] = _rows(src)[src_index[moving]]


def unique(keys, ordered=True):
    """Returns (unique_keys, inverse): with ordered=True in first-occurrence order, as tf.unique;
    with ordered=False in any order (ascending here), which the engine's own de-duplication
    needs and which costs no sort when the keys are small non-negative integers (shard rows)."""
    COUNTS["host_waits"] += 1
    return _unique(keys, ordered)


def _unique(keys, ordered):
    keys = np.asarray(keys)
    if not ordered:
        return _unique_ascending(keys)
    sorted_unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank_of_sorted = np.empty_like(order)
    rank_of_sorted[order] = np.arange(order.shape[0])
    return sorted_unique[order], rank_of_sorted[inverse.reshape(-1)].astype(np.int64)


def _unique_ascending(keys):
    if keys.size and keys.dtype.kind in "iu":
        low, high = int(keys.min()), int(keys.max())
        if low >= 0 and high < 4 * keys.size + 4096:  # a presence array is cheaper than a sort
            present = np.zeros(high + 1, dtype=bool)
            present[keys] = True
            rank = np.cumsum(present, dtype=np.int64) - 1
            return np.flatnonzero(present).astype(keys.dtype, copy=False), rank[keys]
    values, inverse = np.unique(keys, return_inverse=True)
    return values, inverse.reshape(-1).astype(np.int64)


def segment_sum(values, segment_ids, num_segments, counts=None):
    """Returns [num_segments, ...] sums of `values` rows per segment id (absent ids give zeros;
    a negative id, a padded slot, adds nothing). Every row is written whatever sums_kept bound
    (checked alone, as cuda checks it). counts: distinct_rows_padded(counted=True)'s, unused
    here."""
    values = np.asarray(values)
    segment_ids = np.asarray(segment_ids, dtype=np.int64)
    num_segments = int(num_segments)
    kept_sums.kept(num_segments)
    if segment_ids.size and segment_ids.min() < 0:
        kept = segment_ids >= 0
        return segment_sum(values[kept], segment_ids[kept], num_segments)
    if (values.dtype.kind == "f" and values.ndim == 2 and segment_ids.size
            and segment_ids[0] >= 0 and segment_ids[-1] < num_segments
            and np.all(segment_ids[1:] >= segment_ids[:-1])):
        # Sorted ids (a SparseTensor's rows): one pass adding neighbours, in input order.
        counts = np.bincount(segment_ids, minlength=num_segments)
        out = np.zeros((num_segments, values.shape[1]), dtype=values.dtype)
        starts = np.cumsum(counts) - counts
        filled = counts > 0
        out[filled] = np.add.reduceat(values, starts[filled], axis=0)
        return out
    if (values.dtype.kind == "f" and values.ndim == 2 and segment_ids.size
            and segment_ids.min() >= 0 and segment_ids.max() < num_segments):
        # One bincount per column runs several times faster than np.add.at (it sums in float64
        # and rounds once, so it may differ from float32 sums in the last bit).
        out = np.empty((num_segments, values.shape[1]), dtype=values.dtype)
        for column in range(values.shape[1]):
            out[:, column] = np.bincount(segment_ids, weights=values[:, column],
                                         minlength=num_segments)
        return out
    out = np.zeros((num_segments,) + values.shape[1:], dtype=values.dtype)
    _add_at_rows(out, segment_ids, values)
    return out


def _add_at_rows(out, rows, values):
    """np.add.at(out, rows, values) along axis 0, bit for bit (each element's additions in index
    order), as one 1-D np.add.at over flat element indices when it can: NumPy runs that form
    several times faster than the row-wise one."""
    values = np.asarray(values)
    if out.ndim < 2 or not out.flags.c_contiguous or values.shape != rows.shape + out.shape[1:]:
        np.add.at(out, rows, values)
        return
    width = int(np.prod(out.shape[1:], dtype=np.int64))
    flat = (rows.reshape(-1, 1) * width + np.arange(width, dtype=np.int64)).reshape(-1)
    np.add.at(out.reshape(-1), flat, values.reshape(-1))


def scatter_add_rows(table, rows, values):
    """table[rows] += values, repeated rows summed."""
    _add_at_rows(table, np.asarray(rows, dtype=np.int64), values)


class _HostMemory:
    """Exposes host memory a framework owns to NumPy and keeps `owner` (what frees it) alive."""

    def __init__(self, address, shape, dtype, owner):
        self._owner = owner
        self.__array_interface__ = {"data": (address, False), "shape": tuple(shape),
                                    "typestr": np.dtype(dtype).str, "version": 3}


def from_dlpack(capsule):
    """Returns a NumPy array over the memory of a CPU DLPack capsule (no copy); the producer's
    memory stays alive as long as the array. Raises TypeError for a GPU tensor or a used capsule."""
    imported = dlpack.import_capsule(capsule)
    if imported.device_type not in (dlpack.DEVICE_CPU, dlpack.DEVICE_CUDA_HOST):
        imported.release()
        raise TypeError("the cpu backend takes host tensors; this DLPack tensor is on device "
                        "type %d (place the op on the CPU, or use the cuda backend)"
                        % imported.device_type)
    return np.asarray(_HostMemory(imported.address, imported.shape, imported.dtype, imported))


def borrow(address, shape, dtype, owner=None):
    """Returns a NumPy array over C-contiguous host memory a framework owns at `address` (0 for
    no elements), read and written in place; `owner` lives as long as the array."""
    if not address:
        return np.zeros(shape, dtype)
    return np.asarray(_HostMemory(address, shape, dtype, owner))


def address_of(array):
    """The address of an array's first element."""
    return np.asarray(array).__array_interface__["data"][0]


def memory_device(address):
    """None: the cpu backend reads host memory only."""
    return None


def device_ordinal():
    """None: the cpu backend runs on no GPU."""
    return None


def synchronize_device():
    """Nothing queued on the host: the cpu backend's work is done when its calls return."""


def to_dlpack(array):
    """Returns a DLPack capsule over `array` (copied only if it is not C-contiguous and 64-byte
    aligned, which TensorFlow requires); the array lives until the consumer drops it."""
    array = exportable(array)
    return dlpack.export_capsule(array.ctypes.data, array.shape, array.dtype, dlpack.DEVICE_CPU,
                                 0, array)


def wait_for_framework(stream=0):
    """Nothing to order on the host: the framework's inputs are complete when it calls."""


def release_to_framework(stream=0):
    """Nothing to order on the host: the outputs are complete when an op returns."""


def framework_orders():
    """(wait_for_framework, release_to_framework): nothing to order on the host."""
    return wait_for_framework, release_to_framework


def narrow_indices(indices):
    """Returns int32 [n] of int64 positions `indices` [n], each below 2**31."""
    return np.asarray(indices).astype(np.int32)


def upload_staged(host_array):
    """The host is the cpu backend's device: the array itself."""
    return np.asarray(host_array)


def download_staged(array):
    """The host is the cpu backend's device: the array itself."""
    return np.asarray(array)


def download_staged_many(arrays):
    """The arrays themselves, counted as one wait (cuda's download_staged of each, one wait)."""
    return to_host_many(arrays)


def download_staged_later(arrays):
    """Returns a function that returns the arrays (counted as one wait): where cuda queues
    their copies beside the stream's later work and waits for them alone when called."""
    def collect():
        if any(np.asarray(array).size for array in arrays):
            COUNTS["host_waits"] += 1
        return [np.asarray(array) for array in arrays]
    return collect


def host_buffer(nbytes):
    """A uint8 host array of `nbytes` (write_rows copies from any host array alike)."""
    return np.empty(int(nbytes), np.uint8)


def write_rows(dst, first, src):
    """dst[first:first + len(src)] = src along axis 0."""
    rows = int(src.shape[0])
    if src.shape[1:] != dst.shape[1:] or not 0 <= first <= dst.shape[0] - rows:
        raise ValueError("write_rows: %s rows at %d do not fit an array of %s"
                         % (list(src.shape), first, list(dst.shape)))
    dst[first:first + rows] = src


def free_device_memory():
    """None: the cpu backend's arrays are host memory."""
    return None
