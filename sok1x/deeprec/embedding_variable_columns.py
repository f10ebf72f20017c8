"""DeepRec's EmbeddingVariable feature columns on sok1x's engine (DESIGN D12).

    ids = tf.feature_column.categorical_column_with_embedding("item", dtype=tf.string)
    item = tf.feature_column.embedding_column(ids, 16, combiner="sum")
    net = tf.compat.v1.feature_column.input_layer(features, [item, ...])

categorical_column_with_embedding(key, dtype=tf.string, partition_num=None, ev_option=None) is
DeepRec's: a categorical column with no bucket count whose ids are the feature's values
themselves (integers), or for strings their 64-bit hash (tf.strings.to_hash_bucket_fast into
[0, 2^63 - 1), as DeepRec hashes them); -1 and "" are dropped, as TensorFlow's columns drop
them. An embedding column over it (embedding_column, shared_embedding_columns, also over a
weighted_categorical_column of it) keeps its rows in an EmbeddingVariable
(embedding_variables.py: a sok1x.DynamicVariable that grows as keys come, sharded over the
ranks), trained by the program's own optimizer. Its lookup is sok1x's (group_embedding_columns
.py): alone, or inside group_embedding_column_scope together with the scope's other columns.
Its EmbeddingVariable is named as TensorFlow names a column's variable: <input_layer scope>/
<column>_embedding/embedding_weights alone, <shared name>/embedding_weights for shared columns,
<scope name>/<column>/embedding_weights in a group scope.

ev_option takes what get_embedding_variable takes (an InitializerOption's initializer; the rest
refused by name); partition_num (DeepRec's partitioned EmbeddingVariable) changes no number
here, the keys being spread over every rank anyway. Combiners: sum and mean; max_norm and
ckpt_to_load_from are refused naming the column. sok1x.deeprec.install() puts
categorical_column_with_embedding, and an embedding_column / shared_embedding_columns that take
it (deeprec_embedding_columns.py), on tf.feature_column and tf.compat.v1.feature_column;
sok1x.deeprec has them too. Only input_layer's path is served (DenseFeatures raises, saying so).
"""
import collections

import numpy as np

from sok1x.deeprec import embedding_variables
from sok1x.graph_ops.tf_compat import tf1

_CLASS = []


def _make_column_class():
    from tensorflow.python.feature_column import feature_column as fc_old
    from tensorflow.python.feature_column import feature_column_v2 as fc

    fields = collections.namedtuple("EmbeddingCategoricalColumn",
                                    ("key", "dtype", "partition_num", "ev_option"))

    class EmbeddingCategoricalColumn(fc.CategoricalColumn, fc_old._CategoricalColumn, fields):
        """DeepRec's EmbeddingCategoricalColumn: ids for an EmbeddingVariable."""

        @property
        def _is_v2_column(self):
            return True

        @property
        def name(self):
            return self.key

        @property
        def parse_example_spec(self):
            return {self.key: tf1.io.VarLenFeature(self.dtype)}

        @property
        def _parse_example_spec(self):
            return self.parse_example_spec

        def _ids(self, features):
            sparse = fc._to_sparse_input_and_drop_ignore_values(features)
            if sparse.dtype.is_integer != self.dtype.is_integer:
                raise ValueError("categorical_column_with_embedding(%r): the feature is %s, the "
                                 "column's dtype %s" % (self.key, sparse.dtype.name,
                                                        self.dtype.name))
            if self.dtype == tf1.string:
                values = tf1.strings.to_hash_bucket_fast(sparse.values, np.iinfo(np.int64).max)
            else:
                values = tf1.cast(sparse.values, tf1.int64)
            return tf1.SparseTensor(sparse.indices, values, sparse.dense_shape)

        def transform_feature(self, transformation_cache, state_manager):
            return self._ids(transformation_cache.get(self.key, state_manager))

        def _transform_feature(self, inputs):
            return self._ids(inputs.get(self.key))

        @property
        def num_buckets(self):
            raise ValueError(
                "categorical_column_with_embedding(%r) has no bucket count: its rows live in an "
                "EmbeddingVariable. Wrap it in sok1x.deeprec.embedding_column or "
                "shared_embedding_columns (tf.feature_column's, after sok1x.deeprec.install())"
                % self.key)

        @property
        def _num_buckets(self):
            return self.num_buckets

        def get_sparse_tensors(self, transformation_cache, state_manager):
            return fc.CategoricalColumn.IdWeightPair(
                transformation_cache.get(self, state_manager), None)

        def _get_sparse_tensors(self, inputs, weight_collections=None, trainable=None):
            return fc.CategoricalColumn.IdWeightPair(inputs.get(self), None)

        @property
        def parents(self):
            return [self.key]

        def _get_config(self):
            raise NotImplementedError("categorical_column_with_embedding(%r) cannot be "
                                      "serialized" % self.key)

        @classmethod
        def _from_config(cls, config, custom_objects=None, columns_by_name=None):
            raise NotImplementedError("categorical_column_with_embedding cannot be serialized")

    return EmbeddingCategoricalColumn


def column_class():
    """The EmbeddingCategoricalColumn class (made on first use: it imports TF's columns)."""
    if not _CLASS:
        _CLASS.append(_make_column_class())
    return _CLASS[0]


def categorical_column_with_embedding(key, dtype=tf1.string, partition_num=None,
                                      ev_option=None):
    """DeepRec's tf.feature_column.categorical_column_with_embedding: a categorical column whose
    ids key an EmbeddingVariable (see the module's docstring). key: the feature's name; dtype:
    tf.string or an integer dtype; partition_num: None or a positive int; ev_option: a
    tf.EmbeddingVariableOption or None. Raises ValueError naming the column and what sok1x does
    not honour."""
    if not isinstance(key, str) or not key:
        raise ValueError("categorical_column_with_embedding: key must be a non-empty string, got "
                         "%r" % (key,))
    where = "categorical_column_with_embedding(%r)" % key
    try:
        dtype = tf1.as_dtype(dtype)
    except TypeError:
        dtype = None
    if dtype is None or not (dtype == tf1.string or dtype.is_integer):
        raise ValueError("%s: dtype must be tf.string or an integer dtype" % where)
    if partition_num is not None and (isinstance(partition_num, bool) or not isinstance(
            partition_num, int) or partition_num < 1):
        raise ValueError("%s: partition_num must be None or a positive int, got %r"
                         % (where, partition_num))
    refused = embedding_variables.refused_options(ev_option)
    if refused:
        raise ValueError("%s: sok1x does not support %s"
                         % (where, "; ".join("%s (%s)" % pair for pair in refused)))
    return column_class()(key, dtype, partition_num, ev_option)


def of(categorical_column):
    """The EmbeddingCategoricalColumn `categorical_column` is or weighs, else None."""
    if not _CLASS:
        return None
    inner = getattr(categorical_column, "categorical_column", categorical_column)
    return inner if isinstance(inner, _CLASS[0]) else None


def table_of(column, group_name, alone, shared):
    """The EmbeddingVariable of member `column` (a group column over an EmbeddingCategoricalColumn)
    for a lookup made now (see the module's docstring for its name)."""
    key = column._sok1x_table_key
    if not alone:
        full_name = "%s/%s/embedding_weights" % (group_name, key)
    elif shared:
        full_name = "%s/embedding_weights" % key
    else:
        scope = tf1.get_variable_scope().name
        full_name = "%s/embedding_weights" % scope if scope else "embedding_weights"
    return embedding_variables.column_embedding_variable(
        full_name, column.dimension, column.initializer, column.trainable,
        of(column.categorical_column).ev_option)


def check_shareable(columns, where):
    """Raises ValueError unless `columns` are all, or none, over categorical columns with
    embedding."""
    kinds = set(of(c) is not None for c in columns)
    if len(kinds) > 1:
        raise ValueError(
            "%s: %s mix categorical_column_with_embedding columns with columns of a bucket "
            "count; share an EmbeddingVariable among columns with embedding only"
            % (where, [c.name for c in columns]))
