"""Hash tables that grow and evict: one rank's shard of a sok1x.DynamicVariable (issue 11, D6, D11).

var_type "hbm": the shard starts with init_capacity rows and doubles when a step's new keys do not
fit (the index rebuilt; values, every optimizer slot and the update times copied into arrays
twice the size; every key keeps its row), up to max_capacity; a step that needs more raises
TableFullError on every rank, changing nothing.
var_type "hybrid": grows the same way (its access statistics copied too), and once max_capacity
rows are held, a step's new keys take the rows of keys evicted by evict_strategy, per bucket by
score, on the device ("lru": the keys of the new key's bucket looked up least recently, "lfu":
least often; eviction.py states exactly what is guaranteed), never a key looked up in the current
step. Evicted keys and their vectors are kept (the vectors in device memory) until
pop_evicted() hands them out, once, unless drop_evicted(name) said no one reads them (SOK's v2
front door, until a sok1x.sparse_read_and_evict of the table is built or called): then they are
dropped, as SOK drops them.
With max_hbm_for_vectors > 0, rows beyond what that many GiB of vectors hold live in page-locked
host memory that the same kernels read (engine/tables/hybrid_rows.py); optimizer slots split alike.

Rows of evicted keys go to a free list and are handed out again, first freed first; a new key on a
reused row gets its initial value (D10) and every slot's initial value. Per row a hybrid table
keeps one 16-byte record of access statistics, statistics[row] = (last step, count): the step
journal's counter at the row's last training lookup, and its training lookups (each rank's
lookup of a key counts once). One touch_rows per lookup updates them (one sector per key, where
two arrays took two) and stamps the new rows' update times in the same launch (rows split
between GPU and host memory: the lookup's kernel counts it, a fill_rows stamps); a row's count
is zeroed when its key leaves (the pick leaves a victim's record at (step, 0), an undo at 0), so
a new key's row counts from 0.
Eviction reads them on the device (eviction.py: per bucket by score, the policy stated there):
the host reads the victims' keys and rows, never the shard. Nothing else reads them, so an
hbm table, which never evicts, keeps none (statistics None; its lookups stamp the new rows
alone). Checkpoints do not hold the statistics (a loaded
table starts from zero).
Every insert is recorded in the step journal (lookup/step_journal.py): a failed step erases its
new keys, puts evicted keys back with their vectors, slots and statistics, and restores the free
list.
"""
import collections
import math
import os
import time

import numpy as np

from sok1x.engine.tables import eviction, hybrid_rows
from sok1x.engine.tables import placement as placements
from sok1x.engine.tables.table import EmbeddingTable, rebuilt_if_worn, rebuilt_index
from sok1x.errors import TableFullError

VAR_TYPES = ("hbm", "hybrid")
EVICT_STRATEGIES = ("lru", "lfu")
LAST_STEP, COUNT = 0, 1  # the columns of DynamicTable.statistics
_DROPPED = set()  # names of tables whose evicted keys no one reads (drop_evicted)
_READ = set()  # names whose evicted keys something reads: kept for good in this process
_ON_DEVICE = set()  # names whose reader takes them as device arrays (no host copy queued)
SPARE_ENV = "SOK1X_SPARE_ROWS"  # a hybrid shard's spare rows, a fraction of max_capacity
SPARE_DEFAULT = 1.0 / 16


def drop_evicted(name, drop, on_device=False):
    """drop=True: table `name` (made now or later, in this process) drops the keys it evicts
    instead of keeping them for pop_evicted, unless something was ever said to read them;
    drop=False: something reads them: it keeps them from now on, whatever a later drop=True
    (another graph's variable of the same name, say) says; on_device=True: its reader takes
    them as device arrays (pop_evicted(on_device=True)), so no copy to the host is queued for
    them until a pop_evicted on the host says otherwise."""
    if not drop:
        _READ.add(name)
        _DROPPED.discard(name)
        if on_device:
            _ON_DEVICE.add(name)
    elif name not in _READ:
        _DROPPED.add(name)

def all_drop_evicted(tables):
    """Whether every one of `tables` drops the keys it evicts (DynamicTable.drops_evicted)."""
    return _DROPPED.issuperset([table.name for table in tables])


def held_states(tables):
    """[table.held_state() for table in tables]: each DynamicTable's free list and high water,
    read at once where no count is pending (a step's usual case)."""
    return [(table._free_rows, table._high) if table._pending is None else table.held_state()
            for table in tables]


def take_rows_later_many(tables, placed):
    """table.take_rows_later(placed, t) of each of `tables` (a hash group's members, member t
    at t), without a call per table where none has a count pending (a step's usual case)."""
    for t, table in enumerate(tables):
        if table._pending is not None:
            table._settle()
        table._pending = (placed, t)


def settle_rows_many(tables, placed, host_placed):
    """Hands each of `tables` that waits on take_rows_later's counts `placed` its count from
    their host copy `host_placed` (read since), if still pending."""
    taking = [table for table in tables
              if table._pending is not None and table._pending[0] is placed]
    if not taking:
        return
    counts = np.asarray(host_placed, dtype=np.int64).reshape(-1).tolist()
    taken = [counts[table._pending[1]] for table in taking]
    for table in taking:
        table._pending = None
    _hand_out_rows(taking, taken)


def _hand_out_rows(tables, counts):
    """Hands out the rows of counts[t] new keys (host ints) in each of `tables`, none of which
    has a count pending: freed rows first (first freed first), then fresh ones. Returns how
    many were freed rows in all. (One loop for a hash group's members, which take their rows
    at every step: the two counted states read and written as their plain attributes, with no
    call per table where none has a freed row.)"""
    reused = 0
    for table, count in zip(tables, counts):
        free = table._free_rows
        again = count if count < free.size else free.size
        if again:
            table._free_rows = free.taken(again)
        table._high += count - again
        reused += again
    return reused


def evicting_in_place(tables):
    """Host bool [len(tables)]: whether each of `tables` is a hybrid shard that is full (holds
    max_capacity keys: what any eviction leaves; its free rows, if any, are spare rows), with no
    count pending: a lookup's new keys may then all evict, counted on the device alone, and
    take their victims' rows (a padded eviction: engine/tables/eviction.py,
    HashGroup.make_room_in_place). Read at once for a group's members."""
    return np.array([table.statistics is not None and table.capacity == table.max_capacity
                     and table._pending is None
                     and table._high - table._free_rows.size == table.capacity
                     for table in tables], dtype=bool)


def note_touched_many(tables, rows):
    """Adds `rows` (at least the rows a lookup just counted in the statistics) to what the
    current step has touched (DynamicTable._surely_evictable's bound), in each of `tables` that
    keeps statistics, without a call per table (every table keeps the runtime's one step
    journal: its step is read once)."""
    now = None
    for table in tables:
        if table.statistics is None:
            continue
        if now is None:
            now = table.journal.step
        step, touched = table._touched
        table._touched = (now, (touched if step == now else 0) + rows)


Dynamic = collections.namedtuple(
    "Dynamic", "var_type init_capacity max_capacity evict_strategy max_hbm_for_vectors")
Dynamic.__doc__ = """A growing table's settings (per rank): var_type "hbm" | "hybrid";
init_capacity and max_capacity rows; evict_strategy "lru" | "lfu" (hybrid); max_hbm_for_vectors:
GiB of vectors kept in GPU memory before the rest go to page-locked host memory (hybrid; 0: no
limit)."""


def make_dynamic(var_type="hbm", init_capacity=1024, max_capacity=None, evict_strategy="lru",
                 max_hbm_for_vectors=0.0):
    """Returns checked Dynamic settings; raises ValueError naming the bad field.
    max_capacity None: init_capacity (a table that never grows)."""
    if var_type not in VAR_TYPES:
        raise ValueError("var_type must be one of %s, got %r" % (VAR_TYPES, var_type))
    if evict_strategy not in EVICT_STRATEGIES:
        raise ValueError("evict_strategy must be one of %s, got %r"
                         % (EVICT_STRATEGIES, evict_strategy))
    init_capacity = int(init_capacity)
    max_capacity = init_capacity if max_capacity is None else int(max_capacity)
    if init_capacity < 1 or max_capacity < init_capacity:
        raise ValueError("need 1 <= init_capacity <= max_capacity, got %d and %d"
                         % (init_capacity, max_capacity))
    if float(max_hbm_for_vectors) < 0:
        raise ValueError("max_hbm_for_vectors must be >= 0 GiB, got %r" % (max_hbm_for_vectors,))
    return Dynamic(var_type, init_capacity, max_capacity, evict_strategy,
                   float(max_hbm_for_vectors))


def make_table(runtime, name, dim, capacity, use_hashtable, spec, placement=placements.MOD,
               dynamic=None, initialize=True, spare=None):
    """Returns the shard for api.create_table's settings: a DynamicTable when `dynamic` is set,
    else an EmbeddingTable (initialize: see EmbeddingTable). spare: None (SOK1X_SPARE_ROWS's),
    or a DynamicTable's spare rows (a load's new shard takes the old one's, whatever the
    variable says now)."""
    if dynamic is None:
        return EmbeddingTable(runtime, name, dim, capacity, use_hashtable, spec, placement,
                              initialize)
    return DynamicTable(runtime, name, dim, spec, placement, dynamic, spare)


def spare_rows(dynamic):
    """The rows a hybrid shard at max_capacity holds beyond its keys (0 for hbm, which never
    evicts): SOK1X_SPARE_ROWS times max_capacity, rounded up (default 1/16; 0: none). Raises
    ValueError naming the variable where it is not a fraction in [0, 1].

    Why: an evicting step's new keys take spare rows, and its victims' rows become the next
    steps' spares, so a victim's vector and slots stay where they were until a later step: a
    failed step puts the victim's key back at its own row, and nothing copies its vector aside
    first (eviction.evict: where a step's new keys fit in the rows freed before it)."""
    if dynamic.var_type != "hybrid":
        return 0
    wanted = os.environ.get(SPARE_ENV, "")
    try:
        fraction = SPARE_DEFAULT if wanted == "" else float(wanted)
    except ValueError:
        fraction = -1.0
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("%s must be a fraction of max_capacity in [0, 1], got %r"
                         % (SPARE_ENV, wanted))
    return int(math.ceil(dynamic.max_capacity * fraction))


def gradient_rows(capacity, dynamic):
    """The rows a table's gradient spans (its IndexedSlices' dense_shape[0]): `capacity` for a
    table that does not grow (dynamic None), else the most rows its shard holds: max_capacity
    and, for hybrid, its spare rows (a row index reaches past max_capacity)."""
    if dynamic is None:
        return int(capacity)
    return int(dynamic.max_capacity) + spare_rows(dynamic)


def hbm_rows(dynamic, dim):
    """Rows of vectors that fit in max_hbm_for_vectors GiB (at least 1), or None: every row in
    GPU memory (hbm, or hybrid without a limit)."""
    if dynamic.var_type != "hybrid" or not dynamic.max_hbm_for_vectors:
        return None
    return max(1, int(dynamic.max_hbm_for_vectors * 2 ** 30) // (4 * int(dim)))


class FreeRows:
    """A shard's freed rows in taking order (first freed first), on the device: rows[start:] of
    a backend int64 array. Taking rows moves `start` and joining rows makes one new array, each
    a new FreeRows (a held state kept for an undo stays as it was); the host reads the rows
    only where it asks for them (host()). An eviction's own device rows are the next insert's
    pool as they are: no host copy, no upload."""

    __slots__ = ("rows", "start", "size")

    def __init__(self, rows, start=0):
        self.rows, self.start = rows, int(start)
        # how many rows are free: kept, not computed at each read (a hash group's members read
        # it at every step, and a FreeRows never changes)
        self.size = int(rows.shape[0]) - self.start

    def device(self, backend):
        """The free rows as a backend int64 array, in taking order (a view)."""
        return backend.row_view(self.rows, self.start, self.rows.shape[0]) if self.start \
            else self.rows

    def taken(self, count):
        """The list after its first `count` rows are handed out."""
        return FreeRows(self.rows, self.start + int(count))

    def joined(self, backend, rows, last=0):
        """The list with backend int64 `rows` given back after it, or before its `last` rows
        (those stay last)."""
        if not self.size:
            return FreeRows(rows)
        cut = self.size - min(int(last), self.size)
        if cut == self.size:
            return FreeRows(backend.join_keys([self.device(backend), rows], [0, 0]))
        whole = self.device(backend)
        return FreeRows(backend.join_keys([backend.row_view(whole, 0, cut), rows,
                                           backend.row_view(whole, cut, self.size)], [0, 0, 0]))

    def host(self, backend):
        """Host int64: the free rows in taking order (a read)."""
        return np.array(backend.to_host(self.device(backend)), dtype=np.int64).reshape(-1)


def no_free_rows(backend):
    """An empty FreeRows."""
    return FreeRows(backend.zeros((0,), np.int64))


class _CountedState:
    """A DynamicTable's free list or high water, kept in attribute `name`: a hash group's insert
    that kept its count on the device (take_rows_later) is counted when either is next read,
    unless the next op header hands the count over first (settle_rows). Setting one (an undo
    restoring it, an eviction, a load) drops a pending count: it belongs to the insert being
    undone, or was read by the getter just before."""

    def __init__(self, name):
        self.name = name

    def __get__(self, table, owner=None):
        if table is None:
            return self
        if table._pending is not None:
            table._settle()
        return getattr(table, self.name)

    def __set__(self, table, value):
        table._pending = None
        setattr(table, self.name, value)


class DynamicTable(EmbeddingTable):
    """A growing (and, for hybrid, evicting) hash-table shard. Beyond EmbeddingTable's
    attributes: dynamic (Dynamic), max_capacity, statistics (backend int64 [capacity, 2]: each
    row's last step and count, columns LAST_STEP and COUNT; None for var_type "hbm")."""

    def __init__(self, runtime, name, dim, spec, placement, dynamic, spare=None):
        self.max_capacity = dynamic.max_capacity
        # (rows_for reads it: set before the arrays are made)
        self.spare = spare_rows(dynamic) if spare is None else int(spare)
        super().__init__(runtime, name, dim, dynamic.init_capacity, True, spec, placement)
        self.dynamic = dynamic
        self.settings = self.settings[:1] + (dynamic.max_capacity,) + self.settings[2:] + (
            dynamic,)
        self.hbm_rows = hbm_rows(dynamic, self.dim)
        if self.hbm_rows is not None:
            self.values = hybrid_rows.new_rows_array(self.backend, self.values.shape,
                                                     np.float32, self.hbm_rows)
        self.statistics = (self.backend.zeros((self.rows_for(self.capacity), 2), np.int64)
                           if dynamic.var_type == "hybrid" else None)
        self._pending = None  # (placed, member) of a hash group's insert not counted yet
        self._free = no_free_rows(self.backend)  # rows given back (FreeRows)
        self._high_water = 0  # rows [0, high_water) were handed out at least once
        self._evicted = []  # (eviction.KeptVictims, member) of evictions not handed out yet
        self._evicted_keys = 0  # evicted_keys, less padded evictions' counts not read yet
        self._evicted_later = []  # (device victims counts, member) of padded evictions, unread
        self._counted = None  # (keys, index size, missing) from the last capacity_error
        self._touched = (-1, 0)  # (step, at least the rows this step's lookups counted so far)
        self._freed_now = (-1, 0)  # (step, rows its evictions put at the free list's end)

    # The free list and the high water, as of every insert (_CountedState below)
    _free = _CountedState("_free_rows")
    _high_water = _CountedState("_high")

    def rows_for(self, capacity):
        """The rows this shard's arrays and index hold at `capacity` keys: as many, and at
        max_capacity its spare rows beyond them (spare_rows)."""
        capacity = int(capacity)
        return capacity + (self.spare if capacity == self.max_capacity else 0)

    def list_spares(self):
        """At max_capacity, puts the rows never handed out yet (the spare rows, say) at the
        free list's end, the high water at the rows' end: new keys take the same rows in the
        same order (freed rows first, then those), but an eviction's rows now come after them
        (take_victims), so that a step's new keys take rows freed before it (frees_before)."""
        rows = self.rows_for(self.capacity)
        if self.capacity != self.max_capacity or self._high_water >= rows:
            return
        self._free = self._free.joined(self.backend,
                                       self.backend.row_sequence(self._high_water, rows))
        self._high_water = rows

    def frees_before(self, new_keys):
        """Whether `new_keys` new keys, placed now, take only rows that were free before the
        current step (the free list less the rows this step's evictions put at its end): then
        no row a key left in this step is handed out in it, and an undo finds the evicted keys'
        vectors and slots in their rows."""
        return int(new_keys) <= self._free.size - self._freed_this_step()

    def spares_serve(self, bound, step=None):
        """Whether this full shard can hand `bound` new keys of an eviction in place its spare
        rows (HashGroup.spare_lists): its free list holds its spare rows and nothing else
        (list_spares), bound fits them, and no eviction of the journal's `step` (None: the
        current one), in which this one runs, freed a row yet (an undo puts the lists back as
        the step's first eviction found them)."""
        self.list_spares()
        return (0 < int(bound) <= self.spare and self._free.size == self.spare
                and not self._freed_this_step(step))

    def keep_free_rows_in(self, view, copy=True):
        """Makes backend int64 `view` (of the free list's length) this shard's free list,
        copying the list into it (copy=False: it holds it already) unless it is that list."""
        free = self._free
        if free.rows is view and not free.start:
            return
        if copy:
            self.backend.copy_array(view, free.device(self.backend))
        self._free = FreeRows(view)

    def _freed_this_step(self, step=None):
        """The rows at the free list's end that the evictions of the journal's `step` (None:
        the current one) freed (take_victims)."""
        noted, freed = self._freed_now
        return freed if noted == (self.journal.step if step is None else step) else 0

    def _note_freed(self, count):
        self._freed_now = (self.journal.step, self._freed_this_step() + int(count))

    @property
    def evicted_keys(self):
        """How many keys this shard has evicted since made or loaded (a padded eviction's count
        read here, once: a wait)."""
        if self._evicted_later:
            arrays = list({id(a): a for a, _ in self._evicted_later}.values())
            for array, host in zip(arrays, self.backend.to_host_many(arrays)):
                self.settle_evicted(array, np.asarray(host).reshape(-1))
        return self._evicted_keys

    @evicted_keys.setter
    def evicted_keys(self, value):
        self._evicted_later = []
        self._evicted_keys = int(value)

    def settle_evicted(self, served, host_served):
        """Counts a padded eviction's victims here (take_victims left `served`, a device array,
        for later) with host_served, its host copy read since."""
        DynamicTable.settle_evicted_many([self], served, host_served)

    @staticmethod
    def settle_evicted_many(tables, served, host_served):
        """settle_evicted(served, host_served) of each of `tables` (a group's members), without
        a call per table: a full group counts its victims at every step."""
        for table in tables:
            later = table._evicted_later
            if not later:
                continue
            left = []  # (not list.remove: it compares the device arrays of other entries)
            for entry in later:
                if entry[0] is served:
                    table._evicted_keys += int(host_served[entry[1]])
                else:
                    left.append(entry)
            table._evicted_later = left

    def drops_evicted(self):
        """Whether no one reads the keys this table evicts (drop_evicted)."""
        return self.name in _DROPPED

    def _settle(self):
        """Counts the pending insert: one read of its counts, handed to the whole group (every
        member of one insert waits on the same counts)."""
        placed = self._pending[0]  # device counts, or a function reading their copy (a replay)
        host = np.asarray(placed() if callable(placed) else self.backend.to_host(placed))
        host = host.reshape(-1)
        if self.group is not None:
            self.group.settle(placed, host)
        if self._pending is not None:  # not a group's any more
            self.settle_rows(placed, host)

    def capacity_error(self, keys, missing=None, arriving=None, evictable=None):
        """Returns TableFullError if this rank's owned `keys` cannot all be held even after
        growing to max_capacity (and, for hybrid, evicting every key the step has not looked
        up), else None. missing: how many of `keys` are new, where the caller counted them (a
        hash group's rows_needed); else counted here (a wait). keys may be a function returning
        them, with `arriving` their number and `missing` given: it is called only where the
        host's counts cannot tell (a hybrid shard's count of the keys it may evict), unless
        `evictable` is that count (a hash group's, backend.count_evictable). Changes nothing."""
        if arriving is None:
            keys = keys() if callable(keys) else keys
            arriving = int(keys.shape[0])
        if self.index.size + arriving <= self.max_capacity:
            return None  # fits even if every key is new: nothing to count, no wait
        if missing is None:
            missing = self.index.count_missing(keys)
        if not callable(keys):
            self._counted = (keys, self.index.size, missing)  # rows_of's count, one wait fewer
        needed = self.index.size + missing
        if needed <= self.max_capacity:
            return None
        if self.dynamic.var_type != "hybrid":
            evictable = 0
        elif evictable is None:
            if needed - self._surely_evictable(arriving, missing) <= self.max_capacity:
                return None  # no read of the statistics: the eviction reads them once
            evictable = int(np.count_nonzero(self._evictable(keys() if callable(keys)
                                                             else keys)))
        if needed - evictable <= self.max_capacity:
            return None
        return self.shard_full_error(self.index.size, missing, evictable)

    def shard_full_error(self, held, missing, evictable):
        """The TableFullError of `missing` new keys arriving at this shard holding `held` keys of
        which `evictable` may be evicted (0 for an hbm table)."""
        return TableFullError(
            "%s: the shard on rank %d is full: %d keys held of max_capacity=%d, %d new keys "
            "arrived and %d held keys may be evicted (var_type=%r). %s"
            % (self.name, self.rank, held, self.max_capacity, missing, evictable,
               self.dynamic.var_type, "Raise max_capacity, or look up fewer new keys per step."
               if self.dynamic.var_type == "hybrid" else
               "Raise max_capacity, or use var_type='hybrid' to evict."))

    def full_error(self, used, missing):
        """The TableFullError of `missing` new keys arriving at a shard holding `used` keys
        that cannot grow past max_capacity (a hash group's member, engine/lookup/table_group.py)."""
        return TableFullError(
            "%s: the shard on rank %d is full: %d keys held of max_capacity=%d and %d new keys "
            "arrived (var_type=%r). Raise max_capacity, or use var_type='hybrid' to evict."
            % (self.name, self.rank, used, self.max_capacity, missing, self.dynamic.var_type))

    def rows_of(self, keys, insert):
        """Returns the rows of owned `keys`; insert=True (a training lookup) adds unseen keys
        (call capacity_error first), growing or evicting to make room, and counts the lookup.
        While every key would fit even if new, nothing is counted first: one kernel finds and
        places the keys (HashIndex.find_or_insert), the step's one wait is for how many it
        placed."""
        if not insert:
            return self.index.find(keys)
        return self._placed_rows(keys, False)[0]

    def _placed_rows(self, keys, fetch):
        """rows_of(keys, True); returns (rows, vectors), vectors None unless `fetch`
        (EmbeddingTable.inserted_rows_and_vectors)."""
        before = (self._free, self._high_water)
        counted, self._counted = self._counted, None
        if self.index.size + int(keys.shape[0]) <= self.capacity:
            return self._insert(keys, None, before, None, fetch)
        if counted is not None and counted[0] is keys and counted[1] == self.index.size:
            missing = counted[2]  # capacity_error just counted these keys
        else:
            missing = self.index.count_missing(keys)
        if missing == 0:
            found = self.index.find(keys)
            if self.statistics is not None:
                self.note_touched(int(found.shape[0]))
                self.backend.touch_rows(self.statistics, found, self.journal.step)
            return found, (self.gather(found) if fetch else None)
        needed = self.index.size + missing
        if needed > self.capacity and self.capacity < self.max_capacity:
            self._grow(needed)
        evicted = None
        if needed > self.capacity:
            evicted = self._evict(needed - self.capacity, keys)
        return self._insert(keys, missing, before, evicted, fetch)

    def _insert(self, keys, missing, before, evicted, fetch):
        """Finds or places `keys` (missing: how many are new, or None when every key fits even
        if new), new keys taking freed rows (first freed first), then fresh ones; initialises
        the new rows, counts the lookup and records the undo (before: the free list and high
        water before this lookup's eviction, `evicted`). Returns (rows, vectors), vectors None
        unless `fetch`: for split rows one kernel also initialises the new rows, counts the
        lookup and copies every key's vector out; otherwise the init, the count and the gather
        are queued before the host waits for how many keys were placed."""
        backend = self.backend
        # an hbm table frees no row, so its rows [0, index.size) are its keys' (a hash group's
        # insert, engine/lookup/table_group.py, hands them out without counting _high_water)
        free = self._free
        plain = free.size == 0 and (self.statistics is None
                                    or self._high_water == self.index.size)
        pool = None if plain else free.device(backend)
        fused = fetch and hybrid_rows.is_split(self.values)
        gathered = []

        def queue_rows(new_keys, new_rows, count, rows):  # runs while the host waits for count
            if not fused:
                hybrid_rows.init_rows(backend, self.values, new_rows, new_keys, self.spec,
                                      self.table_id, count)
            if fused or self.statistics is None:  # counted by the kernel, or not kept
                self.stamp(new_rows, count)
            else:  # the count and the new rows' update time in one launch
                backend.touch_rows(self.statistics, rows, self.journal.step,
                                   stamp=(self.times, new_rows, time.time(), count))
            if fetch and not fused:
                gathered.append(self.gather(rows))

        # queue_rows or the fused kernel counts every key in the statistics: noted first, so a
        # failure after the count keeps the note (a note of more than was counted is safe)
        if self.statistics is not None:
            self.note_touched(int(keys.shape[0]))
        next_row = None if plain else self._high_water
        if fused:  # the kernel counts the lookup too
            rows, vectors, new_keys, new_rows = self.index.find_or_insert_values(
                keys, self.values, self.spec, self.table_id, row_pool=pool, missing=missing,
                next_row=next_row, queue_first=queue_rows,
                touch=(self.statistics, self.journal.step))
        else:
            rows, new_keys, new_rows = self.index.find_or_insert(
                keys, row_pool=pool, missing=missing, next_row=next_row, queue_first=queue_rows)
            vectors = gathered[0] if fetch else None
        placed = int(new_keys.shape[0])
        if placed:
            reused = self._take_rows(placed)
            if reused:
                self.reset_slot_rows(new_rows[:reused])
            self.journal.record(lambda: self._undo_insert(new_keys, new_rows, before[0],
                                                          before[1], evicted))
        return rows, vectors

    def free_rows(self):
        """Host int64: the rows given back, in the order they are handed out again (a read)."""
        return self._free.host(self.backend)

    def set_free_rows(self, rows):
        """Makes host or backend int64 `rows` the free list, in taking order (a shard filled row
        by row: a load, a benchmark's table)."""
        self._free = FreeRows(self.backend.asarray(np.asarray(rows, dtype=np.int64))
                              if isinstance(rows, np.ndarray) else rows)

    def may_count_later(self):
        """Never: a DynamicVariable's lookup grows or evicts by the count of its new keys."""
        return False

    def slot(self, name, initial_value=0.0):
        """Returns the optimizer slot `name` (rows split as the values'), creating it if new
        (in a group: a view of the group's slot)."""
        if name not in self.slots and self.group is not None:
            self.group.slot(name, initial_value)
        if name not in self.slots:
            self.slots[name] = hybrid_rows.new_rows_array(
                self.backend, self.values.shape, np.float32, self.hbm_rows, float(initial_value))
            self.slot_initial[name] = float(initial_value)
        return self.slots[name]

    def pop_evicted(self, on_device=False):
        """Returns (keys int64 [n], values float32 [n, dim]) of the keys evicted since the last
        call, in eviction order, and forgets them: host arrays, or with on_device=True backend
        arrays (views of the eviction's own where there was one, no copy). The last call's
        kind says whether the next evictions queue a copy to the host (drop_evicted's
        on_device). Keys and vectors were kept in device memory until now;
        an eviction's victims are read for every member of its group that reads on the host at
        once (eviction.KeptVictims.read): the group's readers share one copy."""
        evicted, self._evicted = self._evicted, []
        (_ON_DEVICE.add if on_device else _ON_DEVICE.discard)(self.name)
        backend = self.backend
        if on_device:
            with backend.device_context():
                parts = [kept.device(t) for kept, t in evicted]
                if len(parts) == 1:
                    return parts[0]
                if not parts:
                    return backend.zeros((0,), np.int64), backend.zeros((0, self.dim),
                                                                       np.float32)
                return (backend.join_keys([k for k, _ in parts], np.zeros(len(parts), np.int64)),
                        backend.join_rows([v for _, v in parts]))
        if not evicted:
            return np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        with backend.device_context():
            read = eviction.read_kept(evicted)
        if len(read) == 1:  # one eviction since the last call: no second copy
            return read[0][0], read[0][1].reshape(-1, self.dim)
        return (np.concatenate([keys for keys, _ in read]),
                np.concatenate([vectors.reshape(-1, self.dim) for _, vectors in read]))

    def _held_rows(self, free):
        """Host bool [capacity]: rows holding a key (free: host int64, the free rows)."""
        held = np.zeros(self.rows_for(self.capacity), dtype=bool)
        held[:self._high_water] = True
        held[free] = False
        return held

    def note_touched(self, rows):
        """note_touched_many of this table alone (it keeps statistics)."""
        note_touched_many([self], rows)

    def _surely_evictable(self, arriving, missing):
        """At most as many as _evictable(keys) counts, from host counts alone: the held rows
        less those this step's lookups touched (note_touched) and the held ones among the
        `arriving` keys (at most their number less the `missing` new keys; a key from several
        ranks counts each time, so this serves where a step brings few keys to a full shard, the
        usual case). The journal's steps only grow, so only this step's lookups made a row's
        last step the current one."""
        step, touched = self._touched
        held = self._high_water - self._free.size
        return held - (touched if step == self.journal.step else 0) - (
            int(arriving) - int(missing))

    def _evictable(self, keys):
        """Host bool [capacity]: held rows that neither the current step nor `keys` looked up."""
        backend, free = self.backend, self._free
        reading = [backend.column(self.statistics, LAST_STEP), self.index.find(keys)]
        if free.size:
            reading.append(free.device(backend))
        read = backend.download_staged_many(reading)
        last, batch_rows = read[0], read[1]
        free_rows = np.asarray(read[2], dtype=np.int64) if free.size else np.zeros(0, np.int64)
        evictable = self._held_rows(free_rows) & (last < self.journal.step)
        evictable[batch_rows[batch_rows >= 0]] = False
        return evictable

    def _evict(self, count, keys):
        """Evicts `count` keys that neither the current step nor this lookup (owned `keys`, a
        backend array) looked up, chosen on the device per bucket by score (eviction.py states
        the policy); returns its undo record (eviction.Evicted)."""
        tags = self.backend.zeros((int(keys.shape[0]),), np.int64)
        held = self.held_state()
        try:
            return eviction.evict([self], [count], keys, tags, lambda: (
                self.statistics, np.array([0, self.rows_for(self.capacity)], dtype=np.int64),
                self.values,
                self.slots))
        except BaseException:  # evict gave the victims back: the free list too
            self.restore_held(held)
            raise

    def take_victims(self, victims, t):
        """Takes the victims eviction.evict chose here (member t of `victims`, an
        eviction.Victims), erased from the index already, out of this shard: their rows, on the
        device, join the free list (where it was empty, they are the next insert's pool as they
        are; a padded eviction's are the lookup's insert's pool, and join nothing). Returns the
        entry pop_evicted hands out ((victims.kept, t): their keys and vectors stay on the
        device until read), or None where nothing reads them (drop_evicted)."""
        if victims.totals is None:
            # before the rows earlier evictions of this step freed: those may hold victims
            # whose vectors no undo copied (frees_before), so this step's new keys take them
            # last (never, once full: a full shard's new keys are its victims)
            rows = victims.part(victims.device_rows, t)
            self._free = self._free.joined(self.backend, rows, self._freed_this_step())
            self._note_freed(rows.shape[0])
            self._evicted_keys += int(rows.shape[0])
        else:  # padded: the rows are this lookup's insert's pool; the count stays on the device
            self._evicted_later.append((victims.served, t))
            if not victims.moved:  # its new keys took spare rows: its victims' joined the list
                self._note_freed(victims.starts[t + 1] - victims.starts[t])  # (at most)
        entry = None
        if self.name not in _DROPPED:  # read by someone: kept on the device until then
            entry = (victims.kept, t)
            victims.kept.add_reader(t, self.name not in _ON_DEVICE)
            self._evicted.append(entry)
        return entry

    def restore_victims(self, victims, t, entry, taken):
        """Undoes an eviction here: member t of `victims` goes back into the index with its
        vectors, slots and records, and, where take_victims `taken` them, leaves what
        pop_evicted hands out (`entry`; the free list is the caller's)."""
        backend = self.backend
        device_rows = victims.part(victims.device_rows, t)
        self.index.assign(victims.part(victims.device_keys, t), device_rows)
        if victims.moved:  # else their rows were not handed out: they hold them still
            hybrid_rows.put_rows(backend, self.values, device_rows,
                                 victims.part(victims.values, t))
            for name, saved in victims.slots.items():
                hybrid_rows.put_rows(backend, self.slots[name], device_rows,
                                     victims.part(saved, t))
        backend.put_rows(self.statistics, device_rows, victims.part(victims.records, t))
        if taken:
            self._evicted = [e for e in self._evicted if e is not entry]
            self.evicted_keys -= int(device_rows.shape[0])
            if entry is not None:
                entry[0].forget(entry[1])

    def _take_rows(self, count):
        """Hands out the rows of `count` new keys (_hand_out_rows, once any count pending is
        settled); returns how many were freed rows."""
        if self._pending is not None:
            self._settle()
        return _hand_out_rows([self], [int(count)])

    def _undo_insert(self, new_keys, new_rows, free_before, high_water_before, evicted):
        """Undoes one insert of a failed step (engine/lookup/step_journal.py)."""
        backend = self.backend
        self.index.erase(new_keys)
        self.reset_slot_rows(new_rows)
        if self.statistics is not None:
            backend.put_rows(self.statistics, new_rows,
                             backend.zeros((int(new_rows.shape[0]), 2), np.int64))
        if evicted is not None:
            evicted.put_back()
        self._free, self._high_water = free_before, high_water_before
        self.index = rebuilt_if_worn(backend, self.index, self.capacity)

    # -- what a hash group of hybrid tables asks of its members (lookup/table_group.py) ---------

    def rows_source(self):
        """(row_pool, next_row) for a hash group's insert (backend.hash_insert_many's pools):
        the freed rows in taking order and the high water, or (None, None) where no row was
        freed (new keys take rows index.size, index.size + 1, ...)."""
        free = self._free
        if free.size == 0:
            return None, None
        return free.device(self.backend), self._high_water

    def held_state(self):
        """What undo_placed needs to put the free list and high water back."""
        return self._free, self._high_water

    def take_rows(self, count):
        """Hands out the rows of `count` keys a hash group placed (by rows_source's order);
        returns how many were freed rows."""
        return self._take_rows(count)

    def take_rows_later(self, placed, t):
        """take_rows of placed[t] (placed: a hash group's device counts), counted when the free
        list or the high water is next read, or when settle_rows hands the host copy over."""
        if self._pending is not None:  # an earlier count first
            self._settle()
        self._pending = (placed, t)

    def settle_rows(self, placed, host_placed):
        """Hands over the host copy of take_rows_later's counts `placed`, if still pending."""
        settle_rows_many([self], placed, host_placed)

    def undo_placed(self, new_keys, new_rows, held):
        """Undoes a hash group's placing of `new_keys` at this shard's `new_rows` (backend
        arrays) in a failed step; held: held_state() before it."""
        self._undo_insert(new_keys, new_rows, held[0], held[1], None)

    def restore_held(self, held):
        """Puts the free list and high water back as held_state() gave them (an undone
        eviction's), rebuilding a worn index."""
        self._free, self._high_water = held
        self.index = rebuilt_if_worn(self.backend, self.index, self.capacity)

    def emptied(self):
        """Forgets every key's place for a load into this shard where it is (a hash group's
        member): no freed row, no row handed out, no statistics, nothing evicted to hand out."""
        for kept, t in self._evicted:
            kept.forget(t)
        self._free, self._high_water, self._evicted = no_free_rows(self.backend), 0, []
        self.evicted_keys = 0  # as a table made anew by a load
        if self.statistics is not None:
            self.backend.fill_value(self.statistics, 0)

    def grown_capacity(self, needed):
        """The capacity doubled until `needed` rows fit, at most max_capacity."""
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        return min(capacity, self.max_capacity)

    def _grow(self, needed):
        """Doubles the capacity until `needed` rows fit (at most max_capacity), keeping every
        key's row, vector, slots and statistics. A hash group's member (lookup/table_group.py)
        grows through its group, which holds its arrays."""
        if self.group is not None:
            rows = self.group.capacities.copy()
            rows[self.group.members.index(self)] = needed
            self.group.grow(rows)
            return
        backend = self.backend
        capacity = self.grown_capacity(needed)
        rows = self.rows_for(capacity)
        self.values = hybrid_rows.grown(backend, self.values, rows, self.hbm_rows)
        self.slots = {name: hybrid_rows.grown(backend, s, rows, self.hbm_rows,
                                              self.slot_initial[name])
                      for name, s in self.slots.items()}
        if self.statistics is not None:
            self.statistics = hybrid_rows.grown(backend, self.statistics, rows, None)
        self.times = hybrid_rows.grown(backend, self.times, rows, None)
        self.index = rebuilt_index(backend, self.index, rows)
        self.capacity = capacity

