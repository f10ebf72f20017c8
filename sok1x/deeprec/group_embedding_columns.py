"""DeepRec's tf.feature_column.group_embedding_column_scope on stock TensorFlow (DESIGN D12).

    with sok1x.group_embedding_column_scope(name="deep"):
        user = tf.feature_column.embedding_column(user_id_column, 16, combiner="mean")
        item = tf.feature_column.embedding_column(item_id_column, 8, combiner="sum")
    net = tf.compat.v1.feature_column.input_layer(features, [user, item, ...])

How: while the scope is open, tf.feature_column.embedding_column and shared_embedding_columns
(the tf.feature_column and tf.compat.v1.feature_column names) build GroupEmbeddingColumn, a
subclass of TensorFlow's own EmbeddingColumn that changes one method, `_get_dense_tensor` (the
one input_layer calls). When input_layer asks the first member column of a scope for its dense
tensor, it looks up every member column of that scope passed to the same input_layer call in ONE
fused sok1x lookup (group_embedding's pooled op) and keeps the others' results on input_layer's
feature builder for when input_layer asks them. The columns of that call are read from
input_layer's own frame (its `feature_columns` beside the builder); where they cannot be found,
a column is looked up on its own, which gives the same numbers. On exit the names are what they
were (TensorFlow's, or sok1x.deeprec.install()'s): columns built outside are untouched.

A scope's name names its group: the columns of scopes of one name are looked up together, and its
tables are named after it. A member column's table is a sok1x table [num_buckets, dimension]
sharded over the ranks (no [num_buckets, dimension] TensorFlow variable is made), named <scope
name>/<column name>/embedding_weights, with its initializer drawn by sok1x
(sok1x.common.initializers; TensorFlow's default truncated normal of embedding_column included);
over categorical_column_with_embedding it is an EmbeddingVariable (embedding_variable_columns.py),
which also serves such columns built outside a scope, each looked up alone.
Like safe_embedding_lookup_sparse, ids < 0 (and, for mean, weights <= 0) are dropped and a row
without ids gives zeros. Combiners: sum and mean (DeepRec's); max_norm and ckpt_to_load_from are
not supported (errors name the column). A column of the scope used twice shares its table. Only
input_layer's path (the `_get_dense_tensor` of TensorFlow 1.x feature columns) is grouped;
DenseFeatures raises an error saying so.
"""
import contextlib
import sys

from sok1x.graph_ops.embedding_tag import table_of
from sok1x.graph_ops import pooled_lookup_ops
from sok1x.graph_ops.tf_compat import tf1
from sok1x.deeprec.group_embedding import (LOCALIZED, check_combiner, strategy, table_handle,
                                           table_input)
from sok1x.common.initializers import spec_from_initializer
from sok1x.deeprec import embedding_variable_columns

_PATCHED = ("embedding_column", "shared_embedding_columns")
_OUTPUTS_ATTR = "_sok1x_group_outputs"
_active = []


def _feature_column_modules():
    """The module objects a program reaches feature columns through (no duplicates)."""
    import tensorflow as tf
    modules = []
    for module in (getattr(tf, "feature_column", None), tf1.feature_column):
        if module is not None and all(module is not m for m in modules):
            modules.append(module)
    return modules


def _embedding_column_class():
    from tensorflow.python.feature_column import feature_column_v2
    return feature_column_v2.EmbeddingColumn


class _Group:
    """One group_embedding_column_scope: its name and the tables of its columns. alone: a
    column over categorical_column_with_embedding built outside a scope, looked up alone."""

    def __init__(self, name, alone=False):
        self.name = name
        self.alone = alone


def _make_group_column_class():
    base = _embedding_column_class()

    class GroupEmbeddingColumn(base):
        """TensorFlow's EmbeddingColumn, looked up by sok1x in its scope's fused lookup."""

        @property
        def name(self):
            return getattr(self, "_sok1x_name", None) or base.name.fget(self)

        def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
            return _dense_tensor(self, inputs)

        def create_state(self, state_manager):
            raise _not_for_dense_features(self)  # before DenseFeatures makes a variable

        def get_dense_tensor(self, transformation_cache, state_manager):
            raise _not_for_dense_features(self)

    return GroupEmbeddingColumn


_CLASS = []


def _not_for_dense_features(column):
    how = ("is an embedding column over categorical_column_with_embedding, which sok1x looks up"
           if column._sok1x_group.alone else
           "was built in sok1x.group_embedding_column_scope, which groups the lookups")
    return NotImplementedError("%s %s through tf.compat.v1.feature_column.input_layer; pass it "
                               "to input_layer instead of DenseFeatures" % (column.name, how))


def group_column_class():
    """The EmbeddingColumn subclass the scope builds (made on first use: it imports TF)."""
    if not _CLASS:
        _CLASS.append(_make_group_column_class())
    return _CLASS[0]


def is_group_column(column):
    """True for a column built inside a group_embedding_column_scope."""
    return bool(_CLASS) and isinstance(column, _CLASS[0])


def _num_buckets(categorical_column):
    buckets = getattr(categorical_column, "num_buckets", None)
    return int(buckets if buckets is not None else categorical_column._num_buckets)


def _group_column(tf_column, group, table_key, name=None):
    """Re-makes TensorFlow's EmbeddingColumn `tf_column` as a member column of `group`."""
    fields = tf_column._asdict()
    where = "group_embedding_column_scope(%r): %s" % (group.name, name or tf_column.name)
    check_combiner(fields["combiner"], where)
    if fields.get("max_norm") is not None:
        raise ValueError("%s: max_norm is not supported by sok1x's group lookup" % where)
    if fields.get("ckpt_to_load_from") is not None:
        raise ValueError("%s: ckpt_to_load_from is not supported by sok1x's group lookup; "
                         "restore sok1x tables with tf.compat.v1.train.Saver or sok1x.load"
                         % where)
    column = group_column_class()(**fields)
    column._sok1x_name = name
    column._sok1x_group = group
    column._sok1x_table_key = table_key
    column._sok1x_shared = False
    with_embedding = embedding_variable_columns.of(fields["categorical_column"]) is not None
    # an EmbeddingVariable takes the initializer itself (embedding_variables.py)
    column._sok1x_spec = None if with_embedding else spec_from_initializer(
        fields["initializer"], where)
    return column


def alone_column(tf_column, shared=None, name=None):
    """TensorFlow's EmbeddingColumn `tf_column` over categorical_column_with_embedding, built
    outside a group scope, as a column sok1x looks up alone (embedding_variable_columns.py);
    shared: the name of the EmbeddingVariable it shares with others, or None."""
    column = _group_column(tf_column, _Group(name or tf_column.name, alone=True),
                           shared or tf_column.name, name)
    column._sok1x_shared = shared is not None
    return column


def _wrap_embedding_column(original, group):
    def embedding_column(categorical_column, dimension, *args, **kwargs):
        tf_column = original(categorical_column, dimension, *args, **kwargs)
        return _group_column(tf_column, group, tf_column.name)
    embedding_column.__doc__ = original.__doc__
    return embedding_column


def _wrap_shared_embedding_columns(embedding_column, group):
    def shared_embedding_columns(categorical_columns, dimension, combiner="mean",
                                 initializer=None, shared_embedding_collection_name=None,
                                 ckpt_to_load_from=None, tensor_name_in_ckpt=None,
                                 max_norm=None, trainable=True, **_):
        columns = list(categorical_columns)
        where = "group_embedding_column_scope(%r): shared_embedding_columns" % group.name
        embedding_variable_columns.check_shareable(columns, where)
        with_embedding = any(embedding_variable_columns.of(c) is not None for c in columns)
        sizes = [0] if with_embedding else sorted({_num_buckets(c) for c in columns})
        if len(sizes) != 1:
            raise ValueError("group_embedding_column_scope(%r): shared_embedding_columns needs "
                             "columns with one num_buckets, got %s" % (group.name, sizes))
        shared = shared_embedding_collection_name or "_".join(
            sorted(c.name for c in columns)) + "_shared_embedding"
        return [_group_column(
            embedding_column(c, dimension, combiner=combiner, initializer=initializer,
                             ckpt_to_load_from=ckpt_to_load_from,
                             tensor_name_in_ckpt=tensor_name_in_ckpt, max_norm=max_norm,
                             trainable=trainable),
            group, shared, name="%s_shared_embedding" % c.name) for c in columns]
    return shared_embedding_columns


@contextlib.contextmanager
def group_embedding_column_scope(name=None):
    """DeepRec's tf.feature_column.group_embedding_column_scope: embedding columns built inside
    (tf.feature_column.embedding_column, shared_embedding_columns) are sok1x tables, and those
    of one scope passed to one tf.compat.v1.feature_column.input_layer are looked up together
    in one fused lookup. name: the scope's name (prefix of its tables' names). Under the
    "localized" strategy (DeepRec's default, see enable_distributed_strategy) the columns stay
    TensorFlow's own: each rank looks its variables up itself (data parallel)."""
    group = _Group(name or "group_embedding_column_scope")
    if strategy() == LOCALIZED:
        yield group
        return
    modules = _feature_column_modules()
    saved = [(module, attr, getattr(module, attr))
             for module in modules for attr in _PATCHED if hasattr(module, attr)]
    from tensorflow.python.feature_column import feature_column_v2
    embedding_column = _wrap_embedding_column(feature_column_v2.embedding_column, group)
    replacements = {"embedding_column": embedding_column,
                    "shared_embedding_columns": _wrap_shared_embedding_columns(
                        feature_column_v2.embedding_column, group)}
    for module, attr, _ in saved:
        setattr(module, attr, replacements[attr])
    _active.append(group)
    try:
        yield group
    finally:
        _active.remove(group)
        for module, attr, value in saved:
            setattr(module, attr, value)


# ---------------------------------------------------------------------------------------------
# Looking the columns of one input_layer call up together.

def _columns_of_call(inputs):
    """The feature columns of the input_layer call whose feature builder is `inputs`, read from
    its frame, or None."""
    frame = sys._getframe(2)
    while frame is not None:
        local = frame.f_locals
        if local.get("builder") is inputs and "feature_columns" in local:
            return list(local["feature_columns"])
        frame = frame.f_back
    return None


def _sparse_ids(column, inputs):
    """The column's ids (and weights) as safe_embedding_lookup_sparse prunes them: 2-D, ids >= 0,
    and for mean weights > 0."""
    sparse = column.categorical_column._get_sparse_tensors(inputs)
    ids, weights = sparse.id_tensor, sparse.weight_tensor
    keep = tf1.greater_equal(ids.values, 0)
    if weights is not None:
        if column.combiner != "sum":
            keep = tf1.logical_and(keep, tf1.greater(weights.values, 0))
        weights = tf1.sparse_retain(weights, keep)
    return tf1.sparse_retain(ids, keep), weights


def _handle(column):
    """The handle variable of member `column`'s table (made on first use in this graph): over
    categorical_column_with_embedding its EmbeddingVariable."""
    group = column._sok1x_group
    if embedding_variable_columns.of(column.categorical_column) is not None:
        return embedding_variable_columns.table_of(column, group.name, group.alone,
                                                   column._sok1x_shared)
    table_name = "%s/%s/embedding_weights" % (column._sok1x_group.name, column._sok1x_table_key)
    return table_handle(table_name, column.dimension, _num_buckets(column.categorical_column),
                        column._sok1x_spec)


def _dense_tensor(column, inputs):
    """The dense tensor of member `column` for the input_layer call with builder `inputs`."""
    outputs = getattr(inputs, _OUTPUTS_ATTR, None)
    if outputs is None:
        outputs = {}
        setattr(inputs, _OUTPUTS_ATTR, outputs)
    if id(column) not in outputs:
        group = column._sok1x_group
        members = [] if group.alone else (_columns_of_call(inputs) or [])
        members = [c for c in members if is_group_column(c) and not c._sok1x_group.alone
                   and c._sok1x_group.name == group.name and id(c) not in outputs]
        if all(c is not column for c in members):
            members.append(column)
        handles = [_handle(c) for c in members]
        items = [table_input(*_sparse_ids(c, inputs), combiner=c.combiner,
                             where="group_embedding_column_scope: %s" % c.name) for c in members]
        key_limits = [None if embedding_variable_columns.of(c.categorical_column) is not None
                      else _num_buckets(c.categorical_column) for c in members]
        name = "%s_lookup" % group.name.replace("/", "_")
        looked_up = pooled_lookup_ops.pooled_lookup([table_of(h) for h in handles], handles,
                                                    items, key_limits, name)
        for member, vectors in zip(members, looked_up):
            outputs[id(member)] = vectors
    return outputs[id(column)]
