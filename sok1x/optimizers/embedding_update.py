"""Turns one optimizer step on a sok1x embedding variable into the engine's update op."""
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.errors import Sok1xError
from sok1x.graph_ops import embedding_ops, graph_state, optimizer_ops, pooled_lookup_ops
from sok1x.graph_ops.tf_compat import tf1


def optimizer_name(optimizer):
    """The optimizer's name (TF1 get_name(), Keras _name)."""
    get_name = getattr(optimizer, "get_name", None)
    if callable(get_name):
        return get_name()
    return getattr(optimizer, "_name", type(optimizer).__name__)


class _SlotPrefixes:
    """One graph's optimizers that update sok1x tables, each with its unique slot prefix."""

    def __init__(self):
        self.by_optimizer = {}  # id(optimizer) -> (optimizer, prefix); the graph keeps both
        self.taken = set()

    def prefix_of(self, optimizer):
        known = self.by_optimizer.get(id(optimizer))
        if known is not None and known[0] is optimizer:
            return known[1]
        base = optimizer_name(optimizer)
        prefix, number = base, 0
        while prefix in self.taken:
            number += 1
            prefix = "%s_%d" % (base, number)
        self.taken.add(prefix)
        self.by_optimizer[id(optimizer)] = (optimizer, prefix)
        return prefix


def slot_prefix(optimizer):
    """Returns the prefix of `optimizer`'s slots in the tables it updates ("<prefix>/m", ...): its
    name, made unique among the optimizers updating sok1x tables in the default graph in the order
    they first build an update ("Adam", then "Adam_1", ...), as TensorFlow uniquifies the names
    of slot variables. So two optimizers never share slots, and the names depend only on the
    program: equal on every rank, and again the same when the graph is built anew (a new
    Estimator graph, a restart restoring a checkpoint)."""
    prefixes = graph_state.per_graph(tf1.get_default_graph(), "slot_prefixes", _SlotPrefixes)
    return prefixes.prefix_of(optimizer)


def known_slot_prefix(optimizer):
    """The prefix slot_prefix() gave `optimizer` in the default graph, without taking a new one:
    its name when it has built no update there (dump / load / get_slot of an optimizer)."""
    prefixes = graph_state.per_graph(tf1.get_default_graph(), "slot_prefixes", _SlotPrefixes)
    known = prefixes.by_optimizer.get(id(optimizer))
    if known is not None and known[0] is optimizer:
        return known[1]
    return optimizer_name(optimizer)


def update_op(optimizer, handle, values, indices, update, keyed=None):
    """Returns the op applying `update` (a native_rules.Update built from `optimizer`) to the
    table of embedding variable `handle`, with gradient IndexedSlices parts (values, indices).
    keyed: the KeyedUpdates of the apply_gradients call, or None."""
    table = table_of(handle)
    # Executing eagerly there is no graph to search (and no Horovod op in it).
    crossing = None if tf1.executing_eagerly() else embedding_ops.collective_on_the_way(indices)
    if crossing is not None:
        raise Sok1xError(
            "the gradient of sok1x embedding variable %s went through a Horovod collective (%s, "
            "%s): it holds rows of "
            "this rank's own shard, and all-reducing or all-gathering it across ranks mixes "
            "different rows. Keep embedding gradients away from hvd.DistributedOptimizer and "
            "hvd.allreduce: split the variables with sok1x.split_embedding_variable_from_others "
            "and reduce only the dense gradients."
            % (describe(handle), crossing.name, crossing.type))
    grouped = None if keyed is None else keyed.update_op(optimizer, handle, values, indices,
                                                         update)
    if grouped is None:
        grouped = optimizer_ops.apply_rows_update(
            table.name, values, indices, update.rule, update.hyper, update.options,
            slot_prefix=slot_prefix(optimizer), name="sok1x_%s_update" % update.rule)
    from sok1x.deeprec import plain_variables  # (it imports the optimizers' scope)
    return plain_variables.after_update(handle, indices, grouped)


class KeyedUpdates:
    """The embedding gradients of one apply_gradients call that are, all of them, the unchanged
    gradients of one keyed backward op (graph_ops/pooled_lookup_ops.py): their tables are
    updated by ONE op (made at the first of them; the others get the same op), not one op per
    table. A gradient the optimizer hands over changed (clipped, say) leaves its tables to
    per-table ops."""

    def __init__(self, pairs):
        self._members = {}  # id(handle) -> (group entry [keyed, op or None, usable], place)
        found = {}
        for grad, handle in pairs:
            values = getattr(grad, "values", None)
            keyed = pooled_lookup_ops.keyed_gradient_of(values)
            if keyed is None:
                continue
            place, table = values.value_index, table_of(handle)
            if table is None or table.name != keyed.names[place] or (
                    grad.indices is not keyed.rows[place]):
                continue
            found.setdefault(id(keyed), (keyed, {}))[1].setdefault(place, handle)
        for keyed, members in found.values():
            if len(members) == len(keyed.names):
                entry = [keyed, None, True]
                for place, handle in members.items():
                    self._members[id(handle)] = (entry, place)

    def update_op(self, optimizer, handle, values, indices, update):
        """The one update op of `handle`'s group, or None where it has none."""
        found = self._members.get(id(handle))
        if found is None or not found[0][2]:
            return None
        entry, place = found
        keyed = entry[0]
        if values is not keyed.pieces[place] or indices is not keyed.rows[place]:
            if entry[1] is not None:
                raise Sok1xError(
                    "%s changed the gradient of %s after it had updated the other tables of its "
                    "lookup with theirs; sok1x cannot apply that" % (optimizer_name(optimizer),
                                                                     describe(handle)))
            entry[2] = False  # the optimizer changes gradients: per-table ops
            return None
        if entry[1] is None:
            entry[1] = optimizer_ops.apply_keyed_update(
                keyed, update.rule, update.hyper, update.options, slot_prefix(optimizer),
                name="sok1x_%s_keyed_update" % update.rule)
        return entry[1]


def describe(variable):
    """Names a variable in messages: its TensorFlow name and, for a sok1x one, its table."""
    table = table_of(variable)
    name = getattr(variable, "name", repr(variable))
    return name if table is None else "%s (sok1x table %s)" % (name, table.name)


def dense_gradient_error(handle):
    """The error for a dense gradient reaching an optimizer for embedding variable `handle`."""
    return Sok1xError(
        "the gradient of sok1x embedding variable %s reached the optimizer as a dense tensor; "
        "pass the tf.IndexedSlices that tf.gradients returns for it (its rows are this rank's "
        "shard rows) without converting it to a tensor" % describe(handle))
