"""sok1x.Saver: SOK v1's checkpoint API for one embedding variable at a time.

    saver = sok1x.Saver()
    saver.dump_to_file(layer.embedding_variable, "./embedding_variables")      # op
    saver.restore_from_file(layer.embedding_variable, "./embedding_variables") # op
    saver.load_embedding_values(layer.embedding_variable, [array, ...])        # op

In graph mode each returns an op to run on every rank at the same point (they are collective);
eagerly each runs at once and returns None. The files are sok1x.dump's (D8): every rank's shard of
the table (keys, values, every optimizer slot) and the folder's manifest, so a restore may run on
another number of ranks than the dump, and other tables dumped into the folder stay.
"""
import numpy as np

from sok1x.v1 import sok_files
from sok1x.v2 import checkpoint_api
from sok1x.engine.tables import assign_values
from sok1x.graph_ops import init_ops
from sok1x.graph_ops.tf_compat import py_func, tf1


class Saver:
    """SOK's sok.Saver(). Arguments are accepted for compatibility and ignored."""

    def __init__(self, *args, **kwargs):
        del args, kwargs

    def dump_to_file(self, embedding_variable, filepath):
        """Writes the variable's table (keys, values, optimizer slots) into directory
        `filepath` (made if missing; every rank writes its shard), and SOK's own two files of
        its keys and values beside it (sok_files.py, from rank 0). Returns an op in graph
        mode."""
        dumped = checkpoint_api.dump(filepath, [embedding_variable], file_format="sharded")
        if tf1.executing_eagerly():
            sok_files.write(filepath, embedding_variable)
            return None
        ensure_up = init_ops.bring_up_on_first_use()

        def run():
            ensure_up()
            sok_files.write(filepath, embedding_variable)
            return np.int64(0)
        with tf1.control_dependencies([dumped]):
            return py_func(run, [], tf1.int64, name="sok1x_sok_files").op

    def restore_from_file(self, embedding_variable, filepath):
        """Restores the variable's rows from directory `filepath` (written by dump_to_file or
        sok1x.dump on any number of ranks); its optimizer state starts afresh, as SOK's
        restores embedding values only (sok1x.load restores slots too). Returns an op in graph
        mode; raises sok1x.errors.CheckpointError naming the file for a missing, corrupt or
        mismatched one."""
        return checkpoint_api.load_values(filepath, [embedding_variable])

    def load_embedding_values(self, embedding_variable, tensors):
        """Sets the variable's rows from `tensors` (a tensor or array [n, dim], or a list of
        them, e.g. one per GPU): their rows, concatenated, become the values of keys 0, 1, ...,
        n - 1; other rows and the optimizer slots are untouched. Rank 0's values are used.
        Returns an op in graph mode."""
        name, = checkpoint_api.table_names([embedding_variable])
        if not isinstance(tensors, (list, tuple)):
            tensors = [tensors]

        def assign(values):
            values = np.asarray(values, dtype=np.float32)
            keys = assign_values.sequential_keys(values.shape[0] if values.ndim else 0)
            assign_values.assign_values(name, keys, values,
                                        "sok1x.Saver.load_embedding_values(%s)" % name)
            return np.int64(0)

        if tf1.executing_eagerly():
            assign(np.concatenate([np.asarray(t, dtype=np.float32) for t in tensors]))
            return None
        ensure_up = init_ops.bring_up_on_first_use()
        values = tf1.concat([tf1.cast(t, tf1.float32) for t in tensors], axis=0)

        def run(values):
            ensure_up()
            return assign(values)
        return py_func(run, [values], tf1.int64, name="sok1x_load_embedding_values").op
