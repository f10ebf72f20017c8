"""The all-to-all lookup every front door is built on (SOK's All2All exchange), for one table or
several at once (SOK's fused lookup: one exchange whatever the number of tables).

Forward, on each rank and for each table: de-duplicate the keys, bucket the distinct ones by
owner (the table's placement), exchange the per-owner counts of every table in the op header,
send the keys of all tables to their owners in one exchange, let each owner find (or insert)
their rows and gather their vectors, send the vectors of all tables back in one exchange, and
spread them to every input position. Each distinct key crosses the network once per rank and
direction, however often the batch repeats it. On one rank nothing crosses a network, and the
keys go to the table as they are.
Backward: sum the top gradients of each distinct key, send the sums of all tables to the owners
in one exchange, in the same bucket order, where the sums from different ranks for one row are
added (unique + segment-sum); the result is (values, local rows) per table for IndexedSlices.

    before forward:  rank r holds keys k_t of each table t (any owners)
    after forward:   rank r holds table_t[k_t] for each of its keys, in its input order
    before backward: rank r holds d loss / d table_t[k] for each of its keys
    after backward:  owner o holds, per row of t it owns that was used, the sum of those gradients

Keys and gradients are backend arrays (device arrays on cuda); the host waits of a step are the
bounds of its keys and their distinct counts (one each for all tables), the forward's header
(the per-owner counts ride in it) and the backward's header (the owners' distinct rows are
counted on the device before it, and read with it).
"""
import collections

import numpy as np

from sok1x.engine import distinct_rows
from sok1x.engine.checks import (
    KEY_DTYPES,
    V1_LIMIT,
    VARIABLE_LIMIT,
    check_keys_by_bounds,
    first_error,
)
from sok1x.engine.exchange_header import exchange_sizes
from sok1x.engine.op_order import as_op_id
from sok1x.errors import InvalidInputError

Routing = collections.namedtuple(
    "Routing", "inverse distinct perm send_counts recv_counts owner_rows count may_miss")
Routing.__doc__ = """How one forward pass moved one table's keys: inverse (backend int64
[count], the distinct key of each input position; None on one rank, where keys are not
de-duplicated), distinct (how many distinct keys), perm (backend int64, the distinct key of each
bucketed position; None on one rank: the keys as they came), send_counts / recv_counts (host
int64 [size]), owner_rows (backend int64, the owner's row of each key it received, -1 where a
lookup without insert missed), count (keys in), may_miss (rows may be -1: a hash table looked up
without insert)."""


def check_step_keys(runtime, tables, keys_list, extra_checks=(), key_limits=None):
    """Returns the first input error of a step's keys (dtype, negative, beyond the table), or
    None. extra_checks: (array, check(bounds) -> error or None) pairs whose bounds are read in the
    same single wait. key_limits: per table None or its number of keys (a sok1x.Variable's
    rows), tighter than its shards' capacity."""
    backend = runtime.backend
    arrays = [keys for keys in keys_list if keys.dtype in KEY_DTYPES]
    arrays += [array for array, _ in extra_checks]
    bounds = backend.index_bounds(arrays) if arrays else np.zeros((0, 2), np.int64)
    errors, position = [], 0
    key_limits = key_limits or [None] * len(tables)
    for table, keys, key_count in zip(tables, keys_list, key_limits):
        if keys.dtype in KEY_DTYPES:
            limit, limit_name = table.key_limit, V1_LIMIT
            if key_count is not None:
                limit, limit_name = key_count, VARIABLE_LIMIT
            errors.append(check_keys_by_bounds(table.name, keys, bounds[position], limit,
                                               backend.to_host, limit_name))
            position += 1
        else:
            errors.append(InvalidInputError("%s: keys must be int64 or int32, got %s"
                                            % (table.name, keys.dtype)))
    for _, check in extra_checks:
        errors.append(check(bounds[position]))
        position += 1
    return first_error(*errors)


def lookup_forward_many(runtime, tables, op, keys_list, training, local_error=None):
    """Collective. tables: EmbeddingTables; keys_list: one backend int 1-D array per table.
    Returns (vectors, routings): per table backend float32 [n_t, dim_t] in input order, and the
    Routing its backward pass needs. Raises the step's input errors on every rank before any
    table changes."""
    backend, size = runtime.backend, runtime.size
    error = local_error
    if error is None:
        error = check_step_keys(runtime, tables, keys_list)
    send_counts = np.zeros((size, len(tables)), dtype=np.int64)
    prepared = []
    if error is None and size == 1:  # alone, nothing crosses a network: no de-duplication
        for t, keys in enumerate(keys_list):
            keys = backend.asarray(keys)
            send_counts[0, t] = keys.shape[0]
            prepared.append((keys, None, None, keys))
    owner_counts = None if error is not None else send_counts.T
    if error is None and size > 1:  # one wait for every table's distinct keys; their owner
        # counts stay on the device and travel in the header, read with it
        distinct = backend.unique_many([backend.asarray(k) for k in keys_list], ordered=False)
        perms, owner_counts = backend.bucket_by_owner_many_deferred(
            [d for d, _ in distinct], size, [table.owner_rule for table in tables])
        for (keys, inverse), perm in zip(distinct, perms):
            prepared.append((keys, inverse, perm, backend.take_rows(keys, perm)))
    sizes = exchange_sizes(runtime, op, owner_counts, error)
    send_counts, recv_counts = sizes.sent, sizes.received
    owned = _exchange(runtime, [p[3] for p in prepared], send_counts, recv_counts)
    if training and any(table.use_hashtable for table in tables):
        runtime.host.raise_together(
            first_error(*[table.capacity_error(keys) for table, keys in zip(tables, owned)]),
            as_op_id(op).name)
    owner_rows, vectors = [], []
    for table, keys in zip(tables, owned):
        rows = table.rows_of(keys, bool(training) and table.use_hashtable)
        owner_rows.append(rows)
        vectors.append(table.gather(rows))
    returned = _exchange(runtime, vectors, recv_counts, send_counts)
    outs, routings = [], []
    for t, (table, keys) in enumerate(zip(tables, keys_list)):
        distinct, inverse, perm, _ = prepared[t]
        spread = returned[t]
        if perm is not None:
            spread = backend.empty((distinct.shape[0], table.dim), np.float32)
            backend.put_rows(spread, perm, returned[t])
        outs.append(spread if inverse is None else backend.take_rows(spread, inverse))
        routings.append(Routing(inverse, distinct.shape[0], perm, send_counts[:, t].copy(),
                                recv_counts[:, t].copy(), owner_rows[t], keys.shape[0],
                                table.use_hashtable and not training))
    return outs, routings


def _exchange(runtime, sends, send_counts, recv_counts):
    """One all-to-all of every table's rows (counts [size, tables]); alone, the rows themselves."""
    if runtime.size == 1:
        return list(sends)
    return runtime.data.all_to_all_v_many(sends, list(send_counts.T), list(recv_counts.T))


def lookup_forward(runtime, table, op, keys, training, local_error=None):
    """Collective. lookup_forward_many for one table: returns (vectors, routing)."""
    vectors, routings = lookup_forward_many(runtime, [table], op, [keys], training, local_error)
    return vectors[0], routings[0]


def exchange_gradients_many(runtime, tables, op, routings, grads_list):
    """Collective. grads_list: per table backend float32 [routing.count, dim] in the forward's
    input order. Returns per table backend (rows [u], summed [u, dim]) of this rank's shard: per
    row used, the sum of its gradients over the job (a row -1 collects keys an inference lookup
    missed)."""
    backend = runtime.backend
    error = None
    for table, routing, grads in zip(tables, routings, grads_list):
        if tuple(grads.shape) != (routing.count, table.dim):
            error = error or InvalidInputError(
                "%s: gradient of shape %s does not match the forward's [%d, %d]"
                % (as_op_id(op).name, list(grads.shape), routing.count, table.dim))
    send_counts = np.stack([routing.send_counts for routing in routings], axis=1)
    recv_counts = np.stack([routing.recv_counts for routing in routings], axis=1)
    # The owners' distinct rows are counted before the header, and read in its one wait.
    started, distinct_counts = backend.unique_many_start(
        [routing.owner_rows for routing in routings], ordered=False)
    host_distinct = exchange_sizes(runtime, op, None, error, also_read=[distinct_counts]).extra[0]
    bucketed = []
    for routing, grads in zip(routings, grads_list):
        grads = backend.asarray(grads)
        per_key = grads if routing.inverse is None else backend.segment_sum(
            grads, routing.inverse, routing.distinct)
        bucketed.append(per_key if routing.perm is None else backend.take_rows(per_key,
                                                                               routing.perm))
    owned = _exchange(runtime, bucketed, send_counts, recv_counts)
    out = []
    distinct = backend.unique_many_finish(started, host_distinct)
    for (rows, inverse), received in zip(distinct, owned):
        out.append((rows, backend.segment_sum(received, inverse, rows.shape[0])))
    return out


def lookup_backward_many(runtime, tables, op, routings, grads_list):
    """Collective. As exchange_gradients_many, but returns per table backend (values [u, dim],
    rows [u]) of the rows that exist, for an IndexedSlices."""
    backend = runtime.backend
    out = []
    for routing, (rows, summed) in zip(routings, exchange_gradients_many(
            runtime, tables, op, routings, grads_list)):
        if routing.may_miss:  # rare: the gradient of an inference lookup; drop the misses
            host_rows = backend.to_host(rows)
            used = host_rows >= 0
            if not used.all():
                index = backend.asarray(np.flatnonzero(used).astype(np.int64))
                rows, summed = backend.take_rows(rows, index), backend.take_rows(summed, index)
        distinct_rows.remember(rows)
        out.append((summed, rows))
    return out


def lookup_backward(runtime, table, op, routing, grads):
    """Collective. lookup_backward_many for one table: returns backend (values, rows)."""
    return lookup_backward_many(runtime, [table], op, [routing], [grads])[0]


def exchange_gradients(runtime, table, op, routing, grads):
    """Collective. exchange_gradients_many for one table: returns backend (rows, summed)."""
    return exchange_gradients_many(runtime, [table], op, [routing], [grads])[0]
