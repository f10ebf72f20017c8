"""A plain tf.Variable passed to a group lookup is its own values (DESIGN D12).

Under the "collective" strategy a plain variable [vocab, dim] (or a PartitionedVariable, read
as TensorFlow's "mod" lookups read it: variable_faces.py) is sharded into a sok1x table (row
i on rank i % world_size) with a small trainable handle variable beside it (`handle_of`), which
gets the table's gradient. The variable stays the table's face to TensorFlow:

- Rows in: the table takes its rows from the variable itself, each rank its own rows, at the
  first lookup after the handle's initializer ran (tf.compat.v1.global_variables_initializer
  runs the variable's own initializer with it, or the one tf.train.init_from_checkpoint gave
  it) and after a tf.compat.v1.train.Saver restore: never a draw of sok1x's own.
- Rows out: `sync_to_variables()` (collective) writes every such table back into its variable,
  and every Saver save does the same before it reads the variable, so a checkpoint or SavedModel
  holds the trained rows under the variable's own name. A save gathers the rows inside itself
  (checkpoint_ops.rows_gathered_by_save), so a save that rank 0 runs alone writes back too.
  Between two of those, on several ranks, the variable itself holds the rows of the last
  write-back: `sess.run(variable)` wants a sync first. Where one process holds every row (a
  1-rank job), every update writes the rows it changed back at once (`after_update`), so the
  variable and TensorFlow's own lookups over it always see the trained rows.
"""
import numpy as np

from sok1x.deeprec.variable_faces import face_of
from sok1x.engine import runtime
from sok1x.engine.tables import shard_rows
from sok1x.graph_ops import boundary, checkpoint_ops, init_ops
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import py_func, replace_input, tf1

_HANDLE_ATTR = "_sok1x_group_handle"
# Tables (by name) whose rows must be taken from their variable before their next lookup.
_NEED_ROWS = set()


def handle_of(variable):
    """Returns the sok1x handle variable created beside the plain TF variable `variable` by a
    group lookup, or None."""
    return getattr(variable, _HANDLE_ATTR, None)


def _plain(graph):
    """{table name: face (variable_faces) of its plain variable} of the tables that stand for
    plain variables in `graph`."""
    return per_graph(graph, "plain_variables", dict)


def shard_plain_variable(variable, table_handle, unique_table_name):
    """Returns the sok1x handle standing for the plain TF variable [vocab, dim] `variable`,
    creating it (and the sharded table, and its Saver hooks) on first use.
    table_handle(name, dim, vocab, spec, fill) and unique_table_name(base) are the group
    lookups' (passed in: they live with them)."""
    handle = handle_of(variable)
    if handle is not None:
        return handle
    shape = variable.get_shape()
    if shape.ndims != 2 or not shape.is_fully_defined():
        raise ValueError("group_embedding_lookup_sparse: %s has shape %s; a table must be "
                         "[vocabulary_size, dim] with both known" % (variable.name, shape))
    if variable.dtype.base_dtype != tf1.float32:
        raise ValueError("group_embedding_lookup_sparse: %s holds %s; sok1x tables are float32"
                         % (variable.name, variable.dtype.base_dtype.name))
    face = face_of(variable)
    from sok1x.backend.random_init import make_spec
    name = unique_table_name(face.name + "/sok1x_shards")
    handle = table_handle(name, int(shape[1]), int(shape[0]), make_spec("constant", 0.0),
                          lambda: _NEED_ROWS.add(name))
    setattr(variable, _HANDLE_ATTR, handle)
    _plain(handle.graph)[name] = face
    _hook_saveable(table_of(handle), face)
    return handle


def rows_from_variable(handles):
    """Returns ops, one per handle of a plain variable among `handles`, that (when the table
    needs it) write this rank's rows of the variable's current value into the table; a lookup
    made under tf.control_dependencies(these ops) sees the variable's rows. Local, no
    collective; the variable is read only when its rows are taken."""
    ops = []
    for handle in handles:
        table = table_of(handle)
        face = _plain(handle.graph).get(table.name)
        if face is None:
            continue
        ops.append(_load_rows_op(table, face))
    return ops


def _take_rows(table_name, num_rows, value):
    """Local: writes this rank's rows of `value` (the variable's [num_rows, dim] array) into the
    table and clears its need; returns how many rows were written."""
    rt = runtime.get()
    keys = shard_rows.owned_keys("mod", num_rows, rt.rank, rt.size)
    shard_rows.assign(table_name, keys, np.asarray(value)[keys], key_limit=num_rows)
    _NEED_ROWS.discard(table_name)
    return len(keys)


def _load_rows_op(table, face):
    num_rows = int(face.variable.get_shape()[0])

    def needs_rows():
        return np.bool_(table.name in _NEED_ROWS)

    def load(value):
        return np.int64(_take_rows(table.name, num_rows, value))

    with tf1.name_scope(None):
        needed = boundary.host_op(needs_rows, [], tf1.bool, "sok1x_table_needs_rows")
        needed.set_shape([])
        return tf1.cond(
            needed,
            lambda: boundary.host_op(load, [face.read()], tf1.int64, "sok1x_rows_in"),
            lambda: tf1.constant(0, tf1.int64)).op


def _gathered_rows(pairs, saved=None):
    """A py_func returning every row of each (table name, face) table on every rank
    (collective, one op so every rank gathers the tables in one order). A table that has not
    taken its rows from its variable yet (no lookup since the initializer ran; a Saver saves
    once before the first step) takes them first, so the variable is never overwritten by an
    empty table. saved: {table name: take()} of a Saver whose save gathered the rows
    (checkpoint_ops.rows_gathered_by_save): those are used, with no collective here, so a save
    that rank 0 runs alone writes back too."""
    ensure_up = init_ops.bring_up_on_first_use()
    sizes = [int(face.variable.get_shape()[0]) for _, face in pairs]
    saved = saved or {}

    def run(*values):
        ensure_up()
        rows = {name: saved[name]() if name in saved else None for name, _ in pairs}
        for (name, _), size, value in zip(pairs, sizes, values):
            if name in _NEED_ROWS:
                _take_rows(name, size, value)
                if rows[name] is not None:  # the save gathered the table before it took them
                    rows[name] = np.asarray(value, np.float32)
        # A host all-gather: a rank that never comes ends the job after SOK1X_MPI_TIMEOUT_S.
        return [rows[name] if rows[name] is not None else shard_rows.gather_all(name, size)
                for (name, _), size in zip(pairs, sizes)]
    return py_func(run, [face.read() for _, face in pairs],
                   [tf1.float32] * len(pairs), name="sok1x_rows_out")


def _write_back(pairs, after=(), saved=None):
    """Op writing each (table name, face) table back into its variable (collective unless
    `saved` holds the rows: _gathered_rows), run after the ops `after`."""
    with tf1.name_scope(None), tf1.control_dependencies(None):
        with tf1.control_dependencies(list(after)):
            rows = _gathered_rows(pairs, saved)
        assigns = []
        for tensor, (_, face) in zip(rows, pairs):
            tensor.set_shape(face.variable.get_shape())
            assigns.append(face.assign(tensor))
        return tf1.group(*assigns, name="sok1x_sync_to_variables")


def sync_to_variables(variables=None):
    """Returns an op (graph mode) that writes the tables sok1x keeps for plain tf.Variables
    passed to group lookups back into those variables (all of the graph's, or those in
    `variables`), so `sess.run(variable)`, `tf.nn.embedding_lookup(variable, ...)` or an export
    see the trained rows. Collective: every rank runs it in the same step. Costs one all-gather
    of each table (every row crosses to every rank once). Savers do it by themselves."""
    graph = tf1.get_default_graph()
    plain = sorted(_plain(graph).items())
    if variables is not None:
        wanted = [v for v in (variables if isinstance(variables, (list, tuple)) else [variables])]
        for variable in wanted:
            if handle_of(variable) is None:
                raise ValueError("sync_to_variables: %s was never passed to a group lookup; "
                                 "only those have a sok1x table to write back"
                                 % getattr(variable, "name", variable))
        plain = [(name, f) for name, f in plain if any(f.variable is w for w in wanted)]
    if not plain:
        return tf1.no_op(name="sok1x_sync_to_variables")
    return _write_back(plain)


def _hook_saveable(table, face):
    """Wraps the table's SaveableObject (checkpoint_ops) so that a Saver writes the table back
    into the variable of `face` before it reads the variable to save it, and takes the table's
    rows from the variable again after a restore."""
    collection = tf1.get_collection_ref(tf1.GraphKeys.SAVEABLE_OBJECTS)
    for index, saveable in enumerate(collection):
        if getattr(saveable, "name", None) == "%s/sok1x_table" % table.name:
            collection[index] = _syncing_saveable(saveable, table, face)
            return


def _syncing_saveable(inner, table, face):
    """Returns a saveable standing for the table's saveable `inner` (same name and specs, its
    state taken over) whose save also writes the table back into its variable and whose restore
    makes the table take its rows from the restored variable."""
    base = type(inner)

    class Syncing(base):
        def __init__(self):  # noqa: N807 (no base __init__: the inner one's state is taken)
            self.__dict__.update(inner.__dict__)
            self._write_backs = {}  # Saver name scope -> its write-back op
            spec = self.specs[0]
            inner_tensor = spec._tensor  # SaveSpec keeps its tensor (or a callable) there

            def tensor():
                data = inner_tensor() if callable(inner_tensor) else inner_tensor
                # After the table's own save, which gathered its rows, they go back.
                take = checkpoint_ops.rows_gathered_by_save(
                    table.name, face.variable.get_shape()[0])
                sync = _write_back([(table.name, face)], after=[data.op],
                                   saved={table.name: take})
                self._write_backs[_saver_scope()] = sync
                with tf1.control_dependencies([sync]):
                    return tf1.identity(data)
            spec._tensor = tensor

        def restore(self, restored_tensors, restored_shapes):
            # The Saver built its save ops before its restore ops: order their reads now.
            scope = _saver_scope()
            sync = self._write_backs.get(scope)
            if sync is not None:
                for part in face.parts:
                    _order_variable_reads_after(part, scope, sync)
            done = base.restore(self, restored_tensors, restored_shapes)
            with tf1.control_dependencies([done]), tf1.name_scope(None):
                return py_func(lambda: _NEED_ROWS.add(table.name) or np.int64(0), [],
                               tf1.int64, name="sok1x_rows_from_restored_variable").op
    return Syncing()


def _saver_scope():
    """The top name scope of the Saver being built ("save", "save_1", ...)."""
    return tf1.get_default_graph().get_name_scope().split("/")[0]


def _order_variable_reads_after(variable, scope, sync):
    """Makes the save ops of the Saver built in name scope `scope` read `variable` after `sync`:
    their input that is the variable's value becomes a read made after it (the Saver reads
    the variable's cached read op, which other reads share and must not wait on a collective)."""
    value = variable.value()
    for op in tf1.get_default_graph().get_operations():
        if not op.name.startswith(scope + "/") or op.type not in ("SaveV2", "SaveSlices", "Save"):
            continue
        for index, tensor in enumerate(op.inputs):
            if tensor is value or _reads(tensor, variable):
                with tf1.name_scope(None), tf1.control_dependencies([sync]):
                    replace_input(op, index, tf1.identity(variable.read_value(),
                                                          name="sok1x_synced_read"))


def _reads(tensor, variable):
    """True if `tensor` is a plain read of resource variable `variable` (or an identity of one:
    what a Saver saves of a partition), or reference variable `variable` itself (what a Saver
    saves of a whole one)."""
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    handle = getattr(variable, "handle", None)
    if handle is None:
        return tensor.op is variable.op
    return tensor.op.type == "ReadVariableOp" and tensor.op.inputs[0] is handle


def _one_process():
    """Whether this job has one rank (it then holds every row of every table)."""
    if runtime.is_initialized():
        return runtime.get().size == 1
    from sok1x.comm.process_group import import_mpi
    return import_mpi().COMM_WORLD.Get_size() == 1


def after_update(handle, rows, update):
    """Returns `update` (the op updating rows `rows` of `handle`'s table), followed, where
    `handle` stands for a plain variable and one process holds every row, by a write of the
    updated rows into the variable (local: a read of those rows, a scatter): the op to run
    in its place. Otherwise `update` itself."""
    if tf1.executing_eagerly():
        return update
    try:
        graph = handle.graph
    except AttributeError:  # an eager variable (in a tf.function): never a group lookup's
        return update
    table = table_of(handle)
    face = _plain(graph).get(table.name) if table is not None else None
    if face is None or not _one_process():
        return update
    num_rows = int(face.variable.get_shape()[0])

    def read(keys):
        return shard_rows.read_local(table.name, keys, key_limit=num_rows)[0]
    with tf1.name_scope(None), tf1.control_dependencies([update]):
        keys = tf1.cast(rows, tf1.int64)  # one rank: a row of the shard is its key
        keys = tf1.boolean_mask(keys, keys >= 0)  # rows -1: a bounded step's padding
        values = boundary.engine_op(read, [keys], tf1.float32, "sok1x_updated_rows")
        values.set_shape([None, face.variable.get_shape()[1]])
        return tf1.group(update, face.scatter(keys, values), name="sok1x_update_and_write_back")
