"""A hash group's members' HashIndexes in one launch (engine/lookup/table_group.py's HashGroup, the
kernels hash_find_tagged, hash_find_or_insert_tagged, hash_erase_tagged and the rehash's
hash_take_slots_many and hash_reinsert_many of cuda_kernels/hash_table.cu; their new rows'
initial values: random_rows.init_rows_tagged).

The members travel to a kernel as one int64 list, seven entries each: the address and slot count
of the index's slots, its first new row (its size, or a hybrid table's high water), the rows it
has left, where its rows start among the group's flat rows, and the address and length of its
pool of freed rows (0, 0 for none). The sizes change as keys arrive, so an insert's list is
uploaded per call (one queued copy, no wait; a replayed insert's list is moved past its keys by
its own graph, hash_members_advance, and uploaded only where the host's sizes disagree with it);
a find's or an erase's reads none of them, and is uploaded once per layout of the indexes. Keys
come with tags, the member of each.
"""
import collections
import operator

import numpy as np

from sok1x.backend import size_ledger
from sok1x.backend.cuda.context import capture_recorder, uses_context
from sok1x.backend.cuda.kernel_launch import (
    empty,
    fill_bytes,
    index_array,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_view,
    to_device,
    to_host_many,
    wrap,
)
from sok1x.backend.cuda.staging import upload
from sok1x.backend.cuda.groups import device_constant
from sok1x.backend.cuts import cut_points, part_starts


@memoised_per_context
def _kernels():
    return {"find": prepared("hash_table.cu", "hash_find_tagged", "PPPqP"),
            "insert": prepared("hash_table.cu", "hash_find_or_insert_tagged", "PPPqPPPPPP"),
            "erase": prepared("hash_table.cu", "hash_erase_tagged", "PPPq"),
            "take_slots": prepared("hash_table.cu", "hash_take_slots_many", "PqqPP"),
            "rebuild_flags": prepared("hash_table.cu", "hash_rebuild_flags", "PPPqP"),
            "reinsert": prepared("hash_table.cu", "hash_reinsert_many", "PqqP"),
            "reinsert_into": prepared("hash_table.cu", "hash_reinsert_into_many", "Pqq"),
            "advance": prepared("hash_table.cu", "hash_members_advance", "PPq")}


def _members(indexes, row_starts, pools=None, into=None):
    """The device list of the members' indexes (the module's docstring); pools: as
    hash_insert_many's; into: None, or a device int64 [T * 7] the list is copied into (a
    replayed insert's, which its graph reads), else a new one."""
    pools = pools or [(None, None)] * len(indexes)
    listing = np.zeros((len(indexes), 7), dtype=np.int64)
    for row, index, start, pool_of in zip(listing, indexes, row_starts, pools):
        # size is a property that may read counts left on the device: read where needed, once
        size = index.size if pool_of[1] is None or len(pool_of) < 3 else 0
        pool = pool_of[0]
        row[:] = (index.slots_address, index.slot_count,
                  size if pool_of[1] is None else int(pool_of[1]),
                  index.capacity - size if len(pool_of) < 3 else int(pool_of[2]), int(start),
                  0 if pool is None or not pool.shape[0] else ptr(pool),
                  0 if pool is None else int(pool.shape[0]))
    if into is None:  # (a replayed eviction's insert lists the same pools at every step)
        return device_constant(listing.reshape(-1))
    upload(ptr(into), listing.reshape(-1))
    return into


@uses_context
def hash_insert_members(indexes, row_starts, into=None, sizes=None):
    """The member list hash_insert_many(..., members=) takes for a group's `indexes` as they are
    now (each member's next rows and room from its size), written into `into` (device int64
    [T * 7], kept by the caller: a replayed insert's graph reads it at every replay, and the
    host writes it before one where the graph's own hash_members_advance did not leave it as
    it must be) or a new array. sizes: None, or host int64 [T], the indexes' sizes
    as the caller just read them; then only those and the room are filled in per call, into
    the rest of the list as it is kept per layout.
    The cpu backend's twin returns None."""
    if sizes is None:
        return _members(indexes, row_starts, None, into)
    listing = _insert_layout(indexes, row_starts).copy()
    listing[:, 2] = sizes
    listing[:, 3] -= sizes  # the capacity, less the size: the room
    if into is None:
        return to_device(listing.reshape(-1))
    upload(ptr(into), listing.reshape(-1))
    return into


@uses_context
def hash_members_advance(members, placed):
    """Moves each member of hash_insert_members' list `members` (device, no pools) past its
    placed[t] keys (device int64 [T], a hash_insert_many's placed, the call that read the
    list): its first new row and room then are what hash_insert_members would write for the
    sizes after the call. Queued (one launch; in a replayed insert's recorded work)."""
    parts = int(placed.shape[0])
    if parts:
        launch(_kernels()["advance"], parts, ptr(members), ptr(placed), parts)


_insert_layouts = collections.OrderedDict()  # (slots, capacities, row starts) -> host [T, 7]


def _insert_layout(indexes, row_starts):
    """hash_insert_members' host list of a layout of the indexes with sizes 0 and the room
    their capacities (slots, slot counts and row starts change only where an index is rebuilt
    or the rows are laid out again)."""
    key = (tuple(map(_slots_address, indexes)), tuple(map(_capacity, indexes)),
           _starts_key(row_starts, len(indexes)))
    listing = _insert_layouts.get(key)
    if listing is None:
        listing = np.zeros((len(indexes), 7), dtype=np.int64)
        listing[:, 0], listing[:, 3], listing[:, 4] = key
        listing[:, 1] = [index.slot_count for index in indexes]
        _insert_layouts[key] = listing
        if len(_insert_layouts) > _LAYOUTS_KEPT:
            _insert_layouts.popitem(last=False)
    else:
        _insert_layouts.move_to_end(key)
    return listing


_LAYOUTS_KEPT = 64
_layouts = collections.OrderedDict()  # (slots, slot counts, row starts) -> device list
# A layout's key is read at every step from every member: attribute getters and map, which run
# without a Python frame per member (a group of 26 tables).
_slots_address = operator.attrgetter("slots_address")
_capacity = operator.attrgetter("capacity")
_slot_count = operator.attrgetter("slot_count")


def _starts_key(row_starts, members):
    """The first `members` row starts as a tuple of ints (a layout's key)."""
    starts = row_starts[:members]
    return tuple(starts.tolist() if isinstance(starts, np.ndarray) else map(int, starts))


def _probe_members(indexes, row_starts):
    """The device list of the members for a kernel that only probes their indexes (a find, an
    erase: slots, slot count and row start are all it reads; sizes, room and pools are 0).
    These change only when an index is rebuilt or the group's rows are laid out again, so the
    list is uploaded once per layout (an evicting step probes twice)."""
    key = (tuple(map(_slots_address, indexes)), tuple(map(_slot_count, indexes)),
           _starts_key(row_starts, len(indexes)))  # (row_starts may end the rows)
    members = _layouts.get(key)
    if members is None:
        listing = np.zeros((len(indexes), 7), dtype=np.int64)
        listing[:, 0], listing[:, 1], listing[:, 4] = key
        members = _layouts[key] = to_device(listing.reshape(-1))
        if len(_layouts) > _LAYOUTS_KEPT:
            _layouts.popitem(last=False)
    else:
        _layouts.move_to_end(key)
    recorder = capture_recorder()
    if recorder is not None:  # a captured graph reads it at every replay: keep it alive
        recorder.append((members, 0))
    return members


@uses_context
def hash_find_many(indexes, keys, tags, row_starts):
    """Flat rows (row_starts[t] + the row) of a hash group's keys, keys[i] one of member
    tags[i]'s, -1 where its index does not hold it: one launch, no wait."""
    keys, tags = index_array(keys, "keys"), index_array(tags, "tags")
    rows = empty((keys.shape[0],), np.int64)
    if keys.shape[0]:
        members = _probe_members(indexes, row_starts)
        launch(_kernels()["find"], keys.shape[0], ptr(members), ptr(keys), ptr(tags),
               keys.shape[0], ptr(rows))
    return rows


@uses_context
def hash_erase_many(indexes, keys, tags, counts, erased=None, counted=True):
    """Erases a hash group's keys, keys[i] one that member tags[i] holds (an eviction's
    victims; counts[t], host: how many are member t's), in one launch and no wait; a key -1 is
    passed by. erased: None, or device int64 [T], how many keys each member really erases where
    counts are bounds (a padded eviction: the places without a victim hold -1): each index
    counts them when its size is next read (HashIndex.add_size_later), its tombstones by the
    bounds until then. counted=False: the indexes count nothing now (a replayed eviction's
    recorded erase: hash_erase_counted counts each replay's)."""
    keys, tags = index_array(keys, "keys"), index_array(tags, "tags")
    if keys.shape[0]:
        members = _probe_members(indexes, [0] * len(indexes))
        launch(_kernels()["erase"], keys.shape[0], ptr(members), ptr(keys), ptr(tags),
               keys.shape[0])
    if counted:
        hash_erase_counted(indexes, counts, erased)


def hash_erase_counted(indexes, counts, erased=None):
    """Counts in each of `indexes` the keys an erase took out (hash_erase_many's counts and
    erased)."""
    size_ledger.erase_counted(indexes, counts, erased)


@uses_context
def hash_rehash_many(indexes, capacities=None, when=None):
    """Rebuilds each of `indexes` in place without tombstones, every key at its row: their slots
    copied to one pooled array (16 bytes a slot; it stays in sok1x's pool for the next rehash
    until release_unused), emptied and filled again, two launches for all, no wait and no
    allocation of their own. Returns the indexes. capacities: None, or a capacity per index
    (each at least its size, else OverflowError): new HashIndexes of those capacities, holding
    the keys at their rows, filled in one launch for all from the old slots, which stay as they
    are (a table group's growth, whose failure leaves them). when: None, or device int64 [T]
    (rebuild_flags'): only the indexes whose flag the work finds set are rebuilt, decided when
    it runs (a replayed evicting step's); their tombstones are then the caller's to count."""
    indexes = list(indexes)
    if not indexes:
        return indexes
    if capacities is not None:
        return _regrown(indexes, [int(c) for c in capacities])
    starts, addresses, counts = _slot_listing(indexes)
    listing = device_constant(np.concatenate([starts, addresses, counts]))
    total = int(counts.sum())
    held = empty((total, 2), np.int64)
    kernels = _kernels()
    launch(kernels["take_slots"], total, ptr(listing), len(indexes), total, ptr(held),
           0 if when is None else ptr(when))
    launch(kernels["reinsert"], total, ptr(listing), len(indexes), total, ptr(held))
    if when is None:
        for index in indexes:
            index.forget_tombstones()
    return indexes


@uses_context
def rebuild_flags(wanted, erased, room):
    """int64 [T] on the device: 1 where wanted[t] > room[0, t] or erased[t] > room[1, t]
    (device int64: the keys an insert may place in index t and the keys erased from it, [T]
    each; room [2, T], its empty slots and the tombstones it takes before it is worn), else 0
    (hash_rehash_many's when)."""
    parts = int(wanted.shape[0])
    flags = empty((parts,), np.int64)
    if parts:
        launch(_kernels()["rebuild_flags"], parts, ptr(wanted), ptr(erased), ptr(room), parts,
               ptr(flags))
    return flags


def _slot_listing(indexes):
    """Host int64 (first slot among all of them, slots' address, slot count) per index."""
    counts = np.array([index.slot_count for index in indexes], dtype=np.int64)
    starts = part_starts(counts)
    addresses = np.array([index.slots_address for index in indexes], dtype=np.int64)
    return starts, addresses, counts


def _fresh_indexes(index_class, capacities):
    """Empty HashIndexes (`index_class`) of `capacities` whose slots share one pooled
    allocation, emptied in one fill: a growth of 26 members took 26 allocations of the driver
    (the pool holds no block of a doubled size) and 26 fills in its step. The allocation goes
    back to the pool once every one of them is gone: a member that grows again before the
    others keeps its old slots until they do (16 bytes a slot, about 32 a row: a few percent
    of a member's rows and slots)."""
    counts = [index_class.slot_count_of(capacity) for capacity in capacities]
    slots = fill_bytes(empty((sum(counts), 2), np.int64), 0xFF)
    starts = cut_points(counts).tolist()
    return [index_class(capacity, slots=row_view(slots, start, stop))
            for capacity, start, stop in zip(capacities, starts[:-1], starts[1:])]


def _regrown(indexes, capacities):
    for index, capacity in zip(indexes, capacities):
        if index.size > capacity:
            raise OverflowError("%d keys do not fit in %d rows" % (index.size, capacity))
    fresh = _fresh_indexes(type(indexes[0]), capacities)
    starts, addresses, counts = _slot_listing(indexes)
    _, fresh_addresses, fresh_counts = _slot_listing(fresh)
    listing = to_device(np.concatenate([starts, addresses, fresh_addresses, fresh_counts]))
    total = int(counts.sum())
    launch(_kernels()["reinsert_into"], total, ptr(listing), len(indexes), total)
    for old, new in zip(indexes, fresh):
        new.size = old.size
    return fresh


@uses_context
def hash_insert_many(indexes, keys, tags, row_starts, pools=None, members=None):
    """find_or_insert of a hash group's owned keys in its members' `indexes` (keys[i] one of
    member tags[i]'s, whose rows start at flat row row_starts[t]), in one launch and no wait.
    pools: None, or per member (row_pool, next_row) as HashIndex.find_or_insert's (a hybrid
    table's freed rows in taking order, a device int64 array or None, then rows from next_row;
    None, None: rows from the index's size), or (row_pool, next_row, limit): a padded
    eviction's victims' rows, the k-th key placed taking row_pool[k] while k < limit, none where
    that entry is -1 (no victim: -3, as a key past the room); the index's size is not read.
    Returns (rows, new_keys, new_rows, new_tags, count, placed): every key's flat row (-3 for a
    key past its member's room), the keys placed with their flat rows and tags (the first
    count[0] of them; count a uint64 [1] device array), and placed, int64 [T] on the device:
    how many keys each member placed (past its room too). The indexes' sizes are unchanged
    until hash_insert_many_done, which the caller calls with the host copy of placed. members:
    None, or hash_insert_members' list (no pools), read as it is when the kernel runs. A
    negative key is passed by (row -1)."""
    keys, tags = index_array(keys, "keys"), index_array(tags, "tags")
    n, parts = keys.shape[0], len(indexes)
    counters = fill_bytes(empty((parts + 1,), np.int64), 0)  # per member, then the total
    rows, new_keys, new_rows, new_tags = (empty((n,), np.int64) for _ in range(4))
    if n:
        if members is None:
            members = _members(indexes, row_starts, pools)
        launch(_kernels()["insert"], n, ptr(members), ptr(keys), ptr(tags), n, ptr(counters),
               ptr(counters) + 8 * parts, ptr(new_keys), ptr(new_rows), ptr(new_tags),
               ptr(rows))
    count = wrap((1,), np.uint64, ptr(counters) + 8 * parts, base=counters)
    return rows, new_keys, new_rows, new_tags, count, row_view(counters, 0, parts)


@uses_context
def hash_insert_many_done(indexes, found, placed, keep):
    """Ends hash_insert_many's call `found` with the host copy of its placed counts: each index
    counts the keys it placed; keep=False (a failed step, or a member past its room) erases
    them again (waits: a failing step's path). keep=True with placed left on the device (the
    caller knows no member can pass its room): each index counts it when its size is next read
    (HashIndex.add_size_later), no wait; placed may also be a function returning its host copy
    (backend.read_later's: a copy queued at once, whose read waits for it alone, the same copy
    at every call), which hash_sizes reads once for all the indexes."""
    if keep and not isinstance(placed, np.ndarray):
        size_ledger.add_all(indexes, placed)
        return
    size_ledger.add(indexes, placed)
    if keep:
        return
    _, new_keys, _, new_tags, count, _ = found
    host_count, host_keys, host_tags = to_host_many([count, new_keys, new_tags])
    total = int(host_count[0])
    host_keys, host_tags = host_keys[:total], host_tags[:total]
    for t, index in enumerate(indexes):
        mine = host_tags == t
        if mine.any():
            index.erase(host_keys[mine])
