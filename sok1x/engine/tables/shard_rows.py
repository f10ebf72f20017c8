"""Reading and writing this rank's rows of a table by global key, without any collective:
sok1x.Variable's initial rows, sok1x.export and sok1x.assign (SOK's v2 names, which act on the
local shard only).

Keys are global ids (sok1x.Variable) or hash keys (sok1x.DynamicVariable); each must be owned by
this rank under the table's placement (engine/tables/placement.py). With slot=(name, initial value)
they read and write the rows of one of the table's optimizer slots (tables/table.py, made with
that initial value if the optimizer has not yet) instead of its values: the slot of a key is
the row its key has in the table, so a slot has the table's keys.
"""
import numpy as np

from sok1x.engine import api
from sok1x.engine.tables import hybrid_rows
from sok1x.engine.tables import placement as placements
from sok1x.engine.bounded_collectives import all_gather_rows
from sok1x.engine import runtime as _runtime
from sok1x.errors import InvalidInputError


def owned_keys(placement, num_keys, rank, size):
    """Returns the global keys in [0, num_keys) that `rank` holds (int64, ascending), for a table
    without a hash table: key % size == rank ("mod"), all of them on rank r (("rank", r))."""
    placement = placements.parse(placement)
    if placement.kind == "rank":
        if placement.rank != rank:
            return np.zeros([0], np.int64)
        return np.arange(num_keys, dtype=np.int64)
    return np.arange(rank, num_keys, size, dtype=np.int64)


def owned_count(placement, num_keys, rank, size):
    """How many keys owned_keys(placement, num_keys, rank, size) returns, without making them."""
    placement = placements.parse(placement)
    if placement.kind == "rank":
        return num_keys if placement.rank == rank else 0
    return max(0, -(-(num_keys - rank) // size))


def _owned(table, keys, key_limit):
    """Returns the mask of `keys` this rank holds; raises InvalidInputError for keys outside
    [0, key_limit)."""
    if keys.size and (keys.min() < 0 or (key_limit is not None and keys.max() >= key_limit)):
        raise InvalidInputError("%s: assigned keys must lie in [0, %s), got %d..%d"
                                % (table.name, key_limit, keys.min(), keys.max()))
    backend = table.backend
    owners = backend.to_host(backend.owners_of(backend.asarray(keys), table.size,
                                               *table.owner_rule))
    return np.asarray(owners) == table.rank


def _rows_array(table, slot):
    """The table's values (slot None) or its optimizer slot (name, initial value)."""
    if slot is None:
        return None
    name, initial = slot
    return table.slot(name, initial)


def assign(table_name, keys, values, key_limit=None, slot=None):
    """Local. Writes float32 values [n, dim] to the rows of the global `keys` [n] (distinct)
    that this rank holds (a hash table inserts new ones, their other rows at their initial
    values); keys held on other ranks are left to them, so every rank may pass the same keys
    and values. key_limit: the table's number of keys, if it has one; slot: (name, initial
    value) writes that optimizer slot's rows instead of the values. Returns the number of rows
    written. Raises InvalidInputError, changing nothing, for keys or values that do not fit."""
    with _runtime.entered():
        table = api.shard(table_name)
        backend = table.backend
        keys = np.asarray(backend.to_host(keys)).astype(np.int64).reshape(-1)
        values = np.asarray(backend.to_host(values), dtype=np.float32)
        if values.shape != (keys.shape[0], table.dim):
            raise InvalidInputError("%s: assign needs values [%d, %d] for %d keys, got %s"
                                    % (table_name, keys.shape[0], table.dim, keys.shape[0],
                                       list(values.shape)))
        if np.unique(keys).shape[0] != keys.shape[0]:
            raise InvalidInputError("%s: assign got repeated keys" % table_name)
        mine = _owned(table, keys, key_limit)
        keys, values = keys[mine], values[mine]
        if keys.size == 0:
            return 0
        target = _rows_array(table, slot)
        rows = _rows_inserting(table, keys)
        if target is None:
            table.put(rows, backend.asarray(values))
        else:
            hybrid_rows.put_rows(backend, target, rows, values)
        return int(keys.shape[0])


def _rows_inserting(table, keys):
    """Returns the shard rows of `keys` (int64 NumPy, all held here), inserting the new ones;
    raises the table's capacity error, changing nothing, when they do not fit."""
    keys_on_device = table.backend.asarray(keys)
    if table.use_hashtable:
        error = table.capacity_error(keys_on_device)
        if error is not None:
            raise error
    return table.rows_of(keys_on_device, insert=True)


def export(table_name, key_limit=None, slot=None):
    """Local. Returns host (keys int64 [n], values float32 [n, dim]) of every key this rank holds,
    by ascending row. key_limit: the table's number of keys (rows beyond it are padding); slot:
    (name, initial value) gives that optimizer slot's rows instead of the values."""
    with _runtime.entered():
        table = api.shard(table_name)
        backend = table.backend
        if table.use_hashtable:
            keys, rows = table.index.export()
            keys, rows = np.asarray(backend.to_host(keys)), np.asarray(backend.to_host(rows))
        else:
            rows = np.arange(table.values.shape[0], dtype=np.int64)
            keys = placements.global_keys(table.placement, rows, table.rank, table.size)
            if key_limit is not None:
                rows, keys = rows[keys < key_limit], keys[keys < key_limit]
        target = _rows_array(table, slot)
        if target is None:
            values = backend.to_host(table.gather(backend.asarray(rows)))
        else:
            values = backend.to_host(hybrid_rows.gather_rows(backend, target,
                                                             backend.asarray(rows)))
        return keys.astype(np.int64), np.asarray(values, dtype=np.float32).reshape(-1, table.dim)


def gather_rows(table_name, key_limit=None):
    """Collective (host): returns host (keys int64 [n], values float32 [n, dim]) of every row
    of the table on every rank, in rank order (each rank's rows as export() gives them)."""
    keys, values = export(table_name, key_limit)
    with _runtime.entered() as rt:
        all_keys, _ = all_gather_rows(rt.host, keys)
        all_values, _ = all_gather_rows(rt.host, values)
    return all_keys, all_values


def gather_all(table_name, num_keys):
    """Collective (host): returns float32 [num_keys, dim], every row of a table without a hash
    table (keys are its global rows) on every rank."""
    keys, values = gather_rows(table_name, num_keys)
    table = np.zeros([num_keys, values.shape[1]], np.float32)
    table[keys] = values
    return table


def read_local(table_name, keys, key_limit=None):
    """Local. Returns host (vectors float32 [n, dim], shard rows int64 [n]) of `keys` [n], every
    one held by this rank (a hash table inserts unseen ones with their initial values): SOK's
    sparse_read of a variable whose rows all live here. Raises InvalidInputError, changing
    nothing, for keys this rank does not hold or that do not fit."""
    with _runtime.entered():
        table = api.shard(table_name)
        backend = table.backend
        keys = np.asarray(backend.to_host(keys)).astype(np.int64).reshape(-1)
        mine = _owned(table, keys, key_limit)
        if not np.all(mine):
            raise InvalidInputError("%s: rank %d read keys it does not hold (%s...); only the "
                                    "rank holding a table's rows reads them directly"
                                    % (table_name, table.rank, keys[~mine][:3].tolist()))
        rows = _rows_inserting(table, keys)
        vectors = np.asarray(backend.to_host(table.gather(rows)), np.float32)
        return vectors.reshape(-1, table.dim), np.asarray(backend.to_host(rows), np.int64)
