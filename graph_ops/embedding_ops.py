"""The embedding lookup ops and their registered gradients (DESIGN D1, D2).

Forward: an op of graph_ops/boundary.py into sok1x.engine.api taking the keys and the value of
the table's handle variable, returning the vectors and a token for the backward pass. Its
gradient, registered below, runs the engine's backward exchange and returns, for the handle, a
tf.IndexedSlices of (summed gradients, local rows of this rank's shard, [capacity, dim]).
"""
import collections
import functools

import numpy as np

from sok1x.engine import api, runtime
from sok1x.engine.op_order import as_op_id
from sok1x.engine.tables import dynamic_table
from sok1x.errors import NotInitializedError
from sok1x.graph_ops import boundary, init_ops, ordering
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import inside_function, py_func, tf1

TableSpec = collections.namedtuple(
    "TableSpec", "name dim capacity use_hashtable init_spec placement dynamic")
TableSpec.__new__.__defaults__ = ("mod", None)
TableSpec.__doc__ = ("What the engine needs to create a shard; name is the handle variable's "
                     "name; placement: which rank owns a key (tables/placement.py); dynamic: "
                     "None or a growing table's settings (engine/tables/dynamic_table.py).")

_DENSE_GRAD = "Sok1xDenseLookup"
_SPARSE_GRAD = "Sok1xSparseLookup"


def create_table_now(table, replace=False):
    """Creates this rank's shard of `table` (a TableSpec): anew when `replace`, else only if it
    does not exist yet."""
    api.create_table(table.name, table.dim, table.capacity, table.use_hashtable, table.init_spec,
                     replace, placement=table.placement, dynamic=table.dynamic)


def handle_initial_value(table, init_gate, fill=None, fill_inputs=()):
    """Returns the handle variable's initial value, float32 [1]; evaluating it brings sok1x up
    (through `init_gate`, the graph's Init op) and creates the shard; fill(*values of
    fill_inputs), when given, then writes this rank's initial rows (sok1x.Variable with an
    array or a computed tensor)."""
    def run(_world_size, *values):
        create_table_now(table, replace=True)
        if fill is not None:
            fill(*values)
        return np.zeros([1], np.float32)
    value = py_func(run, [init_gate] + list(fill_inputs), tf1.float32,
                    name="sok1x_create_table")
    value.set_shape([1])
    return value


def eager_initial_value(table, fill=None, fill_inputs=()):
    """Returns the handle variable's initial value, float32 [1], executing eagerly: creates the
    shard now and runs fill(*values of fill_inputs) when given. Raises NotInitializedError when
    sok1x is not up (sok1x.Init() or sok1x.init() first)."""
    if not runtime.is_initialized():
        raise NotInitializedError(
            "%s: sok1x is not initialized; call sok1x.Init(global_batch_size=...) (eagerly it "
            "brings sok1x up at once) or sok1x.init() before creating embedding layers or "
            "variables" % table.name)
    create_table_now(table, replace=True)
    if fill is not None:
        fill(*[tf1.convert_to_tensor(value).numpy() for value in fill_inputs])
    return tf1.zeros([1], tf1.float32)


def _remember(op, table, tower):
    per_graph(op.graph, "lookup_tables", dict)[op.name] = (table, tower)


def _recall(op):
    return per_graph(op.graph, "lookup_tables", dict)[op.name]


def _indexed_slices(table, values, rows):
    """The gradient of `table`'s (a TableSpec) rows: values at shard rows, over every row the
    shard may hold (a DynamicVariable's spare rows too)."""
    dense_shape = tf1.constant([dynamic_table.gradient_rows(table.capacity, table.dynamic),
                                table.dim], dtype=tf1.int64)
    return tf1.IndexedSlices(values, rows, dense_shape)


def _backward(op, grad, engine_grad, name):
    """Builds the chained backward op of forward `op`; returns the handle's IndexedSlices."""
    table, tower = _recall(op)
    # A gather after the lookup (SOK v1's dynamic_input: unique keys, then tf.gather back)
    # hands IndexedSlices down; the engine takes the dense gradient of the outputs.
    grad = tf1.convert_to_tensor(grad)

    def build(op_id):
        def run(token, grads):
            return engine_grad(table.name, op_id, token, grads)
        values, rows = boundary.engine_op(run, [op.outputs[1], grad], [tf1.float32, tf1.int64],
                                          name, host_inputs=(0,))
        values.set_shape([None, table.dim])
        rows.set_shape([None])
        return (values, rows), values.op

    (values, rows), _ = ordering.chained(ordering.BACKWARD, name, build, tower=tower)
    _backward_ops(values.graph).add(values.op.name)
    return _indexed_slices(table, values, rows)


def _backward_ops(graph):
    return per_graph(graph, "backward_ops", set)


def mark_backward_op(op):
    """Records `op` as the backward op of a sok1x lookup: its outputs are embedding gradients
    (is_embedding_gradient), which must never be all-reduced across ranks."""
    _backward_ops(op.graph).add(op.name)


def _is_foreign_collective(op_type):
    return op_type.startswith("Horovod")


def _function_op_types(graph):
    """Returns {function name: op types of its body} of the graph's function library."""
    library = graph.as_graph_def().library
    return {f.signature.name: {node.op for node in f.node_def} | {
        attr.func.name for node in f.node_def for attr in node.attr.values()
        if attr.func.name} for f in library.function}


def _calls_foreign_collective(op, functions, seen=None):
    """True if a function that `op` calls (an If or While branch, say) runs Horovod's ops."""
    seen = set() if seen is None else seen
    names = [value.func.name for value in op.node_def.attr.values() if value.func.name]
    while names:
        name = names.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        if any(_is_foreign_collective(t) for t in functions[name]):
            return True
        names.extend(functions[name])
    return False


def collective_on_the_way(tensor, limit=200):
    """Returns the first op of another framework's collective (Horovod's all-reduce or
    all-gather, also inside a cond) that `tensor` was computed through, searching back to the
    sok1x backward ops, or None. Embedding gradients hold rows of this rank's shard; such a
    collective mixes the rows of different ranks."""
    own = _backward_ops(tensor.graph)
    functions = None
    seen, pending = set(), [tensor.op]
    while pending and len(seen) < limit:
        op = pending.pop()
        if op.name in seen or op.name in own:
            continue
        seen.add(op.name)
        if _is_foreign_collective(op.type):
            return op
        if any(value.func.name for value in op.node_def.attr.values()):
            functions = _function_op_types(tensor.graph) if functions is None else functions
            if _calls_foreign_collective(op, functions):
                return op
        pending.extend(t.op for t in op.inputs)
    return None


def is_embedding_gradient(gradient):
    """True if `gradient` (a tensor or IndexedSlices) is a sok1x table's gradient: rows of one
    rank's shard, which must never be all-reduced across ranks."""
    values = getattr(gradient, "values", gradient)
    op = getattr(values, "op", None)
    return op is not None and op.name in _backward_ops(op.graph)


@boundary.register_gradient(_DENSE_GRAD)
def _dense_lookup_grad(op, grad, _token_grad):
    # a replayed backward's outputs handed over as the forward's are (dense_lookup)
    return [None, _backward(op, grad, functools.partial(api.dense_lookup_grad,
                                                        detach=boundary.replay_detach()),
                            op.name.split("/")[-1] + "_grad")]


@boundary.register_gradient(_SPARSE_GRAD)
def _sparse_lookup_grad(op, grad, _token_grad):
    slices = _backward(op, grad, api.sparse_lookup_grad, op.name.split("/")[-1] + "_grad")
    return [None, None, None, slices]


def _bring_up(ensure_up, table):
    """Returns the prepare() of a lookup op: sok1x up, the table's shard declared."""
    def prepare():
        ensure_up()
        create_table_now(table)
    return prepare


def is_symbolic(keys):
    """True for a tensor Keras made while building a functional model (it carries the Keras
    history of the layer calls that made it); a model called on real keys passes plain ones."""
    return getattr(keys, "_keras_history", None) is not None


def dense_lookup(table, handle, keys, training, row_shape, name):
    """Returns float32 [*keys.shape, dim]: the vectors of int keys from the model-parallel table.
    row_shape: (slot_num, nnz_per_slot) checked at run time, or None for any shape. A training
    lookup in a session's graph may be replayed (api.dense_lookup's replay=True, under
    SOK1X_BOUNDED_STEP=1), its output and gradient handed over so that the graph may keep them
    past the step (a queue, a while loop's TensorArray: boundary.replay_detach). Eager code and
    tf.function run it uncaptured."""
    ensure_up = init_ops.bring_up_on_first_use()

    def run_of(op_id, replay=False):
        detach = replay and boundary.replay_detach()

        def run(keys_value, _handle):
            return api.dense_lookup(table.name, op_id, keys_value, training, row_shape,
                                    replay=replay, detach=detach)
        return run

    if tf1.executing_eagerly():
        return _eager_lookup(table, run_of, [keys], (), _bring_up(ensure_up, table), handle,
                             api.dense_lookup_grad, name)

    replay = bool(training) and not inside_function()

    def forward(handle_value, gradient):
        def build(op_id):
            vectors, token = boundary.engine_op(run_of(op_id, replay), [keys, handle_value],
                                                [tf1.float32, tf1.int64], name,
                                                gradient=gradient, unread_inputs=(1,),
                                                prepare=_bring_up(ensure_up, table),
                                                host_outputs=(1,))
            vectors.set_shape(keys.shape.concatenate([table.dim]))
            token.set_shape([])
            return vectors, vectors.op

        vectors, tower = ordering.chained(ordering.FORWARD, name, build,
                                          symbolic_input=is_symbolic(keys))
        _remember(vectors.op, table, tower)
        return vectors

    return _differentiable(forward, handle, _DENSE_GRAD, api.dense_lookup_grad, name)


def sparse_lookup(table, handle, sp_keys, slot_num, max_nnz, combiner, training, name,
                  symbolic_input=False):
    """Returns float32 [batch, slot_num, dim]: per (sample, slot) row of the SparseTensor
    `sp_keys` ([batch * slot_num, max_nnz]), its keys' vectors combined by sum or mean.
    symbolic_input: the keys are (made from) a Keras model's symbolic input."""
    ensure_up = init_ops.bring_up_on_first_use()
    symbolic = symbolic_input or is_symbolic(sp_keys) or is_symbolic(sp_keys.values)

    def run_of(op_id):
        def run(indices, values, dense_shape, _handle):
            return api.sparse_lookup(table.name, op_id, indices, values, dense_shape,
                                     slot_num, max_nnz, combiner, training)
        return run

    keys = [sp_keys.indices, sp_keys.values, sp_keys.dense_shape]
    if tf1.executing_eagerly():
        return _eager_lookup(table, run_of, keys, (2,), _bring_up(ensure_up, table), handle,
                             api.sparse_lookup_grad, name)

    def forward(handle_value, gradient):
        def build(op_id):
            pooled, token = boundary.engine_op(run_of(op_id), keys + [handle_value],
                                               [tf1.float32, tf1.int64], name,
                                               gradient=gradient, host_inputs=(2,),
                                               unread_inputs=(3,),
                                               prepare=_bring_up(ensure_up, table),
                                               host_outputs=(1,))
            pooled.set_shape([None, slot_num, table.dim])
            token.set_shape([])
            return pooled, pooled.op

        pooled, tower = ordering.chained(ordering.FORWARD, name, build, symbolic_input=symbolic)
        _remember(pooled.op, table, tower)
        return pooled

    return _differentiable(forward, handle, _SPARSE_GRAD, api.sparse_lookup_grad, name)


def _differentiable(forward, handle, gradient_name, engine_grad, name):
    """Returns forward(handle, gradient op type)'s output, differentiable for the handle: by the
    registered gradient in graph mode; inside a tf.function, whose tape finds gradients by op
    type and ignores gradient_override_map, by tf.custom_gradient, so the handle's gradient is
    the engine's IndexedSlices, never a dense tensor."""
    if not inside_function():
        return forward(handle, gradient_name)

    @tf1.custom_gradient
    def lookup(handle_value):
        outputs = forward(handle_value, None)

        def gradient(upstream):
            return _backward(outputs.op, upstream, engine_grad, name + "_grad")
        return outputs, gradient

    return lookup(handle)



_EAGER_NAMES = 64
_eager_pending = {}  # eager lookup name -> forward calls since its last gradient


def _eager_lookup(table, run_of, inputs, host, prepare, handle, engine_grad, name):
    """Executing eagerly (not in a tf.function): runs run_of(op id) on inputs + [handle] now and
    returns its vectors, differentiable by tf.GradientTape through tf.custom_gradient (the
    handle's gradient: the engine's IndexedSlices). The n-th lookup of a layer since its last
    gradient has an op id of its own (64 reused from step to step), the same on every rank."""
    base = "%s:%s" % (name, table.name)
    occurrence = _eager_pending.get(base, 0)
    _eager_pending[base] = (occurrence + 1) % _EAGER_NAMES
    op_name = "%s#%d" % (base, occurrence)
    forward_id, backward_id = as_op_id(op_name), as_op_id(op_name + "_grad")

    @tf1.custom_gradient
    def lookup(handle_value):
        vectors, token = boundary.engine_op(run_of(forward_id), list(inputs) + [handle_value],
                                            [tf1.float32, tf1.int64], name, host_inputs=host,
                                            prepare=prepare, unread_inputs=(len(inputs),))
        # The gradient keeps no output tensor (an output the engine lent TensorFlow through
        # DLPack must be released while Python still runs; the tape's records live on).
        token = int(token)

        def gradient(upstream):
            _eager_pending[base] = 0

            def run(token_now, grads):
                return engine_grad(table.name, backward_id, token_now, grads)
            values, rows = boundary.engine_op(run, [tf1.constant(token, tf1.int64), upstream],
                                              [tf1.float32, tf1.int64], name + "_grad",
                                              host_inputs=(0,))
            return _indexed_slices(table, values, rows)
        return vectors, gradient

    return lookup(handle)
