"""One rank's shard of an embedding table: its rows, its key index and its optimizer slots.

Which rank owns a key is the table's placement (tables/placement.py, D6). With a hash table a key
gets the next free row of its owner on first sight (find-or-insert); without one its row follows
from the key (key // world_size) and every row is initialised up front. A row's initial value
depends only on (seed, table, key) (D10).
"""
import time

import numpy as np

from sok1x.backend import random_init
from sok1x.engine.tables import hybrid_rows
from sok1x.engine.tables import placement as placements
from sok1x.engine.op_keys import name_key
from sok1x.errors import TableFullError


class EmbeddingTable:
    """A shard. name: the variable's name (its hash seeds the initial values); dim; capacity:
    max_vocabulary_size_per_gpu; use_hashtable; spec: backend.random_init.InitializerSpec;
    placement: an engine.placement value ("mod" by default); initialize=False leaves the rows of
    a table without a hash table zero, for a caller that writes them all (a checkpoint load)."""

    def __init__(self, runtime, name, dim, capacity, use_hashtable, spec,
                 placement=placements.MOD, initialize=True):
        backend = runtime.backend
        self.capacity = int(capacity)
        self.backend = backend
        self.name = name
        self.table_id = name_key("table:" + name)
        self.dim = int(dim)
        self.use_hashtable = bool(use_hashtable)
        self.spec = spec
        self.placement = placements.parse(placement)
        self.owner_rule = placements.owner_rule(self.placement)
        self.rank = runtime.rank
        self.size = runtime.size
        self.journal = runtime.journal
        self.settings = (self.dim, self.capacity, self.use_hashtable, spec, self.placement)
        self.slot_initial = {}
        self.group = None  # the TableGroup holding this table's arrays (lookup/table_group.py)
        # A table placed on one rank holds no rows on the others.
        held = self.rows_for(self.capacity) if placements.holds_rows(self.placement,
                                                                   self.rank) else 0
        self.values = backend.zeros((held, self.dim), np.float32)
        self.slots = {}
        # When each row last changed (seconds since the epoch, 0 = never): for checkpoints and
        # incremental_model_dump. One put_rows per insert or update keeps it current.
        self.times = backend.zeros((held,), np.float64)
        if self.use_hashtable:
            self.index = backend.HashIndex(self.rows_for(self.capacity))
        else:
            self.index = None
            if initialize:
                self.initialize_rows(np.arange(held, dtype=np.int64))

    def initialize_rows(self, rows):
        """Writes the initial values of host int64 `rows` of a table without a hash table."""
        keys = placements.global_keys(self.placement, rows, self.rank, self.size)
        self.backend.init_rows(self.values, self.backend.asarray(rows),
                               self.backend.asarray(keys), self.spec, self.table_id)

    def rows_for(self, capacity):
        """The rows this shard's arrays (and its hash index) hold at `capacity` keys: as many
        (a DynamicTable at max_capacity holds spare rows beyond them)."""
        return int(capacity)

    @property
    def key_limit(self):
        """The largest key + 1 a table without a hash table accepts, else None."""
        if self.use_hashtable:
            return None
        return placements.key_limit(self.placement, self.capacity, self.size)

    def capacity_error(self, keys):
        """Returns TableFullError if inserting `keys` (this rank's owned keys) would overflow the
        shard, else None. Changes nothing."""
        if not self.use_hashtable:
            return None
        missing = self.index.count_missing(keys)
        if self.index.size + missing > self.capacity:
            return self.full_error(self.index.size, missing)
        return None

    def full_error(self, used, missing):
        """The TableFullError of `missing` new keys arriving at a shard holding `used` keys."""
        return TableFullError(
            "%s: the shard on rank %d is full: %d rows used of max_vocabulary_size_per_gpu=%d "
            "and %d new keys arrived. Raise max_vocabulary_size_per_gpu."
            % (self.name, self.rank, used, self.capacity, missing))

    def rows_of(self, keys, insert):
        """Returns the rows of owned `keys` (backend int64 array). insert=True adds unseen keys
        (call capacity_error first) and initialises their rows; insert=False gives -1 for them."""
        if not self.use_hashtable:
            return placements.direct_rows(self.backend, self.placement, keys, self.size)
        if not insert:
            return self.index.find(keys)
        return self._placed_rows(keys, False)[0]

    def inserted_rows_and_vectors(self, keys):
        """A training lookup of owned `keys` into a hash table: (rows_of(keys, True), their
        vectors as gather gives them). Rows split between GPU and host memory take one kernel
        that finds, places, initialises the new rows and copies every key's vector out
        (HashIndex.find_or_insert_values: a host row crosses PCIe once); rows in GPU memory
        take find_or_insert, init and gather, measured faster there (bench/NOTES.md, issue 21
        third round), the init and gather queued before the host waits for the count."""
        return self._placed_rows(keys, True)

    def may_count_later(self):
        """True if a training lookup may take inserted_rows_and_vectors_later: a hash table
        whose rows lie in GPU memory."""
        return self.use_hashtable and not hybrid_rows.is_split(self.values)

    def room(self):
        """Host int64 [1]: the rows a hash table's shard has left."""
        return np.array([self.capacity - self.index.size], dtype=np.int64)

    def inserted_rows_and_vectors_later(self, keys):
        """inserted_rows_and_vectors of a hash table whose rows lie in GPU memory, where the
        caller knows the new keys fit (every rank found from the op header that no shard can
        fill up): nothing waits. Returns (rows, vectors, placed): placed, the backend count of
        new keys (uint64 [1]), which the index counts when its size is next read, or when
        index.settle_size(placed, its host copy) hands it over."""
        return self._placed_rows(keys, True, later=True)

    def _placed_rows(self, keys, fetch, later=False):
        """rows_of(keys, True); returns (rows, vectors), vectors None unless `fetch`; later:
        inserted_rows_and_vectors_later's (rows, vectors, placed), the rows in GPU memory."""
        # A row is handed out again only after a failed step gave it back (_undo_insert resets
        # its slots then), so the slots' rows hold their initial value: only the values need
        # initialising (queued before the host waits for how many keys were placed, or by
        # find_or_insert_values' kernel itself).
        fused = fetch and hybrid_rows.is_split(self.values)
        gathered = []

        def queue_new_rows(new_keys, new_rows, count, rows):
            if not fused:
                self.backend.init_rows(self.values, new_rows, new_keys, self.spec,
                                       self.table_id, count)
            self.stamp(new_rows, count)
            if fetch and not fused:
                gathered.append(self.gather(rows))

        if later:
            rows, new_keys, new_rows, placed = self.index.find_or_insert_later(
                keys, queue_first=queue_new_rows)
            self.journal.record(lambda: self._undo_insert(new_keys, new_rows, placed))
            return rows, gathered[0], placed
        if fused:
            rows, vectors, new_keys, new_rows = self.index.find_or_insert_values(
                keys, self.values, self.spec, self.table_id, queue_first=queue_new_rows)
        else:
            rows, new_keys, new_rows = self.index.find_or_insert(keys,
                                                                 queue_first=queue_new_rows)
            vectors = gathered[0] if fetch else None
        if len(new_rows):
            self.journal.record(lambda: self._undo_insert(new_keys, new_rows))
        return rows, vectors

    def _undo_insert(self, new_keys, new_rows, placed=None):
        """Erases keys a failed step inserted (the index hands their rows out next) and resets
        the slots' rows, which the step's updates may have touched. placed: None, or the
        backend count of the first entries of new_keys and new_rows that were placed."""
        if placed is not None:
            count = int(self.backend.to_host(placed).reshape(-1)[0])
            new_keys = self.backend.row_view(new_keys, 0, count)
            new_rows = self.backend.row_view(new_rows, 0, count)
        self.index.erase(new_keys)
        self.reset_slot_rows(new_rows)
        self.index = rebuilt_if_worn(self.backend, self.index, self.capacity)

    def gather(self, rows):
        """Returns the vectors of shard `rows` (backend int64, -1 gives zeros) as a backend
        float32 [n, dim] array."""
        return hybrid_rows.gather_rows(self.backend, self.values, rows)

    def put(self, rows, values):
        """Writes float32 values [n, dim] into shard `rows` (distinct; sok1x.assign, load)."""
        hybrid_rows.put_rows(self.backend, self.values, rows, values)

    def apply_update(self, update, slots, rows, grads, hyper, options):
        """Runs optimizer rule function `update` on the values and `slots` for distinct shard
        `rows` (engine/tables/optimizer_updates.py)."""
        hybrid_rows.apply_update(self.backend, update, self.values, slots, rows, grads, hyper,
                                 options)

    def reset_slot_rows(self, rows):
        """Writes each slot's initial value into `rows` (backend int64) of every slot."""
        reset_slot_rows(self.backend, self.slots, self.slot_initial, rows)

    def stamp(self, rows, count=None):
        """Records now as the update time of shard `rows` (backend int array, no repeats; count:
        see backend.fill_rows)."""
        if int(rows.shape[0]):
            self.backend.fill_rows(self.times, rows, time.time(), count)

    def slot(self, name, initial_value=0.0):
        """Returns the optimizer slot `name` ([capacity, dim] float32, every row starting at
        `initial_value`), creating it if new (in a group: a view of the group's slot)."""
        if name not in self.slots and self.group is not None:
            self.group.slot(name, initial_value)
        if name not in self.slots:
            values = self.backend.zeros(self.values.shape, np.float32)
            if initial_value:
                self.backend.fill_value(values, float(initial_value))
            self.slots[name] = values
            self.slot_initial[name] = float(initial_value)
        return self.slots[name]


def rebuilt_index(backend, index, capacity):
    """Returns a HashIndex of `capacity` rows holding index's keys at their rows, without
    tombstones (on the device, no wait): HashIndex.rehashed, which may rebuild `index` in
    place."""
    return index.rehashed(capacity)


def rebuilt_indexes(backend, indexes, capacities):
    """New HashIndexes of `capacities` holding each of `indexes`' keys at their rows, without
    tombstones, all at once (backend.hash_rehash_many: on cuda one launch for all, no wait); the
    old ones stay as they are. Raises OverflowError where keys do not fit."""
    return backend.hash_rehash_many(list(indexes), [int(c) for c in capacities])


def is_worn(index, capacity):
    """True once `index`'s tombstones pass half the capacity (probes walk past tombstones, so
    they lengthen every probe chain): time to rebuild it."""
    return worn(index.tombstones, capacity)


def worn(tombstones, capacity):
    """is_worn's rule on counts (NumPy arrays too: one flag per index)."""
    return tombstones > capacity // 2


def tombstones_before_worn(index, capacity):
    """The tombstones `index` may still take before it is_worn (negative once it is)."""
    return capacity // 2 - index.tombstones


def rebuilt_if_worn(backend, index, capacity):
    """Returns `index`, or a rebuilt one (of its own rows) where it is_worn at `capacity` keys."""
    if is_worn(index, capacity):
        return rebuilt_index(backend, index, index.capacity)
    return index


def rebuild_worn(backend, tables):
    """Rebuilds the index of each of `tables` that is_worn, all at once (rebuild_indexes; the
    tombstones read at once: a hash group's members at every evicting step)."""
    if not tables:
        return
    flags = worn(backend.hash_tombstones([table.index for table in tables]),
                 np.array([table.capacity for table in tables], dtype=np.int64))
    if flags.any():
        rebuild_indexes(backend, [tables[t] for t in np.flatnonzero(flags).tolist()])


def rebuild_indexes(backend, tables):
    """Rebuilds the index of each of `tables` without tombstones, all at once
    (backend.hash_rehash_many: on cuda in place, two launches for all, no wait)."""
    for table, index in zip(tables, backend.hash_rehash_many([table.index for table in tables])):
        table.index = index


def reset_slot_rows(backend, slots, slot_initial, rows):
    """Writes slot_initial[name] into `rows` (backend int64, no repeats) of each of `slots`
    ({name: [rows, dim] array, plain or split}): a table's, or a hash group's flat ones."""
    if not int(rows.shape[0]):
        return
    for name, values in slots.items():  # a constant's recipe: no rows of it to gather from
        hybrid_rows.init_rows(backend, values, rows, rows,
                              random_init.make_spec("constant", slot_initial[name]), 0)
