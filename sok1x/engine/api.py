"""The engine's entry points, framework-free (DESIGN D1): they take backend arrays (device arrays
on cuda, NumPy on cpu; NumPy is accepted everywhere and copied over) and return backend arrays.
Small control values (tokens, counts, hyper-parameters) are Python or NumPy scalars. The graph
ops reach them through graph_ops/boundary.py, which turns framework tensors into backend arrays
and back without a copy.

Each call holds runtime.LOCK, so at most one engine call (and one collective) runs at a time in a
process; each collective call is made by every rank in the same order (graph_ops/ordering.py).
"""
import numpy as np

from sok1x.backend.random_init import InitializerSpec
from sok1x.engine.tables import placement as placements
from sok1x.engine.lookup import keyed as keyed_lookup_module
from sok1x.engine import runtime as _runtime
from sok1x.engine.lookup.checks import check_dense_shape, check_sparse_shape, first_error
from sok1x.engine.lookup.exchange_header import confirm_same_op, exchange_header
from sok1x.engine.lookup.key_exchange import lookup_backward, lookup_forward, lookup_forward_many
from sok1x.engine.lookup import bounded_step, replayed_step
from sok1x.engine.op_order import as_op_id
from sok1x.engine.lookup.compact import (  # noqa: F401  (CompactRows: part of the API)
    CompactRows,
    compact_backward_many,
    compact_forward_many,
    compact_keyed_forward,
)
from sok1x.engine.lookup.pooled import (  # noqa: F401  (PooledInput: part of the API)
    COMBINERS,
    PooledInput,
    pooled_backward_many,
    pooled_forward_many,
)
from sok1x.engine.tables import dynamic_table, optimizer_updates
from sok1x.engine.tables.dynamic_table import Dynamic, make_table
from sok1x.engine.lookup.keyed import KeyedInput  # noqa: F401  (part of the API)
from sok1x.errors import DeviceMemoryError, InvalidInputError, Sok1xError


class _Step:
    """Enters the engine for a collective call of a step; if it raises (on every rank, as
    collective errors are), the step is rolled back (engine/lookup/step_journal.py). Gives the
    Runtime. A class rather than a generator: every step's calls enter it."""
    __slots__ = ("_entered", "_runtime")

    def __enter__(self):
        self._entered = _runtime.entered()
        self._runtime = self._entered.__enter__()
        return self._runtime

    def __exit__(self, kind, exc, traceback):
        try:
            if exc is not None:
                self._runtime.journal.failed(exc)
        finally:
            self._entered.__exit__(kind, exc, traceback)
        return False


def _ready_table(runtime, name):
    """Returns (table, None), creating the shard if it was declared since; or (None, error) when
    it cannot be had (never declared, or its creation failed, e.g. a full GPU). Changes nothing
    on failure, so the next step tries again on the same terms."""
    settings = runtime.pending_tables.get(name)
    if settings is not None:
        try:
            runtime.tables[name] = make_table(runtime, name, *settings)
        except Sok1xError as exc:
            return None, exc
        except MemoryError as exc:
            return None, DeviceMemoryError(
                "%s: no memory for a shard of %d x %d float32 on rank %d: %s. Make "
                "max_vocabulary_size_per_gpu smaller." % (name, settings[1], settings[0],
                                                          runtime.rank, exc))
        del runtime.pending_tables[name]
    table = runtime.tables.get(name)
    if table is None:
        return None, Sok1xError(
            "embedding variable %s has no shard yet: run its initializer "
            "(tf.compat.v1.global_variables_initializer()) after sok1x.Init()" % name)
    return table, None


def _table(runtime, name):
    """Returns the table `name` for a local op; raises its error on this rank."""
    table, error = _ready_table(runtime, name)
    if error is not None:
        raise error
    return table


def _table_for_collective(runtime, name, op):
    """Returns the table `name` for a collective op; if any rank cannot have it, every rank
    raises that rank's error in the op's header exchange."""
    return _tables_for_collective(runtime, [name], op)[0]


def _made_tables(runtime, names):
    """The usual step's tables of `names`: runtime.tables_named's tuple (the same one step after
    step, which replayed lookups key their classes by) when every one of them is made and none
    is declared anew; else None. Tables of other names still to be made (one that failed to be
    made on some rank, say) do not matter."""
    pending = runtime.pending_tables
    if pending and not pending.keys().isdisjoint(names):
        return None
    return runtime.tables_named(names)


def _tables_for_collective(runtime, names, op):
    """Returns the tables of `names` as a tuple, for one collective op, as
    _table_for_collective."""
    tables = _made_tables(runtime, names)
    if tables is not None:
        return tables
    tables, errors = zip(*[_ready_table(runtime, name) for name in names]) if names else ((), ())
    error = first_error(*errors)
    if error is not None:
        exchange_header(runtime, op, None, error)  # raises on every rank
    return tuple(tables)


def shard(table_name):
    """Local. Returns this rank's EmbeddingTable `table_name`, making it now if it was declared
    and not made yet; raises its error. For benchmarks, checkpoints and tests."""
    with _runtime.entered() as rt:
        return _table(rt, table_name)


def _forward_key(op):
    """One forward op's key in the stash: its tower and place (names repeat when one layer is
    looked up several times)."""
    op = as_op_id(op)
    return "%s#%d#%s" % (op.tower, op.position, op.name)


def _forward_state(runtime, table_name, token, op):
    """Returns what the forward pass of `token` stashed; if any rank lost it, every rank raises."""
    try:
        return runtime.stash.get(table_name, token)
    except Sok1xError as exc:
        exchange_header(runtime, op, None, exc)  # raises on every rank
        raise


def create_table(name, dim, capacity, use_hashtable, spec, replace=False,
                 placement=placements.MOD, dynamic=None):
    """Declares this rank's shard of table `name` (spec: an InitializerSpec; placement: which
    rank owns a key, tables/placement.py); the shard is made, and its memory taken, by the first
    lookup after this call, so a failure there fails that step on every rank. replace=True makes
    it anew at that point (fresh initial values, no optimizer state), as re-running a variable's
    initializer does; replace=False keeps an existing shard. Raises Sok1xError if `name` exists
    with other settings and replace is False, ValueError for a bad placement.

    dynamic: None (a fixed-capacity shard), or engine.dynamic_table.make_dynamic(...) settings
    for a table that grows and, for var_type "hybrid", evicts (sok1x.DynamicVariable): it needs
    use_hashtable=True and capacity == dynamic.max_capacity; pop_evicted() reads what was
    evicted."""
    assert isinstance(spec, InitializerSpec)
    placement = placements.parse(placement)
    if dynamic is not None:
        assert isinstance(dynamic, Dynamic)
        if not use_hashtable or int(capacity) != dynamic.max_capacity:
            raise ValueError("%s: a dynamic table needs use_hashtable=True and capacity == "
                             "max_capacity (%d), got %r and %r"
                             % (name, dynamic.max_capacity, use_hashtable, capacity))
    with _runtime.entered() as rt:
        bad_rank = placements.check_rank(placement, rt.size)
        if bad_rank is not None:
            raise ValueError("%s: %s" % (name, bad_rank))
        if placement.kind == "hash" and not use_hashtable:
            raise ValueError("%s: placement 'hash' needs a hash table (use_hashtable=True): "
                             "its keys' rows cannot follow from the keys" % name)
        settings = (int(dim), int(capacity), bool(use_hashtable), spec, placement)
        if dynamic is not None:
            settings += (dynamic,)
        if replace:
            rt.pending_tables[name] = settings
            return
        if name in rt.pending_tables:
            existing_settings = rt.pending_tables[name]
        else:
            existing = rt.tables.get(name)
            existing_settings = None if existing is None else existing.settings
        if existing_settings is None:
            rt.pending_tables[name] = settings
        elif existing_settings != settings:
            raise Sok1xError(
                "embedding variable %s already exists with other settings; run the "
                "variables' initializer to create it anew" % name)


DETACH_HELD = replayed_step.HELD


def dense_lookup(table_name, op, keys, training, row_shape=None, checks="end", replay=False,
                 detach=False):
    """Collective. op: the calling op's OpId or name; keys: int array [batch, *row_shape] (any
    shape when row_shape is None). Returns (float32 [*keys.shape, dim], token for
    dense_lookup_grad). checks="backward": the caller runs dense_lookup_grad on the token,
    and a bounded one-rank step (SOK1X_BOUNDED_STEP=1, engine/lookup/bounded_step.py) leaves
    the keys' checks to it, so the forward does not wait; bad keys then fail the backward.
    replay=True: the caller is done with this output and its backward's before it calls this
    lookup again, so such a bounded step may be replayed from a recorded shape class, writing
    them into the same arrays each time (engine/lookup/replayed_step.py, SOK1X_CAPTURE).
    detach=True (a framework that may keep the output past its step, as a TensorFlow graph's
    queue or loop does): a replayed output comes as a copy of its own. detach="held"
    (DETACH_HELD; a framework that says what it holds through engine/lent_memory.py, as
    sok1x's TensorFlow kernels do): the class's own output, unless a replay found an earlier
    one still held (that step runs uncaptured, and copies come from then on)."""
    with _Step() as rt:
        keys = rt.backend.asarray(keys)
        table = _table_for_collective(rt, table_name, op)
        if replay:  # a class replayed before with these inputs: none of the checks below
            known = replayed_step.dense_known(rt, table, op, keys, row_shape, training, checks)
            if known is not None:
                shaped = replayed_step.detached(rt, known[0], detach)
                return shaped, np.int64(rt.stash.put(_forward_key(op), known[1]))
        error = None
        if row_shape is not None:
            error = check_dense_shape(table.name, keys, row_shape[0], row_shape[1])
        backend = rt.backend
        flat = backend.reshape(keys, -1)
        replayed = None
        if replay and error is None:
            replayed = replayed_step.forward(rt, table, op, flat, training, checks)
        if replayed is None:
            (vectors,), (routing,) = lookup_forward_many(
                rt, [table], op, [flat], training, error, defer_check=checks,
                member_keys=[np.array([flat.shape[0]], np.int64)])
        else:
            vectors, routing = replayed
        token = rt.stash.put(_forward_key(op), routing)
        shaped = backend.reshape(vectors, tuple(keys.shape) + (table.dim,))
        if replayed is not None:
            replayed_step.remember_dense(rt, table, op, keys, row_shape, training, checks, shaped)
            shaped = replayed_step.detached(rt, shaped, detach)
        return shaped, np.int64(token)


def dense_lookup_grad(table_name, op, token, grads, detach=False):
    """Collective. grads: float32 [..., dim] shaped like the forward's output. Returns
    (values float32 [u, dim], rows int64 [u]) of this rank's shard. detach: as dense_lookup's,
    for the backward of a replayed lookup (its update still replays)."""
    with _Step() as rt:
        table = _table_for_collective(rt, table_name, op)
        routing = _forward_state(rt, table_name, token, op)
        grads = rt.backend.asarray(grads)
        if rt.replays is not None:  # any shape of the forward's output's size
            replayed = replayed_step.backward(rt, table, op, routing, grads, detach)
            if replayed is not None:
                return replayed[:2]
        if grads.dtype == np.float32 and grads.size % table.dim == 0:
            grads = rt.backend.reshape(grads, (-1, table.dim))
        return lookup_backward(rt, table, op, routing, grads)


def sparse_lookup(table_name, op, indices, values, dense_shape, slot_num, max_nnz,
                  combiner, training):
    """Collective. The parts of a SparseTensor [batch * slot_num, max_nnz] of keys. Returns
    (float32 [batch, slot_num, dim] pooled by `combiner`, token for sparse_lookup_grad)."""
    if combiner not in COMBINERS:
        raise ValueError("combiner must be one of %s, got %r" % (COMBINERS, combiner))
    with _Step() as rt:
        backend = rt.backend
        table = _table_for_collective(rt, table_name, op)
        indices, keys = backend.asarray(indices), backend.asarray(values)
        dense_shape = np.asarray(backend.to_host(dense_shape), dtype=np.int64).reshape(-1)
        error = check_sparse_shape(table.name, indices, keys, dense_shape, slot_num, max_nnz)
        rows = int(dense_shape[0]) if error is None else 0
        segment_ids = backend.column(indices, 0) if error is None else keys[:0]
        checks = []
        if error is None:
            width = int(dense_shape[1])

            def position_check(bounds):
                if keys.size and (bounds[0] < 0 or bounds[1] >= width):
                    return InvalidInputError("%s: an index lies outside dense_shape %s"
                                             % (table.name, [rows, width]))
                return None
            checks.append((backend.column(indices, 1), position_check, (0, width - 1)))
        item = PooledInput(keys, segment_ids, rows, None, combiner)
        (pooled,), state = pooled_forward_many(rt, [table], op, [item], training, error,
                                               checks)
        token = rt.stash.put(_forward_key(op), state)
        return pooled.reshape(rows // slot_num, slot_num, table.dim), np.int64(token)


def sparse_lookup_grad(table_name, op, token, grads):
    """Collective. grads: float32 [batch, slot_num, dim]. Returns (values, rows) as above."""
    with _Step() as rt:
        table = _table_for_collective(rt, table_name, op)
        state = _forward_state(rt, table_name, token, op)
        return pooled_backward_many(rt, [table], op, state, [grads])[0]


def pooled_lookup(table_names, op, inputs, training, key_limits=None):
    """Collective: one fused lookup of several tables sharing one exchange. inputs: one
    PooledInput per table; key_limits: per table None or the number of keys it has
    (sok1x.Variable's rows), a tighter bound than its shards' capacity. Returns (list of float32
    [num_segments_t, dim_t], token for pooled_lookup_grad)."""
    with _Step() as rt:
        tables = _tables_for_collective(rt, list(table_names), op)
        outputs, state = pooled_forward_many(rt, tables, op, list(inputs), training,
                                             key_limits=key_limits)
        return outputs, np.int64(rt.stash.put(_forward_key(op), state))


def pooled_lookup_grad(table_names, op, token, grads):
    """Collective. grads: per table float32 [num_segments_t, dim_t]. Returns per table (values
    [u, dim_t], rows [u]) of this rank's shard."""
    names = list(table_names)
    with _Step() as rt:
        tables = _tables_for_collective(rt, names, op)
        state = _forward_state(rt, ",".join(names), token, op)
        return pooled_backward_many(rt, tables, op, state, list(grads))


def compact_lookup(table_names, op, inputs, training, key_limits=None, itemsize=4,
                   joined=False):
    """Collective: pooled_lookup for a seam that crosses the host (engine/lookup/compact.py).
    Returns (per table CompactRows: the pooled vectors, or the batch's distinct rows and int32
    indices of each key's row among them, whichever takes fewer bytes of `itemsize` floats;
    joined=True, tables of one dim: one JoinedRows of all; token for compact_lookup_grad)."""
    with _Step() as rt:
        tables = _tables_for_collective(rt, list(table_names), op)
        rows, state = compact_forward_many(rt, tables, op, list(inputs), training, key_limits,
                                           itemsize, joined)
        return rows, np.int64(rt.stash.put(_forward_key(op), state))


def compact_keyed_lookup(table_names, op, keyed, training, key_limits=None, itemsize=4):
    """Collective: keyed_lookup for a seam that crosses the host (engine/lookup/compact.py):
    keyed: a KeyedInput. Returns (JoinedRows: the distinct rows of all tables' keys, one pass for
    a table group, and int32 indices of each key's row, or the pooled rows where fewer bytes;
    token for compact_lookup_grad, whose one gradient is shaped like the rows)."""
    with _Step() as rt:
        tables = _tables_for_collective(rt, list(table_names), op)
        rows, state = compact_keyed_forward(rt, tables, op, keyed, training, key_limits,
                                            itemsize)
        return rows, np.int64(rt.stash.put(_forward_key(op), state))


def compact_lookup_grad(table_names, op, token, grads):
    """Collective. grads: per table float32 shaped like compact_lookup's rows (or, joined, one
    array shaped like its rows). Returns per table (values [u, dim_t], rows [u]) of this rank's
    shard."""
    names = list(table_names)
    with _Step() as rt:
        tables = _tables_for_collective(rt, names, op)
        state = _forward_state(rt, ",".join(names), token, op)
        return compact_backward_many(rt, tables, op, state, list(grads))


def keyed_lookup(table_names, op, keyed, training, key_limits=None, checks="end",
                 replay=False, detach=False):
    """Collective: one pooled lookup of several tables of one dim whose keys come as ONE array
    (engine/lookup/keyed.py; TorchRec's KeyedJaggedTensor). keyed: a KeyedInput; key_limits: as
    pooled_lookup's; checks, replay and detach: as dense_lookup's (a replayed keyed step: one
    table or one table group of dense tables, or a hash group that does not evict at one rank;
    keys each their own output row, or pooled by segment ids or weighted). Returns (float32
    [sum(num_segments), dim], the tables' outputs one after the other; token for
    keyed_lookup_grad)."""
    with _Step() as rt:
        tables = _tables_for_collective(rt, list(table_names), op)
        out, state = keyed_lookup_module.keyed_forward(rt, tables, op, keyed, training,
                                                       key_limits, checks, replay)
        out = replayed_step.detached(rt, out, detach)
        return out, np.int64(rt.stash.put(_forward_key(op), state))


def keyed_lookup_grad(table_names, op, token, grads, rows_per_table=False, detach=False):
    """Collective. grads: float32 shaped like keyed_lookup's output. Returns (values [u, dim],
    rows int64 [u]: each table's own shard rows, table after table, counts host int64 [T]: rows
    per table). rows_per_table: rows as a list of per-table arrays instead, for per-table
    updates (apply_optimizer_update(s)), which know them for the backward's own rows. A bounded
    one-rank step (SOK1X_BOUNDED_STEP=1) pads each table's rows to its keys (rounded up to 8)
    with rows -1 and zero values, and counts are those pieces' sizes. detach: as
    dense_lookup_grad's."""
    names = list(table_names)
    with _Step() as rt:
        tables = _tables_for_collective(rt, names, op)
        state = _forward_state(rt, ",".join(names), token, op)
        return keyed_lookup_module.keyed_backward(rt, tables, op, state, grads, rows_per_table,
                                                  detach=detach)


def apply_keyed_update(table_names, rule, slot_prefix, options, hyper, values, rows, counts):
    """Local. apply_optimizer_updates for a keyed_lookup_grad's (values, rows, counts): one pass
    over the rows of a table group. rows: joined, or a list of per-table arrays (its
    rows_per_table form). Returns per table the number of distinct rows updated (after a
    bounded step's backward, the size of its piece: padding rows -1 included, and skipped)."""
    with _runtime.entered() as rt:
        tables = _made_tables(rt, table_names)
        if tables is None:
            tables = [_table(rt, name) for name in table_names]
        if rt.replays is not None:
            replayed = replayed_step.keyed_update(rt, tables, rule, slot_prefix, options, hyper,
                                                  values, rows, counts)
            if replayed is not None:
                return replayed
        bounded_step.read_for_update(rt)  # a replayed backward's checks, before any change
        return keyed_lookup_module.keyed_update(rt.backend, tables, rule, slot_prefix, options,
                                                hyper, values, rows, counts)


def allreduce(op, arrays, average):
    """Collective. Sums (or averages) each array over ranks in ONE all-reduce of their
    concatenation. arrays: list of float arrays of one dtype. Returns the list, same shapes."""
    with _Step() as rt:
        confirm_same_op(rt, op)
        arrays = [np.asarray(rt.backend.to_host(a)) for a in arrays]
        if not arrays:
            return []
        flat = np.concatenate([a.reshape(-1) for a in arrays])
        backend = rt.backend
        reduced = backend.to_host(rt.data.all_reduce(backend.asarray(flat), "sum"))
        if average:
            reduced = reduced / rt.size
        out, offset = [], 0
        for a in arrays:
            out.append(reduced[offset:offset + a.size].reshape(a.shape).astype(a.dtype, copy=False))
            offset += a.size
        return out


def broadcast(op, arrays, root=0):
    """Collective. Returns rank `root`'s arrays on every rank (one broadcast per array)."""
    with _Step() as rt:
        confirm_same_op(rt, op)
        return [rt.host.broadcast(np.asarray(rt.backend.to_host(a)), root) for a in arrays]


def read_rows(table_name, op, keys):
    """Collective. Returns float32 [len(keys), dim], the current vectors of `keys` (zeros for keys
    never inserted); inserts nothing. For checkpoints and tests."""
    with _Step() as rt:
        table = _table_for_collective(rt, table_name, op)
        vectors, _ = lookup_forward(rt, table, op, rt.backend.asarray(keys).reshape(-1), False)
        return vectors


def drop_evicted(table_name, drop=True, on_device=False):
    """Local. drop=True: dynamic table `table_name` (made now or later) drops the keys it evicts,
    as SOK's DynamicVariable does, so that a job that never reads them holds none on the host,
    unless something was ever said to read them; drop=False: something reads them: it keeps them
    for pop_evicted from now on, for good (sok1x.sparse_read_and_evict); with on_device=True it
    will read them as device arrays (pop_evicted(on_device=True)), so none is copied to the
    host meanwhile."""
    dynamic_table.drop_evicted(table_name, drop, on_device)


def pop_evicted(table_name, on_device=False):
    """Local. Returns (keys int64 [n], values float32 [n, dim]) host NumPy arrays of the keys this
    rank's shard of dynamic table `table_name` evicted since the last call (each key once), and
    forgets them (sok1x.sparse_read_and_evict); on_device=True: backend arrays, in GPU memory on
    cuda, with no copy to the host. Raises Sok1xError for a table that does not evict. On one
    rank it first reads what forwards left to their next op header (bounded_step.read_left: an
    evicting step's counts; no collective there), so that a step still to fail, a new key left
    without a victim, raises here and is taken back rather than hand out its victims; on
    several ranks that read is collective, and the next op header makes it."""
    with _runtime.entered() as rt:
        table = _table(rt, table_name)
        if not hasattr(table, "pop_evicted"):
            raise Sok1xError("%s is not a dynamic table: it never evicts" % table_name)
        if rt.size == 1:
            bounded_step.read_left(rt)
        return table.pop_evicted(on_device)


def apply_optimizer_update(table_name, rule, slot_prefix, options, hyper, values, rows):
    """Local (no collective). Applies optimizer `rule` (engine.optimizer_updates.RULES) to this
    rank's shard with gradient values [n, dim] of shard rows [n]; hyper: name -> float for this
    step. Returns the number of distinct rows updated. The gradient of a replayed backward
    (api.dense_lookup's replay=True), as it returned it, has its update replayed."""
    with _runtime.entered() as rt:
        table = _table(rt, table_name)
        if rt.replays is not None:
            replayed = replayed_step.update(rt, [table], rule, slot_prefix, options, hyper,
                                            [values], [rows])
            if replayed is not None:
                return replayed[0]
        bounded_step.read_for_update(rt)  # a replayed backward's checks, before any change
        return optimizer_updates.apply_update(rt.backend, table, rule, slot_prefix, options,
                                              hyper, values, rows)


def apply_optimizer_updates(table_names, rule, slot_prefix, options, hyper, values_list,
                            rows_list):
    """Local. apply_optimizer_update for several tables at once: the tables of one group whose
    gradients come unchanged from their lookup's backward pass are updated in one pass
    (engine/lookup/table_group.py). Returns per table the number of distinct rows updated."""
    with _runtime.entered() as rt:
        tables = [_table(rt, name) for name in table_names]
        if rt.replays is not None:
            replayed = replayed_step.update(rt, tables, rule, slot_prefix, options, hyper,
                                            values_list, rows_list)
            if replayed is not None:
                return replayed
        bounded_step.read_for_update(rt)  # a replayed backward's checks, before any change
        return optimizer_updates.apply_updates(rt.backend, tables, rule, slot_prefix, options,
                                               hyper, list(values_list), list(rows_list))


def unique(values):
    """Local. Returns (unique values, int64 inverse) of an int 1-D array, as tf.unique."""
    from sok1x.engine import sparse_math
    with _runtime.entered() as rt:
        return sparse_math.unique(rt.backend, values)


def unsorted_segment_sum(data, segment_ids, num_segments):
    """Local. Returns [num_segments, ...] sums of data per segment id, as
    tf.math.unsorted_segment_sum (negative ids dropped)."""
    from sok1x.engine import sparse_math
    with _runtime.entered() as rt:
        return sparse_math.unsorted_segment_sum(rt.backend, data, segment_ids, num_segments)
