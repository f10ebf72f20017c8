"""The update op of a sok1x embedding table (DESIGN D2), or of all tables of one keyed lookup:
an op of graph_ops/boundary.py into sok1x.engine.api whose inputs are the gradient slices and the
optimizer's hyper-parameter tensors, so learning-rate tensors, schedules and step counters are
read when the op runs, never frozen when the graph is built.

The op is local (the exchange happened in the lookup's backward op, which it depends on through its
gradient input), so it is not chained with the communicating ops; it holds the engine's lock.
"""
import numpy as np

from sok1x.engine import api
from sok1x.graph_ops import boundary
from sok1x.graph_ops.tf_compat import tf1


def _scalar(value, name):
    tensor = tf1.convert_to_tensor(value, name=name)
    if tensor.dtype != tf1.float32:
        tensor = tf1.cast(tensor, tf1.float32)
    tensor.shape.assert_is_compatible_with([])
    return tensor


def apply_rows_update(table_name, values, rows, rule, hyper, options, slot_prefix, name):
    """Returns the tf.Operation applying engine rule `rule` to table `table_name` (executing
    eagerly: the applied op's result).

    values, rows: the gradient's IndexedSlices parts (rows of this rank's shard, repeats summed);
    hyper: dict name -> number or scalar tensor, read at every run; options: dict of Python
    constants (see sok1x.engine.tables.optimizer_updates); slot_prefix: names the table's optimizer
    slots ("<slot_prefix>/m", ...)."""
    names, packed = _packed(hyper)
    options = dict(options)
    values = tf1.convert_to_tensor(values)
    if values.dtype != tf1.float32:
        values = tf1.cast(values, tf1.float32)
    rows = tf1.cast(rows, tf1.int64)

    def run(values_now, rows_now, scalars_now):
        count = api.apply_optimizer_update(table_name, rule, slot_prefix, options,
                                           _hyper_now(names, scalars_now), values_now, rows_now)
        return np.int64(count)

    updated = boundary.engine_op(run, [values, rows, packed], tf1.int64, name, host_inputs=(2,),
                                 host_outputs=(0,))
    return updated if tf1.executing_eagerly() else updated.op


def _packed(hyper):
    """(sorted names, one float32 tensor of their values): one host value for all
    hyper-parameters (on a GPU each would be a device-to-host copy)."""
    names = sorted(hyper)
    scalars = [_scalar(hyper[key], key) for key in names]
    return names, tf1.stack(scalars) if scalars else tf1.zeros([0], tf1.float32)


def _hyper_now(names, scalars_now):
    return dict(zip(names, (float(s) for s in np.reshape(scalars_now, -1))))


def apply_keyed_update(keyed, rule, hyper, options, slot_prefix, name):
    """Returns the tf.Operation applying engine rule `rule` to all tables of one keyed backward
    (keyed: graph_ops.pooled_lookup_ops.KeyedGradient) in ONE op: its values, counts and each
    table's rows cross once, and the engine updates a table group in one pass."""
    names, packed = _packed(hyper)
    options, count = dict(options), len(keyed.rows)

    def run(values_now, counts_now, *rest):
        api.apply_keyed_update(keyed.names, rule, slot_prefix, options,
                               _hyper_now(names, rest[-1]), values_now, list(rest[:-1]),
                               counts_now)
        return np.int64(0)

    inputs = [keyed.values, keyed.counts] + list(keyed.rows) + [packed]
    updated = boundary.engine_op(run, inputs, tf1.int64, name, host_inputs=(1, count + 2),
                                 host_outputs=(0,))
    return updated.op
