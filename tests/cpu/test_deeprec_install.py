"""sok1x.deeprec.install() puts DeepRec's GroupEmbedding and EmbeddingVariable names on the
running TensorFlow (its feature columns included: categorical_column_with_embedding, and an
embedding_column / shared_embedding_columns that take it and hand other columns to
TensorFlow's), and the internal module names DeepRec's programs import, and nothing else does:
importing sok1x and using its own group names patches nothing (DESIGN D12)."""
from without_modules import run_without

_CHECK = """
import tensorflow as tf
import sok1x
names = [(tf.nn, "group_embedding_lookup_sparse"),
         (tf.compat.v1.nn, "group_embedding_lookup_sparse"),
         (tf.feature_column, "group_embedding_column_scope"),
         (tf.compat.v1.feature_column, "group_embedding_column_scope"),
         (tf.config.experimental, "enable_distributed_strategy"),
         (tf.compat.v1.config.experimental, "enable_distributed_strategy"),
         (tf.config.experimental, "enable_group_embedding"),
         (tf.compat.v1.config.experimental, "enable_group_embedding")]
from tensorflow.python.ops import embedding_ops
from tensorflow.python.feature_column import feature_column_v2
from tensorflow.python.framework import config
internal = [(embedding_ops, "group_embedding_lookup_sparse"),
            (feature_column_v2, "group_embedding_column_scope"),
            (config, "enable_distributed_strategy"), (config, "enable_group_embedding")]
embedding_column = tf.compat.v1.feature_column.embedding_column
shared_embedding_columns = tf.compat.v1.feature_column.shared_embedding_columns
with sok1x.group_embedding_column_scope("g"):
    pass
sok1x.group_embedding_lookup_sparse, sok1x.enable_distributed_strategy, sok1x.deeprec
sok1x.enable_group_embedding
assert not any(hasattr(m, n) for m, n in names + internal), [
    (m.__name__, n) for m, n in names + internal if hasattr(m, n)]
assert tf.compat.v1.feature_column.embedding_column is embedding_column
ev_names = ["get_embedding_variable", "EmbeddingVariableOption", "InitializerOption",
            "StorageOption", "CounterFilter", "CBFFilter", "GlobalStepEvict", "L2WeightEvict"]
assert not any(hasattr(m, n) for m in (tf, tf.compat.v1) for n in ev_names)
columns = (tf.feature_column, tf.compat.v1.feature_column)
assert not any(hasattr(m, "categorical_column_with_embedding") for m in columns + (
    feature_column_v2,))
assert tf.compat.v1.feature_column.shared_embedding_columns is shared_embedding_columns
installed = sok1x.deeprec.install()
assert all(getattr(m, n) is getattr(sok1x, n) for m, n in names + internal)
assert all(getattr(m, n) is getattr(sok1x.deeprec, n) for m in (tf, tf.compat.v1)
           for n in ev_names)
column_names = ["categorical_column_with_embedding", "embedding_column",
                "shared_embedding_columns"]
assert all(getattr(m, n) is getattr(sok1x.deeprec, n) for m in columns for n in column_names)
assert (feature_column_v2.categorical_column_with_embedding
        is sok1x.deeprec.categorical_column_with_embedding)
assert feature_column_v2.embedding_column is embedding_column  # TensorFlow's, which it hands on
with sok1x.group_embedding_column_scope("g"):
    pass
assert tf.compat.v1.feature_column.embedding_column is sok1x.deeprec.embedding_column
# a DeepRec program's columns
ids = tf.feature_column.categorical_column_with_embedding("item", dtype=tf.string)
ev = tf.feature_column.embedding_column(ids, 4, combiner="sum")
plain = tf.feature_column.embedding_column(
    tf.feature_column.categorical_column_with_identity("user", 10), 4)
assert sok1x.deeprec.group_embedding_columns.is_group_column(ev)
assert type(plain) is feature_column_v2.EmbeddingColumn
print(" ".join(installed))
"""


def test_only_install_patches_tensorflow():
    done = run_without([], _CHECK)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [
        "tf.nn.group_embedding_lookup_sparse", "tf.feature_column.group_embedding_column_scope",
        "tf.config.experimental.enable_distributed_strategy",
        "tf.config.experimental.enable_group_embedding",
        "tf.get_embedding_variable", "tf.EmbeddingVariableOption", "tf.InitializerOption",
        "tf.StorageOption", "tf.CounterFilter", "tf.CBFFilter", "tf.GlobalStepEvict",
        "tf.L2WeightEvict", "tf.feature_column.categorical_column_with_embedding",
        "tf.feature_column.embedding_column", "tf.feature_column.shared_embedding_columns",
        "tensorflow.python.ops.embedding_ops.group_embedding_lookup_sparse",
        "tensorflow.python.feature_column.feature_column_v2.group_embedding_column_scope",
        "tensorflow.python.framework.config.enable_distributed_strategy",
        "tensorflow.python.framework.config.enable_group_embedding",
        "tensorflow.python.feature_column.feature_column_v2.categorical_column_with_embedding"]
