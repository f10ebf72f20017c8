"""A vectorised open-addressing hash index (linear probing) from int64 keys to shard rows.

Keys are non-negative (the engine rejects negative ones before they get here), so -1 marks an empty
slot and -2 a tombstone: the slot of an erased key, which probes walk past and inserts leave alone
(a key may sit further along its chain), until the owner rebuilds the index (engine tables do so
once tombstones pass half the capacity). The slot array has a power-of-two size of at least twice
the row capacity, so the load stays at or below 0.5 and probe chains stay short. Every operation
works on a whole batch of keys at once: each round probes one slot for every key still unresolved.
"""
import numpy as np

from sok1x.backend.cpu import rows as cpu_rows

EMPTY = -1
TOMBSTONE = -2
OVERFLOW_ROW = -3  # a key that found no room (hash_insert_many), as cuda_kernels' OVERFLOW_ROW


def _slot_count(capacity):
    count = 16
    while count < 2 * capacity:
        count *= 2
    return count


def scramble(keys):
    """MurmurHash3's 64-bit finaliser of each key (uint64), as cuda_kernels' scramble_key."""
    with np.errstate(over="ignore"):
        x = np.asarray(keys).astype(np.uint64)
        x = (x ^ (x >> np.uint64(33))) * np.uint64(0xFF51AFD7ED558CCD)
        x = (x ^ (x >> np.uint64(33))) * np.uint64(0xC4CEB9FE1A85EC53)
        return x ^ (x >> np.uint64(33))


def _home_slot(keys, mask):
    """The scrambled key masked to a slot index."""
    return (scramble(keys) & np.uint64(mask)).astype(np.int64)


class HashIndex:
    """Maps keys to rows 0..capacity-1 of one shard, handing out rows in insertion order.

    capacity: the most keys the shard can hold. Attributes: size (keys held), capacity,
    tombstones (slots of erased keys).
    """

    def __init__(self, capacity):
        self.capacity = int(capacity)
        slots = _slot_count(self.capacity)
        self._mask = slots - 1
        self._slot_keys = np.full(slots, EMPTY, dtype=np.int64)
        self._slot_rows = np.full(slots, EMPTY, dtype=np.int64)
        self.size = 0
        self.tombstones = 0

    def forget_tombstones(self):
        """The index was rebuilt: no tombstone is left (cuda's also drops what pending counts
        would correct; a cpu index has none)."""
        self.tombstones = 0

    def empty_slots(self):
        """Slots neither a key nor a tombstone holds: the most new keys an insert can place
        before the index is rebuilt (an insert does not take a tombstone's slot)."""
        return self.slot_count - self.size - self.tombstones

    @property
    def slot_count(self):
        """The index's slots (twice its capacity or more, a power of two)."""
        return self._mask + 1

    def settle_size(self, counts, host_counts):
        """Nothing to hand over: a cpu index counts its keys as it places them (cuda's may
        count a hash group's placed keys later, HashIndex.add_size_later there)."""

    def _locate(self, keys):
        """Returns the int64 slot of each key, -1 where a key is not held."""
        slots = np.full(keys.shape[0], EMPTY, dtype=np.int64)
        pending = np.arange(keys.shape[0])
        slot = _home_slot(keys, self._mask)
        while pending.size:
            held = self._slot_keys[slot]
            hit = held == keys[pending]
            slots[pending[hit]] = slot[hit]
            go_on = ~hit & (held != EMPTY)
            pending = pending[go_on]
            slot = (slot[go_on] + 1) & self._mask
        return slots

    def find(self, keys):
        """Returns int64 rows for `keys`, -1 where a key is not held."""
        slots = self._locate(np.asarray(keys, dtype=np.int64))
        return np.where(slots >= 0, self._slot_rows[np.maximum(slots, 0)], EMPTY)

    def count_missing(self, keys):
        """Returns how many distinct keys of `keys` are not held yet (a wait on cuda)."""
        cpu_rows.COUNTS["host_waits"] += 1
        return self._count_missing(keys)

    def _count_missing(self, keys):
        unique_keys = np.unique(np.asarray(keys, dtype=np.int64))
        return int(np.count_nonzero(self.find(unique_keys) < 0))

    def find_or_insert(self, keys, row_pool=None, missing=None, next_row=None,
                       queue_first=None):
        """Returns int64 rows for `keys`, giving new keys the next free rows.

        Returns (rows, new_keys, new_rows), the last two for the keys inserted by this call.
        row_pool: None (new keys get rows size, size + 1, ...) or int64 rows, at least as many as
        the new keys: the k-th new key gets row_pool[k] (a table that reuses freed rows); with
        next_row, rows past the pool are next_row, next_row + 1, ... missing: count_missing(keys)
        when the caller has it (the cuda index then skips its own count; here it is not
        needed). The caller checks count_missing() against the capacity first; raises
        OverflowError if the index would overflow anyway (and then changes nothing).
        queue_first: None, or queue_first(new_keys, new_rows, None, rows), called once the keys
        are placed (cuda's calls it before its one wait, with a device count).
        """
        if missing is None:  # cuda's waits for the count of keys it placed
            cpu_rows.COUNTS["host_waits"] += 1
        return self._find_or_insert(keys, row_pool, next_row, queue_first)

    def _find_or_insert(self, keys, row_pool, next_row, queue_first):
        keys = np.asarray(keys, dtype=np.int64)
        unique_keys, inverse = np.unique(keys, return_inverse=True)
        unique_rows = self.find(unique_keys)
        missing = np.flatnonzero(unique_rows < 0)
        if self.size + missing.size > self.capacity:
            raise OverflowError("%d new keys do not fit: %d of %d rows used" % (
                missing.size, self.size, self.capacity))
        new_keys = unique_keys[missing]
        if row_pool is None:
            new_rows = np.arange(self.size, self.size + missing.size, dtype=np.int64)
        else:
            row_pool = np.asarray(row_pool, dtype=np.int64)
            if next_row is not None:
                fresh = max(0, missing.size - row_pool.shape[0])
                row_pool = np.concatenate([row_pool, np.arange(next_row, next_row + fresh,
                                                               dtype=np.int64)])
            if row_pool.shape[0] < missing.size:
                raise OverflowError("%d new keys, %d rows in the pool" % (missing.size,
                                                                         row_pool.shape[0]))
            new_rows = row_pool[:missing.size].copy()
        self._insert(new_keys, new_rows)
        self.size += missing.size
        unique_rows[missing] = new_rows
        rows = unique_rows[inverse]
        if queue_first is not None:
            queue_first(new_keys, new_rows, None, rows)
        return rows, new_keys, new_rows

    def find_or_insert_pooled(self, keys, row_pool):
        """find_or_insert where a padded eviction's victims' rows are the pool: every new key is
        placed, the k-th (in key order) at row_pool[k], and at OVERFLOW_ROW where the pool has
        no row there (a place without a victim: -1, or past the pool), as cuda's kernel places
        them; the size counts them all (the step fails and erases them again). Returns (rows,
        new_keys, new_rows)."""
        keys = np.asarray(keys, dtype=np.int64)
        unique_keys, inverse = np.unique(keys, return_inverse=True)
        unique_rows = self.find(unique_keys)
        missing = np.flatnonzero(unique_rows < 0)
        pool = np.asarray(row_pool, dtype=np.int64)[:missing.size]
        new_rows = np.full(missing.size, OVERFLOW_ROW, dtype=np.int64)
        new_rows[:pool.shape[0]] = np.where(pool >= 0, pool, OVERFLOW_ROW)
        new_keys = unique_keys[missing]
        self._insert(new_keys, new_rows)
        self.size += missing.size
        unique_rows[missing] = new_rows
        return unique_rows[inverse], new_keys, new_rows

    def find_or_insert_later(self, keys, queue_first=None):
        """find_or_insert where the caller knows the new keys fit (cuda's waits for nothing
        then): returns (rows, new_keys, new_rows, placed), placed uint64 [1] their count."""
        rows, new_keys, new_rows = self._find_or_insert(keys, None, None, queue_first)
        return rows, new_keys, new_rows, np.array([new_keys.shape[0]], dtype=np.uint64)

    def find_or_insert_values(self, keys, values, spec, table_id, row_pool=None, missing=None,
                              next_row=None, queue_first=None, touch=None):
        """find_or_insert, then init_rows of the new keys' rows of `values` and the vectors of
        every key: (rows, vectors [n, dim], new_keys, new_rows), as the cuda index's one
        kernel; touch: None or (statistics, step) for touch_rows of the rows."""
        rows, new_keys, new_rows = self.find_or_insert(keys, row_pool, missing, next_row,
                                                       queue_first)
        cpu_rows.init_rows(values, new_rows, new_keys, spec, table_id)
        if touch is not None:
            cpu_rows.touch_rows(touch[0], rows, touch[1])
        return rows, cpu_rows.gather_rows(values, rows), new_keys, new_rows

    def assign(self, keys, rows):
        """Inserts distinct keys that are not held yet with the given rows (used by load)."""
        keys = np.asarray(keys, dtype=np.int64)
        self._insert(keys, np.asarray(rows, dtype=np.int64))
        self.size += keys.shape[0]

    def erase(self, keys, all_held=False):
        """Removes distinct `keys`; returns int64 rows they had (-1 where a key was not held).
        all_held: the caller knows every key is held (cuda's then waits for no count)."""
        slots = self._locate(np.asarray(keys, dtype=np.int64))
        held = slots[slots >= 0]
        rows = np.where(slots >= 0, self._slot_rows[np.maximum(slots, 0)], EMPTY)
        self._slot_keys[held] = TOMBSTONE
        self._slot_rows[held] = EMPTY
        self.size -= held.size
        self.tombstones += held.size
        return rows

    def _insert(self, keys, rows):
        """Places distinct, absent keys; when several claim one empty slot, the first one wins and
        the rest probe on."""
        slot = _home_slot(keys, self._mask)
        pending = np.arange(keys.shape[0])
        while pending.size:
            free = self._slot_keys[slot] == EMPTY
            winners = np.zeros(pending.size, dtype=bool)
            free_at = np.flatnonzero(free)
            _, first = np.unique(slot[free_at], return_index=True)
            winners[free_at[first]] = True
            self._slot_keys[slot[winners]] = keys[pending[winners]]
            self._slot_rows[slot[winners]] = rows[pending[winners]]
            pending = pending[~winners]
            slot = (slot[~winners] + 1) & self._mask

    def rehashed(self, capacity):
        """Returns a new HashIndex of `capacity` rows holding this index's keys at their rows,
        without tombstones. Raises OverflowError where they do not fit."""
        if self.size > capacity:
            raise OverflowError("%d keys do not fit in %d rows" % (self.size, capacity))
        fresh = HashIndex(capacity)
        fresh.assign(*self.export())
        return fresh

    def export(self):
        """Returns (keys, rows) of every held key, ordered by row."""
        used = self._slot_keys >= 0
        keys, rows = self._slot_keys[used], self._slot_rows[used]
        order = np.argsort(rows, kind="stable")
        return keys[order], rows[order]


def hash_sizes(indexes):
    """Host int64 [len(indexes)]: each index's size (cuda's reads a group's pending counts
    once for all of them; a cpu index counts as it places)."""
    return np.array([index.size for index in indexes], dtype=np.int64)


def hash_tombstones(indexes):
    """Host int64 [len(indexes)]: each index's tombstones."""
    return np.array([index.tombstones for index in indexes], dtype=np.int64)


def hash_settle_sizes(indexes, counts, host_counts):
    """Nothing to hand over, as HashIndex.settle_size (cuda's hands a group's counts to every
    index at once)."""


def hash_insert_members(indexes, row_starts, into=None, sizes=None):
    """cuda's list of a group's members for a replayed insert: the cpu insert reads the indexes
    themselves whenever it runs, so there is none (None)."""
    return None


def hash_members_advance(members, placed):
    """cuda's list moved past a call's placed keys: there is no list here (None)."""


def hash_insert_many(indexes, keys, tags, row_starts, pools=None, members=None):
    """find_or_insert of a hash group's owned keys in its members' `indexes`: keys[i] is a key
    of member tags[i], whose rows start at flat row row_starts[t]; pools: None, or per member
    (row_pool, next_row) as find_or_insert's (None, None: rows from the index's size), or
    (row_pool, next_row, limit): a padded eviction's victims' rows, every new key placed from
    the pool alone (HashIndex.find_or_insert_pooled: OVERFLOW_ROW where it has no row, as on
    cuda).
    Returns (rows, new_keys, new_rows, new_tags, count, placed): every key's flat row
    (OVERFLOW_ROW where its member's shard has no room), the keys placed with their flat rows
    and tags (the first count[0] of them, -1 after), and per member int64 [T] how many new keys
    it got (its room exceeded: the shard is full, nothing of it placed). A negative key is
    passed by (row -1), as cuda's kernel passes it; members: cuda's list (hash_insert_members),
    unused here. No wait (cuda leaves placed on the device); the caller reads placed and ends
    the call with hash_insert_many_done."""
    keys, tags = np.asarray(keys, dtype=np.int64), np.asarray(tags, dtype=np.int64)
    rows = np.full(keys.shape[0], EMPTY, dtype=np.int64)
    placed = np.zeros(len(indexes), dtype=np.int64)
    new = [(keys[:0], keys[:0], keys[:0])]
    held = keys >= 0
    for t in np.unique(tags[held]):
        index, mine = indexes[t], np.flatnonzero((tags == t) & held)
        start = int(row_starts[t])
        placed[t] = index._count_missing(keys[mine])
        if pools is not None and len(pools[t]) == 3:  # a padded eviction's: the pool alone
            own, new_keys, new_rows = index.find_or_insert_pooled(keys[mine], pools[t][0])
        elif index.size + placed[t] > index.capacity:
            own = index.find(keys[mine])
            rows[mine] = np.where(own >= 0, own + start, OVERFLOW_ROW)
            continue
        else:
            pool, next_row = (None, None) if pools is None else pools[t]
            own, new_keys, new_rows = index.find_or_insert(keys[mine], pool, placed[t],
                                                           next_row)
        rows[mine] = np.where(own >= 0, own + start, own)
        new.append((new_keys, np.where(new_rows >= 0, new_rows + start, new_rows),
                    np.full(new_keys.shape, t, dtype=np.int64)))
    new_keys, new_rows, new_tags = (np.concatenate(parts) for parts in zip(*new))
    count = np.array([new_keys.shape[0]], dtype=np.uint64)
    # as long as the keys, as cuda's (a replay copies them into arrays of that length)
    new_keys, new_rows, new_tags = (np.concatenate([a, np.full(keys.shape[0] - a.shape[0], -1,
                                                               dtype=np.int64)])
                                    for a in (new_keys, new_rows, new_tags))
    return rows, new_keys, new_rows, new_tags, count, placed


def hash_insert_many_done(indexes, found, placed, keep):
    """Ends hash_insert_many's call `found` with the host copy of its placed counts (or a
    function returning it, as cuda takes): keep=True keeps the placed keys (the indexes counted
    them as they placed them); keep=False erases them from their members' indexes again."""
    if keep:
        return
    _, new_keys, _, new_tags, count, _ = found
    count = int(count[0])
    for t, index in enumerate(indexes):
        mine = new_tags[:count] == t
        if mine.any():
            index.erase(new_keys[:count][mine])


def hash_erase_many(indexes, keys, tags, counts, erased=None, counted=True):
    """Erases a hash group's keys, keys[i] one that member tags[i] holds (counts[t]: how many
    are member t's, or a bound on them where `erased` (int64 [T]) says how many; a key -1 is
    passed by). A cpu index counts what it erases as it erases them, whatever `counted` (cuda's
    counts `erased` later, or, counted=False, leaves it to hash_erase_counted)."""
    keys, tags = np.asarray(keys, dtype=np.int64), np.asarray(tags, dtype=np.int64)
    held = keys >= 0
    for t, index in enumerate(indexes):
        if counts[t]:
            index.erase(keys[(tags == t) & held])


def hash_erase_counted(indexes, counts, erased=None):
    """cuda's count of an erase's keys in its indexes: a cpu index counted them as it erased
    them (hash_erase_many), so nothing is left to count."""


def hash_rehash_many(indexes, capacities=None, when=None):
    """Each of `indexes` rebuilt at its own capacity (or at capacities[t]: at least its size,
    else OverflowError) without tombstones, every key at its row; returns them (new HashIndexes
    here; cuda rebuilds them in place at their own capacity, and makes new ones at others,
    the old ones left as they are). when: None, or int64 [T] (rebuild_flags'): only the indexes
    flagged are rebuilt, the others returned as they are."""
    if capacities is None:
        capacities = [index.capacity for index in indexes]
    return [index.rehashed(int(capacity)) if when is None or when[t] else index
            for t, (index, capacity) in enumerate(zip(indexes, capacities))]


def rebuild_flags(wanted, erased, room):
    """int64 [T]: 1 where wanted[t] > room[0, t] (its empty slots) or erased[t] > room[1, t]
    (the tombstones it takes before it is worn), else 0 (cuda's, on the device)."""
    room = np.asarray(room).reshape(2, -1)
    return ((np.asarray(wanted) > room[0]) | (np.asarray(erased) > room[1])).astype(np.int64)


def hash_find_many(indexes, keys, tags, row_starts):
    """Flat rows (row_starts[t] + the row) of a hash group's keys, keys[i] one of member
    tags[i]'s, -1 where its index does not hold it; a negative key (a per-peer capacity's
    padded slot, tag -1) is passed by, row -1, as cuda's kernel passes it."""
    keys, tags = np.asarray(keys, dtype=np.int64), np.asarray(tags, dtype=np.int64)
    rows = np.full(keys.shape[0], EMPTY, dtype=np.int64)
    held = keys >= 0
    for t in np.unique(tags[held]):
        mine = np.flatnonzero(held & (tags == t))
        own = indexes[t].find(keys[mine])
        rows[mine] = np.where(own >= 0, own + int(row_starts[t]), EMPTY)
    return rows
