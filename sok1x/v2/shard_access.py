"""sok1x.export, sok1x.assign and the evicted keys of sok1x.sparse_read_and_evict (SOK's v2
names): this rank's shard of a sok1x variable (or of an optimizer slot of it, a
slot_views.SlotView) as (keys, values) tensors, writing rows of it by global key, and the keys a
DynamicVariable evicted. All are local (no collective). export and assign are not per-step, so
they cross to the engine as host NumPy through py_func; the evicted keys, read every step, cross
as the lookups do (graph_ops/boundary.py's engine_op). Executing eagerly they run at once."""
import numpy as np

from sok1x.graph_ops.embedding_tag import handle_value, table_of
from sok1x.engine import api
from sok1x.engine.tables import shard_rows
from sok1x.errors import InvalidInputError
from sok1x.graph_ops import boundary, init_ops
from sok1x.graph_ops.tf_compat import py_func, tf1


def _handle_and_slot(variable):
    """(the sok1x variable's handle, the engine slot (name, initial value) or None): a
    slot_views.SlotView (which imports this module) reads its variable's table at its
    engine_slot."""
    engine_slot = getattr(variable, "engine_slot", None)
    if engine_slot is not None:
        return variable.variable, engine_slot
    return variable, None


def _table(variable):
    table = table_of(variable)
    if table is None:
        raise TypeError("%r is not a sok1x variable (sok1x.Variable or sok1x.DynamicVariable)"
                        % (getattr(variable, "name", variable),))
    return table


def _keys_and_values(variable, read, name):
    """Returns (keys int64 [n], values float32 [n, dim]) tensors of read(table_name) -> host
    (keys, values): at once executing eagerly, else by an op that depends on the handle."""
    variable, _ = _handle_and_slot(variable)
    table = _table(variable)
    ensure_up = init_ops.bring_up_on_first_use()

    def run(*_):
        ensure_up()
        keys, values = read(table.name)
        return (np.asarray(keys, np.int64),
                np.asarray(values, np.float32).reshape(-1, table.dim))
    if tf1.executing_eagerly():
        keys, values = run()
        return tf1.convert_to_tensor(keys), tf1.convert_to_tensor(values)
    keys, values = py_func(run, [handle_value(variable)], [tf1.int64, tf1.float32], name=name)
    keys.set_shape([None])
    values.set_shape([None, table.dim])
    return keys, values


def export(variable):
    """Returns (keys int64 [n], values float32 [n, dim]) of every row of `variable` held on this
    rank (global ids for a sok1x.Variable, keys for a DynamicVariable); of a SlotView, the rows
    of that slot."""
    key_limit = getattr(variable, "num_rows", None)
    _, slot = _handle_and_slot(variable)
    return _keys_and_values(variable, lambda name: shard_rows.export(name, key_limit, slot),
                            "sok1x_export")


def shard_shape(variable):
    """SOK's shape of `variable` (a v2 handle, or a SlotView of one): [rows held on this rank,
    dim] for a sok1x.Variable, [None, dim] for a DynamicVariable (its rows come and go)."""
    handle, _ = _handle_and_slot(variable)
    return tf1.TensorShape([getattr(handle, "rows_held", None), handle.dimension])


def read_shard(variable):
    """float32 [rows held here, dim]: every row of `variable` (a v2 handle or a SlotView) on
    this rank, in the order export gives them (a tensor in graph mode)."""
    values = export(variable)[1]
    if not tf1.executing_eagerly():
        values.set_shape(shard_shape(variable))
    return values


def check_shard_value(variable, value, where):
    """Returns `value` as a float32 tensor; raises InvalidInputError naming `where` unless its
    shape fits shard_shape(variable)."""
    value = tf1.cast(value, tf1.float32)
    expected = shard_shape(variable)
    if not expected.is_compatible_with(value.shape):
        raise InvalidInputError(
            "%s: the value must be this rank's rows of the table, shape %s (SOK's var.shape), "
            "got %s; to write rows by key use sok1x.assign(var, keys, values)"
            % (where, expected.as_list(), value.shape))
    return value


def write_shard(variable, value, where):
    """Writes float [rows held here, dim] `value` over this rank's rows of `variable` (a v2
    handle or a SlotView), the rows of read_shard in its order. Returns the op (graph mode) or
    the number of rows written. Raises InvalidInputError naming `where` for a value of another
    shape, changing nothing."""
    value = check_shard_value(variable, value, where)
    keys, _ = export(variable)
    return assign(variable, keys, value)


def assign(variable, indices, values):
    """Writes `values` (float [n, dim]) to the rows of global keys `indices` (int [n], distinct)
    of `variable` that this rank holds (of a SlotView: that slot's rows); a DynamicVariable
    inserts new keys. Keys held on other ranks are left to them, so every rank may pass the same
    keys and values. Returns the op (graph mode) or the number of rows written here. Raises
    InvalidInputError for keys outside a Variable's rows, or values that do not fit, changing
    nothing."""
    key_limit = getattr(variable, "num_rows", None)
    variable, slot = _handle_and_slot(variable)
    table = _table(variable)
    ensure_up = init_ops.bring_up_on_first_use()

    def run(keys_now, values_now, *_):
        ensure_up()
        return np.int64(shard_rows.assign(table.name, keys_now, values_now, key_limit,
                                           slot))
    if tf1.executing_eagerly():
        return run(np.asarray(indices), np.asarray(values))
    written = py_func(run, [tf1.convert_to_tensor(indices), tf1.convert_to_tensor(values),
                            handle_value(variable)], tf1.int64, name="sok1x_assign")
    return written.op


def read_evicted(variable):
    """From now on the DynamicVariable `variable` keeps the keys it evicts for evicted() (a
    DynamicVariable drops them until something reads them: v2/variables.py), which takes them
    as the engine's arrays."""
    api.drop_evicted(_table(_handle_and_slot(variable)[0]).name, False, on_device=True)


def evicted(variable):
    """Returns (keys int64 [n], values float32 [n, dim]): the keys this rank's shard of the
    DynamicVariable `variable` evicted (var_type "hybrid", once full) since the last call (the
    first: since this op was built, or called eagerly), each once, with their vectors at eviction
    (sok1x.sparse_read_and_evict). A per-step op: it crosses as the step's lookups do, and through
    sok1x's kernels on a GPU its outputs are the engine's device arrays, never copied to the host
    (graph_ops/boundary.py). Raises Sok1xError for a variable that never evicts."""
    read_evicted(variable)
    handle = _handle_and_slot(variable)[0]
    table = _table(handle)

    def run(_):
        return list(api.pop_evicted(table.name, on_device=True))
    keys, values = boundary.engine_op(
        run, [handle_value(handle)], [tf1.int64, tf1.float32], "sok1x_sparse_read_and_evict",
        prepare=init_ops.bring_up_on_first_use(), unread_inputs=(0,))
    if not tf1.executing_eagerly():
        keys.set_shape([None])
        values.set_shape([None, table.dim])
    return keys, values
