"""The host's counts of hash indexes whose inserts and erases the device counts: keys held and
tombstones, one int64 array each for a ledger's indexes, and the device counts still to add.

A backend whose inserts count their placed keys on the device (cuda) leaves those counts
pending and adds them when a size is next read, or when the engine hands over a copy it read
since. An index alone has a ledger of its own (one entry). A hash group's indexes share one,
joined when the group's sizes are read (sizes(): an index's position there is its member's),
so that a step's placed counts are one pending entry for the whole group, settled by one NumPy
expression: the host's work is then the same for 1 or 26 members. An index read on its own
(size, tombstones) reads its ledger's entry; reading a size settles every count pending on its
ledger (one read of each copy, waiting for it alone).

Memory: 16 bytes an index, and each pending entry's references (a device count array or the
function reading its copy, and the tombstones' bounds, 8 bytes an index). A ledger names its
indexes by id() only, so it keeps none of them alive; an index that dies or joins another
ledger leaves its old one unshared (shared() then finds none, and the next sizes() joins
them again). The group calls take a list of indexes in a group's order and fall back to a call
per index where they share no ledger.
"""
import numpy as np

__all__ = ["SizeLedger", "CountedIndex", "sizes", "tombstones", "settle", "add_all", "add",
           "erase_counted"]


class SizeLedger:
    """Keys held (`sizes`) and tombstones of n indexes, int64 [n] each, and `later`: the counts
    still on the device, entries (counts, targets, positions, sign, bounds): counts a device
    integer array (or a function returning its host copy), whose host copy at `positions` is
    added times `sign` to sizes at `targets` (an int, an int64 array of distinct indexes, or a
    slice for every index); bounds: 0, or the bounds on erased keys (per target) that
    tombstones counted meanwhile, corrected by the true counts then (where not 0). ids: the
    id() of each index, in order, while the ledger is theirs alone (None once one of them left
    it). to_host_many: the backend's copy of several device arrays to the host, one wait."""

    __slots__ = ("sizes", "tombstones", "later", "ids", "to_host_many")

    def __init__(self, sizes, tombstones, to_host_many, ids=None):
        self.sizes = np.array(sizes, dtype=np.int64).reshape(-1)
        self.tombstones = np.array(tombstones, dtype=np.int64).reshape(-1)
        self.later = []
        self.ids = ids
        self.to_host_many = to_host_many

    def settle(self):
        """Adds every pending count: copies already queued (functions) are read, the other
        device arrays copied in one call; counted only once every read returned, so a read that
        fails (a bounded wait that timed out) leaves every count pending, none lost."""
        later = self.later
        waited = [entry[0] for entry in later if not callable(entry[0])]
        copies = iter(self.to_host_many(waited) if waited else ())
        hosts = [entry[0]() if callable(entry[0]) else next(copies) for entry in later]
        self.later = []
        for entry, host in zip(later, hosts):
            self._count(entry, host)

    def settle_of(self, counts, host_counts):
        """Adds the pending entries of the device arrays `counts` (a list) with their host
        copies `host_counts`, read since; the other entries stay pending."""
        left = []  # (by identity: == would compare the device arrays)
        for entry in self.later:
            for array, host in zip(counts, host_counts):
                if entry[0] is array:
                    self._count(entry, host)
                    break
            else:
                left.append(entry)
        self.later = left

    def _count(self, entry, host):
        _, targets, positions, sign, bounds = entry
        count = np.asarray(host, dtype=np.int64).reshape(-1)[positions]
        if sign > 0:
            self.sizes[targets] += count
        else:
            self.sizes[targets] -= count
        # bounds: 0 (a placed count's), else the tombstones an erase counted by its bounds,
        # corrected where a bound is not 0 (nothing counted meanwhile, or forgotten)
        if isinstance(bounds, np.ndarray):
            self.tombstones[targets] -= np.where(bounds != 0, bounds - count, 0)
        elif bounds:
            self.tombstones[targets] -= bounds - count

    def forget_tombstones(self, t):
        """Index t was rebuilt (its erased keys' slots emptied): no tombstone left, nor one to
        correct by a pending count (whose bound would otherwise take the gap between bound and
        count off a zero)."""
        self.tombstones[t] = 0
        kept = []
        for counts, targets, positions, sign, bounds in self.later:
            if np.any(bounds):
                if isinstance(targets, slice):
                    bounds = np.array(bounds, dtype=np.int64)
                    bounds[t] = 0
                elif isinstance(targets, np.ndarray):  # (some of the indexes, in order)
                    bounds = np.where(targets == t, 0, bounds)
                elif targets == t:
                    bounds = 0
            kept.append((counts, targets, positions, sign, bounds))
        self.later = kept


class CountedIndex:
    """A hash index's size and tombstones kept in a SizeLedger (its own until sizes() of its
    group joins it to the group's): the part of cuda's HashIndex that counts. Call _count_in(
    to_host_many) from __init__."""

    def _count_in(self, to_host_many):
        self._ledger = SizeLedger([0], [0], to_host_many, [id(self)])
        self._slot = 0

    @property
    def size(self):
        """Keys held (the counts pending on its ledger added first: a read)."""
        ledger = self._ledger
        if ledger.later:
            ledger.settle()
        return int(ledger.sizes[self._slot])

    @size.setter
    def size(self, value):
        # the size as of now, counts still pending added when next read (a shared ledger's
        # are added for every index at a read of any: set a size read just before, as the
        # engine's `size +=` does, or an index's first)
        self._ledger.sizes[self._slot] = int(value)

    @property
    def tombstones(self):
        """Erased keys' slots, as the host counts them (by a bound until a pending erase count
        is read)."""
        return int(self._ledger.tombstones[self._slot])

    @tombstones.setter
    def tombstones(self, value):
        self._ledger.tombstones[self._slot] = int(value)

    def has_pending_counts(self):
        """Whether a count the device keeps is still to be added to size or tombstones (on this
        index's ledger, which a group's indexes share)."""
        return bool(self._ledger.later)

    def __del__(self):
        ledger = getattr(self, "_ledger", None)
        if ledger is not None:
            ledger.ids = None  # (its id may name another index from now on)

    def forget_tombstones(self):
        """The index was rebuilt (its erased keys' slots emptied): no tombstone is left, nor is
        one left to correct by a count still pending (add_size_later's bound, which would
        otherwise take the gap between bound and count off a zero and leave the host's count
        below the slots', overstating empty_slots)."""
        self._ledger.forget_tombstones(self._slot)

    def add_size_later(self, counts, position, sign=1, tombstones=0):
        """Counts counts[position] (a device integer array queued work fills: keys this index
        placed, sign 1, or erased, sign -1; or a function returning its host copy) into size
        when size is next read, or settle_size hands it over; tombstones: the bound on erased
        keys the tombstones counted meanwhile, corrected then."""
        self._ledger.later.append((counts, self._slot, position, sign, tombstones))

    def settle_size(self, counts, host_counts):
        """add_size_later's entries of `counts` (on this index's ledger: those of the indexes
        sharing it too, whose counts the same copy holds), with host_counts its host copy read
        since."""
        self._ledger.settle_of([counts], [host_counts])


def shared(indexes):
    """The ledger `indexes` share in their order, else None."""
    if not indexes:
        return None
    ledger = indexes[0]._ledger
    ids = ledger.ids
    if ids is not None and len(ids) == len(indexes) and ids == list(map(id, indexes)):
        return ledger
    return None


def _join(indexes):
    """Has `indexes` (several, no count pending on any) share a new ledger in their order, each
    index's size and tombstones carried over, the ledgers they leave unshared."""
    olds = [index._ledger for index in indexes]
    slots = [index._slot for index in indexes]
    ledger = SizeLedger([old.sizes[t] for old, t in zip(olds, slots)],
                        [old.tombstones[t] for old, t in zip(olds, slots)],
                        olds[0].to_host_many, list(map(id, indexes)))
    for t, (old, index) in enumerate(zip(olds, indexes)):
        old.ids = None
        index._ledger, index._slot = ledger, t


def sizes(indexes):
    """Host int64 [len(indexes)]: each index's size, pending counts added (on a shared ledger:
    each copy read once for all, no call per index). Several indexes that share none (a group
    just formed or regrouped) are read one by one and then share one."""
    ledger = shared(indexes)
    if ledger is None:
        held = np.array([index.size for index in indexes], dtype=np.int64)
        if len(indexes) > 1:  # (an index read alone keeps its group's ledger)
            _join(indexes)  # (every count pending on their ledgers was read just now)
        return held
    if ledger.later:
        ledger.settle()
    return ledger.sizes.copy()


def tombstones(indexes):
    """Host int64 [len(indexes)]: each index's tombstones as the host counts them (by their
    bounds where an erase's count is pending)."""
    ledger = shared(indexes)
    if ledger is None:
        return np.array([index.tombstones for index in indexes], dtype=np.int64)
    return ledger.tombstones.copy()


def settle(indexes, counts, host_counts):
    """settle_size(counts, host_counts) of every index, counts one device count array and
    host_counts its host copy, or a list of each (settled in one pass)."""
    if not isinstance(counts, list):
        counts, host_counts = [counts], [host_counts]
    ledger = shared(indexes)
    if ledger is not None:
        if ledger.later:
            ledger.settle_of(counts, host_counts)
        return
    for index in indexes:
        index._ledger.settle_of(counts, host_counts)


def add_all(indexes, counts):
    """add_size_later(counts, t) of each index t of `indexes` (a hash group's placed keys, a
    device array or the function reading its copy): one entry where they share a ledger."""
    ledger = shared(indexes)
    if ledger is not None:
        ledger.later.append((counts, slice(None), slice(None), 1, 0))
        return
    for t, index in enumerate(indexes):
        index.add_size_later(counts, t)


def add(indexes, host_counts):
    """Adds host_counts[t] (host integers) to the size of each index t of `indexes`."""
    ledger = shared(indexes)
    if ledger is None:
        for index, count in zip(indexes, host_counts):
            index.size += int(count)
        return
    if ledger.later:
        ledger.settle()
    ledger.sizes += np.asarray(host_counts, dtype=np.int64).reshape(-1)


def erase_counted(indexes, counts, erased=None):
    """Counts an erase of up to counts[t] (host) keys from each index t: tombstones grow by
    counts; sizes shrink by counts (erased None), or by erased[t] (a device array filled by the
    erase, counts then its bounds) when next read."""
    ledger = shared(indexes)
    if ledger is None:
        for t, (index, count) in enumerate(zip(indexes, counts)):
            if erased is None:
                index.size -= int(count)
            elif count:
                index.add_size_later(erased, t, -1, int(count))
            index.tombstones += int(count)
        return
    counts = np.array(counts, dtype=np.int64).reshape(-1)  # (a copy: an entry keeps it)
    if erased is None:
        if ledger.later:
            ledger.settle()
        ledger.sizes -= counts
    elif counts.all():
        ledger.later.append((erased, slice(None), slice(None), -1, counts))
    elif counts.any():  # a member with no bound counts nothing, whatever erased holds for it
        bounded = np.flatnonzero(counts)
        ledger.later.append((erased, bounded, bounded, -1, counts[bounded]))
    ledger.tombstones += counts
