"""HashIndex on the GPU: int64 key -> row of one shard (cuda_kernels/hash_table.cu).

Open addressing with linear probing. Each slot holds (key, row) as two int64 side by side; -1 marks
a free slot and -2 an erased key's slot, a tombstone (keys are never negative here). Keys are
placed with atomicCAS; the rows of the keys one call inserts are consecutive, taken from an atomic
counter, so they follow arrival order and may differ from the cpu backend's, while find after
find_or_insert, the set of held keys and export() agree with it. The slot count is capacity /
max_load rounded up to a multiple of 32 (at least capacity + 1), so a full shard fills at most
max_load of the slots (0.5, as on cpu).

find_or_insert is one kernel that finds and places every key (hash_find_or_insert), then one
wait for how many it placed, or none when the caller passes the count it just took
(count_missing: a kernel and a wait). Too many new keys raise OverflowError; the keys placed by
that call are erased again. find_or_insert_values does the same and, in the same kernel,
initialises the new keys' rows of a value table and copies every key's vector out
(hash_find_or_insert_values, HierarchicalKV's find_or_insert); for a table split between GPU and
host memory, the host rows are left to a second kernel that walks them in ascending regions
(hash_settle_host_rows, cuda_host_order).
"""
import numpy as np
from pycuda import gpuarray

from sok1x.backend.cuda import context as cuda_context
from sok1x.backend.cuda import host_row_order as cuda_host_order
from sok1x.backend import random_init as recipe
from sok1x.backend import size_ledger
from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.hash_groups import hash_rehash_many
from sok1x.backend.cuda.host_row_order import host_order_and_start, walk_blocks
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
    split_args,
    to_host,
    to_host_many,
    to_host_later,
)


@memoised_per_context
def _hash_kernels():
    return {
        "find": prepared("hash_table.cu", "hash_find", "PQPqP"),
        "count_missing": prepared("hash_table.cu", "hash_count_missing", "PQPqPQP"),
        "find_or_insert": prepared("hash_table.cu", "hash_find_or_insert", "PQPqqqPPPPqP"),
        "find_or_insert_values": prepared("hash_table.cu", "hash_find_or_insert_values",
                                          "PQPqqqPPPPqP" + "PPqPqqQQddP" + "PqP"),
        "settle_host_rows_w4": prepared("hash_table.cu", "hash_settle_host_rows_w4",
                                        "PPqPPP" + "PPqPqqQQddP"),
        "settle_host_rows_w16": prepared("hash_table.cu", "hash_settle_host_rows_w16",
                                         "PPqPPP" + "PPqPqqQQddP"),
        "erase": prepared("hash_table.cu", "hash_erase", "PQPqPP"),
        "assign": prepared("hash_table.cu", "hash_assign", "PQPPq"),
        "reinsert": prepared("hash_table.cu", "hash_reinsert", "PQPQ"),
        "keys_by_row": prepared("hash_table.cu", "hash_keys_by_row", "PQqPPP"),
        "compact_rows": prepared("hash_table.cu", "hash_compact_rows", "PPPqPP"),
    }


def _fresh_bits(values):
    """For find_or_insert_values on a split table whose host rows host_order orders: a zeroed
    bit per host row (the rows the call places), else None (one pass does every row)."""
    if not cuda_host_order.ordered(values):
        return None
    words = -(-(int(values.shape[0]) - int(values.hbm_rows)) // 32)
    return fill_bytes(empty((words,), np.uint32), 0)


def _slot_count(capacity, max_load):
    wanted = max(int(np.ceil(capacity / max_load)), capacity + 1, 32)
    return -(-wanted // 32) * 32


def hash_sizes(indexes):
    """Host int64 [len(indexes)]: each HashIndex's size. A hash group's indexes share one
    ledger (backend/size_ledger.py): its pending counts (a replayed insert's placed counts,
    one copy read once) are added to all of them by one expression, with no call per index."""
    return size_ledger.sizes(indexes)


def hash_tombstones(indexes):
    """Host int64 [len(indexes)]: each HashIndex's tombstones as the host counts them (by their
    bounds where an erase's count is pending)."""
    return size_ledger.tombstones(indexes)


def hash_settle_sizes(indexes, counts, host_counts):
    """HashIndex.settle_size(counts, host_counts) of every index, where counts is one device
    count array and host_counts its host copy, or a list of each (a replayed eviction's erased
    and placed counts, settled in one pass over a group's shared ledger)."""
    size_ledger.settle(indexes, counts, host_counts)


class HashIndex(size_ledger.CountedIndex):
    """Maps keys to rows 0..capacity-1 of one shard, handing out rows in arrival order.

    capacity: the most keys the shard can hold; max_load: the most of the slots a full shard
    uses (0 < max_load <= 1). Attributes: size (keys held), capacity, slot_count. A training
    lookup of a hash group may leave its count of placed keys on the device (add_size_later):
    size reads it first (a wait), unless the engine handed it over read (settle_size).
    """

    @uses_context
    def __init__(self, capacity, max_load=0.5, slots=None):
        """slots: None, or int64 [slot_count(capacity, max_load), 2] device memory whose bytes
        are all 0xFF (empty), which the index takes as its slots (hash_rehash_many's: the new
        indexes of a growth in one allocation)."""
        if not 0.0 < max_load <= 1.0:
            raise ValueError("max_load must be in (0, 1], got %r" % (max_load,))
        self.capacity = int(capacity)
        self.slot_count = _slot_count(self.capacity, max_load)
        # its size and tombstones: its own entry of a ledger, shared with the other indexes
        # of a hash group once a group call joins them (backend/size_ledger.py)
        self._count_in(to_host_many)
        if slots is not None:
            if tuple(slots.shape) != (self.slot_count, 2) or slots.dtype != np.int64:
                raise ValueError("an index of capacity %d takes int64 slots [%d, 2], got %s %s"
                                 % (self.capacity, self.slot_count, slots.dtype,
                                    list(slots.shape)))
            self._slots = slots
        else:
            # From the memory pool: an index a growth or a load replaces goes back to the pool,
            # where a free of its own allocation would wait for the device (cuMemFree), in the
            # step
            self._slots = gpuarray.GPUArray((self.slot_count, 2), np.int64,
                                            allocator=cuda_context.allocate)
            fill_bytes(self._slots, 0xFF)
        # its address as a plain int, for the per-step member lists of a group (the slots never
        # move: a rebuild rewrites them in place, a growth makes another index)
        self.slots_address = int(self._slots.gpudata)

    @staticmethod
    def slot_count_of(capacity, max_load=0.5):
        """The slots of a HashIndex of `capacity` at `max_load`."""
        return _slot_count(int(capacity), max_load)

    def empty_slots(self):
        """Slots neither a key nor a tombstone holds, as the host counts them (tombstones by a
        bound until counted): the most new keys an insert can place before the index is
        rebuilt (an insert does not take a tombstone's slot; a read of the size)."""
        return self.slot_count - self.size - self.tombstones

    def _find(self, keys):
        rows = empty((keys.shape[0],), np.int64)
        if keys.shape[0]:
            launch(_hash_kernels()["find"], keys.shape[0], ptr(self._slots), self.slot_count,
                   ptr(keys), keys.shape[0], ptr(rows))
        return rows

    @uses_context
    def find(self, keys):
        """Returns int64 rows for `keys`, -1 where a key is not held (queued, no wait)."""
        return self._find(index_array(keys, "keys"))

    def _count_missing(self, keys):
        n = keys.shape[0]
        if n == 0:
            return 0
        seen_count = 2 * n + 32
        seen_keys = fill_bytes(empty((seen_count,), np.int64), 0xFF)
        missing = fill_bytes(empty((1,), np.uint64), 0)
        launch(_hash_kernels()["count_missing"], n, ptr(self._slots), self.slot_count, ptr(keys),
               n, ptr(seen_keys), seen_count, ptr(missing))
        return int(to_host(missing)[0])

    @uses_context
    def count_missing(self, keys):
        """Returns how many distinct keys of `keys` are not held yet (waits for the GPU)."""
        return self._count_missing(index_array(keys, "keys"))

    @uses_context
    def find_or_insert(self, keys, row_pool=None, missing=None, next_row=None,
                       queue_first=None):
        """Returns int64 rows for `keys`, giving new keys the next free rows.

        Returns (rows, new_keys, new_rows), the last two for the keys inserted by this call, in
        placing order. row_pool: None (rows size, size + 1, ...) or int64 rows: the k-th key
        placed gets row_pool[k]; past the pool, rows next_row, next_row + 1, ... (next_row None:
        the pool must hold every new key). missing: count_missing(keys) when the caller has it
        (then nothing waits); else one kernel places the keys and the host waits for how many
        it placed. Raises OverflowError if the new keys do not fit (the index then holds the
        keys it held, with tombstones where this call placed some). queue_first: None, or
        queue_first(new_keys, new_rows, placed, rows), called once the keys are placed and
        before the host waits for their count, to queue work on the rows (every key's `rows`
        is final then) that runs during the wait: placed is None where the arrays hold exactly
        the placed keys, else a uint64 [1] device array counting them, the arrays' entries past
        it unset (backend ops take it as `count`: init_rows, fill_rows).
        """
        return self._find_or_insert(index_array(keys, "keys"), row_pool, missing, next_row,
                                    queue_first, None)

    @uses_context
    def find_or_insert_later(self, keys, queue_first=None):
        """find_or_insert (rows from size on) where the caller knows the new keys fit: nothing
        waits. Returns (rows, new_keys, new_rows, placed): the new arrays keys-long, their first
        placed[0] entries set (placed a uint64 [1] device array, as queue_first gets it); size
        counts placed when next read (add_size_later). The caller must rule out keys past the
        room: they would be claimed with no row (OVERFLOW_ROW) and counted, nothing raised."""
        return self._find_or_insert(index_array(keys, "keys"), None, None, None, queue_first,
                                    None, later=True)

    @uses_context
    def find_or_insert_values(self, keys, values, spec, table_id, row_pool=None, missing=None,
                              next_row=None, queue_first=None, touch=None):
        """find_or_insert that also initialises the new keys' rows of `values` (a float32
        [rows, dim] GPUArray or split array) as init_rows(values, new_rows, new_keys, spec,
        table_id) does, and returns every key's vector: (rows, vectors float32 [n, dim],
        new_keys, new_rows), zeros for a key without a row. One kernel finds, places,
        initialises and copies (HierarchicalKV's find_or_insert): a new row's vector is
        computed once and written to the table and the output, nothing is read back, and no
        row copy waits for the host (a split table's host rows take a second kernel that walks
        them in ascending regions, cuda_host_order). touch: None, or (statistics, step):
        the kernel also counts the lookup as backend.touch_rows(statistics, rows, step) does.
        Other arguments and errors as find_or_insert's (an overflowing call leaves the output
        unspecified and, with touch, has counted the lookup of the keys it found)."""
        if values.dtype != np.float32 or values.ndim != 2:
            raise TypeError("find_or_insert_values needs a float32 [rows, dim] table, got %s %s"
                            % (values.dtype, values.shape))
        keys = index_array(keys, "keys")
        dim = int(values.shape[1])
        vectors = empty((keys.shape[0], dim), np.float32)
        statistics = (0, 0) if touch is None else (ptr(touch[0]), int(touch[1]))
        fetch = (values, dim, recipe.kernel_arguments(spec, table_id), vectors, statistics)
        rows, new_keys, new_rows = self._find_or_insert(keys, row_pool, missing, next_row,
                                                        queue_first, fetch)
        return rows, vectors, new_keys, new_rows

    def _find_or_insert(self, keys, row_pool, missing, next_row, queue_first, fetch,
                        later=False):
        """find_or_insert; fetch: None, or (values, dim, init kernel arguments, vectors,
        statistics arguments) for find_or_insert_values' kernel; later: find_or_insert_later."""
        n = keys.shape[0]
        limit = self.capacity - self.size
        if missing is not None:
            missing = int(missing)
            if missing > limit:
                raise OverflowError("%d new keys do not fit: %d of %d rows used" % (
                    missing, self.size, self.capacity))
            if missing == 0 and fetch is None:
                found, new_keys, new_rows = (self._find(keys), empty((0,), np.int64),
                                             empty((0,), np.int64))
                if queue_first is not None:
                    queue_first(new_keys, new_rows, None, found)
                return found, new_keys, new_rows
        pool, pool_count, first_new_row = 0, 0, self.size
        if row_pool is not None:
            row_pool = index_array(row_pool, "row_pool")
            pool, pool_count = ptr(row_pool), row_pool.shape[0]
            if next_row is None:
                if missing is not None and pool_count < missing:
                    raise OverflowError("%d new keys, %d rows in the pool" % (missing,
                                                                             pool_count))
                limit = min(limit, pool_count)
            else:
                first_new_row = int(next_row)
        room = n if missing is None else missing
        new_keys = empty((room,), np.int64)
        new_rows = empty((room,), np.int64)
        rows = empty((n,), np.int64)
        if n == 0:
            if queue_first is not None:
                queue_first(new_keys, new_rows, None, rows)
            if later:
                return rows, new_keys, new_rows, fill_bytes(empty((1,), np.uint64), 0)
            return rows, new_keys, new_rows
        placed = fill_bytes(empty((1,), np.uint64), 0)
        arguments = (ptr(self._slots), self.slot_count, ptr(keys), n, first_new_row, limit,
                     ptr(placed), ptr(new_keys), ptr(new_rows), pool, pool_count, ptr(rows))
        fresh = None
        if fetch is None:
            launch(_hash_kernels()["find_or_insert"], n, *arguments)
        else:
            values, dim, init, vectors, statistics = fetch
            if getattr(values, "device_pieces", None) is not None:  # hash_table.cu reads .split
                raise TypeError("find_or_insert_values takes one table's rows, not a group's")
            fresh = _fresh_bits(values)
            launch(_hash_kernels()["find_or_insert_values"], n, *arguments,
                   *split_args(values, dim), dim, *init, ptr(vectors), *statistics,
                   0 if fresh is None else ptr(fresh))
        # The count is final after the first kernel. Copied before the host rows' pass, the
        # host's wait for it does not wait for that pass's writes to host memory to drain (a
        # millisecond in some calls: bench/NOTES.md, issue 21).
        if later:
            self.add_size_later(placed, 0)
            if queue_first is not None:
                queue_first(new_keys, new_rows, placed, rows)
            return rows, new_keys, new_rows, placed
        counted = None if missing is not None else to_host_later(
            placed, "the count of keys find_or_insert placed")
        if fresh is not None:  # host rows second, walked in ascending regions
            order, start = host_order_and_start(values, rows, zero_negative=True)
            width = 4 if dim % 4 == 0 else 1
            work = n * dim // width
            launch(_hash_kernels()["settle_host_rows_w%d" % (4 * width)], work,
                   ptr(keys), ptr(rows), n, ptr(order), ptr(start), ptr(fresh),
                   *split_args(values, dim), dim, *init, ptr(vectors),
                   blocks=walk_blocks(order, work))
        if missing is not None:
            self.size += missing
            if queue_first is not None:
                queue_first(new_keys, new_rows, None, rows)
            return rows, new_keys, new_rows
        if queue_first is not None:
            queue_first(new_keys, new_rows, placed, rows)
        count = int(counted()[0])
        self.size += count
        if count > limit:
            self.erase(new_keys[:count])
            raise OverflowError("%d new keys do not fit: %d of %d rows used, %d rows to give" % (
                count, self.size, self.capacity, limit))
        return rows, row_view(new_keys, 0, count), row_view(new_rows, 0, count)

    @uses_context
    def erase(self, keys, all_held=False):
        """Removes distinct `keys`; returns int64 rows they had (-1 where a key was not held).
        Waits for the GPU (the count of erased keys), unless all_held: the caller knows every
        key is held (an eviction's victims)."""
        keys = index_array(keys, "keys")
        rows = empty((keys.shape[0],), np.int64)
        if keys.shape[0]:
            erased = fill_bytes(empty((1,), np.uint64), 0)
            launch(_hash_kernels()["erase"], keys.shape[0], ptr(self._slots), self.slot_count,
                   ptr(keys), keys.shape[0], ptr(rows), ptr(erased))
            count = keys.shape[0] if all_held else int(to_host(erased)[0])
            self.size -= count
            self.tombstones += count
        return rows

    @uses_context
    def assign(self, keys, rows):
        """Inserts distinct keys that are not held yet with the given rows (used by load);
        raises OverflowError, changing nothing, if they exceed the capacity."""
        keys = index_array(keys, "keys")
        rows = index_array(rows, "rows")
        if rows.shape != keys.shape:
            raise ValueError("assign: %d rows for %d keys" % (rows.shape[0], keys.shape[0]))
        if self.size + keys.shape[0] > self.capacity:
            raise OverflowError("%d keys do not fit: %d of %d rows used" % (
                keys.shape[0], self.size, self.capacity))
        if keys.shape[0]:
            launch(_hash_kernels()["assign"], keys.shape[0], ptr(self._slots), self.slot_count,
                   ptr(keys), ptr(rows), keys.shape[0])
        self.size += keys.shape[0]

    @uses_context
    def rehashed(self, capacity):
        """Returns a HashIndex of `capacity` rows (past every held row) holding this index's
        keys at their rows, without tombstones, with no wait: this index itself where the
        capacity is its own (hash_rehash_many: no allocation of its own, whose free would wait
        for the device), else a new one (the caller
        may drop this one at once: its slots' free waits until the device is done with them).
        Raises OverflowError where they do not fit."""
        if self.size > capacity:
            raise OverflowError("%d keys do not fit in %d rows" % (self.size, capacity))
        if capacity == self.capacity:
            return hash_rehash_many([self])[0]
        fresh = HashIndex(capacity)
        launch(_hash_kernels()["reinsert"], self.slot_count, ptr(self._slots), self.slot_count,
               ptr(fresh._slots), fresh.slot_count)
        fresh.size = self.size
        return fresh

    @uses_context
    def export(self):
        """Returns (keys, rows) of every held key as int64 GPUArrays, ordered by row.

        Rows must lie in [0, capacity); raises RuntimeError if the index breaks that or holds
        a different number of keys than `size`.
        """
        kernels = _hash_kernels()
        key_of_row = fill_bytes(empty((self.capacity,), np.int64), 0xFF)
        is_held = fill_bytes(empty((self.capacity,), np.int64), 0)
        bad_rows = fill_bytes(empty((1,), np.uint64), 0)
        launch(kernels["keys_by_row"], self.slot_count, ptr(self._slots), self.slot_count,
               self.capacity, ptr(key_of_row), ptr(is_held), ptr(bad_rows))
        positions = exclusive_scan(is_held, self.capacity)
        held, bad = (int(a[0]) for a in to_host_many([positions[self.capacity:], bad_rows]))
        if bad or held != self.size:
            raise RuntimeError("hash index of capacity %d is inconsistent: %d keys held, %d "
                               "distinct rows in range, %d rows out of range" % (
                                   self.capacity, self.size, held, bad))
        keys = empty((held,), np.int64)
        rows = empty((held,), np.int64)
        if held:
            launch(kernels["compact_rows"], self.capacity, ptr(key_of_row), ptr(is_held),
                   ptr(positions), self.capacity, ptr(keys), ptr(rows))
        return keys, rows

    def __repr__(self):
        return "cuda HashIndex(size=%d, capacity=%d, slots=%d, device=%d)" % (
            self.size, self.capacity, self.slot_count, cuda_context.device_ordinal())
