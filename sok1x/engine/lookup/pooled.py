"""Pooled lookups of one or several tables in one exchange: each output row (a (sample, slot) of
DistributedEmbedding, a sample of sok1x.lookup_sparse or of a group lookup) is the sum or mean of
its keys' vectors, optionally weighted, as tf.nn.embedding_lookup_sparse computes it:

    sum:   out[s] = sum_i w_i * v_i                      over the keys i of segment s
    mean:  out[s] = sum_i w_i * v_i / sum_i w_i          (0 for an empty segment)

with w_i = 1 when there are no weights. The keys cross in key_exchange's fused exchange; the
pooling happens after the vectors come back, on the rank that asked (SOK all-gathers keys and
reduce-scatters partial sums instead): it reuses the one exchange every front door shares and
moves nnz * dim floats each way, against world_size * segments * dim for the reduce-scatter.

The tables of a lookup pass in units (lookup/table_group.py): a group's keys are joined in its id
space and looked up, pooled (its members' output rows one after the other) and, backward,
spread and summed in one pass; the members get row views of the group's outputs and gradients.
Members with different combiners or weighting share the lookup and are pooled apart.
"""
import collections

import numpy as np

from sok1x.backend.cuts import cut_points, part_starts
from sok1x.engine.lookup import group_gradients, table_group
from sok1x.engine.lookup.checks import first_error
from sok1x.engine.lookup.key_exchange import (
    lookup_backward_many, lookup_forward_many, start_key_checks,
)
from sok1x.errors import InvalidInputError

COMBINERS = ("sum", "mean")

PooledInput = collections.namedtuple(
    "PooledInput", "keys segment_ids num_segments weights combiner admit_ratio",
    defaults=(None,))
PooledInput.__doc__ = """One table's share of a pooled lookup: keys (int [nnz]), segment_ids
(int64 [nnz], the output row of each key; None: each key its own row, num_segments = nnz),
num_segments (int), weights (float32 [nnz] or None),
combiner ("sum" or "mean"), admit_ratio (None, or a hash table's low-frequency filter:
engine/tables/admission.py). Arrays are backend arrays (or NumPy)."""

Pool = collections.namedtuple("Pool", "segment_ids num_segments weights denominators")
Pool.__doc__ = """One pooling pass: the keys' output rows (None: each key its own row), how many
rows, weights or None, and the mean's per-row divisors or None."""

UnitPooling = collections.namedtuple("UnitPooling", "unit routing pools key_counts segments")
UnitPooling.__doc__ = """What the backward pass needs of one unit (lookup/table_group.py): the
Unit, its Routing, its Pools (one over all members' keys joined, or one per member when their
combiners or weighting differ), and per member its number of keys and of output rows."""

def check_input(table, item):
    """Returns (error or None, extra bound checks) for one table's PooledInput."""
    name = table.name
    if item.combiner not in COMBINERS:
        return InvalidInputError("%s: combiner must be one of %s, got %r"
                                 % (name, COMBINERS, item.combiner)), []
    nnz = item.keys.shape[0] if len(item.keys.shape) == 1 else -1
    if nnz < 0:
        return InvalidInputError("%s: keys must be 1-D, got shape %s"
                                 % (name, list(item.keys.shape))), []
    if item.segment_ids is None and int(item.num_segments) != nnz:
        return InvalidInputError("%s: %d output rows for %d keys without segment ids (each key "
                                 "is its own row)" % (name, int(item.num_segments), nnz)), []
    if item.segment_ids is not None and tuple(item.segment_ids.shape) != (nnz,):
        return InvalidInputError("%s: %d segment ids for %d keys"
                                 % (name, item.segment_ids.shape[0], nnz)), []
    if item.weights is not None and tuple(item.weights.shape) != (nnz,):
        return InvalidInputError("%s: %s weights for %d keys (the weights must match the ids "
                                 "one to one)" % (name, list(item.weights.shape), nnz)), []
    segments = int(item.num_segments)
    if item.segment_ids is None:
        return None, []

    def segment_check(bounds):
        if nnz and (bounds[0] < 0 or bounds[1] >= segments):
            return InvalidInputError("%s: a key belongs to output row %d, outside [0, %d)"
                                     % (name, bounds[0] if bounds[0] < 0 else bounds[1],
                                        segments))
        return None
    return None, [(item.segment_ids, segment_check, (0, segments - 1))]


def checked_inputs(backend, tables, inputs, error=None, checks=()):
    """Returns (inputs, error, checks): the PooledInputs (one per table) with their arrays on
    the backend, `error` or else the first input error, and `checks` with each input's bound
    checks (read in the step's wait) up to that error."""
    inputs = [item._replace(keys=backend.asarray(item.keys),
                            segment_ids=None if item.segment_ids is None else backend.asarray(
                                item.segment_ids),
                            weights=None if item.weights is None else backend.asarray(
                                item.weights))
              for item in inputs]
    checks = list(checks)
    for table, item in zip(tables, inputs):
        if error is None:
            error, more = check_input(table, item)
            checks += more
    return inputs, error, checks


def pooled_forward_many(runtime, tables, op, inputs, training, local_error=None,
                        extra_checks=(), key_limits=None, checked_keys=None,
                        inputs_checked=False):
    """Collective. inputs: one PooledInput per table. Returns (outputs, state): per table backend
    float32 [num_segments, dim], and what pooled_backward_many needs. The tables pass in units
    (lookup/table_group.py): a group's keys are joined, looked up and pooled in one pass. Every
    input error, on any rank, raises on every rank before any table changes. extra_checks: more
    (array, check(bounds)) pairs read in the same wait; key_limits: per table None or its number
    of keys (see key_exchange.check_step_keys); checked_keys: None, or per table the keys whose
    bounds judge the step (the batch's own, where inputs hold its distinct keys);
    inputs_checked: the caller made them with checked_inputs, whose error and checks it passes
    as local_error and extra_checks."""
    backend = runtime.backend
    if inputs_checked:
        error, checks = local_error, list(extra_checks)
    else:
        inputs, error, checks = checked_inputs(backend, tables, inputs, local_error,
                                               extra_checks)
    key_check = None
    if error is None:  # judged with the distinct-key counts, in one wait
        key_check = start_key_checks(runtime, tables, checked_keys or [
            item.keys for item in inputs], checks, key_limits)
    units = table_group.plan(runtime, tables, [p for p, item in enumerate(inputs)
                                               if item.admit_ratio is not None])
    unit_keys = [_joined_keys(backend, unit, [inputs[p] for p in unit.positions], error)
                 for unit in units]
    admit_ratios = [None if unit.grouped else inputs[unit.positions[0]].admit_ratio
                    for unit in units]  # a filtered hash table is never grouped
    vectors, routings = lookup_forward_many(runtime, [unit.table for unit in units], op,
                                            [keys for keys, _, _ in unit_keys], training,
                                            first_error(error), key_check=key_check,
                                            admit_ratios=admit_ratios,
                                            tags_list=[tags for _, tags, _ in unit_keys],
                                            tag_counts=[counts for _, _, counts in unit_keys])
    outputs, state = [None] * len(tables), []
    for unit, found, routing in zip(units, vectors, routings):
        items = [inputs[p] for p in unit.positions]
        key_counts = [int(item.keys.shape[0]) for item in items]
        segments = [int(item.num_segments) for item in items]
        if len(items) == 1 or len({(item.combiner, item.weights is None) for item in items}) == 1:
            pools = [_pool_of(backend, items, segments)]
            pooled = [pooled_rows(backend, found, pools[0])]
            if len(items) > 1:
                pooled = _pieces(backend, pooled[0], segments)
        else:  # members pooled apart, each over its share of the unit's vectors
            pools = [_pool_of(backend, [item], [count]) for item, count in zip(items, segments)]
            pooled = [pooled_rows(backend, part, pool) for part, pool in zip(
                _pieces(backend, found, key_counts), pools)]
        for p, out in zip(unit.positions, pooled):
            outputs[p] = out
        state.append(UnitPooling(unit, routing, pools, key_counts, segments))
    return outputs, state


def _joined_keys(backend, unit, items, error):
    """The unit's (keys, tags, tag counts): a group's members' keys in its id space, joined (a
    hash group's as they are, with their tags and host counts of keys per member); a table's
    own keys (tags and counts None)."""
    if not unit.grouped:
        return items[0].keys, None, None
    if error is not None:  # not looked at: the step fails in the first exchange
        return backend.asarray(np.zeros(0, np.int64)), None, None
    group = unit.table
    if group.use_hashtable:
        counts = np.array([item.keys.shape[0] for item in items], dtype=np.int64)
        cuts = cut_points(counts)
        return (backend.join_keys([item.keys for item in items], np.zeros(len(items), np.int64)),
                backend.part_tags(cuts), counts)
    return backend.join_keys([item.keys for item in items], group.key_starts[:-1]), None, None


def _pieces(backend, array, counts):
    """Row views of `array`, counts[i] rows each, in order."""
    return backend.row_views(array, cut_points(counts))


def _pool_of(backend, items, segments):
    """The Pool of `items` (one combiner and weighting) joined: member i's output rows follow
    member i - 1's."""
    num_segments = int(sum(segments))
    if len(items) == 1:
        segment_ids, weights = items[0].segment_ids, items[0].weights
    else:
        starts = part_starts(segments)
        own_rows = [item.segment_ids is None for item in items]
        segment_ids = None  # every key its own row: so are the joined keys
        if not all(own_rows):
            segment_ids = backend.join_keys(
                [backend.asarray(np.arange(int(item.keys.shape[0]), dtype=np.int64)) if own
                 else item.segment_ids for item, own in zip(items, own_rows)], starts)
        weights = None if items[0].weights is None else backend.join_rows(
            [item.weights for item in items])
    return make_pool(backend, segment_ids, num_segments, weights, items[0].combiner)


def make_pool(backend, segment_ids, num_segments, weights, combiner):
    """The Pool of keys with output rows `segment_ids` (None: each key its own row, nothing
    to add up), their weights (or None), `combiner`."""
    if segment_ids is None:  # a row's sum is its one (weighted) vector, its divisor its weight
        return Pool(None, num_segments, weights, weights if combiner == "mean" else None)
    denominators = None
    if combiner == "mean":
        denominators = (backend.segment_counts(segment_ids, num_segments) if weights is None
                        else backend.segment_sum(weights, segment_ids, num_segments))
    return Pool(segment_ids, num_segments, weights, denominators)


def pooled_rows(backend, vectors, pool):
    """out[s] = sum of the (weighted) vectors of segment s, over its divisor for a mean."""
    weighted = vectors if pool.weights is None else backend.scale_rows(vectors, pool.weights)
    pooled = weighted if pool.segment_ids is None else backend.segment_sum(
        weighted, pool.segment_ids, pool.num_segments)
    if pool.denominators is not None:
        pooled = backend.scale_rows(pooled, pool.denominators, divide=True)
    return pooled


def spread_rows(backend, grads, pool):
    """The gradient of each key from its output row's gradient grads [num_segments, dim]."""
    if pool.denominators is not None:
        grads = backend.scale_rows(grads, pool.denominators, divide=True)
    spread = grads if pool.segment_ids is None else backend.take_rows(grads, pool.segment_ids)
    if pool.weights is not None:
        spread = backend.scale_rows(spread, pool.weights)
    return spread


def pooled_backward_many(runtime, tables, op, state, grads_list, bounded=True):
    """Collective. state: pooled_forward_many's; grads_list: per table float32 [num_segments,
    dim] (backend or NumPy). Returns per table backend (values [u, dim], rows [u]) of this rank's
    shard. A gradient that does not fit, in any table, fails the step on every rank. A bounded
    one-rank step (lookup/bounded_step.py; bounded=False keeps the rows counted, for a seam that
    sends them over the host) pads each table's rows to its keys with rows -1 and zeros."""
    backend = runtime.backend
    per_key = []
    for pooling in state:
        unit = pooling.unit
        dim = unit.table.dim
        grads = [backend.asarray(grads_list[p]) for p in unit.positions]
        if any(g.dtype != np.float32 or g.size != count * dim
               for g, count in zip(grads, pooling.segments)):
            # exchange_gradients_many reports the mismatch on every rank
            per_key.append(backend.empty((0, dim), np.float32))
            continue
        grads = [g if tuple(g.shape) == (count, dim) else backend.reshape(g, (count, dim))
                 for g, count in zip(grads, pooling.segments)]
        if len(pooling.pools) == 1:
            joined = grads[0] if len(grads) == 1 else backend.join_rows(grads)
            per_key.append(spread_rows(backend, joined, pooling.pools[0]))
        else:
            per_key.append(backend.join_rows([spread_rows(backend, g, pool)
                                              for g, pool in zip(grads, pooling.pools)]))
    units = [pooling.unit for pooling in state]
    pieces = None  # a group's keys come member after member (_joined_keys)
    if bounded:
        pieces = [None if not pooling.unit.grouped else np.concatenate(
            [[0], np.cumsum(pooling.key_counts)]).astype(np.int64) for pooling in state]
    results = lookup_backward_many(runtime, [unit.table for unit in units], op,
                                   [pooling.routing for pooling in state], per_key, pieces)
    out = [None] * len(tables)
    for pooling, (summed, rows, ranks) in zip(state, results):
        unit = pooling.unit
        if not unit.grouped:
            out[unit.positions[0]] = (summed, rows)
            continue
        for p, pair in zip(unit.positions, group_gradients.split_gradient(
                backend, unit.table, summed, rows, ranks, pooling.routing.row_starts)):
            out[p] = pair
    return out
