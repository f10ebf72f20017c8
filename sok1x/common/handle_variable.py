"""The handle variable that stands for a model-parallel table in TensorFlow (DESIGN D1).

The table's rows and optimizer slots live in the engine. TensorFlow sees one small trainable
variable per table ([1] float32, identical on every rank, so broadcasting or saving it is
harmless): it gets the table's gradient as IndexedSlices of local rows, and it is what
split_embedding_variable_from_others() and OptimizerScope recognise.
"""
import numpy as np

from sok1x.graph_ops import embedding_ops, init_ops
from sok1x.graph_ops.embedding_tag import check_one_device, is_embedding_variable, tag
from sok1x.graph_ops.tf_compat import tf1
from sok1x.optimizers import guard


def create_handle(layer, table_name, dim, capacity, use_hashtable, init_spec, placement="mod",
                  fill=None, trainable=True, dynamic=None, fill_inputs=()):
    """Adds the handle variable to Keras `layer` and returns it, tagged with its TableSpec.
    Its initializer depends on the graph's Init op and creates this rank's shard, then runs
    fill() (writes this rank's initial rows) when given. layer=None makes a free-standing
    variable (sok1x.Variable); executing eagerly (a free-standing variable, or a layer built
    eagerly or by a tf.function), the shard is made at once (sok1x.init() or, eagerly,
    sok1x.Init() must have run). dynamic: a growing table's settings (sok1x.DynamicVariable)."""
    # Native optimizers must not touch this variable outside OptimizerScope; the guard that
    # enforces it goes in with the first table, whichever way sok1x was imported.
    guard.install()
    check_one_device(table_name)
    table = embedding_ops.TableSpec(table_name, dim, capacity, use_hashtable, init_spec,
                                    placement, dynamic)
    if layer is None and tf1.executing_eagerly():
        embedding_ops.create_table_now(table, replace=True)
        if fill is not None:
            fill()
        handle = tf1.Variable(np.zeros([1], np.float32), trainable=trainable, use_resource=True,
                              name=table_name.split("/")[-1])
    else:
        gate = None if tf1.executing_eagerly() else init_ops.gate()

        def initial_value(shape=None, dtype=None, **_):
            if tf1.executing_eagerly():  # a Keras layer built eagerly or by a tf.function
                return embedding_ops.eager_initial_value(table, fill, fill_inputs)
            return embedding_ops.handle_initial_value(table, gate, fill, fill_inputs)

        if layer is None:
            handle = tf1.Variable(initial_value, trainable=trainable, use_resource=True,
                                  name=table_name.split("/")[-1], dtype=tf1.float32)
        else:
            handle = layer.add_weight(name=table_name.split("/")[-1], shape=[1],
                                      dtype=tf1.float32, initializer=initial_value,
                                      trainable=trainable, use_resource=True)
    return tag(handle, table)


def create_graph_handle(table, fill=None):
    """Creates and returns the handle variable of `table` (an embedding_ops.TableSpec) outside
    any Keras layer, named table.name (which must be unused) at the graph's top level and out of
    any control-flow or control-dependency context. Its initializer depends on the Init op and
    runs fill() (when given) once the shard exists."""
    guard.install()
    check_one_device(table.name)
    gate = init_ops.gate()
    scope, _, leaf = table.name.rpartition("/")
    with tf1.init_scope(), tf1.name_scope(scope + "/" if scope else None):
        handle = tf1.Variable(lambda: embedding_ops.handle_initial_value(table, gate, fill),
                              trainable=True, name=leaf, dtype=tf1.float32, use_resource=True)
    if handle.op.name != table.name:
        raise ValueError("the name %s is taken in this graph; sok1x needs it for the handle "
                         "variable of table %s" % (table.name, table.name))
    return tag(handle, table)


def split_embedding_variable_from_others(variables):
    """Returns (embedding_vars, other_vars), two lists, as SOK's code returns them (its
    docstring says tuples; SOK's DLRM tutorial adds a list to them), splitting `variables` (an
    iterable of variables) into sok1x embedding variables and the rest, each in the given
    order."""
    variables = list(variables)
    embedding = [v for v in variables if is_embedding_variable(v)]
    others = [v for v in variables if not is_embedding_variable(v)]
    return embedding, others
