"""Which keys a full DynamicVariable shard evicts (issue 38, D14): per bucket, by score, on the
device (cuda_kernels/eviction.cu; backend/cpu/eviction.py its twin), as HierarchicalKV does.

What the policy guarantees. A shard at max_capacity that must take n new keys in a step evicts
exactly n held keys, chosen as follows:
- A key's bucket is the top bits of its 64-bit hash (MurmurHash3's finaliser), with
  2**bits the largest power of two that is at most max_capacity / 64: a bucket holds about 64
  keys on average (at least 1 bucket: a shard below 128 rows is one bucket, the whole shard).
- A held key may be evicted when no lookup of the current training step used it (its last
  step is older) and it is not among the keys of the lookup making room.
- Its score is, for evict_strategy "lru", (the last training step that looked it up, key); for
  "lfu", (its count of training lookups, that last step, key). Lowest goes first. So "least
  recently used" means: least recently used among the evictable keys of the new key's bucket,
  at the granularity of steps, ties broken by the smaller key, not of the whole shard.
- The new keys that evict are the step's new keys in the order of their hashes, which orders
  them by bucket (all of them once the shard is full; at the step that fills it, the first n).
  The k-th of them in a bucket takes the k-th lowest-score evictable key of that bucket; one
  whose bucket has no evictable key left takes the lowest-score evictable key left in the
  whole shard (new keys in the same order).
The choice is a function of the keys, their records and the step, never of thread timing, so
the cpu and cuda backends evict the same keys and a run repeats exactly. A step that cannot make
room (fewer evictable keys than new ones) fails on every rank before evicting (TableFullError).

How: evict() takes every member of a table group that must evict at once (a table alone is a
group of one). The device counts each bucket's distinct new keys and picks the victims of every
member in one pass (backend.pick_victims), with no sort and no host copy of the keys; the host
reads one number per member (the lowest row its victims got: none is missing) and never the
victims themselves, which stay on the device for the free lists (dynamic_table.FreeRows) and
for what pop_evicted hands out. One launch erases every victim (backend.hash_erase_many), and
each member's victims' rows are its next insert's pool as they are (first freed first).
What undoing the eviction needs (the victims' vectors, slots and records, the looked-up rows'
records) is gathered on the device, one gather per array for the whole group.

Two ways to know how many keys a member evicts:
- counted: the host reads each member's count of new keys first (table_group.HashGroup's
  rows_needed, a wait), evicts exactly what does not fit, and checks the victims (the wait
  above); a member that is filling up (free rows or fresh rows left, but too few) takes this way.
- padded (in place): a member that is full and frees no row (every one of max_capacity rows
  held: what any eviction leaves) evicts every one of its new keys, so the host needs no count.
  The arrays are sized by a bound on its new keys (the lookup's keys of that member), member t's
  places at the front of its part (one per new key, holding its victim) and -1 after them; the
  device counts each member's places (totals), those left without a victim (unserved, -1: the
  shard cannot make room) and its victims (served); the erase passes the -1 places by, and
  the member's insert takes the victims' rows as its pool in the same queue
  (HashGroup.make_room_in_place, insert_start). The host reads those counts with the placed
  counts in one wait once all of it is queued, and fails the step (TableFullError, undone by
  the step journal) where a key went unserved. Memory: the undo record's arrays are as long
  as the bound (8 + 8 + 16 + 4 dim (1 + slots) bytes a key), not as the victims.
"""
import collections
import weakref

import numpy as np

from sok1x.backend.cuts import cut_points
from sok1x.engine.tables import hybrid_rows
from sok1x.engine.tables.table import rebuild_worn

# a training lookup's header tells this as the room of a shard that is full and evicts every
# new key in place (lookup/table_group.py's HashGroup.room)
EVICTS_IN_PLACE = -1
KEYS_PER_BUCKET = 64
PREFETCHED = 4  # evictions whose victims' host copy is kept until read (KeptVictims)
# weak references to those KeptVictims, oldest first: one whose table went (replaced, deleted)
# takes its copy along; a copy still running then reads memory handed out again, harmless to
# it, and its page-locked blocks are taken again only once it has run (staging's events)
_PREFETCHED = []


def prefetched():
    """The KeptVictims whose host copy is kept until read, oldest first."""
    live = [kept for kept in (ref() for ref in _PREFETCHED) if kept is not None]
    _PREFETCHED[:] = [weakref.ref(kept) for kept in live]
    return live


def bucket_bits(capacity):
    """log2 of the bucket count of a shard of `capacity` rows: the largest power of two that is
    at most capacity / KEYS_PER_BUCKET (0: one bucket)."""
    buckets = max(1, int(capacity) // KEYS_PER_BUCKET)
    return buckets.bit_length() - 1


class Victims:
    """The victims of one evict(), every member's in one set of device arrays, member t's at
    [starts[t], starts[t + 1]) (starts: host): their keys, member rows, vectors, slots ({name:
    array}) and records (what undoing needs). The host holds their counts alone, or, for a
    padded eviction, bounds on them: then `totals` (device int64 [T]) says how many places each
    member has, one per new key, at the front of its part (the rest of it -1 keys and rows,
    zero rows), `served` how many of those got a victim (all of them, unless the step fails:
    a place without one holds -1), and the host reads them only where it needs a member's own
    victims (an undo, a reader). An array's members' parts are cut out together, the first
    time one of them is asked for. `kept` is what the members whose evicted keys someone reads
    keep of it (KeptVictims): the keys and vectors alone, so an eviction no one reads yet holds
    no slot or record. moved=False: no victim's row is handed out again in the step that
    evicted it, so an undo finds its vector and slots in it: `values` are gathered only for
    readers (else None), `slots` not at all ({})."""

    def __init__(self, backend, starts, device_keys, device_rows, values, slots, records,
                 totals=None, served=None, moved=True):
        self.backend, self.starts = backend, starts
        self.moved = moved  # whether a victim's row may be handed out in its step (undo_copies)
        self.spares = None  # SpareLists, where a padded eviction's new keys take spare rows
        self.device_keys, self.device_rows = device_keys, device_rows
        self.values, self.slots = values, slots
        self.records, self.totals, self.served = records, totals, served
        self.kept = KeptVictims(backend, starts, device_keys, values, totals)
        self._parts = {}  # id(array): (array, its members' parts)
        self._with_victim = {}  # padded, member t: None (every place got one) or which did

    def part(self, array, t):
        """Member t's victims' rows of one of the device arrays above. A padded eviction's
        (an undo's) are read first, once (a wait): its count, and which of its places got a
        victim (one that could not serve every new key has -1 among them)."""
        whole = self._parts_of(array)[t]
        if self.totals is None:
            return whole
        backend = self.backend
        part = backend.row_view(whole, 0, int(self.kept.counts()[t]))
        if t not in self._with_victim:
            rows = part if array is self.device_rows else backend.row_view(
                self._parts_of(self.device_rows)[t], 0, int(self.kept.counts()[t]))
            rows = np.asarray(backend.to_host(rows)).reshape(-1)
            self._with_victim[t] = (None if (rows >= 0).all() else
                                    backend.asarray(np.flatnonzero(rows >= 0)))
        places = self._with_victim[t]
        return part if places is None else backend.take_rows(part, places)

    def _parts_of(self, array):
        cut = self._parts.get(id(array))
        if cut is None or cut[0] is not array:
            cut = self._parts[id(array)] = (array, self.backend.row_views(array, self.starts))
        return cut[1]


class SpareLists:
    """The free lists of the members of a group that hand the new keys of an eviction in place
    their spare rows (HashGroup.spare_lists): one device int64 array, `lists`, member t's list
    at [cuts[t], cuts[t + 1]) (empty for a member that does not), each such member's FreeRows a
    view of it (`views`); and `backup`, the lists as they were before the step's eviction, from
    which its insert takes its rows and which its undo copies back. The eviction rotates each
    list on the device (queue_padded: backend.rotate_parts), its length fixed, so the host never
    reads it and a replayed class keeps both arrays."""

    def __init__(self, backend, cuts, lists):
        """lists: the members' lists joined (backend int64 [cuts[-1]]), kept as they are."""
        self.cuts = np.asarray(cuts, dtype=np.int64)
        self.lists = lists
        self.backup = backend.empty((int(self.cuts[-1]),), np.int64)
        self.views = backend.row_views(self.lists, self.cuts)
        self.backup_views = backend.row_views(self.backup, self.cuts)
        self.lengths = np.diff(self.cuts)
        self._held = []  # note_held's (member, its FreeRows, its high water)

    def note_held(self, tables):
        """Notes each member that takes spare rows through these lists (`tables`, the
        DynamicTables with parts here) as it holds them now (spares_serve said yes)."""
        self._held = [(table, table._free_rows, table._high) for table in tables]

    def serve_as_they_are(self, bounds, step):
        """Whether these lists serve an eviction in place of host int64 `bounds` in the
        journal's `step` as they did at note_held, without asking each member: the same members
        evict, each bound fits its part, and no member's free list, high water or count pending
        changed since, nor did an eviction of `step` free a row of it yet."""
        bounds = np.asarray(bounds)
        return (bool(self._held) and np.array_equal(bounds > 0, self.lengths > 0)
                and bool(np.all(bounds <= self.lengths))
                and all(table._pending is None and table._free_rows is free
                        and table._high == high and table._freed_now[0] != step
                        for table, free, high in self._held))

    def queue(self, backend, victims_rows, victims_cuts, served):
        """The device work of a step that takes them: the lists copied to `backup`, then each
        member's list less its first served[t] rows (those its new keys take) followed by its
        first served[t] victims' member rows (`victims_rows`, cut at host `victims_cuts`)."""
        backend.copy_array(self.backup, self.lists)
        backend.rotate_parts(self.lists, self.backup, self.cuts, victims_rows, victims_cuts,
                             served)

    def undo(self, backend):
        """Puts the lists back as they were before the step (its eviction undone)."""
        backend.copy_array(self.lists, self.backup)


class KeptVictims:
    """The keys and vectors of one evict()'s victims (device arrays, member t's at [starts[t],
    starts[t + 1]), or, padded, the first totals[t] rows there), kept for the members that hand
    them out (readers: take_victims adds them) until pop_evicted reads them, on the host (read)
    or as device arrays (device). prefetch() queues the host copy at once for readers on the
    host, beside the step's later work (with a padded eviction's totals); the last PREFETCHED
    evictions not read yet keep theirs (page-locked host memory), an older one reads its
    victims again when asked."""

    def __init__(self, backend, starts, device_keys, values, totals=None):
        self.backend, self.starts = backend, starts
        self.device_keys, self.values = device_keys, values
        self.totals = totals
        self._counts = None if totals is not None else np.diff(starts)  # host, once known
        self.readers = set()
        self.host_readers = set()  # those that read on the host (prefetch copies for them)
        self._host = None  # read(): (first row read, keys, vectors) on the host
        self._copying = None  # prefetch(): (first row, last row, collect)
        self._parts = None  # device(): every member's (keys, vectors) views
        self._unread = set()  # readers that have not read yet (add_reader)

    def know_counts(self, host_counts):
        """A padded eviction's totals, read by the host: counts() needs no wait then."""
        if self._counts is None:
            self._counts = np.asarray(host_counts, dtype=np.int64).reshape(-1)

    def counts(self):
        """Host int64 [T]: each member's victims (a padded eviction's places, read now: a
        wait; a step whose places did not all get one fails, and its readers forget it)."""
        if self._counts is None:
            self._counts = np.asarray(self.backend.to_host(self.totals),
                                      dtype=np.int64).reshape(-1)
        return self._counts

    def add_reader(self, t, on_host):
        """Member t hands these victims out (on the host, or as device arrays)."""
        self.readers.add(t)
        self._unread.add(t)
        if on_host:
            self.host_readers.add(t)

    def device(self, t):
        """Member t's (keys, vectors) as views of the device arrays (no copy)."""
        if self._parts is None:  # every member's at once: one row_views call an array
            backend, starts = self.backend, self.starts[:-1]
            stops = starts + self.counts()
            self._parts = list(zip(backend.row_views(self.device_keys, starts, stops),
                                   backend.row_views(self.values, starts, stops)))
        return self._parts[t]

    def _span(self, t=None):
        members = self.readers if t is None else self.readers | {t}
        return int(self.starts[min(members)]), int(self.starts[max(members) + 1])

    def _arrays(self, span):
        """The device arrays a host read of `span` copies: keys, vectors, and a padded
        eviction's totals while not read yet."""
        backend = self.backend
        arrays = [backend.row_view(self.device_keys, *span), backend.row_view(self.values, *span)]
        return arrays + ([self.totals] if self._counts is None else [])

    def prefetch(self):
        """Queues the copy of every reader's victims to the host (one copy per array, run beside
        the work queued after it); read() then waits for it alone."""
        if not self.host_readers or self._host is not None or self._copying is not None:
            return
        span = self._span()
        self._copying = span + (self.backend.download_staged_later(self._arrays(span)),)
        live = prefetched() + [self]
        for older in live[:-PREFETCHED]:
            older._copying = None  # its page-locked blocks go back
        _PREFETCHED[:] = [weakref.ref(kept) for kept in live[-PREFETCHED:]]

    def forget(self, t):
        """Member t no longer reads these victims (its step was undone, its table emptied by a
        load): once no member does, the host copy and its page-locked blocks go."""
        self.readers.discard(t)
        self.host_readers.discard(t)
        self._unread.discard(t)
        if not self.readers:
            self._drop_host()

    def _drop_host(self):
        self._host = self._copying = None
        _unlist(self)

    def _copied(self, t):
        """(span, collect) of the prefetched copy where it holds member t's victims, else None."""
        copying = self._copying
        if copying is not None and copying[0] <= self.starts[t] and \
                self.starts[t + 1] <= copying[1]:
            return copying
        return None

    def _take_host(self, span, keys, vectors, totals=None):
        if self.backend.NAME == "cpu":  # the device arrays there are the undo record's own
            keys, vectors = np.array(keys), np.array(vectors)
        if totals is not None and self._counts is None:
            self._counts = np.array(totals, dtype=np.int64).reshape(-1)
        self._host = (span[0], np.asarray(keys).reshape(-1), np.asarray(vectors))
        self._copying = None
        _unlist(self)

    def read(self, t):
        """Host (keys int64 [n], vectors float32 [n, dim]) of member t's victims. The first read
        takes those of every reader (the members from the first reader to the last) in one copy
        per array and one wait (prefetch's, where it still holds them); on cuda the arrays
        handed out lie in sok1x's page-locked blocks as copied (a block is taken again once no
        view of it lives), on cpu they are copies. Once every reader has read, the host copy is
        dropped (each reader's arrays keep their own blocks)."""
        if self._host is None:
            copied = self._copied(t)
            if copied is not None:
                self._take_host(copied[:2], *copied[2]())
            else:
                span = self._span(t)
                self._take_host(span, *self.backend.download_staged_many(self._arrays(span)))
        first, keys, vectors = self._host
        begin = int(self.starts[t]) - first
        end = begin + int(self.counts()[t])
        out = keys[begin:end], vectors[begin:end]
        self._unread.discard(t)
        if not self._unread:
            self._drop_host()
        return out


def _unlist(kept):
    _PREFETCHED[:] = [ref for ref in _PREFETCHED if ref() is not None and ref() is not kept]


def read_kept(entries):
    """Host (keys, vectors) of each (KeptVictims, member) entry (a table's unread evictions),
    with one wait for all of them that no prefetched copy holds, plus one per prefetched copy
    taken."""
    pending = {}
    for kept, t in entries:
        if kept._host is None and kept._copied(t) is None and id(kept) not in pending:
            pending[id(kept)] = (kept, kept._span(t))
    if pending:
        kept_list = list(pending.values())
        backend = kept_list[0][0].backend
        lists = [kept._arrays(span) for kept, span in kept_list]
        hosts = backend.download_staged_many([a for arrays in lists for a in arrays])
        at = 0
        for (kept, span), arrays in zip(kept_list, lists):
            kept._take_host(span, *hosts[at:at + len(arrays)])
            at += len(arrays)
    return [kept.read(t) for kept, t in entries]


class Evicted:
    """One evict()'s undo record: put_back() gives every victim its key, row, vector, slots and
    record again and the looked-up rows their records as they were (the caller restores the
    members' free lists and high water)."""

    def __init__(self, backend, flat_arrays, row_starts, found, pinned):
        self.backend = backend
        self.flat_arrays = flat_arrays  # () -> (statistics, row_starts) as they are then
        self.row_starts = np.asarray(row_starts, dtype=np.int64)  # those `found` counts in
        self.found, self.pinned = found, pinned  # every key's flat row, its record before
        self.victims = None  # Victims, once chosen
        self.spares = None  # SpareLists, where the new keys took spare rows
        self.unserved = None  # a padded eviction's device counts of new keys left without one
        # per member with victims: (t, table, the entry take_victims returned, taken)
        self.members = []

    def settle(self, host_totals, host_served, placed=None):
        """Hands a padded eviction's counts per member, read by the host since, to what would
        count them later: its places (host_totals) to the readers' copy, its victims
        (host_served) to each member's index (its size) and count of evicted keys. placed:
        None, or (device counts, their host copy) of the insert that took the victims' rows,
        which the same indexes count in the same pass."""
        victims = self.victims
        victims.kept.know_counts(host_totals)
        host_served = np.asarray(host_served, dtype=np.int64).reshape(-1)
        tables = [table for _, table, _, _ in self.members]
        counts, hosts = [victims.served], [host_served]
        if placed is not None:
            counts.append(placed[0])
            hosts.append(placed[1])
        self.backend.hash_settle_sizes([table.index for table in tables], counts, hosts)
        if tables:
            tables[0].settle_evicted_many(tables, victims.served, host_served)

    def put_back(self):
        backend, victims = self.backend, self.victims
        for t, table, entry, taken in reversed(self.members):
            table.restore_victims(victims, t, entry, taken)
        if self.spares is not None:
            self.spares.undo(backend)
        found = np.asarray(backend.to_host(self.found))  # undoing a failed step: a wait
        rows, first = np.unique(found, return_index=True)
        held = rows >= 0
        if held.any():  # the group may have grown since: its rows moved with its row_starts
            rows, first = rows[held], first[held]
            statistics, starts = self.flat_arrays()
            member = np.searchsorted(self.row_starts, rows, "right") - 1
            rows = rows - self.row_starts[member] + np.asarray(starts)[member]
            backend.put_rows(statistics, backend.asarray(rows),
                             backend.take_rows(self.pinned, backend.asarray(first)))


def _check_found(backend, tables, counts, starts, picked, statistics, evicted):
    """Raises RuntimeError, the records of the victims found put back, where some member's
    victims are fewer than counts[t] (one small wait: the lowest row of each member's)."""
    device_rows, records = picked[1], picked[2]
    short = np.flatnonzero(backend.part_bounds([device_rows], starts)[:, 0] < 0)
    if not short.size:
        return
    t = int(short[0])
    host_rows = np.asarray(backend.to_host(device_rows)).reshape(-1)
    chosen = np.flatnonzero(host_rows >= 0)  # their records as they were
    if chosen.size:
        backend.put_rows(statistics, backend.asarray(host_rows[chosen]),
                         backend.take_rows(records, backend.asarray(chosen)))
    evicted.put_back()
    found_here = int(np.count_nonzero(host_rows[starts[t]:starts[t + 1]] >= 0))
    raise RuntimeError("%s: %d of the %d keys to evict on rank %d were found"
                       % (tables[t].name, found_here, int(counts[t]), tables[0].rank))


class Queued(collections.namedtuple(
        "Queued", "found pinned keys rows values slots records totals unserved served")):
    """queue_padded's device arrays: every key's flat row and its record before (pinned); the
    victims' keys, member rows, vectors, slots ({name: array}) and records; and the device
    counts per member of places, places left without a victim and victims (Victims')."""
    __slots__ = ()

    def arrays(self):
        """The arrays as one list (a recorded run's outputs), the slots by name (the victims'
        vectors and slots where gathered)."""
        values = [] if self.values is None else [self.values]
        return list(self[:4]) + values + [self.slots[name] for name in sorted(self.slots)] + list(
            self[6:])

    @classmethod
    def of(cls, arrays, slot_names, values=True):
        """The Queued whose arrays() are `arrays` (slot_names: the gathered slots' names;
        values: whether the vectors were gathered)."""
        names, first = sorted(slot_names), 4 + bool(values)
        slots = dict(zip(names, arrays[first:first + len(names)]))
        return cls(*(list(arrays[:4]) + [arrays[4] if values else None, slots]
                     + list(arrays[first + len(names):])))


def _gathered(backend, values, slots, rows, fill):
    """(values[rows], {name: slot[rows]}) of the victims' flat `rows` (fill: a zero row where
    rows is -1, else those places unwritten): the vectors and every slot in one gather where
    the backend can (backend.gather_rows_many)."""
    names = list(slots)
    out = hybrid_rows.gather_rows_many(backend, [values] + [slots[name] for name in names], rows,
                                       fill)
    return out[0], dict(zip(names, out[1:]))


def fixed_victims(backend, bounds):
    """queue_padded's `out` for members of host `bounds`: arrays the victims' keys, flat rows,
    records and member rows are written into (a replayed step's, the same at every run: the
    member lists its insert and the offsets read hold their addresses)."""
    m = int(np.sum(bounds))
    return (backend.empty((m,), np.int64), backend.empty((m,), np.int64),
            backend.empty((m, 2), np.int64), backend.empty((m,), np.int64))


def queue_padded(tables, bounds, keys, tags, flat_arrays, step, out=None, room=None,
                 spares=None):
    """The device work of a padded eviction (evict's, module docstring), and nothing the host
    counts: the lookup's rows found and their records kept, the rows stamped with `step`, the
    victims picked, their vectors, slots and records gathered, their keys erased from the
    indexes (not counted: record_padded counts them), their records left at (step, 0). A replayed
    evicting step records this once (table_group.ReplayedInsert), its victims written into
    `out` (fixed_victims'; None: new arrays). room: None, or device int64 [2, T], each
    member's index's empty slots and the tombstones it takes before it is worn (table.is_worn:
    half its capacity less its tombstones), as the host counted them before the step: after the
    erase, every index with fewer empty slots than its new keys (its insert takes no
    tombstone's slot), or worn by the erase (its insert's probes would walk past the
    tombstones), is rebuilt, decided on the device, as an uncaptured step rebuilds worn indexes
    between its erase and its insert. spares: None, or the members' SpareLists
    (HashGroup.spare_lists): their new keys take spare rows, each list is rotated (its victims'
    rows joining it), and the victims keep their vectors and slots in their rows: nothing of
    them is gathered but the vectors of members whose evicted keys someone reads. Returns a
    Queued."""
    backend = tables[0].backend
    statistics, row_starts, values, slots = flat_arrays()
    bounds = np.asarray(bounds, dtype=np.int64)
    indexes = [table.index for table in tables]
    found = backend.hash_find_many(indexes, keys, tags, row_starts)
    pinned = backend.gather_rows(statistics, found)
    backend.stamp_last_step(statistics, found, step)  # what this step looked up stays
    device_keys, device_rows, records, totals, unserved, served = backend.pick_victims(
        indexes, statistics, row_starts, keys, tags, found, bounds,
        [bucket_bits(table.capacity) for table in tables], step,
        [table.dynamic.evict_strategy == "lfu" for table in tables], None, True,
        None if out is None else out[:3])
    starts = cut_points(bounds)
    firsts = np.asarray(row_starts[:-1], dtype=np.int64)
    member_rows = backend.offset_parts(device_rows, starts, -firsts,
                                       None if out is None else out[3])
    # (the places without a victim, past a member's new keys, are never read: not written,
    # which halves these gathers' bytes where a member's new keys are half its bound)
    vectors, saved = None, {}
    read = spares is not None and not all(
        table.drops_evicted() for table, bound in zip(tables, bounds) if bound)
    if spares is None or read:
        vectors, saved = _gathered(backend, values, {} if spares is not None else slots,
                                   device_rows, False)
    if spares is not None:
        spares.queue(backend, member_rows, starts, served)
    queued = Queued(found, pinned, device_keys, member_rows, vectors, saved, records, totals,
                    unserved, served)
    # the erase last, so that nothing here fails once a victim left its index (the pick left
    # each victim's record at (step, 0), what its row's new key counts from)
    backend.hash_erase_many(indexes, device_keys, backend.part_tags(starts), bounds, served,
                            counted=False)
    if room is not None:
        rebuilt = backend.hash_rehash_many(indexes, when=backend.rebuild_flags(totals, served,
                                                                              room))
        for table, index in zip(tables, rebuilt):
            table.index = index
    return queued


def record_padded(tables, bounds, queued, flat_arrays, spares=None):
    """The host's part of queue_padded's eviction (`queued`, for owned keys whose member t had
    at most bounds[t] new keys): the indexes count the erased victims (by their device counts,
    read with their next size or handed over by Evicted.settle), each member takes its victims
    (DynamicTable.take_victims). spares: queue_padded's. Returns the Evicted for the step
    journal
    (its `unserved` the device count of places without a victim, for the caller to read);
    on a failure, every victim is put back and the error raised."""
    backend = tables[0].backend
    row_starts = flat_arrays()[1]
    bounds = np.asarray(bounds, dtype=np.int64)
    starts = cut_points(bounds)
    evicted = Evicted(backend, lambda: flat_arrays()[:2], row_starts, queued.found,
                      queued.pinned)
    evicted.victims = Victims(backend, starts, queued.keys, queued.rows, queued.values,
                              queued.slots, queued.records, queued.totals, queued.served,
                              spares is None)
    evicted.victims.spares = evicted.spares = spares
    evicted.unserved = queued.unserved
    backend.hash_erase_counted([table.index for table in tables], bounds, queued.served)
    _take_victims(tables, bounds, evicted)
    return evicted


def _take_victims(tables, counts, evicted, first=None):
    """first() (or nothing), then each of `tables` with counts[t] takes its victims of
    `evicted` (DynamicTable.take_victims); on a failure, every victim back in its index with its
    record, the members done so far undone, and the error raised."""
    try:
        if first is not None:
            first()
        for t, table in enumerate(tables):
            if counts[t]:
                evicted.members.append((t, table, table.take_victims(evicted.victims, t), True))
    except BaseException:
        done = {member[0] for member in evicted.members}
        evicted.members += [(t, table, None, False) for t, table in enumerate(tables)
                            if counts[t] and t not in done]
        evicted.put_back()
        raise


def evict(tables, counts, keys, tags, flat_arrays, found=None, segments=None, padded=False,
          spares=None):
    """Evicts counts[t] keys from each of `tables` (host int64; a table group's members in
    order, or one table alone) that neither the current step nor this lookup looked up: the
    lookup's owned `keys` (backend int64), tags[i] the member of keys[i]. flat_arrays() returns
    (statistics, row_starts, values, slots): the flat arrays of their rows as they are then,
    member t's from row_starts[t] (slots: {name: array}); found: None, or the keys' flat rows
    by those arrays (backend.hash_find_many's, where the caller has them); segments: the new
    keys' segments backend.count_new_keys_segmented counted them in, or None.
    padded: counts[t] is a bound on member t's new keys (0: it evicts none), and every one of
    them evicts, counted on the device alone (no wait): the member, full (no free row), takes
    them into the rows its victims leave, in the lookup's insert (its pool: Victims.device_rows'
    part). evicted.unserved (device int64 [T]) then counts each member's new keys left without
    a victim: the caller reads it (with Victims' totals and served: Evicted.settle) and fails
    the step where one is not 0 (TableFullError, the step undone). spares: a padded eviction's
    SpareLists (queue_padded), or None.
    Returns an Evicted for the step journal. Raises, changing nothing, where something fails:
    RuntimeError where a member finds fewer victims than it needs (capacity_error rules that
    out; a padded eviction leaves that to unserved)."""
    first = tables[0]
    backend, step = first.backend, first.journal.step
    if padded:
        evicted = record_padded(tables, counts, queue_padded(
            tables, counts, keys, tags, flat_arrays, step, spares=spares), flat_arrays, spares)
        try:
            rebuild_worn(backend, tables)  # the erased keys' tombstones: every worn index at once
        except BaseException:
            evicted.put_back()
            raise
        _prefetch(evicted)
        return evicted
    statistics, row_starts, values, slots = flat_arrays()
    counts = np.asarray(counts, dtype=np.int64)
    indexes = [table.index for table in tables]
    if found is None:
        found = backend.hash_find_many(indexes, keys, tags, row_starts)
    evicted = Evicted(backend, lambda: flat_arrays()[:2], row_starts, found,
                      backend.gather_rows(statistics, found))
    backend.stamp_last_step(statistics, found, step)  # what this step looked up stays
    moved, read = undo_copies(tables, counts)
    picked = backend.pick_victims(
        indexes, statistics, row_starts, keys, tags, found, counts,
        [bucket_bits(table.capacity) for table in tables], step,
        [table.dynamic.evict_strategy == "lfu" for table in tables], segments, padded)
    device_keys, device_rows, records = picked[:3]
    totals = served = None
    starts = cut_points(counts)
    if padded:
        totals, evicted.unserved, served = picked[3:]
    else:  # one small wait: the lowest flat row of each member's victims (-1: one is missing)
        _check_found(backend, tables, counts, starts, picked, statistics, evicted)
    # what allocates comes before the first change
    firsts = np.asarray(row_starts[:-1], dtype=np.int64)
    vectors, saved = None, {}
    if moved or read:  # (the slots only where an undo must write them back)
        vectors, saved = _gathered(backend, values, slots if moved else {}, device_rows, True)
    evicted.victims = Victims(
        backend, starts, device_keys, backend.offset_parts(device_rows, starts, -firsts),
        vectors, saved, records, totals, served, moved)
    backend.hash_erase_many(indexes, device_keys, backend.part_tags(starts), counts, served)

    def first():
        rebuild_worn(backend, tables)  # the erased keys' tombstones: every worn index at once
    _take_victims(tables, counts, evicted, first)
    _prefetch(evicted)
    return evicted


def undo_copies(tables, counts):
    """(moved, read) for an eviction of counts[t] keys from each of `tables` (counted: each
    member then holds its capacity in keys, its new keys those and the room it had): moved,
    whether some member's new keys would take a row this step freed (more of them than the rows
    it had free before the step: DynamicTable.frees_before, after list_spares put its rows
    never handed out on the list), so that an undo must copy the victims' vectors and slots
    aside first; read, whether someone reads some member's evicted keys (their vectors are
    gathered then, slots never)."""
    moved = read = False
    for table, count in zip(tables, counts):
        if not count:
            continue
        table.list_spares()
        new_keys = int(count) + table.capacity - table.index.size
        moved = moved or not table.frees_before(new_keys)
        read = read or not table.drops_evicted()
    return moved, read


def _prefetch(evicted):
    try:  # the readers' copy, beside the rest of the step; without it read() copies then
        evicted.victims.kept.prefetch()
    except Exception:  # noqa: BLE001 (an optimisation: nothing depends on it)
        evicted.victims.kept._drop_host()
