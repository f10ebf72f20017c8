"""Which TensorFlow variables stand for sok1x tables (DESIGN D1): a handle variable carries its
table's TableSpec as an attribute and sits in one graph collection. The optimizers, the hooks and
every front door ask here, below all of them, so none of them imports another to learn it."""
from sok1x.graph_ops import checkpoint_ops
from sok1x.graph_ops.tf_compat import tf1

EMBEDDING_VARIABLES = "sok1x_embedding_variables"
_TABLE_ATTR = "_sok1x_table"


def tag(handle, table):
    """Marks `handle` as the variable of `table` (an embedding_ops.TableSpec; the components of
    a distributed handle too), puts it in the EMBEDDING_VARIABLES collection and the table in
    the Saver's saveables (D8). Returns handle."""
    setattr(handle, _TABLE_ATTR, table)
    # Made in a tf.distribute strategy's scope, handle is a distributed (mirrored) variable:
    # its per-device components, which the strategy's optimizer updates are given, are tagged.
    for component in tf1.distribute.get_strategy().experimental_local_results(handle):
        setattr(component, _TABLE_ATTR, table)
    tf1.add_to_collection(EMBEDDING_VARIABLES, handle)
    checkpoint_ops.add_saveable(table)
    return handle


def check_one_device(table_name):
    """Raises ValueError naming table `table_name` where a tf.distribute strategy in scope runs
    several devices in this process: sok1x trains one device per process, so its ops would run
    once per device and update the table that often. Does nothing otherwise."""
    if not tf1.distribute.has_strategy():
        return
    devices = list(tf1.distribute.get_strategy().extended.worker_devices)
    if len(devices) > 1:
        raise ValueError(
            "sok1x table %s is made in a tf.distribute strategy over %d devices of this process "
            "(%s); sok1x trains one device per process: start one process per device (mpiexec "
            "-n N, sok1x-run) and give each a strategy of its own device, e.g. "
            "tf.distribute.MirroredStrategy(['/gpu:0']) with CUDA_VISIBLE_DEVICES set per rank"
            % (table_name, len(devices), ", ".join(devices)))


def table_of(variable):
    """Returns the TableSpec of a sok1x embedding variable, or None for any other variable."""
    return getattr(variable, _TABLE_ATTR, None)


def handle_value(variable):
    """The handle variable's own value (TensorFlow's read of it), which sok1x's ops take as an
    input so that they run after its initializer and the tape records the read: a v2
    variable's read_value() is SOK's, this rank's rows of the table (sok1x/v2/shard_faces.py)."""
    own = getattr(variable, "_sok1x_handle_value", None)
    return own() if own is not None else variable.read_value()


def is_embedding_variable(variable):
    """True for the handle variable of a sok1x table."""
    return table_of(variable) is not None
