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

Tables of one dim and one pooling (combiner, weighted or not) cross in keyed form (graph mode and
tf.function): the graph joins their keys, segment ids and weights (tf.concat) and the engine
takes them as one array (engine/lookup/keyed.py), returns one pooled output that the graph splits
(tf.split, whose gradient joins the tables' gradients again), and one values output beside each
table's rows on the way back; so a step crosses the seam a few times, not a few times per table.
Each table's rows stay an output of their own: its update op hands them back, and the engine
knows them as its backward's own rows (engine/lookup/distinct_rows.py).

On the host seam (TensorFlow 1.15 on GPUs: every byte crosses PCIe twice), graph mode takes the
compact form instead: per table the pooled vectors or, where fewer bytes, the batch's distinct
rows and int32 indices, which the graph gathers and pools on TensorFlow's device (_CompactForm);
tables the keyed form fits cross as one array of the unit's distinct rows and one of indices
(_CompactKeyedForm: de-duplicated once for a table group), each table then updated on its own.
"""
import collections
import functools

import numpy as np

from sok1x.engine import api
from sok1x.engine.lookup.keyed import KeyedInput
from sok1x.engine.op_order import as_op_id
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.graph_ops import boundary, embedding_ops, init_ops, ordering, tf_compat
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.embedding_tag import handle_value
from sok1x.graph_ops.tf_compat import tf1

_GRAD = "Sok1xPooledLookup"
_EAGER_NAMES = 64
_eager_pending = {}  # eager lookup name -> forward calls since its last gradient

TableInput = collections.namedtuple(
    "TableInput", "keys segment_ids num_segments weights combiner admit_ratio", defaults=(None,))
TableInput.__doc__ = ("One table's tensors: keys int [nnz], segment_ids int64 [nnz], num_segments "
                      "int64 scalar, weights float32 [nnz] or None, combiner 'sum' or 'mean', "
                      "admit_ratio None or a hash table's low-frequency filter (a float).")


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
    ratios = [item.admit_ratio for item in items]

    def run(*arrays, lookup=None):
        position, pooled_inputs = len(tables), []
        for combiner, has_weights, ratio in zip(combiners, weighted, ratios):
            keys, segment_ids, num_segments = arrays[position:position + 3]
            position += 3
            weights = None
            if has_weights:
                weights, position = arrays[position], position + 1
            pooled_inputs.append(PooledInput(keys, segment_ids, int(num_segments), weights,
                                             combiner, ratio))
        if lookup is not None:  # the compact form's: per table rows and int32 indices
            results, token = lookup(pooled_inputs, True, key_limits)
            return [a for rows, indices in results for a in (
                rows, np.zeros(0, np.int32) if indices is None else indices)] + [token]
        outputs, token = api.pooled_lookup(names, op_id, pooled_inputs, True, key_limits)
        return list(outputs) + [token]
    return run


class _ListForm:
    """Per table its own tensors in and out of the engine (tables of several dims or
    poolings, and eager lookups)."""

    def __init__(self, tables, items, key_limits):
        self.tables, self.items, self.key_limits = tables, items, key_limits
        self.dtypes = [tf1.float32] * len(tables) + [tf1.int64]

    def inputs(self, handle_values):
        """The forward op's inputs (the handles' values first) and its host input positions."""
        return _flat_inputs(handle_values, self.items)

    def function(self, op_id):
        return _forward_function(self.tables, self.items, self.key_limits, op_id)

    def pooled(self, outputs):
        """Per table float32 [num_segments_t, dim_t] of the forward op's outputs."""
        for pooled, table in zip(outputs, self.tables):
            pooled.set_shape([None, table.dim])
        return outputs[:-1]

    def tops(self, outputs, grads):
        """The backward op's gradient inputs from the gradients of the forward op's outputs
        (graph mode) or of the per-table pooled outputs (tf.function): per table."""
        return [tf1.zeros_like(outputs[t]) if grads[t] is None else grads[t]
                for t in range(len(self.tables))]

    def backward(self, token, tops, op_id, name):
        """Makes the engine's backward op; returns (per table (values, rows), the op)."""
        pairs = _backward_op(self.tables, token, tops, op_id, name)
        return pairs, pairs[0][0].op


class _KeyedForm(_ListForm):
    """All tables' keys in one tensor (tf.concat), one pooled output split in the graph."""

    def __init__(self, tables, items, key_limits):
        _ListForm.__init__(self, tables, items, key_limits)
        self.dtypes = [tf1.float32, tf1.int64]
        self.num_segments = None
        # a session's graph (pooled_lookup): the engine may replay the step (api.keyed_lookup's
        # replay=True), its output and gradient handed over as boundary.replay_detach says
        self.replay = False

    @staticmethod
    def fits(tables, items):
        """True for tables of one dim and items of one pooling with int keys and no filter, more
        than one."""
        return len(tables) > 1 and len({table.dim for table in tables}) == 1 and len(
            {(item.combiner, item.weights is None) for item in items}) == 1 and all(
            item.keys.dtype in (tf1.int32, tf1.int64) and item.admit_ratio is None
            for item in items)

    def inputs(self, handle_values):
        items, count = self.items, len(self.items)
        keys = [item.keys for item in items]
        if len({k.dtype for k in keys}) > 1:
            keys = [tf1.cast(k, tf1.int64) for k in keys]
        self.num_segments = tf1.stack([tf1.cast(item.num_segments, tf1.int64) for item in items])
        inputs = list(handle_values) + [
            tf1.concat(keys, 0), tf1.stack([tf1.size(k, out_type=tf1.int64) for k in keys]),
            tf1.concat([tf1.cast(item.segment_ids, tf1.int64) for item in items], 0),
            self.num_segments]
        if items[0].weights is not None:
            inputs.append(tf1.concat([item.weights for item in items], 0))
        return inputs, [count + 1, count + 3]

    def keyed_input(self):
        """Returns a function of the op's arrays that gives the engine's KeyedInput."""
        count, combiner = len(self.tables), self.items[0].combiner
        weighted = self.items[0].weights is not None

        def keyed(arrays):
            keys, lengths, segment_ids, num_segments = arrays[count:count + 4]
            weights = arrays[count + 4] if weighted else None
            return KeyedInput(keys, lengths, segment_ids, num_segments, weights, combiner)
        return keyed

    def function(self, op_id):
        names, key_limits = [table.name for table in self.tables], self.key_limits
        keyed = self.keyed_input()

        replay = self.replay
        detach = replay and boundary.replay_detach()

        def run(*arrays):
            out, token = api.keyed_lookup(names, op_id, keyed(arrays), True, key_limits,
                                          replay=replay, detach=detach)
            return [out, token]
        return run

    def pooled(self, outputs):
        outputs[0].set_shape([None, self.tables[0].dim])
        return tf1.split(outputs[0], self.num_segments, num=len(self.tables))

    def tops(self, outputs, grads):
        if len(outputs) == len(self.tables):  # the per-table pooled outputs (tf.function)
            return [tf1.concat(_ListForm.tops(self, outputs, grads), 0)]
        return [tf1.zeros_like(outputs[0]) if grads[0] is None else grads[0]]

    def backward(self, token, tops, op_id, name):
        names = [table.name for table in self.tables]
        count = len(names)
        detach = boundary.replay_detach()

        def run(token_now, grads_now):
            values, rows, counts = api.keyed_lookup_grad(names, op_id, token_now, grads_now,
                                                         rows_per_table=True, detach=detach)
            return [values, counts] + list(rows)
        outputs = boundary.engine_op(run, [token, tops[0]],
                                     [tf1.float32, tf1.int64] + [tf1.int64] * count, name,
                                     host_inputs=(0,), host_outputs=(1,))
        outputs[0].set_shape([None, self.tables[0].dim])
        for rows in outputs[2:]:
            rows.set_shape([None])
        values = tf1.split(outputs[0], outputs[1], num=count)
        per_graph(values[0].graph, "keyed_gradients", dict)[values[0].op.name] = KeyedGradient(
            names, outputs[0], outputs[1], outputs[2:], values)
        return list(zip(values, outputs[2:])), outputs[0].op


KeyedGradient = collections.namedtuple("KeyedGradient", "names values counts rows pieces")
KeyedGradient.__doc__ = """The outputs of one keyed backward op: the tables' names, values
[u, dim] of all tables, counts [T], each table's rows, and the values' per-table pieces (the
graph's split): an update of all tables at once hands values, counts and rows back."""


def keyed_gradient_of(values):
    """The KeyedGradient one of whose per-table pieces is `values`, or None."""
    op = getattr(values, "op", None)
    if op is None or op.type != "SplitV":
        return None
    return per_graph(op.graph, "keyed_gradients", dict).get(op.name)


class _CompactForm(_ListForm):
    """Host staging (TensorFlow 1.15 on GPUs, DESIGN D1): per table the engine hands over the
    fewer bytes (engine/lookup/compact.py): the pooled vectors, or the batch's distinct rows and
    int32 indices of each key's row among them, and the graph gathers and pools on
    TensorFlow's own device (tf.gather, tf.math.unsorted_segment_sum: the math of
    tf.nn.embedding_lookup_sparse). Which one a step took shows in the indices: empty for pooled
    rows (distinct rows come only for keys). The gather's gradient is, per distinct row, the sum
    of its keys' gradients: what crosses back."""

    def __init__(self, tables, items, key_limits):
        _ListForm.__init__(self, tables, items, key_limits)
        self.dtypes = [tf1.float32, tf1.int32] * len(tables) + [tf1.int64]

    @staticmethod
    def fits(items):
        """True on the host seam, for items of int keys and no filter."""
        return boundary.seam_path() == boundary.HOST_STAGING and all(
            item.keys.dtype in (tf1.int32, tf1.int64) and item.admit_ratio is None
            for item in items)

    def function(self, op_id):
        names = [table.name for table in self.tables]
        forward = _forward_function(self.tables, self.items, self.key_limits, op_id)

        def run(*arrays):
            return forward(*arrays, lookup=functools.partial(api.compact_lookup, names, op_id))
        return run

    def pooled(self, outputs):
        pooled = []
        for t, (table, item) in enumerate(zip(self.tables, self.items)):
            rows, indices = outputs[2 * t], outputs[2 * t + 1]
            rows.set_shape([None, table.dim])
            indices.set_shape([None])
            pooled.append(tf1.cond(tf1.size(indices) > 0,
                                   functools.partial(_pool_distinct, rows, indices, item),
                                   functools.partial(tf1.identity, rows)))
            pooled[-1].set_shape([None, table.dim])
        return pooled

    def tops(self, outputs, grads):
        return [_rows_gradient(outputs[2 * t], grads[2 * t]) for t in range(len(self.tables))]

    def backward(self, token, tops, op_id, name):
        pairs = _backward_op(self.tables, token, tops, op_id, name, api.compact_lookup_grad)
        return pairs, pairs[0][0].op


class _CompactKeyedForm(_KeyedForm):
    """The compact form of tables of one dim and one pooling (the keyed form's inputs): one
    array of the unit's distinct rows (de-duplicated once for a table group) and one of int32
    indices, or the pooled rows of all tables joined; the graph gathers, pools and splits."""

    def __init__(self, tables, items, key_limits):
        _KeyedForm.__init__(self, tables, items, key_limits)
        self.dtypes = [tf1.float32, tf1.int32, tf1.int64]

    def function(self, op_id):
        names, key_limits = [table.name for table in self.tables], self.key_limits
        keyed = self.keyed_input()

        def run(*arrays):
            joined, token = api.compact_keyed_lookup(names, op_id, keyed(arrays), True,
                                                     key_limits)
            indices = np.zeros(0, np.int32) if joined.indices is None else joined.indices
            return [joined.rows, indices, token]
        return run

    def pooled(self, outputs):
        rows, indices = outputs[0], outputs[1]
        rows.set_shape([None, self.tables[0].dim])
        indices.set_shape([None])
        starts = tf1.math.cumsum(self.num_segments, exclusive=True)
        items = self.items
        joined = TableInput(
            None, tf1.concat([tf1.cast(item.segment_ids, tf1.int64) + starts[t]
                              for t, item in enumerate(items)], 0),
            tf1.reduce_sum(self.num_segments),
            None if items[0].weights is None else tf1.concat([i.weights for i in items], 0),
            items[0].combiner)
        out = tf1.cond(tf1.size(indices) > 0, functools.partial(_pool_distinct, rows, indices,
                                                                 joined),
                       functools.partial(tf1.identity, rows))
        out.set_shape([None, self.tables[0].dim])
        return tf1.split(out, self.num_segments, num=len(self.tables))

    def tops(self, outputs, grads):
        return [_rows_gradient(outputs[0], grads[0])]

    def backward(self, token, tops, op_id, name):
        pairs = _backward_op(self.tables, token, tops, op_id, name, api.compact_lookup_grad)
        return pairs, pairs[0][0].op


def _rows_gradient(rows, grad):
    """The dense gradient of the rows a compact form handed over: the gather's IndexedSlices
    summed per distinct row, zeros where no output is used."""
    if grad is None:
        return tf1.zeros_like(rows)
    if isinstance(grad, tf1.IndexedSlices):
        return tf1.math.unsorted_segment_sum(grad.values, grad.indices, tf1.shape(rows)[0])
    return grad


def _pool_distinct(rows, indices, item):
    """float32 [num_segments, dim]: the keys' rows (rows gathered by indices) pooled by the
    item's segment ids, weights and combiner, as tf.nn.embedding_lookup_sparse."""
    vectors = tf1.gather(rows, indices)
    weights = None if item.weights is None else tf1.reshape(item.weights, [-1, 1])
    if weights is not None:
        vectors = vectors * weights
    num_segments = tf1.cast(item.num_segments, tf1.int64)
    segment_ids = tf1.cast(item.segment_ids, tf1.int64)
    pooled = tf1.math.unsorted_segment_sum(vectors, segment_ids, num_segments)
    if item.combiner != "mean":
        return pooled
    ones = tf1.ones_like(segment_ids, tf1.float32) if weights is None else item.weights
    total = tf1.math.unsorted_segment_sum(ones, segment_ids, num_segments)
    return tf1.math.divide_no_nan(pooled, tf1.reshape(total, [-1, 1]))


def _form(tables, items, key_limits, eager=False, traced=False):
    """The form of one lookup's op: compact on the host seam in graph mode (not traced by a
    tf.function, whose tape differentiates the pooled outputs), else keyed or list."""
    if not eager and not traced and _CompactForm.fits(items):
        keyed = _KeyedForm.fits(tables, items)
        return (_CompactKeyedForm if keyed else _CompactForm)(tables, items, key_limits)
    keyed = not eager and _KeyedForm.fits(tables, items)
    return (_KeyedForm if keyed else _ListForm)(tables, items, key_limits)


def _prepare(tables, ensure_up):
    def prepare():
        ensure_up()
        for table in tables:
            embedding_ops.create_table_now(table)
    return prepare


_indexed_slices = embedding_ops._indexed_slices


def _backward_op(tables, token, grads, op_id, name, lookup_grad=None):
    """Makes the engine's backward op (lookup_grad: api.pooled_lookup_grad or
    api.compact_lookup_grad); returns per table (values, rows) tensors."""
    names = [table.name for table in tables]
    lookup_grad = lookup_grad or api.pooled_lookup_grad

    def run(token_now, *grads_now):
        results = lookup_grad(names, op_id, token_now, list(grads_now))
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
    handle_values = [handle_value(h) for h in handles]
    if tf1.executing_eagerly():
        inputs, host = _flat_inputs(handle_values, items)
        return _eager_lookup(tables, inputs, host, items, key_limits, name, prepare)
    traced = tf_compat.inside_function()
    form = _form(tables, items, key_limits, traced=traced)
    inputs, host = form.inputs(handle_values)
    if traced:
        return _function_lookup(form, inputs, host, name, prepare)
    form.replay = True  # only a keyed form replays
    outputs, tower = _forward_op(form, inputs, host, name, prepare, _GRAD)
    per_graph(outputs[0].graph, "pooled_lookups", dict)[outputs[0].op.name] = (form, tower)
    return form.pooled(outputs)


def _forward_op(form, inputs, host, name, prepare, gradient):
    """Makes the chained forward op; returns (its outputs: pooled per table, or joined in keyed
    form, then the token; its tower)."""
    count = len(form.tables)

    def build(op_id):
        outputs = boundary.engine_op(form.function(op_id), inputs, form.dtypes, name,
                                     gradient=gradient, host_inputs=host, prepare=prepare,
                                     unread_inputs=range(count),
                                     host_outputs=(len(form.dtypes) - 1,))
        outputs[-1].set_shape([])
        return outputs, outputs[0].op

    return ordering.chained(ordering.FORWARD, name, build)


def _function_lookup(form, inputs, host, name, prepare):
    """The lookup inside a tf.function: chained graph ops as in graph mode, but differentiable by
    tf.GradientTape, which looks gradients up by op type and ignores gradient_override_map."""
    count = len(form.tables)
    others = inputs[count:]

    @tf1.custom_gradient
    def lookup(*handle_values):
        outputs, tower = _forward_op(form, list(handle_values) + others, host, name, prepare,
                                     None)
        pooled = form.pooled(outputs)

        def gradient(*upstream):
            return _chained_backward(form, outputs[-1], form.tops(pooled, upstream), tower,
                                     name + "_grad")
        return list(pooled), gradient

    return list(lookup(*inputs[:count]))


def _chained_backward(form, token, tops, tower, name):
    """Makes the chained backward op in `tower`; returns the handles' IndexedSlices."""
    def build(op_id):
        return form.backward(token, tops, op_id, name)

    pairs, _ = ordering.chained(ordering.BACKWARD, name, build, tower=tower)
    for op in {tower.last_op, pairs[0][0].op}:  # in keyed form the values come from a split
        embedding_ops.mark_backward_op(op)
    return [_indexed_slices(table, values, rows)
            for table, (values, rows) in zip(form.tables, pairs)]


@boundary.register_gradient(_GRAD)
def _pooled_lookup_grad(op, *grads):
    form, tower = per_graph(op.graph, "pooled_lookups", dict)[op.name]
    slices = _chained_backward(form, op.outputs[-1], form.tops(op.outputs[:-1], grads), tower,
                               op.name.split("/")[-1] + "_grad")
    return slices + [None] * (len(op.inputs) - len(form.tables))


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
