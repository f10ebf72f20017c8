"""The victims of full DynamicVariable shards, chosen on the GPU per bucket by score for every
member of a table group at once (cuda_kernels/eviction.cu; backend/cpu/eviction.py is the NumPy
twin, with the docstrings)."""
import numpy as np

from sok1x.backend import given_hyper
from sok1x.backend.cuda import context as cuda_context
from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.groups import device_constant
from sok1x.backend.cuda.kernel_launch import (
    empty,
    exclusive_scan,
    fill_bytes,
    index_array,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    resident_blocks,
    row_view,
    to_device,
)
from sok1x.backend.cuts import part_starts

_PICK_THREADS, _REST_WARPS = 128, 16  # eviction.cu's threads of evict_pick, warps of _rest
_REST_CAP = 32768  # eviction.cu's REST_CAP
_KEYS_PER_SEGMENT = 32  # count_new_keys' segments
_BLOCKS_A_SLOT = 16  # evict_pick's first pass: blocks for each the GPU holds (_buckets_a_block)
_PICK_WARPS = _PICK_THREADS // 32
_BLOCK_KEYS_A_BUCKET = 16  # a lookup's keys a bucket from which a bucket is a block's
_UNSERVED_THREADS = 1024  # evict_unserved's block (a member's places)


@memoised_per_context
def _eviction_kernels():
    return {
        "counts": prepared("eviction.cu", "evict_bucket_counts", "PPPPqPP"),
        "scatter": prepared("eviction.cu", "evict_bucket_scatter", "PPPPqPPPP"),
        "distinct": prepared("eviction.cu", "evict_bucket_distinct", "PqPPP"),
        "totals": prepared("eviction.cu", "evict_member_totals", "PqPP"),
        "evictable": prepared("eviction.cu", "evict_count_evictable", "PqPqPP"),
        "mark": prepared("table_groups.cu", "mark_rows", "PqP"),
        "pick": prepared("eviction.cu", "evict_pick", "PqPqPqqPPPPPq"),
        "rest": prepared("eviction.cu", "evict_pick_rest", "PqPqPPPPPPPPP"),
        "stamp": prepared("eviction.cu", "stamp_last_step", "PPqqP"),
        "unserved": prepared("eviction.cu", "evict_unserved", "PqPPPPP"),
    }


def _step_at():
    """The device address the kernels read a replayed step from (given_hyper.step_given's
    clock[1]), or 0: they take the step they are passed."""
    clock = given_hyper.given_step()
    return 0 if clock is None else ptr(clock) + 8


@uses_context
def stamp_last_step(statistics, rows, step):
    """statistics[row, 0] = step for every row >= 0 of `rows` (queued; inside
    given_hyper.step_given, the step its clock holds when the work runs)."""
    rows = index_array(rows, "rows")
    if rows.shape[0]:
        launch(_eviction_kernels()["stamp"], rows.shape[0], ptr(statistics), ptr(rows),
               rows.shape[0], int(step), _step_at())


class NewKeySegments:
    """count_new_keys_segmented's segments of a lookup's new keys (member t's 2^bits[t] of them
    from first_segment[t], host; distinct_starts [total + 1] on the device): pick_victims takes
    them for the same keys, tags and found rows instead of counting the new keys again, where
    every member that evicts was segmented by the bits it picks by."""

    def __init__(self, keys, tags, found, bits, first_segment, total, distinct_starts):
        self.keys, self.tags, self.found = keys, tags, found
        self.bits, self.first_segment = bits, first_segment
        self.total, self.distinct_starts = total, distinct_starts

    def serve(self, keys, tags, found, counts, bits):
        """True where pick_victims of these arguments may take these segments."""
        if keys is not self.keys or tags is not self.tags or found is not self.found:
            return False
        evicting = np.flatnonzero(np.asarray(counts) > 0)
        return bool(np.array_equal(self.bits[evicting], np.asarray(bits, np.int64)[evicting]))


def _member_listing(indexes, row_starts, bits, counts, first_segment, lfu):
    """The kernels' device list of the members (eviction.cu's Evicting, EVICT_MEMBER entries
    each): index slots (0 for an index of None), bucket bits, keys to evict (0: its segments
    are passed by), its first victim's place (counts summed) and first segment."""
    counts = np.asarray(counts, dtype=np.int64)
    first_victim = part_starts(counts)
    listing = np.array([[0 if index is None else index.slots_address,
                         0 if index is None else index.slot_count, int(start), int(b),
                         int(c), int(v), int(s), int(bool(f))]
                        for index, start, b, c, v, s, f in zip(
                            indexes, row_starts, bits, counts, first_victim, first_segment,
                            lfu)], dtype=np.int64)
    return device_constant(listing.reshape(-1))  # (the same members and bounds each step)


def _new_key_segments(indexes, row_starts, keys, tags, found, counts, bits, lfu,
                      arrivals=None):
    """The passes both functions below share: each new key of a member with counts[t] > 0 into
    a segment per bucket of `bits` bits, and the distinct keys counted per segment. indexes:
    the members' HashIndexes, or None where no pick follows; arrivals: None, or a zeroed device
    int64 [T] that gets every member's keys (repeats too). Returns (the device member list, the
    number of segments, distinct_starts [segments + 1]: the exclusive scan of the distinct
    counts)."""
    counts = np.asarray(counts, dtype=np.int64)
    bits = np.asarray(bits, dtype=np.int64)
    segments = np.where(counts > 0, np.left_shift(1, bits), 0)
    first_segment = part_starts(segments)
    members = _member_listing(indexes, row_starts, bits, counts, first_segment, lfu)
    total = int(segments.sum())
    kernels = _eviction_kernels()
    n = keys.shape[0]
    # per segment: new keys, places taken, distinct keys
    zeroed = fill_bytes(empty((3 * total,), np.int64), 0)
    counted, taken = row_view(zeroed, 0, total), row_view(zeroed, total, 2 * total)
    distinct = row_view(zeroed, 2 * total, 3 * total)
    common = (ptr(members), ptr(keys), ptr(tags), ptr(found), n)
    launch(kernels["counts"], n, *common, ptr(counted), 0 if arrivals is None else ptr(arrivals))
    starts = exclusive_scan(counted, total)
    entry_keys, entry_segments = empty((n,), np.int64), empty((n,), np.int64)
    launch(kernels["scatter"], n, *common, ptr(starts), ptr(taken), ptr(entry_keys),
           ptr(entry_segments))
    launch(kernels["distinct"], n, ptr(starts), total, ptr(entry_keys), ptr(entry_segments),
           ptr(distinct))
    return members, total, exclusive_scan(distinct, total)


@uses_context
def count_new_keys(parts, keys, tags, found):
    """As backend/cpu/eviction.py's: int64 [2, parts] on the device, queued (no wait)."""
    return count_new_keys_segmented(parts, keys, tags, found)[0]


@uses_context
def count_new_keys_segmented(parts, keys, tags, found, bits=None):
    """count_new_keys, and its segments for pick_victims (NewKeySegments, or None where there
    are no keys). bits: None, or per member the bucket bits to segment its new keys by (-1:
    segments of about 32 keys, as count_new_keys's): a member that may evict segmented by the
    bits it picks by spares pick_victims its own count."""
    keys, tags, found = (index_array(a, what) for a, what in
                         ((keys, "keys"), (tags, "tags"), (found, "found")))
    n = keys.shape[0]
    out = fill_bytes(empty((2, parts), np.int64), 0)
    if n == 0:
        return out, None
    uniform = max(0, (n // _KEYS_PER_SEGMENT).bit_length() - 1)  # segments of about 32 keys
    bits = np.array([uniform] * parts if bits is None else
                    [uniform if b < 0 else b for b in bits], dtype=np.int64)
    members, total, distinct_starts = _new_key_segments(
        [None] * parts, [0] * parts, keys, tags, found, [1] * parts, bits, [False] * parts,
        arrivals=row_view(out.reshape(-1), parts, 2 * parts))
    launch(_eviction_kernels()["totals"], parts, ptr(members), parts, ptr(distinct_starts),
           ptr(out))
    first_segment = np.concatenate([[0], np.cumsum(np.left_shift(1, bits))[:-1]])
    return out, NewKeySegments(keys, tags, found, bits, first_segment, total, distinct_starts)


@uses_context
def count_evictable(indexes, statistics, row_starts, found, step):
    """As backend/cpu/eviction.py's: int64 [T] on the device, queued (no wait): a bit per flat
    row marks the found ones, then one pass over every member's slots."""
    parts = len(indexes)
    found = index_array(found, "found")
    evictable = fill_bytes(empty((parts,), np.int64), 0)
    rows = int(statistics.shape[0])
    looked = fill_bytes(empty((max(1, -(-rows // 32)),), np.uint32), 0)
    kernels = _eviction_kernels()
    if found.shape[0]:
        launch(kernels["mark"], found.shape[0], ptr(found), found.shape[0], ptr(looked))
    listing = np.array([[index.slots_address, index.slot_count, int(start), 0, 0, 0, 0, 0]
                        for index, start in zip(indexes, row_starts)], dtype=np.int64)
    members = to_device(listing.reshape(-1))
    launch(kernels["evictable"], max(index.slot_count for index in indexes), ptr(members), parts,
           ptr(statistics), int(step), ptr(looked), ptr(evictable))
    return evictable


@memoised_per_context
def _pick_slots():
    """The blocks of evict_pick the GPU holds at once."""
    return (resident_blocks(_eviction_kernels()["pick"], _PICK_THREADS)
            * cuda_context.multiprocessor_count())


def _buckets_a_block(buckets, keys):
    """How many buckets each block of evict_pick's first pass takes (1 to 32), for a lookup of
    `keys` keys: one where the buckets meet many keys each (keys at least _BLOCK_KEYS_A_BUCKET
    times the buckets: a full group's, dlrm26_full's 1,664 buckets of about 84 new keys), whose
    four warps then rank a bucket's keys together; else a multiple of the block's warps, each
    warp a bucket of few new keys at a time (a group of full shards whose every bucket meets a
    few), as many as leave _BLOCKS_A_SLOT blocks for each the GPU holds at once, so that the
    pass's tail (its last blocks' buckets, one after another) stays short: 32 for a full table
    alone's 2^20 buckets in a call of 2^20 keys, most of them met by no new key and passed over
    in one read."""
    if keys >= _BLOCK_KEYS_A_BUCKET * buckets:
        return 1
    many = buckets // (_BLOCKS_A_SLOT * _pick_slots())
    return int(min(32, max(_PICK_WARPS, -(-many // _PICK_WARPS) * _PICK_WARPS)))


@uses_context
def pick_victims(indexes, statistics, row_starts, keys, tags, found, counts, bits, step, lfu,
                 segments=None, padded=False, out=None):
    """As backend/cpu/eviction.py's: (victim_keys, victim_rows, victim_records [m, 2]) int64
    GPUArrays, queued (no wait); padded: also (totals, unserved, served), int64 [T] each. Sized
    by the keys and the host's counts: a segment per bucket of each evicting member (2^bits of
    them, about a 64th of its rows), then one block per segment (its bucket's evictable keys
    ranked in shared memory; where they meet few keys each, a block per 4 to 32 segments, a
    warp a segment: _buckets_a_block), one block per member for the keys whose bucket was used
    up (the member's evictable keys left, ranked), and one warp per member, key by key, where a
    member has more of those than a block ranks; padded, one block per member counts its
    places, those left without a victim and its victims. segments: count_new_keys_segmented's,
    taken where it serves these keys (NewKeySegments.serve) instead of counting the new keys
    again. out: None, or the three victims' arrays to write (a replayed step's, kept from one
    run to the next)."""
    m = int(np.sum(counts))
    if out is None:
        out = (empty((m,), np.int64), empty((m,), np.int64), empty((m, 2), np.int64))
    victim_keys, victim_rows, victim_records = (
        fill_bytes(array, fill) for array, fill in zip(out, (0xFF, 0xFF, 0)))
    keys, tags, found = (index_array(a, what) for a, what in
                         ((keys, "keys"), (tags, "tags"), (found, "found")))
    parts = len(indexes)
    checked = fill_bytes(empty((3 * parts,), np.int64), 0) if padded else None
    picked = (victim_keys, victim_rows, victim_records)
    if padded:  # each member's places, those without a victim, its victims
        picked += tuple(row_view(checked, k * parts, (k + 1) * parts) for k in range(3))
    if m == 0 or keys.shape[0] == 0:
        return picked
    if segments is not None and segments.serve(keys, tags, found, counts, bits):
        # every member keeps its segments of the count; one that does not evict is passed by
        members = _member_listing(indexes, row_starts, segments.bits, counts,
                                  segments.first_segment, lfu)
        total, distinct_starts = segments.total, segments.distinct_starts
    else:
        members, total, distinct_starts = _new_key_segments(indexes, row_starts, keys, tags,
                                                            found, counts, bits, lfu)
    kernels = _eviction_kernels()
    left = fill_bytes(empty((2,), np.uint64), 0)  # the first pass's keys without a victim, then
    again = row_view(left, 1, 2)  # the members evict_pick_rest leaves to the last pass
    victims = (ptr(victim_keys), ptr(victim_rows), ptr(victim_records), _step_at())
    head = (ptr(members), parts, ptr(statistics), int(step), ptr(distinct_starts))
    per_block = _buckets_a_block(total, keys.shape[0])
    launch(kernels["pick"], 0, *(head + (total, 0, ptr(left)) + victims + (per_block,)),
           block=_PICK_THREADS, blocks=-(-total // per_block))
    waiting = empty((m,), np.int64)
    candidates = empty((parts * 4 * _REST_CAP,), np.int64)
    launch(kernels["rest"], 32 * _REST_WARPS * parts,
           *(head + (ptr(left), ptr(again), ptr(waiting), ptr(candidates)) + victims),
           block=32 * _REST_WARPS, blocks=parts)
    launch(kernels["pick"], 0, *(head + (parts, 1, ptr(again)) + victims + (1,)),
           block=_PICK_THREADS, blocks=parts)  # a block a member, its first warp key by key
    if padded:
        launch(kernels["unserved"], 0, ptr(members), parts, ptr(distinct_starts),
               ptr(victim_rows), *(ptr(checked) + 8 * k * parts for k in range(3)),
               block=_UNSERVED_THREADS, blocks=parts)  # a block a member
    return picked
