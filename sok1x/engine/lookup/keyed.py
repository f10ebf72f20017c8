"""A pooled lookup of many tables given as ONE array of keys (TorchRec's KeyedJaggedTensor): the
keys of all tables one table after the other, each table's count of keys beside them, and ONE
array of pooled outputs back (table after table), so that a step's host work does not grow with
the number of tables: no Python object per table per step, no per-table input check, one
framework tensor each way.

    keys           int [nnz]       table t's keys (relative to its table) at cuts[t]:cuts[t + 1]
    lengths        host int [T]    keys per table (cuts = 0, cumsum(lengths))
    segment_ids    int64 [nnz]     each key's output row among its table's rows, or None:
                                   each key is its own output row (num_segments = lengths),
                                   a lookup without pooling, as a dense lookup's
    num_segments   host int [T]    output rows per table
    weights        float32 [nnz] or None
    combiner       "sum" or "mean", for all tables

    forward:   out float32 [sum(num_segments), dim], table t's rows after table t - 1's
    backward:  grads like out -> values [u, dim], rows int64 [u] (each table's own shard rows,
               ascending, table after table), counts host int64 [T] (rows per table)
    update:    values, rows, counts as the backward returns them (or changed values)

When the tables are one table group (lookup/table_group.py) in its own order, or one table, the
keys, checks, exchange, gather, pooling and update are one pass each: the keys' per-table bounds
are taken in one op, the keys moved into the group's id space in one op, the member outputs are
the group's output as it is. Any other set of tables (several groups, hash tables beside dense
ones) is cut into per-table pieces and takes engine/lookup/pooled.py's path, with the same
results.
"""
import collections

import numpy as np

from sok1x.backend.cuts import cut_points
from sok1x.engine.tables import optimizer_updates
from sok1x.engine.lookup import group_gradients, replayed_step, table_group
from sok1x.engine.lookup.checks import KEY_DTYPES, V1_LIMIT, VARIABLE_LIMIT, check_keys_by_bounds
from sok1x.engine.lookup.checks import first_error
from sok1x.engine.lookup.key_exchange import KeyCheck, lookup_backward_many, lookup_forward_many
from sok1x.engine.lookup.pooled import (
    COMBINERS,
    PooledInput,
    UnitPooling,
    make_pool,
    pooled_backward_many,
    pooled_forward_many,
    pooled_rows,
    spread_rows,
)
from sok1x.engine.op_order import as_op_id
from sok1x.errors import InvalidInputError

KeyedInput = collections.namedtuple(
    "KeyedInput", "keys lengths segment_ids num_segments weights combiner")
KeyedInput.__doc__ = """The keys of all tables of a lookup in one array (see the module's text):
keys int [nnz], lengths host int [T], segment_ids int64 [nnz] or None (each key its own output
row), num_segments host int [T],
weights float32 [nnz] or None, combiner "sum" or "mean"."""

KeyedState = collections.namedtuple("KeyedState", "pooling cuts segment_cuts pieces")
KeyedState.__doc__ = """What the backward pass needs: pooling (the one UnitPooling of the fast
path, or pooled_lookup's state list), cuts and segment_cuts (host int64 [T + 1]), pieces (True
when the tables went through pooled_lookup's per-table path)."""

_KEY_MAX = np.iinfo(np.int64).max
_LAYOUTS_KEPT = 64
_layouts = {}  # (lengths bytes, num_segments bytes) -> _layout's tuple


def _layout(lengths, num_segments):
    """(cuts, segment_cuts, whether no entry is negative, whether they are equal) of host int64
    lengths and num_segments [T]: made once per layout (one-hot batches have one; multi-hot
    ones change each batch, and the memo only costs them a look-up)."""
    key = (lengths.tobytes(), num_segments.tobytes())
    known = _layouts.get(key)
    if known is None:
        if len(_layouts) >= _LAYOUTS_KEPT:
            _layouts.clear()
        known = _layouts[key] = (cut_points(lengths), cut_points(num_segments),
                                 bool(np.all(lengths >= 0) and np.all(num_segments >= 0)),
                                 bool(np.array_equal(lengths, num_segments)))
    return known


def _whole_group(tables):
    """The TableGroup whose members are `tables` in their order, or None."""
    group = getattr(tables[0], "group", None) if len(tables) else None
    return group if group is not None and group.members == list(tables) else None


def _one_dim_error(tables):
    """ValueError for tables of several dims (or none), else None; a whole group has one."""
    if _whole_group(tables) is not None or len({table.dim for table in tables}) == 1:
        return None
    return ValueError("a keyed lookup needs tables of one dim, got %s"
                      % {table.name: table.dim for table in tables})


def _one_unit(runtime, tables):
    """The lookup's one unit (a TableGroup, or the only table) when `tables` pass as one in
    their own order, else None."""
    units = table_group.plan(runtime, tables)
    if len(units) != 1 or list(units[0].positions) != list(range(len(tables))):
        return None
    return units[0]


def _where(tables):
    return "the keyed lookup of %s" % ", ".join(table.name for table in tables)


def _checked_layout(tables, item):
    """(the input error of `item` found without looking at the data or None, cuts,
    segment_cuts: host int64 [T + 1] of its keys and output rows, None with an error)."""
    count = len(tables)
    keys = item.keys
    if item.combiner not in COMBINERS:
        return InvalidInputError("%s: combiner must be one of %s, got %r"
                                 % (_where(tables), COMBINERS, item.combiner)), None, None
    if keys.dtype not in KEY_DTYPES:
        return InvalidInputError("%s: keys must be int64 or int32, got %s"
                                 % (_where(tables), keys.dtype)), None, None
    if len(keys.shape) != 1:
        return InvalidInputError("%s: keys must be 1-D, got shape %s"
                                 % (_where(tables), list(keys.shape))), None, None
    lengths, segments = item.lengths, item.num_segments
    if lengths.shape != (count,) or segments.shape != (count,):
        return InvalidInputError("%s: lengths and num_segments need one entry per table (%d), "
                                 "got %d and %d" % (_where(tables), count, lengths.size,
                                                    segments.size)), None, None
    nnz = keys.shape[0]
    cuts, segment_cuts, valid, one_per_row = _layout(lengths, segments)
    if not valid or cuts[-1] != nnz:
        return InvalidInputError("%s: lengths %s must be >= 0 and add up to the %d keys, "
                                 "num_segments %s >= 0" % (_where(tables), lengths.tolist(),
                                                           nnz, segments.tolist())), None, None
    if item.segment_ids is None:
        if not one_per_row:
            return InvalidInputError(
                "%s: without segment ids each key is its own output row, so num_segments %s "
                "must equal lengths %s" % (_where(tables), segments.tolist(),
                                           lengths.tolist())), None, None
    elif tuple(item.segment_ids.shape) != (nnz,):
        return InvalidInputError("%s: %s segment ids for %d keys"
                                 % (_where(tables), list(item.segment_ids.shape), nnz)), None, None
    if item.weights is not None and tuple(item.weights.shape) != (nnz,):
        return InvalidInputError("%s: %s weights for %d keys (the weights must match the ids "
                                 "one to one)" % (_where(tables), list(item.weights.shape),
                                                  nnz)), None, None
    return None, cuts, segment_cuts


def _key_check(backend, tables, item, cuts, key_limits, group):
    """The step's key and segment-id checks started on the device for all tables at once: one
    bounds op over both arrays' parts, one flag. key_limits: None or per table None or its
    number of keys. Returns a KeyCheck."""
    limits, key_high = _key_limits(tables, key_limits, group)
    checked = [item.keys] if item.segment_ids is None else [item.keys, item.segment_ids]
    ranges = np.zeros((len(checked) * len(tables), 2), dtype=np.int64)
    ranges[:len(tables), 1] = key_high
    if item.segment_ids is not None:
        ranges[len(tables):, 1] = item.num_segments - 1
    bounds = backend.part_bounds_deferred(checked, cuts)
    flag = backend.flag_outside(bounds, ranges)

    def judge(host_bounds):  # only when some rank's flag is set: names the bad table
        errors = []
        for t, (table, limit) in enumerate(zip(tables, limits)):
            keys = backend.row_view(item.keys, int(cuts[t]), int(cuts[t + 1]))
            limit_name = V1_LIMIT if not key_limits or key_limits[t] is None else VARIABLE_LIMIT
            errors.append(check_keys_by_bounds(table.name, keys, host_bounds[t], limit,
                                               backend.to_host, limit_name))
            if item.segment_ids is None:
                continue
            low, high = (int(b) for b in host_bounds[len(tables) + t])
            rows = int(item.num_segments[t])
            if cuts[t + 1] > cuts[t] and (low < 0 or high >= rows):
                errors.append(InvalidInputError(
                    "%s: a key belongs to output row %d, outside [0, %d)"
                    % (table.name, low if low < 0 else high, rows)))
        return first_error(*errors)
    return KeyCheck(bounds, judge, flag, None)


def _key_limits(tables, key_limits, group):
    """Per table its key limit (None: any key) and the highest key allowed, host int64 [T];
    remembered by a TableGroup, whose members' limits never change."""
    seen = None if key_limits is None else tuple(key_limits)
    known = None if group is None else group.keyed_limits.get(seen)
    if known is None:
        limits = [table.key_limit if limit is None else limit
                  for table, limit in zip(tables, key_limits or [None] * len(tables))]
        known = (limits, np.array([_KEY_MAX if limit is None else int(limit) - 1
                                   for limit in limits], dtype=np.int64))
        if group is not None:
            group.keyed_limits[seen] = known
    return known


def _normalized(backend, tables, item):
    """`item` with backend arrays and host int64 counts; raises ValueError for tables of
    several dims."""
    dim_error = _one_dim_error(tables)
    if dim_error is not None:
        raise dim_error
    return item._replace(keys=backend.asarray(item.keys),
                         segment_ids=None if item.segment_ids is None else backend.asarray(
                             item.segment_ids),
                         lengths=np.asarray(item.lengths, dtype=np.int64).reshape(-1),
                         num_segments=np.asarray(item.num_segments, dtype=np.int64).reshape(-1),
                         weights=None if item.weights is None else backend.asarray(item.weights))


def keyed_distinct_forward(runtime, tables, op, item, training, key_limits, pays):
    """Collective. keyed_forward for a seam that crosses the host (engine/lookup/compact.py):
    where the tables pass as one unit of dense tables (one table, or a TableGroup in its order)
    and pays(distinct keys, keys, output rows) says so, the batch's keys are de-duplicated once,
    in the group's id space, and looked up once each. Returns (rows, inverse, KeyedState):
    rows float32 [u, dim], the distinct keys' vectors, and inverse int64 [nnz], each key's row
    among them (keyed_backward then takes gradients [u, dim]); else keyed_forward's pooled
    output, None and its state."""
    backend = runtime.backend
    item = _normalized(backend, tables, item)
    error, cuts, segment_cuts = _checked_layout(tables, item)
    unit = None if error is not None else _one_unit(runtime, tables)
    if unit is None or unit.table.use_hashtable or not item.keys.shape[0]:
        out, state = keyed_forward(runtime, tables, op, item, training, key_limits)
        return out, None, state
    group = unit.table if isinstance(unit.table, table_group.TableGroup) else None
    keys = item.keys
    if group is not None:
        keys, = backend.offset_parts_many([keys], cuts, [group.key_starts[:-1]])
    distinct, inverse = backend.unique(keys, ordered=False)  # the host waits for their count
    count = int(distinct.shape[0])
    if not pays(count, int(keys.shape[0]), int(segment_cuts[-1])):
        out, state = keyed_forward(runtime, tables, op, item, training, key_limits)
        return out, None, state
    key_check = _key_check(backend, tables, item, cuts, key_limits, group)
    (found,), (routing,) = lookup_forward_many(runtime, [unit.table], op, [distinct], training,
                                               key_check=key_check)
    pool = make_pool(backend, None, count, None, "sum")  # each distinct key its own row
    pooling = UnitPooling(unit, routing, [pool], item.lengths, item.num_segments)
    return found, inverse, KeyedState(pooling, cuts, np.array([0, count], np.int64), False)


def keyed_forward(runtime, tables, op, item, training, key_limits=None, checks="end",
                  replay=False):
    """Collective. item: a KeyedInput over `tables` (all of one dim). Returns (float32
    [sum(num_segments), dim], KeyedState). Every input error, on any rank, raises on every rank
    before any table changes; checks="backward": the caller runs the backward, which may read
    the keys' checks (a bounded step, lookup/bounded_step.py); replay=True: as
    api.dense_lookup's (_replayed_forward)."""
    backend = runtime.backend
    front = None
    if replay and runtime.replays is not None:
        front = _front(tables, op, item, training, key_limits, checks)
        again = None if front is None else _replayed_again(runtime, tables, front, item, checks)
        if again is not None:
            return again
    item = _normalized(backend, tables, item)
    error, cuts, segment_cuts = _checked_layout(tables, item)
    unit = _one_unit(runtime, tables)
    if unit is None:
        return _forward_by_table(runtime, tables, op, item, training, key_limits, error, cuts,
                                 segment_cuts)
    group = unit.table if isinstance(unit.table, table_group.TableGroup) else None
    if replay and error is None:
        replayed = _replayed_forward(runtime, tables, unit, group, op, item, training,
                                     key_limits, checks, cuts, segment_cuts, front)
        if replayed is not None:
            return replayed
    key_check, keys, segment_ids, tags, tag_counts = None, item.keys, item.segment_ids, None, None
    if error is None:
        key_check = _key_check(backend, tables, item, cuts, key_limits, group)
        if group is not None and group.use_hashtable:  # keys as they are, tagged
            tags, tag_counts = backend.part_tags(cuts), np.diff(cuts)
            if segment_ids is not None:
                segment_ids = backend.offset_parts(segment_ids, cuts, segment_cuts[:-1])
        elif group is not None and segment_ids is None:
            keys, = backend.offset_parts_many([keys], cuts, [group.key_starts[:-1]])
        elif group is not None:
            keys, segment_ids = backend.offset_parts_many(
                [keys, segment_ids], cuts, [group.key_starts[:-1], segment_cuts[:-1]])
    else:
        keys = backend.asarray(np.zeros(0, np.int64))
    (found,), (routing,) = lookup_forward_many(runtime, [unit.table], op, [keys], training,
                                               error, key_check=key_check, tags_list=[tags],
                                               tag_counts=[tag_counts],
                                               defer_check=None if segment_ids is not None
                                               else checks,
                                               member_keys=None if error else [np.diff(cuts)])
    num_segments = int(segment_cuts[-1])
    pool = make_pool(backend, segment_ids, num_segments, item.weights, item.combiner)
    pooling = UnitPooling(unit, routing, [pool], item.lengths, item.num_segments)
    return pooled_rows(backend, found, pool), KeyedState(pooling, cuts, segment_cuts, False)


def _front(tables, op, item, training, key_limits, checks):
    """A replayed keyed lookup's key of its raw inputs (replayed_step.replay_known): the
    tables, op, keys' shape and dtype, lengths and num_segments as given, combiner, key limits
    and checks mode; None where it cannot be one (not a training lookup of keys each their own
    output row, unweighted, with lengths and num_segments as NumPy arrays or lists)."""
    keys = item.keys
    dtype = getattr(getattr(keys, "dtype", None), "str", None)  # NumPy's or the backend's
    lengths, segments = _counts_key(item.lengths), _counts_key(item.num_segments)
    if not (training and item.segment_ids is None and item.weights is None
            and lengths is not None and segments is not None and dtype is not None):
        return None
    return (id(tables), as_op_id(op), tuple(keys.shape), dtype, lengths, segments,
            item.combiner, None if key_limits is None else tuple(key_limits), checks)


def _counts_key(counts):
    """Host counts as given (a NumPy array, or a list or tuple of numbers) as a key, or None.
    Equal keys are normalized alike by _normalized, so they share a layout."""
    if type(counts) is np.ndarray:
        return counts.dtype.str, counts.shape, counts.tobytes()
    if type(counts) not in (list, tuple):
        return None
    key = tuple(counts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _replayed_again(runtime, tables, front, item, checks):
    """keyed_forward's result from the replay of the class first seen under `front` (its
    layout checked then; its keys are checked on the device at every replay), or None where
    the whole path must run."""
    replayed = replayed_step.replay_known(runtime, front, tables, front[1],
                                          runtime.backend.asarray(item.keys), checks)
    if replayed is None:
        return None
    vectors, routing, (unit, pool, cuts, lengths, segments) = replayed
    return vectors, KeyedState(UnitPooling(unit, routing, [pool], lengths, segments), cuts,
                               cuts, False)


def _replayed_forward(runtime, tables, unit, group, op, item, training, key_limits, checks,
                      cuts, segment_cuts, front=None):
    """keyed_forward's replayed path (engine/lookup/replayed_step.py): a bounded training
    lookup of one unit of dense tables (one table, or a TableGroup in its order) or of a
    HashGroup, its rows in device memory or partly in host memory (its insert replayed too:
    table_group.ReplayedInsert, its evicting steps too), int64 keys. What is
    recorded looks every key up as its own row; keys of dense tables pooled by segment ids, or
    weighted, replay too (on one rank with checks="end"): the segment ids ride with the keys
    (forward_of's riders), checked in the same flag, and the pooling is done after the replay
    and undone before the replayed backward (pooled.spread_rows). Returns keyed_forward's
    result, or None where the uncaptured path must run (not such a lookup, the first sight of
    its shape class, or on one rank a hash group's step in which a member might fill up: on
    several ranks that step goes on uncaptured after the replayed half before its header, the
    counted way, or sized by the caps where its full shards evict in place).
    A replayed class is remembered under `front` (_front), for _replayed_again."""
    table, keys = unit.table, item.keys
    hashed = isinstance(group, table_group.HashGroup)
    pooled = item.segment_ids is not None or item.weights is not None
    if (not training or keys.dtype != np.int64
            or (pooled and (hashed or (runtime.size == 1 and checks != "end")))
            or (table.use_hashtable and not hashed)
            or not keys.shape[0] or checks not in ("end", "backward")
            or not replayed_step.enabled(runtime)):
        return None
    op = as_op_id(op)
    # the unit, not its tables' names: the class holds it (forward_of asks it is the same)
    # a hash group whose members with keys are all full records its evicting step apart
    evicting = hashed and group.replays_eviction(np.diff(cuts))
    key = (op.tower, op.position, op.name, id(table), int(keys.shape[0]), keys.dtype.str, checks,
           item.lengths.tobytes(), None if key_limits is None else tuple(key_limits),
           None if item.segment_ids is None  # the riders, checked against the output rows
           else item.num_segments.tobytes(), evicting)
    riders = () if item.segment_ids is None else (item.segment_ids,)
    backend = runtime.backend

    hooks = table_group.ReplayedInsert(
        group, cuts, evicting, lambda error: runtime.host.raise_together(error, op.name)
    ) if hashed else None

    def routed(fixed, riders=()):  # the checks, and the keys moved into the group's id space
        check = _key_check(backend, tables, item._replace(
            keys=fixed, segment_ids=riders[0] if riders else None, weights=None), cuts,
            key_limits, group)
        if hashed:  # keys as they are, tagged
            return check, fixed, backend.part_tags(cuts)
        return check, fixed if group is None else backend.offset_parts_many(
            [fixed], cuts, [group.key_starts[:-1]])[0]

    def run(fixed, riders=()):
        check, flat, *tags = routed(fixed, riders)
        if hashed:  # a negative key is passed by (its check fails)
            return (check,) + hooks.insert(flat, tags[0])
        rows = table.rows_of(flat, False)
        return check, rows, table.gather(rows)

    replayed = replayed_step.forward_of(runtime, key, table, op, keys, checks, run, cuts, hooks,
                                        routed, riders)
    if replayed is None:
        return None
    vectors, routing = replayed  # the checks passed (read here, or in the op header)
    segment_ids = item.segment_ids
    if segment_ids is not None and group is not None:
        segment_ids = backend.offset_parts(segment_ids, cuts, segment_cuts[:-1])
    pool = make_pool(backend, segment_ids, int(segment_cuts[-1]), item.weights, item.combiner)
    if front is not None:
        replayed_step.remember_front(runtime, front, key, tables, (
            unit, pool, cuts, item.lengths.copy(), item.num_segments.copy()))
    pooling = UnitPooling(unit, routing, [pool], item.lengths, item.num_segments)
    out = pooled_rows(backend, vectors, pool) if pooled else vectors
    return out, KeyedState(pooling, cuts, segment_cuts, False)


def _forward_by_table(runtime, tables, op, item, training, key_limits, error, cuts,
                      segment_cuts):
    """The keyed lookup as one pooled lookup of per-table pieces (several units)."""
    backend = runtime.backend
    if error is not None:  # fails on every rank in the first exchange
        empty = backend.asarray(np.zeros(0, np.int64))
        inputs = [PooledInput(empty, empty, 0, None, "sum") for _ in tables]
        pooled_forward_many(runtime, tables, op, inputs, training, error)
        raise error  # not reached: the exchange raised

    def pieces(array):
        return [None] * len(tables) if array is None else backend.row_views(array, cuts)

    inputs = [PooledInput(keys, segment_ids, int(segments), weights, item.combiner)
              for keys, segment_ids, segments, weights in zip(
                  pieces(item.keys), pieces(item.segment_ids), item.num_segments,
                  pieces(item.weights))]
    outputs, state = pooled_forward_many(runtime, tables, op, inputs, training,
                                         key_limits=key_limits)
    return backend.join_rows(outputs), KeyedState(state, cuts, segment_cuts, True)


def keyed_backward(runtime, tables, op, state, grads, rows_per_table=False, bounded=True,
                   detach=False):
    """Collective. grads: float32 [sum(num_segments), dim] like the forward's output. Returns
    (values [u, dim], rows int64 [u], counts host int64 [T]) of this rank's shards; with
    rows_per_table, rows is a list of each table's rows (64-byte aligned, known distinct when
    handed back to a per-table update: engine/lookup/distinct_rows.py). A bounded one-rank
    step (lookup/bounded_step.py; bounded=False keeps the rows counted, for a seam that sends
    them over the host) returns a piece per table sized by its keys, padded with rows -1.
    detach: as replayed_step.backward's."""
    backend = runtime.backend
    grads = backend.asarray(grads)
    dim = tables[0].dim
    segments = int(state.segment_cuts[-1])
    fits = grads.dtype == np.float32 and grads.size == segments * dim
    if fits and tuple(grads.shape) != (segments, dim):
        grads = backend.reshape(grads, (segments, dim))
    if bounded and fits and not state.pieces and runtime.replays is not None:
        replayed = _replayed_backward(runtime, tables, op, state, grads, rows_per_table,
                                      detach)
        if replayed is not None:
            return replayed
    if state.pieces:
        pieces = (backend.row_views(grads, state.segment_cuts) if fits
                  else [grads] * (len(state.segment_cuts) - 1))
        pairs = pooled_backward_many(runtime, tables, op, state.pooling, pieces, bounded)
        counts = np.array([int(rows.shape[0]) for _, rows in pairs], dtype=np.int64)
        rows = [r for _, r in pairs]
        if not rows_per_table:
            rows = backend.join_keys(rows, np.zeros(len(pairs), np.int64))
        return backend.join_rows([v for v, _ in pairs]), rows, counts
    pooling = state.pooling
    unit = pooling.unit
    # a gradient that does not fit: exchange_gradients_many reports it on every rank
    per_key = spread_rows(backend, grads, pooling.pools[0]) if fits else backend.empty(
        (0, dim), np.float32)
    group = unit.table
    grouped = isinstance(group, table_group.TableGroup)
    (summed, rows, ranks), = lookup_backward_many(
        runtime, [unit.table], op, [pooling.routing], [per_key],
        [state.cuts if grouped else None] if bounded else None)
    return _backward_result(backend, tables, pooling, summed, rows, ranks, rows_per_table)


def _replayed_backward(runtime, tables, op, state, grads, rows_per_table, detach=False):
    """keyed_backward of a replayed forward (replayed_step.backward), or None where it was not
    one: `grads` spread to the keys (each key its own output row, unweighted: `grads` as
    they are)."""
    pooling = state.pooling
    if not replayed_step.replayed_routing(runtime, pooling.routing):
        return None
    grads = spread_rows(runtime.backend, grads, pooling.pools[0])
    replayed = replayed_step.backward(runtime, pooling.unit.table, op, pooling.routing, grads,
                                      detach)
    if replayed is None:
        return None
    return _backward_result(runtime.backend, tables, pooling, *replayed, rows_per_table)


def _backward_result(backend, tables, pooling, summed, rows, ranks, rows_per_table):
    """keyed_backward's result from one unit's backward (summed, rows, ranks)."""
    group = pooling.unit.table
    if not isinstance(group, table_group.TableGroup):  # one piece: padded or not, the count is
        return summed, [rows] if rows_per_table else rows, np.array(  # the rows'
            [int(rows.shape[0])], dtype=np.int64)
    padded = isinstance(ranks, group_gradients.Padded)  # a bounded step: a piece per member
    cut = np.asarray(ranks.piece_starts if padded else ranks, dtype=np.int64)
    counts = cut[1:] - cut[:-1]
    starts = pooling.routing.row_starts
    if rows_per_table:  # the values' pieces are row views of summed: joined, they are summed
        pieces = group_gradients.split_gradient(backend, group, summed, rows, ranks, starts)
        return summed, [r for _, r in pieces], counts
    own = ranks.local if padded else backend.local_rows(
        rows, starts, np.zeros(len(tables), np.int64), int(rows.shape[0]))
    group.last_keyed = (own, summed, rows, starts)
    return summed, own, counts


def keyed_update(backend, tables, rule_name, slot_prefix, options, hyper, values, rows, counts):
    """Applies optimizer `rule_name` to `tables` with a keyed backward's (values, rows, counts)
    (values may be changed, e.g. clipped). Returns per table the number of distinct rows
    updated. Raises InvalidInputError for a gradient that does not fit, before anything
    changes."""
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    if isinstance(rows, (list, tuple)):  # each table's rows (keyed_backward's rows_per_table)
        return _update_by_table(backend, tables, rule_name, slot_prefix, options, hyper,
                                backend.asarray(values), list(rows), counts)
    values, rows = backend.asarray(values), backend.asarray(rows)
    group = _whole_group(tables) if len(tables) > 1 else None
    if counts.shape != (len(tables),) or np.any(counts < 0) or (
            group is None and _one_dim_error(tables) is not None) or (
            len(rows.shape) != 1 or int(counts.sum()) != rows.shape[0]) or (
            tuple(values.shape) != (rows.shape[0], tables[0].dim)):
        raise InvalidInputError(
            "an update of %s needs values [n, dim] and rows [n] of tables of one dim, and "
            "counts per table adding up to n; got values %s, rows %s, counts %s"
            % (", ".join(table.name for table in tables), list(values.shape),
               list(rows.shape), counts.tolist()))
    if len(tables) == 1:
        return [optimizer_updates.apply_update(backend, tables[0], rule_name, slot_prefix,
                                               options, hyper, values, rows)]
    if group is None:
        cuts = cut_points(counts)
        value_pieces, row_pieces = backend.row_views(values, cuts), backend.row_views(rows, cuts)
        return optimizer_updates.apply_updates(backend, tables, rule_name, slot_prefix, options,
                                               hyper, value_pieces, row_pieces)
    flat, summed, distinct_counts = group_gradients.keyed_gradient(backend, group, values, rows,
                                                               counts)
    optimizer_updates.apply_group_update(backend, group, rule_name, slot_prefix, options, hyper,
                                         flat, summed)
    return distinct_counts


def _update_by_table(backend, tables, rule_name, slot_prefix, options, hyper, values, rows,
                     counts):
    """keyed_update with each table's rows apart: values cut into row views by counts, which
    are the backward's own pieces when handed back unchanged (one pass over a group)."""
    if counts.shape != (len(tables),) or len(rows) != len(tables) or np.any(counts < 0) or (
            len(values.shape) != 2 or int(counts.sum()) != values.shape[0]):
        raise InvalidInputError(
            "an update of %s needs values [n, dim], one rows array per table and counts per "
            "table adding up to n; got values %s, %d rows arrays, counts %s"
            % (", ".join(table.name for table in tables), list(values.shape), len(rows),
               counts.tolist()))
    cuts = cut_points(counts)
    pieces = backend.row_views(values, cuts)
    return optimizer_updates.apply_updates(backend, tables, rule_name, slot_prefix, options,
                                           hyper, pieces, rows)
