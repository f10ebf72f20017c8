"""Table groups (DESIGN D13): the tables of one lookup go through the engine as one table, as in
FBGEMM's table-batched embedding, so a step costs the same kernel launches, host waits and Python
whatever the number of tables.

A group keeps its members' rows in one flat array, table after table (row_starts[t] is where
table t's rows begin), and likewise their update times and each optimizer slot; every member's
own arrays become views of its rows there, so everything that reads or writes one table
(single-table lookups, checkpoints, assign, export, per-table updates) works as before. Table t's
key k is key key_starts[t] + k of the group. With "mod" placement key_starts[t] is
row_starts[t] * world_size, so the group's key g is owned by rank g % world_size at its flat row
g // world_size, exactly as one table's key would be; with ("rank", r) placement the flat row is
g itself. The group is then ONE unit of the lookup (engine/lookup/key_exchange.py): one
de-duplication, one owner bucketing, one exchange each way, one gather, one pooling, one backward
segment-sum, and one optimizer update over all of its rows when all members are updated in one
call (engine.api.apply_optimizer_updates; TensorFlow's optimizers update the members one by one,
each on its own rows). The layout (offsets, views) is made once, at the first lookup that names
the tables together, never per step.

Hash tables (use_hashtable=True, SOK v1's) group as HashGroups: a v1 hash table's arrays have a
fixed capacity and never move, so its rows, times and slots join a flat array as above, but its
rows come from its own key index, and its keys are any non-negative int64, which leave no room to
fold the table into the key. So a hash group's keys stay as they are and each carries a tag, its
member's place in the group (int64 [n] beside the keys, sent in the same exchange): the keys are
de-duplicated per (tag, key), bucketed by owner, and the owner finds or inserts all of them in
every member's own HashIndex in one launch (the indexes travel as a list of addresses), getting
flat rows; then one init of the new rows, one stamp, one gather, and from there on (spread,
backward, update) the group is a TableGroup. The host waits once, for all members' counts of
placed keys (a full shard in any member fails the step on every rank and the call's keys are
erased again: no table changes). Each member keeps its own index, so checkpoints, export,
restore, erase and rebuilds work per table as before.

Growth (hbm sok1x.DynamicVariables, a hash group of their own): a member starts at init_capacity
rows and doubles up to max_capacity. While every member's shard holds the step's owned keys of
the group even if all are new, nothing is counted. Otherwise the group finds the keys first and
the host counts each member's new ones exactly (HashGroup.rows_needed, one wait): a member past
its max_capacity fails the step on every rank, changing no table, in the lookup's one agreement;
a member past its capacity grows once every rank knows the step goes on (HashGroup.grow: every
flat array laid out again, all made before any is taken, so a failure leaves the group as it
was; the grown member's index rebuilt; every key keeps its member's row), and then the keys are
placed (one wait more, in a step that grows). Growth moves the flat rows of the members after
the grown one: a lookup's Routing keeps the row_starts it routed with, and its backward pass
splits by them into each member's own rows, which growth does not move (a lookup and its
gradient may lie on either side of a growth, as in eager mode). A large group grows in place
instead (HashGroup._reserved_rows; SOK1X_GROW_IN_PLACE): its flat arrays reserve every member's
max_capacity rows (row_starts from those, for good), with memory behind each member's rows held
only (held_rows; backend.reserved_rows: device memory mapped behind a reserved address range on
cuda, pages opened with mprotect on cpu, where touching a row not held faults as on a GPU); a
growth maps memory behind the new rows and rebuilds the grown indexes, copying nothing and
moving no row (its cost: the new slots' and times' initial values, one pass over their new
memory). A member past 3/4 of its capacity gets the memory of its next doubling mapped ahead, on
a helper thread while steps go on (HashGroup._back_ahead), so the step that grows it does not
wait for the driver; from then on it holds that memory. Checks of a member's rows go by
held_rows, never by row_starts. An hbm DynamicVariable looked up alone whose rows may grow in
place is a hash group of one, so that its growth copies nothing either (_grows_in_place_alone);
a lookup that names it with others takes it into their group (the group of one dissolved).

What separates groups (tables that cannot share a pass are looked up as units of their own, in
the same exchange):
  - the dim (rows are joined into one [rows, dim] array);
  - the placement ("mod", or the rank of ("rank", r)): it decides owner and row of a key;
  - storage: dense tables (rows follow from keys) group with dense tables, v1 hash tables with
    v1 hash tables, never with each other (a dense group folds the table into the key, a hash
    group tags it);
  - for hash tables, the initializer (InitializerSpec: kind, bounds, seed): the one init launch
    of a hash group's new rows takes one recipe (each member's table id is per row);
  - a hash table with a low-frequency filter in this lookup (admit_ratio) stays a unit of its own;
  - a sok1x.DynamicVariable of var_type "hbm" (no host part, no eviction, no statistics) groups
    with hbm DynamicVariables of the same dim, placement and initializer, never with v1 hash
    tables (whose groups so never re-lay their arrays);
  - a hybrid sok1x.DynamicVariable groups with hybrid DynamicVariables of the same dim, placement
    and initializer, whether or not its rows split between GPU and host memory
    (max_hbm_for_vectors): where a member's do, the group's values and slots are a GroupedRows
    (tables/hybrid_rows.py), each member's device rows in one device block and its host rows in one
    host block, which the row kernels read with a split per member, and each member's own arrays are
    views of its rows in both blocks. Such a group also joins its members' access statistics into
    one flat array (one count of a step's lookup for all members, in the launch that stamps the new
    rows), hands each member's new keys its freed rows first (the insert launch takes a pool of
    freed rows per member, DynamicTable.rows_source), and its members hand those rows out by their
    counts of placed keys: read in the lookup where a member may fill up, else, as an hbm group's,
    in the next op header's wait (DynamicTable.take_rows_later; reused rows' slots are reset on the
    device meanwhile). The members short of rows at max_capacity evict together, after the lookup's
    agreement: their victims chosen on the device in one pass, read by the host once
    (HashGroup.make_room, engine/tables/eviction.py); members that are full and free no row evict
    in place instead, every new key of each with nothing counted first, the insert taking the
    victims' rows in the same queue (HashGroup.make_room_in_place; the counts read once, after);
  - optimizer and dtype separate nothing today: values are float32 everywhere, and a group's
    slots are made per slot name, so an optimizer touches only the slots it keeps;
  - a table belongs to one group: the first lookup naming it with others makes its group; a
    lookup naming it with another set of tables looks it up as a unit of its own (a group whose
    member was re-made, by re-running its initializer, is dissolved first).
"""
import collections
import contextlib
import functools
import os
import time
import weakref

import numpy as np

from sok1x.backend.cuts import cut_points
from sok1x.engine import environment
from sok1x.engine.lookup import bounded_step
from sok1x.engine.tables import eviction, hybrid_rows, optimizer_updates
from sok1x.engine.tables import dynamic_table
from sok1x.engine.tables import placement as placements
from sok1x.engine.tables.table import (
    EmbeddingTable, rebuild_indexes, rebuild_worn, rebuilt_indexes,
)

IN_PLACE_ENV = "SOK1X_EVICT_IN_PLACE"  # "0": full members evict by counts read first
REPLAY_EVICTION_ENV = "SOK1X_REPLAY_EVICTION"  # "0": evicting steps never replay
# a replayed eviction's copy of its slots, at most, where its graph rebuilds short or worn
# indexes itself (past it, ready() rebuilds short ones before the replay, or the step runs
# uncaptured)
REBUILD_INSIDE_BYTES = 256 << 20
_SPARE_LISTS_KEPT = 8  # SpareLists a group keeps, each of a set of evicting members
GROW_ENV = "SOK1X_GROW_IN_PLACE"  # "0": a growing group lays its arrays out again; "1": in place
_GRANULE = 2 << 20  # the device's allocation granularity (backend.back_rows), 2 MiB on H100/H200
_MOST_RESERVED = 64
_AHEAD = 0.75  # a member growing in place past this share of its capacity backs its next rows
# table alone -> ((capacity, GROW_ENV), whether it is a group of one): _grows_in_place_alone
_ALONE_VERDICTS = weakref.WeakKeyDictionary()

class Unit(collections.namedtuple("Unit", "table positions")):
    """One pass of a lookup: table (an EmbeddingTable or a TableGroup) and positions (the places
    in the lookup's table list of its members, in the unit's order)."""
    __slots__ = ()

    @property
    def grouped(self):
        """Whether the unit is a TableGroup (of one table, too: _grows_in_place_alone)."""
        return isinstance(self.table, TableGroup)


class TableGroup:
    """The tables `members` (EmbeddingTables without hash table, of one dim and placement) as
    one. Reads to key_exchange like an EmbeddingTable: name, dim, owner_rule, use_hashtable,
    rows_of, gather, capacity_error. key_starts / row_starts: host int64 [T + 1]."""

    use_hashtable = False

    def __init__(self, runtime, members):
        self.backend = runtime.backend
        first = members[0]
        self.members = list(members)
        self.name = "group of %s" % ", ".join(table.name for table in members)
        self.dim, self.placement, self.owner_rule = first.dim, first.placement, first.owner_rule
        self.size = runtime.size
        held = [int(table.values.shape[0]) for table in members]
        self.held_rows = np.array(held, dtype=np.int64)  # each member's rows (its views) now
        reserved = self._reserved_rows(members)
        self.reserved = reserved is not None  # rows grow in place (HashGroup._reserved_rows)
        self.layout = 0  # counts the growths: a replayed step records the layout it read
        self.row_starts = np.concatenate(
            [[0], np.cumsum(held if reserved is None else reserved)]).astype(np.int64)
        self.key_starts = self._key_starts(members)
        self.hbm = self._device_rows(held)
        self.values = self._joined([table.values for table in members], 0.0, hbm=self.hbm)
        self.times = self._joined([table.times for table in members], 0.0)
        self.slots, self.slot_initial = {}, {}
        self.last_gradient = None  # (flat rows, summed, member pieces, starts): split_gradient
        self.last_keyed = None  # (own rows, summed, flat rows, starts): engine/lookup/keyed.py
        self.keyed_limits = {}  # key_limits -> (limits, highest keys): engine/lookup/keyed.py
        self.planned = (None, None)  # (table ids, units) of the last lookup of exactly this group
        self.live_at = None  # the runtime tables' version at which all members were last seen
        for t, table in enumerate(members):
            table.values, table.times = self._view(self.values, t), self._view(self.times, t)
            table.group = self
        for table in members:
            for name in list(table.slots):
                self.slot(name, table.slot_initial[name])
        # The members' own arrays are gone now: their memory must not stay held by the pool
        # (a group of large tables would need twice their memory), once per group.
        self.backend.release_unused()

    @staticmethod
    def _key_starts(members):
        return np.concatenate(
            [[0], np.cumsum([table.key_limit for table in members])]).astype(np.int64)

    @staticmethod
    def _reserved_rows(members):
        return None  # dense tables never grow

    def _device_rows(self, capacities):
        """Host int64 [T]: the rows of each member that live in device memory at `capacities`
        (a hybrid DynamicVariable's hbm_rows, tables/hybrid_rows.py), or None when all do: the
        layout of the group's values and slots (a GroupedRows where some member splits)."""
        capacities = [int(c) for c in capacities]
        device = [c if getattr(table, "hbm_rows", None) is None else min(table.hbm_rows, c)
                  for table, c in zip(self.members, capacities)]
        return None if device == capacities else np.array(device, dtype=np.int64)

    def _view(self, array, t):
        if isinstance(array, hybrid_rows.GroupedRows):
            return array.member(self.backend, t)
        start = int(self.row_starts[t])
        return self.backend.row_view(array, start, start + int(self.held_rows[t]))

    def _joined(self, arrays, initial, row_shape=None, dtype=np.float32, starts=None, hbm=None):
        """A flat array holding each of `arrays` from its member's start (starts, default
        row_starts); None entries, and rows past an array's end (a member grown), get `initial`
        (rows of row_shape, default the arrays' own). hbm: None, or each member's rows in device
        memory (_device_rows): then a GroupedRows, each member's rows split where its own are."""
        backend = self.backend
        starts = self.row_starts if starts is None else starts
        known = [a for a in arrays if a is not None]
        if known:
            row_shape, dtype = tuple(known[0].shape[1:]), known[0].dtype
        if self.reserved:
            return self._reserved_joined(arrays, initial, tuple(row_shape), dtype)
        if hbm is not None:
            grouped = hybrid_rows.GroupedRows(backend, np.diff(starts), hbm, row_shape, dtype,
                                              initial)
            for t, array in enumerate(arrays):
                if array is not None:
                    hybrid_rows.copy_rows(backend, grouped.member(backend, t), array)
            return grouped
        flat = backend.zeros((int(starts[-1]),) + tuple(row_shape), dtype)
        if initial:
            backend.fill_value(flat, initial)
        for t, array in enumerate(arrays):
            if array is not None and array.shape[0]:  # one device copy a member
                backend.write_rows(flat, int(starts[t]), array)
        return flat

    def _reserved_joined(self, arrays, initial, row_shape, dtype):
        """_joined's flat array for a group whose rows grow in place: an array of every
        member's reserved rows (backend.reserved_rows), memory behind each member's held rows
        only, those holding its array's rows (`initial` where it has none)."""
        backend = self.backend
        flat = backend.reserved_rows((int(self.row_starts[-1]),) + row_shape, dtype)
        for t, array in enumerate(arrays):
            start = int(self.row_starts[t])
            backend.back_rows(flat, start, start + int(self.held_rows[t]))
            if array is None or array.shape[0] < self.held_rows[t]:
                backend.fill_value(self._view(flat, t), initial)
            if array is not None and array.shape[0]:
                backend.write_rows(flat, start, array)
        return flat

    def slot(self, name, initial_value=0.0):
        """Returns the group's flat slot `name`, making it (and every member's view of it) if
        new; a member that had the slot already keeps its values."""
        if name not in self.slots:
            flat = self._joined([table.slots.get(name) for table in self.members],
                                float(initial_value), (self.dim,), hbm=self.hbm)
            self.slots[name], self.slot_initial[name] = flat, float(initial_value)
            for t, table in enumerate(self.members):
                table.slots[name] = self._view(flat, t)
                table.slot_initial[name] = float(initial_value)
        return self.slots[name]

    def live(self, runtime):
        """True while every member is still the runtime's table of its name: looked at once
        after each change of the runtime's tables (their version), not at every step."""
        version = runtime.tables.version
        if self.live_at == version:
            return True
        if all(runtime.tables.get(table.name) is table and table.group is self
               for table in self.members):
            self.live_at = version
            return True
        return False

    def dissolve(self):
        """Leaves the members as tables of their own (their views stay their arrays). Drops
        what the group keeps of past steps, and its plan, which refers to the group itself: the
        flat arrays then go as soon as no member views them, with no wait for Python's cycle
        collector."""
        self.live_at = None
        self.planned = (None, None)
        self.forget_steps()  # (a replayed class of the group's is dropped: replayed_step._where)
        for table in self.members:
            if table.group is self:
                table.group = None

    def forget_steps(self):
        """Drops the results of the group's last backward passes and its replayed classes
        (a member's rows or index were replaced: by a growth, a dissolve, or in place by a
        checkpoint's load, which gives a member another index: a recorded step reads its old
        one's slots). The layout counts it (replayed_step._where: a class of the group is
        dropped at its next lookup)."""
        self.last_gradient = self.last_keyed = None
        self.layout += 1

    # -- what key_exchange asks of a table ------------------------------------------------------

    def capacity_error(self, keys):
        return None

    def rows_of(self, keys, insert):
        """Flat rows of owned group keys."""
        return placements.direct_rows(self.backend, self.placement, keys, self.size)

    def gather(self, rows):
        return self.backend.gather_rows(self.values, rows)

    def apply_update(self, update, slots, rows, grads, hyper, options):
        """Runs optimizer rule function `update` on the group's values and flat `slots` for
        distinct flat `rows` (engine/tables/optimizer_updates.py), as EmbeddingTable does. A rule
        that moves every row (optimizer_updates.moves_every_row) runs on each member's rows
        where the group's rows grow in place: its flat arrays reserve rows no member holds."""
        if self.reserved and optimizer_updates.moves_every_row(update):
            self._update_each_member(update, slots, rows, grads, hyper, options)
            return
        update(self.backend, self.values, slots, rows, grads, hyper, options)

    def _update_each_member(self, update, slots, rows, grads, hyper, options):
        """apply_update's rule on each member's held rows in turn, with the rows (and their
        gradients) of that member (one read of the rows: a replay refuses to record it, and
        the update runs uncaptured), as on a group that grows by copies, row for row."""
        backend = self.backend
        host = np.asarray(backend.to_host(rows), dtype=np.int64)
        member = np.searchsorted(self.row_starts[:-1], host, side="right") - 1
        for t in range(len(self.members)):
            mine = np.flatnonzero((member == t) & (host >= 0))  # (-1: a padded row)
            update(backend, self._view(self.values, t),
                   {name: self._view(flat, t) for name, flat in slots.items()},
                   backend.asarray(host[mine] - self.row_starts[t]),
                   backend.take_rows(grads, backend.asarray(mine)), hyper, options)

    def stamp(self, rows, count=None):
        """Records now as the update time of flat `rows` (count: see backend.fill_rows)."""
        if int(rows.shape[0]):
            self.backend.fill_rows(self.times, rows, time.time(), count)


class HashGroup(TableGroup):
    """The v1 hash tables `members` (of one dim, placement and initializer) as one: a
    TableGroup's flat rows, times and slots, each member keeping its own HashIndex. Its keys
    come with tags (the member of each key, see the module's docstring). Reads to key_exchange
    as a TableGroup with use_hashtable, plus insert_start / insert_error / insert_finish (a
    training lookup) and find (one without insert). A group of hybrid DynamicVariables also
    keeps their access statistics in one flat array (statistics; None for the other groups),
    and evicts (evicts True)."""

    use_hashtable = True

    def __init__(self, runtime, members):
        super().__init__(runtime, members)
        self.spec = members[0].spec
        self.rank = runtime.rank
        self.journal = runtime.journal
        self.table_ids = np.array([table.table_id for table in members], dtype=np.uint64)
        self.key_capacities = np.array([table.capacity for table in members], dtype=np.int64)
        self.max_capacities = np.array([getattr(table, "max_capacity", table.capacity)
                                        for table in members], dtype=np.int64)
        self.evicts = any(getattr(table, "statistics", None) is not None for table in members)
        self.grows = self.evicts or bool(np.any(self.max_capacities > self.capacities))
        self.statistics = None
        self._ahead = {}  # member -> (capacity, back_rows_ahead's future): _back_ahead
        # eviction.SpareLists by the members' spare rows they list (spare_lists), the last
        # one used first: a replayed class keeps the one it recorded
        self._spare_lists = collections.OrderedDict()
        self._arrivals = None  # rows_needed's (keys, per member its keys, evictable)
        # rows_needed's (keys, row_starts, their flat rows, their segments) for make_room
        self._found = None
        if self.evicts:
            self.statistics = self._joined([table.statistics for table in members], 0)
            for t, table in enumerate(members):
                table.statistics = self._view(self.statistics, t)
            self.backend.release_unused()

    @staticmethod
    def _key_starts(members):
        return None  # keys are tagged, never offset

    @property
    def capacities(self):
        """Host int64 [members]: each member's capacity, the most keys it holds now (its arrays
        hold held_rows: as many, or at max_capacity a hybrid member's spare rows beyond them,
        DynamicTable.rows_for)."""
        return self.key_capacities

    def _rows_for(self, capacities):
        """Host int64 [members]: the rows each member holds at `capacities` keys."""
        return np.array([member.rows_for(c) for member, c in zip(self.members, capacities)],
                        dtype=np.int64)

    @staticmethod
    def _reserved_rows(members):
        """Host int64 [members], the rows to reserve for each member (its max_capacity), where
        the group's rows grow in place; else None (the copies of grow). In place: members that
        may grow, none of which splits its rows into host memory, where the granules the
        members may leave unused (about one per member and array, _GRANULE: a member's end
        shares one with the next one's start) are at most an eighth of the group's values
        held, and the reserve at most _MOST_RESERVED times the rows held (the backward's row
        bitmap is sized by the reserve); members that evict (hybrid DynamicVariables) too, their
        access statistics growing in place beside the values. SOK1X_GROW_IN_PLACE=0: never;
        =1: whenever such members may grow."""
        wanted = os.environ.get(GROW_ENV, "")
        held = np.array([int(table.values.shape[0]) for table in members], dtype=np.int64)
        most = np.array([table.rows_for(getattr(table, "max_capacity", table.capacity))
                         for table in members], dtype=np.int64)
        if wanted == "0" or np.array_equal(most, held) or any(
                getattr(table, "hbm_rows", None) is not None for table in members):
            return None
        if wanted != "1":
            held_bytes = int(held.sum()) * 4 * int(members[0].dim)
            if (most.sum() > _MOST_RESERVED * held.sum()
                    or len(members) * 4 * _GRANULE * 8 > held_bytes):
                return None
        return most

    def capacity_error(self, keys):
        raise NotImplementedError("a hash group's keys need their tags: insert_start")

    def rows_of(self, keys, insert):
        raise NotImplementedError("a hash group's keys need their tags: find or insert_start")

    def indexes(self):
        """The members' HashIndexes as they are now (a rebuild or a load replaces one)."""
        return [table.index for table in self.members]

    def find(self, keys, tags):
        """Flat rows of owned tagged keys, -1 where a member does not hold its key."""
        return self.backend.hash_find_many(self.indexes(), keys, tags, self.row_starts)

    def insert_start(self, keys, tags, evicted=None, members=None, clock=None):
        """Queues a training lookup of owned tagged keys: find-or-insert in every member's index,
        the new rows' initial values and update times, and every key's vector. evicted: None,
        or make_room_in_place's: the members it evicted from take their new keys into their
        victims' rows; where the members hand out rows an eviction freed (or those victims'
        rows), the new rows' slots are reset in the pass that writes their vectors. Returns
        (state, placed): placed, backend int64 [T] (keys each member
        placed) for the host to read and hand to insert_error and insert_finish (or, where no
        member can pass its room, to insert_kept). members and clock: a replayed insert's
        (engine/lookup/replayed_step.py; a group that does not evict): the member list
        (backend.hash_insert_members: the host writes it where the recorded work's own
        hash_members_advance did not leave it as it must be) and the clock (float64 [1]) the
        host writes before each replay, both read when the work runs; no size is read here
        then."""
        self._found = None  # rows_needed's, for make_room only
        backend, indexes = self.backend, self.indexes()
        # (not after an eviction in place: its members' sizes count its victims on the device,
        # read with its placed counts once all is queued; insert_error is not asked then)
        sizes = None if evicted is not None or members is not None else np.array(
            [index.size for index in indexes], dtype=np.int64)
        held = pools = None
        reusing, in_place = False, ()
        # new keys take freed rows first (DynamicTable.rows_source); not a replayed insert's
        # (its member list hands rows out, and a read of a member's rows here could wait for
        # the last step's counts inside the capture: ReplayedInsert.ready saw no freed row)
        if self.evicts and members is None:
            held = dynamic_table.held_states(self.members)
            pools = [table.rows_source() for table in self.members]
            if evicted is not None:  # a padded eviction's victims' rows, in their places
                victims = getattr(evicted, "victims", evicted)  # (an Evicted, or its Victims)
                in_place = tuple(np.flatnonzero(np.diff(victims.starts)).tolist())
                spares = victims.spares  # (or its members' spare rows, as the lists were)
                for t in in_place:  # (its first new row unused: the pool serves every key)
                    start, end = int(victims.starts[t]), int(victims.starts[t + 1])
                    pools[t] = (backend.row_view(victims.device_rows, start, end), 0,
                                end - start) if spares is None else (
                        spares.backup_views[t], 0, int(spares.cuts[t + 1] - spares.cuts[t]))
            reusing = any(pool[0] is not None for pool in pools)
        found = backend.hash_insert_many(indexes, keys, tags, self.row_starts, pools, members)
        rows, new_keys, new_rows, new_tags, count, placed = found
        # a freed row still holds its last key's slots: reset in the vectors' pass
        backend.init_rows_tagged(self.values, new_rows, new_keys, new_tags, self.spec,
                                 self.table_ids, count, self._slot_resets() if reusing else ())
        if not self.evicts:  # a group that evicts stamps them when the insert is kept
            with backend.time_given(clock) if clock is not None else contextlib.nullcontext():
                self.stamp(new_rows, count)
        return (indexes, found, self.gather(rows), sizes, held, reusing, in_place), placed

    def sizes(self):
        """Host int64 [members]: the keys each member's shard holds."""
        return self.backend.hash_sizes(self.indexes())

    def room(self):
        """Host int64 [members]: the rows each member's shard has left (a training lookup's
        header tells it), EVICTS_IN_PLACE for a member that is full and would evict every new
        key in place (full_members, where in_place_bounds may serve): its room is no bound on
        its keys then. A group growing in place backs a near-full member's next rows ahead
        here (_back_ahead): the header is where every step reads its sizes."""
        sizes = self.sizes()
        if self.reserved:
            self._back_ahead(sizes)
        room = self.capacities - sizes
        if self.evicts and environment.get(IN_PLACE_ENV) != "0":
            room[self.full_members()] = eviction.EVICTS_IN_PLACE
        return room

    def rows_needed(self, keys, tags, most=None):
        """Host int64 [members]: the rows each member needs to hold its keys and the new ones
        among owned tagged `keys` (a training lookup's), counted exactly on the device
        (backend.count_new_keys; one wait for the counts), where a member that may grow might
        not hold them even if all were new; else None (no wait). most: None, or host int64
        [members], the most keys of each member that can arrive (the op header's bound; else
        all of `keys`)."""
        if not self.grows:
            return None
        sizes = self.sizes()
        if self.reserved:
            self._back_ahead(sizes)
        arriving = int(keys.shape[0])
        if most is not None:
            arriving = np.minimum(np.asarray(most, dtype=np.int64), arriving)
        self._found = None
        if np.all(sizes + arriving <= self.capacities):
            return None
        backend, found = self.backend, self.find(keys, tags)
        # a member that may evict counts its new keys by the buckets its victims are picked
        # by, so that the pick takes these counts (backend.count_new_keys_segmented)
        bits = [eviction.bucket_bits(member.capacity) if self.evicts and member.capacity ==
                self.max_capacities[t] else -1 for t, member in enumerate(self.members)]
        counted, segments = backend.count_new_keys_segmented(len(self.members), keys, tags,
                                                             found, bits)
        self._found = (keys, self.row_starts, found, segments)
        counting = [counted]
        if self.evicts:  # what each member may evict, should it pass max_capacity
            counting.append(backend.count_evictable(self.indexes(), self.statistics,
                                                    self.row_starts, found, self.journal.step))
        counted = [np.array(a) for a in backend.download_staged_many(counting)]
        # growth_error's, for the same keys: each member's keys, and keys it may evict
        self._arrivals = (keys, counted[0][1], counted[1] if self.evicts else None)
        return sizes + counted[0][0]

    def growth_error(self, needed, keys, tags):
        """TableFullError for the first member whose rows `needed` (rows_needed's, for owned
        tagged `keys`) pass its max_capacity (for a hybrid member: even after evicting every key
        the step did not look up), else None. A hybrid member's check reads no key where the
        host's counts tell (DynamicTable.capacity_error)."""
        over = np.flatnonzero(needed > self.max_capacities)
        sizes = self.sizes()
        arrivals = evictable = None
        if self._arrivals is not None and self._arrivals[0] is keys:
            arrivals, evictable = self._arrivals[1:]
        mine = {}  # {member: its keys}, read only where a check needs them

        def keys_of(t):
            if not mine:
                mine.update(self._keys_of(keys, tags))
            return self.backend.asarray(mine[t])
        for t in over.tolist():
            member = self.members[t]
            if self.evicts:  # rows_needed counted its new keys
                error = member.capacity_error(
                    functools.partial(keys_of, t), int(needed[t] - sizes[t]),
                    None if arrivals is None else int(arrivals[t]),
                    None if evictable is None else int(evictable[t]))
            else:
                error = member.full_error(int(sizes[t]), int(needed[t] - sizes[t]))
            if error is not None:
                return error
        return None

    def _keys_of(self, keys, tags):
        """{member: host int64, its keys among tagged `keys`} (host work: a hybrid member's
        check that the host's counts cannot settle)."""
        keys, tags = self.backend.download_staged_many([keys, tags])  # read, not kept
        order = np.argsort(np.asarray(tags), kind="stable")
        cuts = np.cumsum(np.bincount(np.asarray(tags), minlength=len(self.members)))[:-1]
        return dict(enumerate(np.split(np.asarray(keys)[order], cuts)))

    def make_room(self, needed, keys, tags):
        """Makes room for the rows `needed` (rows_needed's, checked by growth_error) of owned
        tagged `keys`: grows the members that need it (grow), then evicts from every hybrid
        member still short of rows (at max_capacity) the keys it needs freed, all at once
        (engine/tables/eviction.py), recording in the step journal how to put them back."""
        self._arrivals = None  # growth_error's, read: the keys go
        counted, self._found = self._found, None
        self.grow(needed)
        short = needed > self.capacities
        if not short.any():
            return
        found = segments = None  # rows_needed's of these keys, unless a growth moved the rows
        if counted is not None and counted[0] is keys and counted[1] is self.row_starts:
            found, segments = counted[2:]
        held = dynamic_table.held_states(self.members)
        try:
            evicted = eviction.evict(
                self.members, np.where(short, needed - self.capacities, 0), keys, tags,
                self._flat_arrays, found,
                segments)
        except BaseException:  # evict gave the victims back: the free lists too
            self._restore_held(held)
            raise
        self.journal.record(functools.partial(self._undo_evict, evicted, held))

    def in_place_bounds(self, keys, most=None, full=None, sizes=None):
        """Host int64 [members]: where this group (one that evicts) may take a training lookup
        of owned `keys` without counting its new keys first, a bound on each member's new keys
        (0 for a member that need not evict): every member either holds all its keys even if
        new, or is full and frees no row (dynamic_table.evicting_in_place), so that all its new
        keys evict, counted on the device (make_room_in_place); else None (the counted way).
        most: None, or the op header's host int64 [members], the most keys of each member that
        can arrive at an owner (without it, each member's bound would be all of `keys`: the
        counted way serves; keys None: `most` alone bounds them). SOK1X_EVICT_IN_PLACE=0 takes
        the counted way always. full: None,
        or full_members() as it is now (where the caller asked it already); sizes: None, or
        sizes() as they are now."""
        if not self.evicts or most is None or environment.get(IN_PLACE_ENV) == "0":
            return None
        arriving = np.asarray(most, dtype=np.int64)
        if keys is not None:
            arriving = np.minimum(arriving, int(keys.shape[0]))
        if full is None:
            full = self.full_members()
        if not full.any():
            return None
        fits = (self.sizes() if sizes is None else sizes) + arriving <= self.capacities
        if not np.all(full | fits):
            return None
        return np.where(full, arriving, 0).astype(np.int64)

    def spare_lists(self, bounds, step=None):
        """The eviction.SpareLists through which each member with bounds[t] > 0 (evicting in
        place) hands its new keys its spare rows, where every such member can
        (DynamicTable.spares_serve: their free lists made views of it, copied in where they
        were not), else None (the new keys take their victims' rows). One is kept while the
        members evicting and their spare rows stay the same (up to _SPARE_LISTS_KEPT such
        sets). step: the journal's step the eviction runs in (None: the current one)."""
        kept = self._spare_lists
        spares = next(reversed(kept.values())) if kept else None
        if spares is not None and spares.serve_as_they_are(bounds, self.journal.step
                                                           if step is None else step):
            return spares  # (a step like the last one: no call per member)
        members = self.members
        evicting = np.flatnonzero(bounds).tolist()
        if not evicting or not all(members[t].spares_serve(bounds[t], step) for t in evicting):
            return None
        lengths = np.zeros(len(members), np.int64)
        lengths[evicting] = [members[t].spare for t in evicting]
        cuts = cut_points(lengths)
        layout = cuts.tobytes()
        spares, copy = kept.get(layout), True
        if spares is None:  # the lists joined, once for these members' spare rows
            backend, copy = self.backend, False
            joined = backend.join_keys([members[t]._free.device(backend) for t in evicting],
                                       np.zeros(len(evicting), np.int64))
            spares = kept[layout] = eviction.SpareLists(backend, cuts, joined)
            while len(kept) > _SPARE_LISTS_KEPT:
                kept.popitem(last=False)
        kept.move_to_end(layout)
        for t in evicting:
            members[t].keep_free_rows_in(spares.views[t], copy)
        spares.note_held([members[t] for t in evicting])
        return spares

    def make_room_in_place(self, bounds, keys, tags):
        """Evicts from each full member t with bounds[t] > 0 (in_place_bounds') every one of its
        new keys among owned tagged `keys`, victims chosen and counted on the device with no
        wait (eviction.evict, padded), recording in the step journal how to put them back.
        Returns the eviction.Evicted for insert_start, whose `unserved` the caller reads: not 0
        where a member had fewer evictable keys than new ones (the step must fail)."""
        self._arrivals = self._found = None
        spares = self.spare_lists(bounds)  # (first: it may make the free lists views of it)
        held = dynamic_table.held_states(self.members)
        try:
            evicted = eviction.evict(
                self.members, bounds, keys, tags,
                self._flat_arrays, padded=True, spares=spares)
        except BaseException:  # evict gave the victims back: the free lists too
            self._restore_held(held)
            raise
        self.journal.record(functools.partial(self._undo_evict, evicted, held))
        return evicted

    def _flat_arrays(self):
        """(statistics, row_starts, values, slots) as they are now (eviction.evict's)."""
        return self.statistics, self.row_starts, self.values, self.slots

    def full_members(self):
        """Host bool [members]: which members are full and free no row
        (dynamic_table.evicting_in_place)."""
        return dynamic_table.evicting_in_place(self.members)

    def replays_eviction(self, counts, full=None):
        """Whether a replayed lookup (host counts [T] of keys per member) records its eviction
        (ReplayedInsert, evicting): every member with keys is full and frees no row
        (dynamic_table.evicting_in_place), so that all its new keys would evict in place, no member
        keeps what it evicts for a reader (drop_evicted: a reader would hand out arrays the next
        replay writes), and SOK1X_REPLAY_EVICTION is not 0. Else such a group's steps replay
        only where their keys fit. full: None, or full_members() as it is now."""
        if not self.evicts or environment.get(REPLAY_EVICTION_ENV) == "0":
            return False
        if full is None:
            full = self.full_members()
        return (bool(np.all(full | (np.asarray(counts) == 0)))
                and dynamic_table.all_drop_evicted(self.members))

    def in_place_error(self, totals, unserved):
        """The TableFullError of the first member whose new keys make_room_in_place could not
        all serve (host int64 [members]: its victims counted, totals, and the places left
        without one, unserved: it held max_capacity keys, of which only the victims found could
        be evicted), else None."""
        short = np.flatnonzero(np.asarray(unserved) > 0)
        if not short.size:
            return None
        t = int(short[0])
        member, new = self.members[t], int(totals[t])
        return member.shard_full_error(member.capacity, new, new - int(unserved[t]))

    def _undo_evict(self, evicted, held):
        """Undoes make_room's eviction (`evicted`; held: each member's held_state before)."""
        evicted.put_back()
        self._restore_held(held)

    def _restore_held(self, held):
        """Gives each member back its free list and high water (held: their held_state)."""
        for member, state in zip(self.members, held):
            member.restore_held(state)

    def grow(self, needed):
        """Grows each member whose rows `needed` (host int64 [members]) pass its capacity, in
        place: its capacity doubled until they fit, at most max_capacity. The flat values, times
        and slots are laid out again with the new row_starts and the grown members' indexes
        rebuilt, every one made before any is taken (so a failure, of memory say, leaves the
        group as it was; until then the group's arrays are held twice); every key keeps its
        member's row. The rows of the members after a grown one move (see the module's
        docstring); the group forgets its saved passes."""
        members, backend = self.members, self.backend
        capacities = np.array([member.grown_capacity(int(n)) if n > c else int(c) for member, n, c
                               in zip(members, needed, self.capacities)], dtype=np.int64)
        grown = np.flatnonzero(capacities != self.capacities).tolist()
        if not grown:
            return
        if self.reserved:
            self._grow_in_place(capacities, grown)
            return
        rows = self._rows_for(capacities)
        starts = cut_points(rows)
        hbm = self._device_rows(rows)

        def relaid(flat, initial, split=False):  # the views by the layout of now
            return self._joined([self._view(flat, t) for t in range(len(members))], initial,
                                starts=starts, hbm=hbm if split else None)
        values, times = relaid(self.values, 0.0, True), relaid(self.times, 0.0)
        statistics = None if self.statistics is None else relaid(self.statistics, 0)
        slots = {name: relaid(flat, self.slot_initial[name], True)
                 for name, flat in self.slots.items()}
        indexes = [member.index for member in members]
        for t, index in zip(grown, rebuilt_indexes(
                backend, [indexes[t] for t in grown], rows[grown])):
            indexes[t] = index
        self.row_starts, self.held_rows = starts, rows  # taken: nothing fails from here
        self.key_capacities = capacities
        self.hbm = hbm
        self.values, self.times, self.slots = values, times, slots
        self.statistics = statistics
        for t, member in enumerate(members):
            member.values, member.times = self._view(values, t), self._view(times, t)
            if statistics is not None:
                member.statistics = self._view(statistics, t)
            for name, flat in slots.items():
                member.slots[name] = self._view(flat, t)
            member.index, member.capacity = indexes[t], int(capacities[t])
        self.forget_steps()
        backend.release_unused()

    def _back_ahead(self, sizes):
        """Where a member of a group growing in place holds more than _AHEAD of its capacity
        (host `sizes`), has memory mapped behind the rows of its next doubling on a helper
        thread (backend.back_rows_ahead) while steps go on, so that the step that grows it does
        not wait for the driver (about 8 ms for 10 GiB on one H200); once, until it grows. From
        then on the member holds that memory. A failure there is forgotten: the growth backs
        what is missing itself, and raises what the driver says."""
        near = [t for t in np.flatnonzero((sizes > _AHEAD * self.capacities)
                                          & (self.capacities < self.max_capacities)).tolist()
                if t not in self._ahead]
        if not near:
            return
        grown = [self.members[t].rows_for(self.members[t].grown_capacity(
            2 * int(self.capacities[t]))) for t in near]
        spans = [(int(self.row_starts[t]) + int(self.held_rows[t]), int(self.row_starts[t]) + g)
                 for t, g in zip(near, grown)]  # each member's rows of its next doubling
        try:  # one job for the members that pass it together: one wait for the GIL
            ahead = self.backend.back_rows_ahead([(flat, first, stop, initial)
                                                  for flat, initial in self._growing_arrays()
                                                  for first, stop in spans])
        except RuntimeError:  # no helper thread now (interpreter exit): the growth backs
            return
        for t, g in zip(near, grown):
            self._ahead[t] = (g, ahead)

    def _growing_arrays(self):
        """(flat array, the initial value of its new rows) of each array a growth in place
        extends: the values, times, access statistics (a hybrid group's) and slots. The
        values' rows get zeros, as a group growing by copies gives them: a key's insert writes
        its vector, but a rule that moves every row (optimizer_updates.moves_every_row) reads
        rows no key has taken yet."""
        statistics = [] if self.statistics is None else [(self.statistics, 0)]
        return [(self.values, 0.0), (self.times, 0.0)] + statistics + [
            (flat, self.slot_initial[name]) for name, flat in self.slots.items()]

    def _grow_in_place(self, capacities, grown):
        """grow() of a group whose rows grow in place (_reserved_rows): memory behind each grown
        member's (`grown`: their places) new rows in every flat array (backend.back_rows),
        those rows given their initial values (_growing_arrays), the grown members' indexes
        rebuilt; no row moves and nothing is copied. Rows backed and filled ahead
        (_back_ahead) are taken as they are. A failure (of memory, say) gives back what it
        backed: the group stays as it was."""
        backend, members = self.backend, self.members
        rows = self._rows_for(capacities)
        filled = {}  # (array id, member) -> the flat row up to which the rows were filled ahead
        joined = {}  # id(future) -> its arrays, or None where it failed (members share a job)
        for t in grown:
            ahead = self._ahead.pop(t, None)
            if ahead is None:
                continue
            if id(ahead[1]) not in joined:
                try:
                    joined[id(ahead[1])] = backend.join_ahead(ahead[1])
                except Exception:  # noqa: BLE001 (backed here instead, raising the driver's)
                    joined[id(ahead[1])] = None
            done = joined[id(ahead[1])]
            if done is None:
                continue
            for flat, _ in done:
                filled[id(flat), t] = int(self.row_starts[t]) + ahead[0]
        backed = []
        try:
            for flat, initial in self._growing_arrays():
                for t in grown:
                    start = int(self.row_starts[t])
                    old, new = start + int(self.held_rows[t]), start + int(rows[t])
                    if filled.get((id(flat), t), old) >= new:
                        continue  # backed and filled ahead: a driver call less
                    backed.append((flat, backend.back_rows(flat, old, new)))
                    old = min(max(old, filled.get((id(flat), t), old)), new)
                    if initial is not None and new > old:
                        backend.fill_value(backend.row_view(flat, old, new), initial)
            indexes = dict(zip(grown, rebuilt_indexes(
                backend, [members[t].index for t in grown], rows[grown])))
        except BaseException:
            for flat, pieces in reversed(backed):
                backend.unback_rows(flat, pieces)
            raise
        self.held_rows, self.key_capacities = rows, capacities  # taken
        for t in grown:
            member = members[t]
            member.values, member.times = self._view(self.values, t), self._view(self.times, t)
            if self.statistics is not None:
                member.statistics = self._view(self.statistics, t)
            for name, flat in self.slots.items():
                member.slots[name] = self._view(flat, t)
            member.index, member.capacity = indexes[t], int(capacities[t])
        self.forget_steps()

    def reserved_bytes(self):
        """The device (or host) memory behind the flat arrays of a group whose rows grow in
        place (backend.backed_bytes), else None."""
        if not self.reserved:
            return None
        return sum(self.backend.backed_bytes(flat) for flat, _ in self._growing_arrays())

    def insert_kept(self, state, placed):
        """Ends insert_start's call without reading `placed`, where the caller knows that no
        member can pass its room: keeps the placed keys (undone if the step fails later; the
        caller counts the lookup with count_kept once the lookup's agreement passed); each
        index counts its placed keys when its size is next read or settle(placed, its host copy)
        hands them over. Returns (flat rows, vectors)."""
        indexes, found, vectors, _, held, reusing, in_place = state
        self.backend.hash_insert_many_done(indexes, found, placed, True)
        self._record_undo(found, held)  # first: a failure below still takes the keys out
        if held is not None:  # a group that evicts: its members hand their rows out later
            for t, member in enumerate(self.members):
                if t not in in_place:  # those took their victims' rows: nothing to hand out
                    member.take_rows_later(placed, t)
        return found[0], vectors

    def _slot_resets(self):
        """(flat slot, its initial value) of every slot: what init_rows_tagged writes into rows
        an eviction freed (they still hold their last key's slots) beside their vectors."""
        return [(flat, self.slot_initial[name]) for name, flat in self.slots.items()]

    def keep_replayed(self, found, held=None):
        """Ends a replayed insert (insert_start with members; in a group that evicts, one in
        which no member evicts or reuses a freed row: ReplayedInsert.ready): `found`, its
        hash_insert_many result, the placed keys kept. Each index (and, in a group that evicts,
        each member's high water) counts them when next read, from a copy of the placed counts
        queued now (that read waits for the copy alone, never for the work queued after it),
        and the step journal records how to erase them should the step fail (held: each
        member's held_state before the insert, in a group that evicts). Returns the function
        that reads that copy (backend.read_later's)."""
        backend = self.backend
        placed = backend.read_later(found[5])  # (read once, however often called)
        backend.hash_insert_many_done(self.indexes(), found, placed, True)
        self._record_undo(found, held)
        if held is not None:
            dynamic_table.take_rows_later_many(self.members, placed)
        return placed

    def settle(self, placed, host_placed):
        """Hands insert_kept's `placed`, read by the host since, to the indexes it counts for
        (and, in a group that evicts, to the members that hand rows out by it)."""
        self.backend.hash_settle_sizes(self.indexes(), placed, host_placed)
        if self.evicts:
            dynamic_table.settle_rows_many(self.members, placed, host_placed)

    def insert_error(self, state, placed):
        """TableFullError for the first member whose shard the host counts `placed` overflow,
        else None."""
        sizes = state[3]
        over = np.flatnonzero(sizes + placed > self.capacities)
        if not over.size:
            return None
        t = int(over[0])
        return self.members[t].full_error(int(sizes[t]), int(placed[t]))

    def insert_finish(self, state, placed, keep):
        """Ends insert_start's call with the host counts `placed`: keep=True keeps the placed
        keys (undone if the step fails later) and returns (flat rows, vectors); keep=False
        erases them again (a failed step) and returns None."""
        indexes, found, vectors, _, held = state[:5]
        backend = self.backend
        backend.hash_insert_many_done(indexes, found, placed, keep)
        if not keep:  # nothing counted yet: a row's counts are still 0 when no key took it
            self._rebuild_worn()
            return None
        if placed.any():  # first: a failure below still takes the keys out
            self._record_undo(found, held)
        self.count_kept(state)
        if held is not None and placed.any():  # (insert_start reset a reused row's slots)
            for member, n in zip(self.members, placed):
                member.take_rows(int(n))
        return found[0], vectors

    def count_kept(self, state):
        """Counts a kept insert's lookup (`state`: insert_start's) in the rows' statistics and
        stamps the new rows, in one launch (a group that evicts; else nothing). Called once the
        step is known to go on (by insert_finish with keep=True, or after the lookup's agreement
        for insert_kept), as a table alone counts after the agreement (a step that fails there
        counts nothing)."""
        if self.evicts:
            found = state[1]
            rows, new_rows, count = found[0], found[2], found[4]
            # the group's rows: at least each member's
            dynamic_table.note_touched_many(self.members, int(rows.shape[0]))
            self.backend.touch_rows(self.statistics, rows, self.journal.step,
                                    stamp=(self.times, new_rows, time.time(), count))

    def _record_undo(self, found, held):
        """Records in the step journal the erasing of the new keys of hash_insert_many's
        `found`, by the row_starts their flat rows have (a later growth replaces row_starts);
        held: None, or each member's held_state before the insert (a group that evicts)."""
        new_keys, new_rows, new_tags, count = found[1:5]
        starts = self.row_starts
        self.journal.record(
            lambda: self._undo_insert(new_keys, new_rows, new_tags, count, starts, held))

    def _undo_insert(self, new_keys, new_rows, new_tags, count, starts, held):
        """Erases the keys a failed step inserted, member by member, and resets their slots'
        rows (as EmbeddingTable._undo_insert; a hybrid member also its statistics, free list and
        high water: DynamicTable.undo_placed); starts: the row_starts of their flat rows."""
        backend = self.backend
        count = int(backend.to_host(count).reshape(-1)[0])
        keys, rows, tags = (backend.to_host(a)[:count] for a in (new_keys, new_rows, new_tags))
        for t, table in enumerate(self.members):
            mine = tags == t
            if not mine.any():
                continue
            own_keys = backend.asarray(keys[mine])
            # a key a padded eviction left without a victim got no row (-3): its key alone goes
            own_rows = backend.asarray(rows[mine & (rows >= 0)] - starts[t])
            if held is not None:
                table.undo_placed(own_keys, own_rows, held[t])
                continue
            table.index.erase(own_keys)
            table.reset_slot_rows(own_rows)
        self._rebuild_worn()

    def _rebuild_worn(self):
        rebuild_worn(self.backend, self.members)


_UNSET = object()  # ReplayedInsert._spares before its class is recorded


class ReplayedInsert:
    """The host's part of a replayed training lookup of a HashGroup (rows in device memory or
    partly in host memory; engine/lookup/replayed_step.py's hooks): ready() before each replay,
    done() after it, checked() once its key checks passed (in a step with room, where its
    forward leaves them to its backward, as late as that: the step journal undoes the insert
    until then). On several ranks (engine/lookup/replayed_ranks.py) ready() is
    asked after the op header, with the most keys of each member this owner can get as its
    bound (False: this owner inserts uncaptured, its peers may replay), and checked() right
    after done(): the header read every rank's checks.

    A recorded insert hands out each member's next rows from a member list its graph reads as
    it is when it runs, and stamps the new rows with the time a clock then holds. The graph
    moves the list past the keys it placed (backend.hash_members_advance); ready() writes the
    list from the indexes' sizes only where it does not hold them already, and arm() writes
    the time now, once ready() found that no member can fill up in the step: each
    member's keys in the lookup (between its `cuts`) fit its room, or else, near a member's
    capacity, its distinct new keys do, counted on the device (one wait, as the uncaptured step
    counts them). Where they do not fit, the uncaptured path runs, which grows, evicts or fails
    as it does without replays. done() keeps the placed keys (HashGroup.keep_replayed).

    A group that evicts (hybrid DynamicVariables) replays the steps with room in which no
    member has a freed row to hand out (its new keys take fresh rows, as a group that does not
    evict hands them out); its members' high water counts the placed keys as the indexes do,
    the step journal can put back what each member held, and checked() counts the lookup in
    the rows' access statistics (the step's number and time, one launch beside the graph)
    once the step is known to go on, as the uncaptured step counts it after its checks.

    evicting=True (a class of its own: keyed.py's key tells it): the steps of a group whose
    members with keys in the lookup are all full and free no row, none keeping what it evicts
    for a reader (HashGroup.replays_eviction), so that every new key evicts in place
    (make_room_in_place's way): the recorded work picks the victims, erases them and inserts the
    new keys into their rows (eviction.queue_padded, then the insert), marking rows with the
    step a clock of two (time, step) holds when it runs (backend.step_given). done() counts
    the eviction into the indexes and members by its device counts (eviction.record_padded) and
    records the undo in the step journal; checked(), once the key checks passed (at the
    forward's end, or in its backward once that work is queued), reads the eviction's and the
    insert's counts (the step's one wait), hands them over, rebuilds worn indexes beside the
    graph, and fails the step, through `fail`, where a new key found no victim, as the
    uncaptured step does. On several ranks (agreed_check) the class is an owner's: ready()
    takes the op header's most keys of each member this owner can get as the bound its victims
    are sized by (set at its first step; a step with another bound runs uncaptured), and its
    forward is one recorded exchange half, as any class's: the caller
    leaves agreed_check() to the next op header (the backward's), which reads the counts
    (failure()), agrees with every rank on a new key left without a victim, and fails the
    step on every rank or runs checked(), as an uncaptured step's owners do then
    (key_exchange._agreed_in_place)."""

    def __init__(self, group, cuts, evicting=False, fail=None):
        self.group, self.cuts = group, cuts
        self.counts = np.diff(cuts)  # evicting on several ranks: the op header's bound
        self.evicting, self.fail = evicting, fail
        self.members = self.clock = self._given = self._tags = None
        self._listing = None  # ready(): (indexes, row starts, sizes) the list holds before the run
        self._listed = None  # done(): _listing and the run's placed counts (their read)
        self._held = self._found = self._error = None  # this step's, for done and checked
        self._counted = None  # evicting: done()'s (queued, evicted, found, read), for checked()
        self._slot_names = None  # evicting: the slots the recorded work resets, by name
        self._victims = None  # evicting: the arrays its victims are written into (fixed)
        self._room = self._room_now = None  # evicting: queue_padded's room (device, host)
        self._room_written = None  # evicting: the bytes of the room _room holds (arm's upload)
        self._sizes = None  # evicting: the sizes ready() read, for arm()
        self._inside = None  # evicting: whether its work rebuilds indexes (_rebuilds_inside)
        # evicting: the group's SpareLists its recorded work takes rows from, or None (its new
        # keys take their victims' rows), once recorded (_UNSET before); and what that way
        # gathers of the victims (their vectors, their slots' names), Queued.of's
        self._spares = self._spares_now = _UNSET
        self._gathered = (True, None)

    def ready(self, keys, opens_step=False, bound=None):
        """True, with the member list holding the indexes' sizes, where the step's `keys`
        (backend int64, each member's in turn, as the lookup's) fit (evicting: evict in
        place). opens_step: whether the op's order checks, after this, open a new step. bound:
        on several ranks (after the op header), host int64 [members], the most keys of each
        member this owner can get, which must fit its room (nothing is counted)."""
        group = self.group
        if self.evicting:
            return self._ready_to_evict(keys, group.journal.step + bool(opens_step), bound)
        if group.evicts:
            held = dynamic_table.held_states(group.members)
        sizes = group.sizes()
        backend, room = group.backend, group.capacities - sizes
        # a member with room hands its new keys the rows from its size on, as the member list
        # does, where it has no freed row; a full one (its free rows spare rows, say) may take
        # no new key (counted below)
        if group.evicts and ((room > 0) & (
                (np.array([free.size for free, _ in held]) > 0)
                | (np.array([high for _, high in held]) != sizes))).any():
            return False
        if group.reserved:  # as room() does for an uncaptured step
            group._back_ahead(sizes)
        if ((self.counts if bound is None else bound) > room).any():
            if bound is not None:  # (a guard: the header let the step run only where they fit)
                return False
            if self._tags is None:
                self._tags = backend.part_tags(self.cuts)
            found = group.find(keys, self._tags)
            counted = backend.count_new_keys(len(group.members), keys, self._tags, found)
            if (np.asarray(backend.to_host(counted))[0] > room).any():
                return False
        self._list_members(sizes)
        if group.evicts:
            self._held = held
        return True

    def _list_members(self, sizes):
        """Has the member list the recorded insert reads hold the indexes as they are (host
        `sizes`): uploaded, unless it already does. The recorded work moves the list past its
        placed keys (backend.hash_members_advance), so after a step that kept them it holds
        the sizes the host counts next, and a step of the class uploads nothing; anything else
        that changed the indexes (an undone step, another path's insert, a growth or rebuild
        into other indexes or rows) shows as sizes or a layout that differ, and the list is
        written again."""
        group = self.group
        indexes, starts = group.indexes(), group.row_starts
        listed, self._listed = self._listed, None  # unknown until done() (a replay may fail)
        if listed is not None:
            kept_indexes, kept_starts, before, read = listed
            if (indexes == kept_indexes and _same_ints(starts, kept_starts)
                    and _same_ints(before + np.asarray(read()).reshape(-1), sizes)):
                self._listing = (indexes, kept_starts, sizes)
                return
        self.members = group.backend.hash_insert_members(indexes, starts, self.members, sizes)
        self._listing = (indexes, np.array(starts, dtype=np.int64), sizes)

    def arm(self):
        """Writes the clock the recorded work reads: the time now, and evicting, the step (the
        op's journal step, open once its order checks passed)."""
        group = self.group
        backend = group.backend
        if self.clock is None:
            self.clock = backend.empty((2 if self.evicting else 1,), np.float64)
            self._given = backend.empty((1,), np.float32)
        backend.write_given(self._given, [0.0], self.clock, time.time(),
                            group.journal.step if self.evicting else None)
        if self.evicting and self._rebuilds_inside(group):  # the work rebuilds by these
            # each index's empty_slots() and tombstones_before_worn(), read at once
            indexes = group.indexes()
            # ready()'s sizes (first: a count their read settles corrects tombstones)
            sizes, self._sizes = self._sizes, None
            if sizes is None:
                sizes = backend.hash_sizes(indexes)
            tombstones = backend.hash_tombstones(indexes)
            slots, halves = np.array(
                [(index.slot_count, member.capacity // 2)
                 for index, member in zip(indexes, group.members)], dtype=np.int64).T
            room = self._room_now = np.array([slots - sizes - tombstones, halves - tombstones])
            if self._room is None:
                self._room = backend.zeros(room.shape, np.int64)
                self._room_written = None
            # a full group's room is the same step after step (sizes at capacity, tombstones
            # 0 after the recorded rebuild): the device array holds it already
            written = room.tobytes()
            if written != self._room_written:
                backend.write_rows(self._room, 0, room)  # one upload, straight in
                self._room_written = written

    def _ready_to_evict(self, keys, step, bound=None):
        group = self.group
        self._sizes = None
        if bound is not None:  # several ranks: the class's victims are as many as its bound
            if self._victims is None:  # (not yet run: its first step sets it)
                self.counts = np.asarray(bound, dtype=np.int64)
            elif not _same_ints(np.asarray(bound), self.counts):
                return False
        held = dynamic_table.held_states(group.members)  # (first: it hands over counts pending)
        full = group.full_members()
        if not group.replays_eviction(self.counts, full):
            return False
        slot_names = sorted(group.slots)
        if self._slot_names is not None and self._slot_names != slot_names:
            return False  # a slot made since: the recorded work resets the slots it knew
        sizes = group.sizes()
        bounds = group.in_place_bounds(keys, self.counts, full, sizes)
        if bounds is None or not _same_ints(bounds, self.counts):
            return False
        spares = None if self._spares is None else group.spare_lists(bounds, step)
        if self._spares is not _UNSET and spares is not self._spares:
            return False  # recorded with the spare rows' lists, which changed or do not serve
        if spares is not None:  # (it may have made the free lists views of them)
            held = dynamic_table.held_states(group.members)
        if not self._rebuilds_inside(group):
            # a rebuild inside the graph would hold a copy of every slot: short members are
            # rebuilt now, in place, and where even that falls short the step runs uncaptured
            crowded = [member for member, bound in zip(group.members, self.counts)
                       if bound and member.index.empty_slots() < bound]
            if crowded:
                rebuild_indexes(group.backend, crowded)
                if any(member.index.empty_slots() < bound for member, bound in
                       zip(group.members, self.counts) if bound):
                    return False
        self._held, self._slot_names, self._sizes = held, slot_names, sizes
        self._spares_now = spares
        return True

    def _rebuilds_inside(self, group):
        """Whether the recorded work rebuilds an index short of empty slots, or worn by its
        erase, itself (its copy of every member's slots, 16 bytes a slot, at most
        REBUILD_INSIDE_BYTES), decided once."""
        if self._inside is None:
            slots = sum(member.index.slot_count for member in group.members)
            self._inside = 16 * slots <= REBUILD_INSIDE_BYTES
        return self._inside

    def insert(self, keys, tags):
        """The recorded insert of a step's fixed `keys` (with their `tags`): (rows, vectors,
        [new keys, new rows, new tags, count, placed]) as insert_start queues them (evicting:
        the eviction's arrays after those, eviction.Queued.arrays())."""
        group = self.group
        if not self.evicting:
            state, _ = group.insert_start(keys, tags, None, self.members, self.clock)
            found = state[1]
            group.backend.hash_members_advance(self.members, found[5])
            return found[0], state[2], list(found[1:])
        backend = group.backend
        if self._victims is None:  # (the eager run's and the recorded run's: one listing)
            self._victims = eviction.fixed_victims(backend, self.counts)
        spares = self._spares = self._spares_now
        with backend.step_given(self.clock):
            queued = eviction.queue_padded(group.members, self.counts, keys, tags,
                                           group._flat_arrays, group.journal.step,
                                           self._victims, self._room, spares)
        self._gathered = (queued.values is not None, sorted(queued.slots))
        starts = cut_points(self.counts)
        victims = eviction.Victims(backend, starts, queued.keys, queued.rows, queued.values,
                                   queued.slots, queued.records, queued.totals, queued.served,
                                   spares is None)
        victims.spares = spares
        state, _ = group.insert_start(keys, tags, victims)  # (the victims' slots reset in it)
        found = state[1]
        return found[0], state[2], list(found[1:]) + queued.arrays()

    def done(self, rows, placed_keys):
        """Keeps what the step's insert placed (its `rows` of every key, and [new keys, new
        rows, new tags, count, placed], evicting: and the eviction's arrays); evicting, records
        the undo and queues the copy of the step's counts to the host, which checked() reads."""
        found = [rows] + list(placed_keys[:5])
        held, self._held = self._held, None
        if not self.evicting:
            placed = self.group.keep_replayed(found, held)
            listing, self._listing = self._listing, None
            if listing is not None:  # the list holds these sizes and the placed keys now
                self._listed = listing + (placed,)
            self._found = found if held is not None else None
            return
        group = self.group
        backend = group.backend
        queued = eviction.Queued.of(placed_keys[5:], self._gathered[1], self._gathered[0])
        # the undo first, by the device counts (as make_room_in_place and insert_kept record
        # theirs before their one wait): a wait that fails below still finds it recorded
        evicted = eviction.record_padded(group.members, self.counts, queued,
                                         group._flat_arrays, self._spares)
        group.journal.record(functools.partial(group._undo_evict, evicted, held))
        backend.hash_insert_many_done(group.indexes(), found, found[5], True)
        group._record_undo(found, held)  # (its undo runs first: the new keys out, then victims)
        self._counted = counted = [queued, evicted, found, None]  # read in checked()
        self._found = found
        # undone first: a step that fails before checked() still hands its counts over, as the
        # other undo actions expect, and its host mirrors the rebuilds its graph made (recorded
        # before the copy is queued: a queue that fails still finds it, and reads them then)
        group.journal.record(functools.partial(self._counts_read_in_undo, counted))
        # their copies queued now, before the backward's work: checked() then waits for the
        # forward alone, where a copy queued there waited for the backward too
        counted[3] = backend.read_many_later(_step_counts(queued, found))

    def agreed_check(self, op_name, fault=None, read=False):
        """On several ranks, the bounded_step.agreed_check this step leaves to the next op
        header: its error is failure()'s then, or, where read (failure() was asked already, or
        done() failed), `fault` (None, or the error of this rank: every rank fails with it
        there); checked() runs once every rank passed."""
        describe = (lambda: fault) if read else self.failure
        return bounded_step.agreed_check(describe, op_name, self.checked)

    def failure(self):
        """An evicting step's error, its counts read now where done() left them (one wait):
        a TableFullError where a new key found no victim, else None."""
        if self._counted is not None:
            self._read_counts()
        error, self._error = self._error, None
        return error

    def failure_counts(self, more):
        """The device counts whose any value above 0 fails a step (evicting: each member's new
        keys left without a victim, of the eviction's arrays among the recorded run's `more`
        outputs), else None: what a replayed update is predicated on beside the key checks."""
        if not self.evicting:
            return None
        return eviction.Queued.of(more[5:], self._gathered[1], self._gathered[0]).unserved

    def _counts_read_in_undo(self, counted):
        if self._counted is counted:
            self._read_counts()
            self._error = None  # (the step fails for another reason)

    def _read_counts(self):
        """An evicting step's one wait: the eviction's and the insert's counts (done()'s)
        handed to the indexes and members, worn indexes rebuilt; sets the step's error (a new
        key without a victim) or None."""
        queued, evicted, found, read = self._counted
        self._counted = None
        group = self.group
        unserved, totals, served, placed = (
            np.asarray(a, dtype=np.int64).reshape(-1) for a in (
                read() if read is not None
                else group.backend.to_host_many(_step_counts(queued, found))))
        # (_settled_in_place's, for one eviction; the placed counts with the erased ones, in
        # one pass over the indexes)
        evicted.settle(totals, served, (found[5], placed))
        group.settle(found[5], placed)
        if self._room_now is not None:  # the recorded work rebuilt these after its erase
            empty, worn = self._room_now
            members = group.members
            for t in np.flatnonzero((totals > empty) | (served > worn)).tolist():
                members[t].index.forget_tombstones()
        group._rebuild_worn()  # the victims' tombstones
        self._error = group.in_place_error(totals, unserved)

    def checked(self):
        """The step's key checks passed (read at the forward's end, or in its backward: in an
        evicting step, once that work is queued, its counts are read now, in one wait): a step
        whose new keys found no victim fails (evicting, through `fail`), else a group that
        evicts counts its lookup (its rows' access statistics, the new rows' times) as
        HashGroup.count_kept does."""
        error = self.failure()
        found, self._found = self._found, None
        if error is not None:
            self.fail(error)
        if found is not None:
            self.group.count_kept((None, found))


def _same_ints(a, b):
    """np.array_equal(a, b) for host int arrays, in a third of its Python calls (a replayed
    group step compares its sizes and layout with the listed ones at every step)."""
    return a.shape == b.shape and bool((a == b).all())


def _step_counts(queued, found):
    """An evicting replay's device counts the host reads (ReplayedInsert._read_counts): per
    member its places without a victim, its places, its victims and its keys placed."""
    return [queued.unserved, queued.totals, queued.served, found[5]]


def group_kind(table, position, alone=()):
    """What a table may share a pass with (module docstring): tables of one kind form a group."""
    dynamic = getattr(table, "dynamic", None)
    if dynamic is not None and dynamic.var_type == "hbm" and position not in alone:
        return ("hbm", table.dim, table.placement, table.spec)
    if dynamic is not None and position not in alone:
        return ("hybrid", table.dim, table.placement, table.spec)
    if type(table) is not EmbeddingTable or position in alone:
        return ("alone", position)
    if table.use_hashtable:
        return ("hash", table.dim, table.placement, table.spec)
    return ("group", table.dim, table.placement)


def plan(runtime, tables, alone=()):
    """Returns the lookup of `tables` as [Unit]: the tables of one kind (group_kind) as one
    TableGroup or HashGroup (made now, once, if they have none), every other table as a unit of
    its own. alone: positions that stay units of their own (hash tables with a low-frequency
    filter). The units keep the order of their first table in `tables`."""
    lookup = (tuple(map(id, tables)), tuple(alone))
    group = getattr(tables[0], "group", None) if tables else None
    if group is not None and group.planned[0] == lookup and group.live(runtime):
        return group.planned[1]
    classes = collections.OrderedDict()
    for position, table in enumerate(tables):
        classes.setdefault(group_kind(table, position, alone), []).append(position)
    units = []
    for kind, positions in classes.items():
        group = (_group_of(runtime, [tables[p] for p in positions])
                 if len(positions) > 1 or _grows_in_place_alone(kind, tables[positions[0]])
                 else None)
        if group is None:
            units += [Unit(tables[p], [p]) for p in positions]
            continue
        place = {id(tables[p]): p for p in positions}
        units.append(Unit(group, [place[id(member)] for member in group.members]))
    if len(units) == 1 and isinstance(units[0].table, TableGroup):
        units[0].table.planned = (lookup, units)  # the same lookup next step: no planning
    return units


def _grows_in_place_alone(kind, table):
    """Whether `table`, the one table of its `kind` (group_kind) in a lookup, is looked up as a
    hash group of one: an hbm DynamicVariable whose rows may grow in place
    (HashGroup._reserved_rows), so that its growth copies nothing and never holds its arrays
    twice, as a group's does (or it is in such a group already)."""
    if kind[0] != "hbm":
        return False
    group = table.group
    if group is not None:
        return len(group.members) == 1
    asked = (table.capacity, os.environ.get(GROW_ENV, ""))
    known = _ALONE_VERDICTS.get(table)
    if known is None or known[0] != asked:  # (asked at every lookup of the table: kept)
        known = _ALONE_VERDICTS[table] = (asked, table.capacity < table.max_capacity and
                                          HashGroup._reserved_rows([table]) is not None)
    return known[1]


def _group_of(runtime, members):
    """The live TableGroup of exactly `members`, a new one if none of them is in a live group,
    else None (a table named twice, or grouped with other tables). A group of one
    (_grows_in_place_alone) gives its table up to a lookup that names it with tables in no
    group of more than one (else the table stays in it, looked up there as a unit alone)."""
    if len({id(table) for table in members}) != len(members):
        return None
    groups = {id(table.group): table.group for table in members if table.group is not None}
    for group in list(groups.values()):
        if not group.live(runtime):
            group.dissolve()
            del groups[id(group)]
    alone = [group for group in groups.values() if len(group.members) == 1]
    if len(members) > 1 and len(alone) == len(groups):  # only groups of one: theirs now
        for group in alone:
            group.dissolve()
        groups = {}
    if not groups:
        return (HashGroup if members[0].use_hashtable else TableGroup)(runtime, members)
    if len(groups) == 1:
        group = next(iter(groups.values()))
        if len(group.members) == len(members) and all(t.group is group for t in members):
            return group
    return None
