"""DeepRec's tf.feature_column.embedding_column and shared_embedding_columns: over
categorical_column_with_embedding (embedding_variable_columns.py), columns whose rows live in
an EmbeddingVariable, looked up by sok1x alone (group_embedding_columns.py); over any other
categorical column TensorFlow's own. sok1x.deeprec.install() puts them on tf.feature_column
and tf.compat.v1.feature_column (TensorFlow's internal feature_column_v2 keeps its own, which
these hand other columns to)."""
from sok1x.deeprec import group_embedding_columns
from sok1x.deeprec.embedding_variable_columns import check_shareable, of


def _delegate(name):
    """TensorFlow's own feature-column function `name`."""
    from tensorflow.python.feature_column import feature_column_v2
    return getattr(feature_column_v2, name)


def embedding_column(categorical_column, dimension, combiner="mean", initializer=None,
                     ckpt_to_load_from=None, tensor_name_in_ckpt=None, max_norm=None,
                     trainable=True, use_safe_embedding_lookup=True):
    """DeepRec's tf.feature_column.embedding_column: over categorical_column_with_embedding (or
    a weighted column of it) a column whose rows live in an EmbeddingVariable, looked up by
    sok1x; over any other column TensorFlow's own. Raises ValueError naming the column for a
    combiner other than sum or mean, max_norm or ckpt_to_load_from."""
    options = dict(combiner=combiner, initializer=initializer,
                   ckpt_to_load_from=ckpt_to_load_from, tensor_name_in_ckpt=tensor_name_in_ckpt,
                   max_norm=max_norm, trainable=trainable)
    if not use_safe_embedding_lookup:  # TensorFlow 2.x's option, for TensorFlow's columns
        options["use_safe_embedding_lookup"] = False
    tf_column = _delegate("embedding_column")(categorical_column, dimension, **options)
    if of(categorical_column) is None:
        return tf_column
    return group_embedding_columns.alone_column(tf_column)


def shared_embedding_columns(categorical_columns, dimension, combiner="mean", initializer=None,
                             shared_embedding_collection_name=None, ckpt_to_load_from=None,
                             tensor_name_in_ckpt=None, max_norm=None, trainable=True,
                             use_safe_embedding_lookup=True):
    """DeepRec's tf.feature_column.shared_embedding_columns: over categorical columns with
    embedding, columns sharing one EmbeddingVariable (named shared_embedding_collection_name,
    else after the columns); over other columns TensorFlow's own. Raises ValueError for a mix
    of both, and as embedding_column does."""
    columns = list(categorical_columns)
    if all(of(c) is None for c in columns):
        unsafe = {} if use_safe_embedding_lookup else {"use_safe_embedding_lookup": False}
        return _delegate("shared_embedding_columns")(
            columns, dimension, combiner=combiner, initializer=initializer,
            shared_embedding_collection_name=shared_embedding_collection_name,
            ckpt_to_load_from=ckpt_to_load_from, tensor_name_in_ckpt=tensor_name_in_ckpt,
            max_norm=max_norm, trainable=trainable, **unsafe)
    check_shareable(columns, "shared_embedding_columns")
    shared = shared_embedding_collection_name or "_".join(
        sorted(c.name for c in columns)) + "_shared_embedding"
    return [group_embedding_columns.alone_column(
        _delegate("embedding_column")(c, dimension, combiner=combiner, initializer=initializer,
                                      ckpt_to_load_from=ckpt_to_load_from,
                                      tensor_name_in_ckpt=tensor_name_in_ckpt, max_norm=max_norm,
                                      trainable=trainable),
        shared=shared, name="%s_shared_embedding" % c.name) for c in columns]
