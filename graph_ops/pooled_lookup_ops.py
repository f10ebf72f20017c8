"""The fused pooled lookup op of sok1x.lookup_sparse (DESIGN D11) and its gradient.

One op looks up several tables in one exchange (sok1x.engine.api.pooled_lookup): per table, int
keys [nnz], their output rows (segment ids) [nnz], the number of output rows, optional float32
weights [nnz] and a combiner. Its gradient runs one backward exchange for all tables and returns,
for each table's handle variable, tf.IndexedSlices(values, local rows, [capacity, dim]).

Graph mode: the forward op is chained (graph_ops/ordering.py) and its gradient is registered for
tf.gradients, as the v1 lookups. Executing eagerly (under tf.GradientTape) the ops run in program
order, the same on every rank; the same engine calls are made at once under tf.custom_gradient,
whose gradient function the tape calls. Each eager call is a tower of its own, named after its
tables and how many lookups of them await a gradient. Inside a tf.function the ops are the
chained graph ops, made differentiable for the tape by tf.custom_gradient as well.
"""
import collections

from sok1x.engine import api
from sok1x.engine.op_order import as_op_id
from sok1x.engine.pooled_lookup import PooledInput
from sok1x.graph_ops import boundary, embedding_ops, init_ops, ordering, tf_compat
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import tf1

_GRAD = "Sok1xPooledLookup"
_EAGER_NAMES = 64
_eager_pending = {}  # eager lookup name -> forward calls since its last gradient

TableInput = collections.namedtuple("TableInput", "keys segment_ids num_segments weights combiner")
TableInput.__doc__ = ("One table's tensors: keys int [nnz], segment_ids int64 [nnz], num_segments "
                      "int64 scalar, weights float32 [nnz] or None, combiner 'sum' or 'mean'.")


def _flat_inputs(handles, items):
    """The op's inputs: the handles' values, then per table keys, segment ids, row count and
    weights (when given). Returns (inputs, positions of the row counts)."""
    inputs, host = list(handles), []
    for item in items:
        host.append(len(inputs) + 2)
        inputs += [item.keys, item.segment_ids, item.num_segments]
        if item.weights is not None:
            inputs.append(item.weights)
    return inputs, host


def _forward_function(tables, items, key_limits, op_id):
    names = [table.name for table in tables]
    combiners = [item.combiner for item in items]
    weighted = [item.weights is not None for item in items]

    def run(*arrays):
        position, pooled_inputs = len(tables), []
        for combiner, has_weights in zip(combiners, weighted):
            keys, segment_ids, num_segments = arrays[position:position + 3]
            position += 3
            weights = None
            if has_weights:
                weights, position = arrays[position], position + 1
            pooled_inputs.append(PooledInput(keys, segment_ids, int(num_segments), weights,
                                             combiner))
        outputs, token = api.pooled_lookup(names, op_id, pooled_inputs, True, key_limits)
        return list(outputs) + [token]
    return run


def _prepare(tables, ensure_up):
    def prepare():
        ensure_up()
        for table in tables:
            embedding_ops.create_table_now(table)
    return prepare


def _indexed_slices(table, values, rows):
    dense_shape = tf1.constant([table.capacity, table.dim], dtype=tf1.int64)
    return tf1.IndexedSlices(values, rows, dense_shape)


def _backward_op(tables, token, grads, op_id, name):
    """Makes the engine's backward op; returns per table (values, rows) tensors."""
    names = [table.name for table in tables]

    def run(token_now, *grads_now):
        results = api.pooled_lookup_grad(names, op_id, token_now, list(grads_now))
        return [array for pair in results for array in pair]
    outputs = boundary.engine_op(run, [token] + list(grads),
                                 [tf1.float32, tf1.int64] * len(tables), name, host_inputs=(0,))
    pairs = []
    for t, table in enumerate(tables):
        values, rows = outputs[2 * t], outputs[2 * t + 1]
        values.set_shape([None, table.dim])
        rows.set_shape([None])
        pairs.append((values, rows))
    return pairs


def pooled_lookup(tables, handles, items, key_limits, name):
    """Returns per table float32 [num_segments_t, dim_t]: the pooled vectors of one fused lookup.
    tables: TableSpecs; handles: their handle variables; items: TableInputs; key_limits: per
    table None or its number of keys."""
    prepare = _prepare(tables, init_ops.bring_up_on_first_use())
    inputs, host = _flat_inputs([h.read_value() for h in handles], items)
    if tf1.executing_eagerly():
        return _eager_lookup(tables, inputs, host, items, key_limits, name, prepare)
    if tf_compat.inside_function():
        return _function_lookup(tables, inputs, host, items, key_limits, name, prepare)
    outputs, tower = _forward_op(tables, inputs, host, items, key_limits, name, prepare, _GRAD)
    per_graph(outputs[0].graph, "pooled_lookups", dict)[outputs[0].op.name] = (tables, tower)
    return outputs[:-1]


def _forward_op(tables, inputs, host, items, key_limits, name, prepare, gradient):
    """Makes the chained forward op; returns (its outputs: pooled per table, then the token;
    its tower)."""
    def build(op_id):
        outputs = boundary.engine_op(_forward_function(tables, items, key_limits, op_id),
                                     inputs, [tf1.float32] * len(tables) + [tf1.int64], name,
                                     gradient=gradient, host_inputs=host, prepare=prepare,
                                     unread_inputs=range(len(tables)))
        for pooled, table in zip(outputs, tables):
            pooled.set_shape([None, table.dim])
        outputs[-1].set_shape([])
        return outputs, outputs[0].op

    return ordering.chained(ordering.FORWARD, name, build)


def _function_lookup(tables, inputs, host, items, key_limits, name, prepare):
    """The lookup inside a tf.function: chained graph ops as in graph mode, but differentiable by
    tf.GradientTape, which looks gradients up by op type and ignores gradient_override_map."""
    count = len(tables)
    others = inputs[count:]

    @tf1.custom_gradient
    def lookup(*handle_values):
        outputs, tower = _forward_op(tables, list(handle_values) + others, host, items,
                                     key_limits, name, prepare, None)

        def gradient(*upstream):
            upstream = [tf1.zeros_like(outputs[t]) if upstream[t] is None else upstream[t]
                        for t in range(count)]
            return _chained_backward(tables, outputs[count], upstream, tower, name + "_grad")
        return list(outputs[:-1]), gradient

    return list(lookup(*inputs[:count]))


def _chained_backward(tables, token, grads, tower, name):
    """Makes the chained backward op in `tower`; returns the handles' IndexedSlices."""
    def build(op_id):
        pairs = _backward_op(tables, token, grads, op_id, name)
        return pairs, pairs[0][0].op

    pairs, _ = ordering.chained(ordering.BACKWARD, name, build, tower=tower)
    embedding_ops.mark_backward_op(pairs[0][0].op)
    return [_indexed_slices(table, values, rows) for table, (values, rows) in zip(tables, pairs)]


@tf1.RegisterGradient(_GRAD)
def _pooled_lookup_grad(op, *grads):
    tables, tower = per_graph(op.graph, "pooled_lookups", dict)[op.name]
    count = len(tables)
    grads = [tf1.zeros_like(op.outputs[t]) if grads[t] is None else grads[t]
             for t in range(count)]
    slices = _chained_backward(tables, op.outputs[count], grads, tower,
                               op.name.split("/")[-1] + "_grad")
    return slices + [None] * (len(op.inputs) - count)


def _eager_lookup(tables, inputs, host, items, key_limits, name, prepare):
    """The lookup executed eagerly, differentiable by tf.GradientTape."""
    count = len(tables)
    base = "%s:%s" % (name, ",".join(table.name for table in tables))
    # The n-th lookup of these tables since their last gradient: the engine keeps the latest
    # forward state per name, so a step may look the same tables up several times, and the
    # states stay bounded (_EAGER_NAMES names per lookup, reused from step to step).
    occurrence = _eager_pending.get(base, 0)
    _eager_pending[base] = (occurrence + 1) % _EAGER_NAMES
    op_name = "%s#%d" % (base, occurrence)
    forward_id, backward_id = as_op_id(op_name), as_op_id(op_name + "_grad")
    others = inputs[count:]

    @tf1.custom_gradient
    def lookup(*handle_values):
        outputs = boundary.engine_op(_forward_function(tables, items, key_limits, forward_id),
                                     list(handle_values) + others,
                                     [tf1.float32] * count + [tf1.int64], name, host_inputs=host,
                                     prepare=prepare, unread_inputs=range(count))
        # The gradient function keeps no output tensor: the tape's records of it live until
        # the interpreter exits, and an output the engine lent TensorFlow (DLPack) must be
        # released while Python still runs.
        token = int(outputs[-1])
        shapes = [tuple(output.shape) for output in outputs[:-1]]

        def gradient(*upstream):
            _eager_pending[base] = 0
            upstream = [tf1.zeros(shapes[t], tf1.float32) if upstream[t] is None
                        else upstream[t] for t in range(count)]
            pairs = _backward_op(tables, tf1.constant(token, tf1.int64), upstream, backward_id,
                                 name + "_grad")
            return [_indexed_slices(table, values, rows)
                    for table, (values, rows) in zip(tables, pairs)]
        return list(outputs[:-1]), gradient

    return list(lookup(*inputs[:count]))
