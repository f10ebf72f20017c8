"""Setting the values of given keys of a table from whole arrays (SOK v1's
Saver.load_embedding_values): rank 0's keys and values are sent to the ranks that own them, which
write them into their shards (inserting keys a hash table has not seen). Optimizer slots and rows
of other keys keep what they hold. Framework-free; collective.
"""
import numpy as np

from sok1x.backend import cpu as host_ops
from sok1x.engine import checkpoint
from sok1x.engine import runtime as _runtime
from sok1x.engine.bounded_collectives import all_to_all_rows
from sok1x.errors import InvalidInputError


def _check(table, keys, values, where):
    """Returns the error (or None) of assigning `values` [n, dim] to `keys` [n] of `table`."""
    if values.ndim != 2 or values.shape[1] != table.dim:
        return InvalidInputError(
            "%s: the values have shape %s; table %s needs rows of dim %d ([n, %d])"
            % (where, list(values.shape), table.name, table.dim, table.dim))
    if keys.shape[0] != values.shape[0]:
        return InvalidInputError("%s: %d keys for %d rows of values (table %s)"
                                 % (where, keys.shape[0], values.shape[0], table.name))
    if keys.size and int(keys.min()) < 0:
        return InvalidInputError("%s: negative key %d for table %s"
                                 % (where, int(keys.min()), table.name))
    limit = table.key_limit
    if limit is not None and keys.size and int(keys.max()) >= limit:
        return InvalidInputError(
            "%s: %d rows given, but table %s without a hash table holds keys below %d "
            "(max_vocabulary_size_per_gpu=%d x %d ranks): give at most that many rows, or "
            "raise max_vocabulary_size_per_gpu" % (where, keys.shape[0], table.name, limit,
                                                  table.capacity, table.size))
    return None


def assign_values(table_name, keys, values, where="load_embedding_values"):
    """Collective. Sets the rows of global `keys` (int [n], distinct) of table `table_name` to
    `values` (float32 [n, dim]), rank 0's arrays being used (the others may pass None). Raises
    InvalidInputError (or TableFullError) on every rank, changing nothing, for a wrong shape, a
    key the table cannot hold, or a full shard."""
    with _runtime.entered() as rt:
        table, = checkpoint.ready_tables(rt, [table_name], where)
        error = None
        if rt.rank == 0:
            keys = np.asarray(keys, dtype=np.int64).reshape(-1)
            values = np.asarray(values, dtype=np.float32)
            error = _check(table, keys, values, where)
        rt.host.raise_together(error, where)
        owned_keys, owned_values = _scatter_from_root(rt, table, keys, values)
        backend = rt.backend
        keys_b = backend.asarray(owned_keys)
        rt.host.raise_together(table.capacity_error(keys_b), where)
        rows = table.rows_of(keys_b, insert=True)
        table.put(rows, backend.asarray(owned_values))
        table.stamp(rows)


def _scatter_from_root(rt, table, keys, values):
    """Collective: sends each rank the rows of rank 0's (keys, values) that it owns."""
    if rt.size == 1:
        return keys, values
    host = rt.host
    counts = None
    if rt.rank == 0:
        order, counts = host_ops.bucket_by_owner(keys, rt.size, *table.owner_rule)
        keys, values = keys[order], values[order]
    counts = np.asarray(host.broadcast_object(None if counts is None else np.asarray(counts)),
                        np.int64)
    send_counts = counts if rt.rank == 0 else np.zeros(rt.size, np.int64)
    recv_counts = np.zeros(rt.size, np.int64)
    recv_counts[0] = counts[rt.rank]
    if rt.rank != 0:
        keys, values = np.zeros(0, np.int64), np.zeros((0, table.dim), np.float32)
    return (all_to_all_rows(host, keys, send_counts, recv_counts),
            all_to_all_rows(host, values, send_counts, recv_counts))


def sequential_keys(count):
    """The keys 0, 1, ..., count - 1 (int64): those SOK gives the concatenated rows of
    load_embedding_values."""
    return np.arange(int(count), dtype=np.int64)
