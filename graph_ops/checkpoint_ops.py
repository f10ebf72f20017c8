"""Tables in TensorFlow checkpoints (DESIGN D8): one SaveableObject per table in
GraphKeys.SAVEABLE_OBJECTS, so tf.compat.v1.train.Saver, Scaffold and MonitoredTrainingSession's
checkpoint_dir save and restore the table's rows and optimizer slots with no new call.

A table's saveable carries one small string tensor: its manifest entry (engine/
checkpoint/manifest.py: dims, slots, placement, each rank's shard file with size and checksum).
The rows are in shard files beside the checkpoint prefix, one per table and rank, written by
every rank in parallel (checkpoint/tables.py), named so that TensorFlow deletes them with their
checkpoint (checkpoint.saver_shard_name), never over the files of the checkpoint already at the
prefix (a generation letter in the name, engine/checkpoint/generations.py). TensorFlow writes
the entries last, in its own index file, so a checkpoint is whole or absent, and the previous
one stays whole until then. A Saver run on rank 0 only (the Horovod idiom) saves
and restores every rank's rows: the other ranks take part at their next op
(engine/checkpoint/join.py).

All the sok1x tables of one Saver save together: their save ops are chained (control
dependencies, in the Saver's order, the same on every rank) and the first to run saves every
table of that Saver in one pass (a marker that names them all, then the shards); the others hand
out its entries. The restore ops are chained alike and the last loads every table at once, all or
nothing. So any number of tables saves at any inter_op_parallelism_threads, never crossing.
"""
import os

import numpy as np

from sok1x.engine import checkpoint, runtime
from sok1x.engine.checkpoint import join as checkpoint_join
from sok1x.engine.checkpoint import manifest as checkpoint_manifest
from sok1x.errors import CheckpointError
from sok1x.graph_ops import init_ops, saver_index, shared_checkpoint_dir
from sok1x.graph_ops.tf_compat import py_func, saveable_classes, tf1

class _SaverTables:
    """The sok1x tables of one Saver (one prefix tensor), in the order its ops were built, and
    what its save and restore ops hand each other at run time."""

    def __init__(self):
        self.save_tables, self.restore_tables = {}, {}  # name -> TableSpec, build order
        self.last_save_op = self.last_restore_op = None
        # the save op that saves every table (_table_saveable): the first one built that knows
        # its shard file, else the first one built; (its token, whether it knows the file)
        self.saver = (None, False)
        self.saved, self.restored = {}, {}  # name -> manifest bytes
        self.gather = {}  # name -> number of keys: tables whose rows the save gathers
        self.gathered = {}  # name -> float32 [keys, dim] the last save gathered


_GROUPS = {}  # (graph id, prefix tensor name) -> _SaverTables


def _prefix_tensor(graph):
    """The Saver's checkpoint prefix tensor ('<saver scope>/Const'), found from the name scope
    the Saver builds its ops in; raises CheckpointError outside a Saver."""
    parts = graph.get_name_scope().split("/")
    for end in range(len(parts), 0, -1):
        try:
            op = graph.get_operation_by_name("/".join(parts[:end] + ["Const"]))
        except KeyError:
            continue
        if op.type == "PlaceholderWithDefault":
            return op.outputs[0]
    raise CheckpointError("a sok1x table is saved outside a tf.compat.v1.train.Saver (name "
                          "scope %r): save tables with a Saver or sok1x.dump"
                          % graph.get_name_scope())


def _group(graph, prefix):
    return _GROUPS.setdefault((id(graph), prefix.name), _SaverTables())


def _bring_up(tables, ensure_up):
    from sok1x.graph_ops.embedding_ops import create_table_now
    ensure_up()
    for table in tables:
        create_table_now(table)


def save_tables(group, ensure_up, prefix, sharded_filename):
    """Collective, run by a Saver's first table op: opens the save (engine/checkpoint/join.py:
    ranks that do not run it themselves take part at their next op), writes every rank's shard
    of every table of `group` beside checkpoint `prefix` under names the checkpoint there does not
    use, and, when every rank saves, takes turns with ranks that share the directory; fills
    group.saved. The files the new index replaces are removed once it is written
    (graph_ops/saver_index.py)."""
    tables = list(group.save_tables.values())
    names = [table.name for table in tables]
    prefix = os.fsdecode(prefix)
    with runtime.LOCK:
        _bring_up(tables, ensure_up)
        rt = runtime.get()
        if len(names) > checkpoint.MOST_SAVER_SHARDS or rt.size > checkpoint.MOST_SAVER_SHARDS:
            raise CheckpointError("a Saver carries at most %d sok1x tables on at most %d ranks"
                                  % (checkpoint.MOST_SAVER_SHARDS, checkpoint.MOST_SAVER_SHARDS))
        description, everyone = checkpoint_join.open_checkpoint(rt, {
            "kind": "save", "names": names, "directory": os.path.dirname(os.path.abspath(prefix)),
            "stem": os.path.basename(prefix), "gather": sorted(group.gather.items()),
            "live": saver_index.named_generations(prefix, names)})
        manifest = checkpoint_join.perform(description)
        group.gathered = manifest["gathered"]
        group.saved = {name: checkpoint_manifest.encode(checkpoint_manifest.make(
            manifest["world_size"], {name: manifest["tables"][name]})) for name in names}
        pass_turn = (shared_checkpoint_dir.take_turns(rt, sharded_filename,
                                                      checkpoint_join.timeout())
                     if everyone else None)
        saver_index.remove_replaced_when_indexed(
            prefix, names, manifest["generation"], checkpoint_join.timeout(), then=pass_turn,
            temporary=shared_checkpoint_dir.temporary_directory(sharded_filename))


def restore_tables(group, ensure_up, prefix):
    """Collective, run by a Saver's last table restore op: loads every table of `group` from the
    entries its restore ops left in group.restored and the shards beside `prefix` (ranks that do
    not restore themselves take part at their next op, with this rank's checkpoint)."""
    tables = list(group.restore_tables.values())
    names = [table.name for table in tables]
    prefix = os.fsdecode(prefix)
    with runtime.LOCK:
        _bring_up(tables, ensure_up)
        description, _ = checkpoint_join.open_checkpoint(runtime.get(), {
            "kind": "restore", "names": names,
            "directory": os.path.dirname(os.path.abspath(prefix)),
            "manifests": [group.restored.get(name) for name in names],
            "where": "the TensorFlow checkpoint %s" % prefix})
        checkpoint_join.perform(description)


def rows_gathered_by_save(table_name, num_keys):
    """Called while a Saver builds its save ops (in its name scope): that Saver's saves also
    gather every row of table `table_name` (without hash table, `num_keys` keys) onto each
    saving rank, inside the save (so a save rank 0 runs alone gets them too). Returns take():
    the rows [num_keys, dim] the last save gathered, then forgotten, or None."""
    graph = tf1.get_default_graph()
    group = _group(graph, _prefix_tensor(graph))
    group.gather[table_name] = int(num_keys)
    return lambda: group.gathered.pop(table_name, None)


def add_saveable(table):
    """Puts `table` (an embedding_ops.TableSpec) into the graph's SAVEABLE_OBJECTS."""
    if tf1.executing_eagerly():
        return None
    saveable = _table_saveable(table)
    tf1.add_to_collection(tf1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    return saveable


def _chained(previous):
    return tf1.control_dependencies([] if previous is None else [previous])


def _table_saveable(table):
    SaveableObject, SaveSpec = saveable_classes()
    ensure_up = init_ops.bring_up_on_first_use()

    class TableSaveable(SaveableObject):
        """A sok1x table in a TensorFlow checkpoint, under '<table>/sok1x_table'."""

        def __init__(self):
            name = "%s/sok1x_table" % table.name
            # A callable: the Saver makes the tensor while it builds its save ops, in its scope,
            # so the tensor can find the Saver's prefix and the tables saved with it.
            spec = SaveSpec(_save_tensor, "", name, dtype=tf1.string, device="")
            super().__init__(table.name, [spec], name)

        def restore(self, restored_tensors, restored_shapes):
            graph = tf1.get_default_graph()
            prefix = _prefix_tensor(graph)
            group = _group(graph, prefix)
            group.restore_tables[table.name] = table
            count = len(group.restore_tables)

            def run(prefix_value, data):
                group.restored[table.name] = bytes(data)
                if count == len(group.restore_tables):  # the last of the chain: load them all
                    restore_tables(group, ensure_up, prefix_value)
                return np.int64(0)
            with tf1.name_scope(None), _chained(group.last_restore_op):
                done = py_func(run, [prefix, restored_tensors[0]], tf1.int64,
                               name="sok1x_restore_table")
            group.last_restore_op = done.op
            return done.op

    def _save_tensor():
        # TensorFlow 1.15's sharded Saver asks for the tensor twice: once to group the
        # saveables by device (before any shard file name exists, its op's output unused but
        # run, since each save op runs after the one before), then for the shard it writes.
        # Only an op that knows its shard file may save: ranks sharing a directory take turns
        # by it (shared_checkpoint_dir).
        graph = tf1.get_default_graph()
        prefix = _prefix_tensor(graph)
        group = _group(graph, prefix)
        group.save_tables[table.name] = table
        filename = _last_sharded_filename(graph, graph.get_name_scope())
        inputs = [prefix] + ([] if filename is None else [filename])
        token = object()
        if group.saver[0] is None or (filename is not None and not group.saver[1]):
            group.saver = (token, filename is not None)

        def run(prefix_value, *sharded):
            if group.saver[0] is token:
                save_tables(group, ensure_up, prefix_value, sharded[0] if sharded else b"")
            elif table.name not in group.saved:  # an op that runs before the saving one
                return np.array(b"", dtype=object)
            return np.array(group.saved[table.name], dtype=object)
        with tf1.name_scope(None), _chained(group.last_save_op):
            data = py_func(run, inputs, tf1.string, name="sok1x_save_table")
        data.set_shape([])
        group.last_save_op = data.op
        return data

    return TableSaveable()


def _last_sharded_filename(graph, scope):
    """The output of the newest ShardedFilename op in name scope `scope` (the shard file the
    sharded Saver building its save ops there writes), or None (a non-sharded Saver)."""
    for op in reversed(graph.get_operations()):
        if op.type == "ShardedFilename" and op.name.startswith(scope + "/"):
            return op.outputs[0]
    return None
