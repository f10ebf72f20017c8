"""install(): DeepRec's GroupEmbedding names on stock TensorFlow, by one explicit call (D12).

    import tensorflow as tf
    import sok1x
    sok1x.deeprec.install()      # the one added line
    tf.config.experimental.enable_distributed_strategy(strategy="collective")
    ...tf.nn.group_embedding_lookup_sparse(...) / tf.feature_column.group_embedding_column_scope()

install() sets, on the running TensorFlow, the names DeepRec (a fork of TensorFlow) adds:

    tf.nn.group_embedding_lookup_sparse              sok1x.group_embedding_lookup_sparse
    tf.feature_column.group_embedding_column_scope   sok1x.group_embedding_column_scope
    tf.config.experimental.enable_distributed_strategy   sok1x.enable_distributed_strategy
    tf.config.experimental.enable_group_embedding    (DeepRec's older spelling)
    tf.get_embedding_variable, tf.EmbeddingVariableOption, tf.InitializerOption,
    tf.StorageOption, tf.CounterFilter, tf.CBFFilter, tf.GlobalStepEvict, tf.L2WeightEvict
                                                     sok1x.deeprec's (embedding_variables.py)
    tf.feature_column.categorical_column_with_embedding, and embedding_column and
    shared_embedding_columns that take it (TensorFlow's own for other columns)
                                                     sok1x.deeprec's (embedding_variable_columns.py,
                                                     deeprec_embedding_columns.py)

on tf and tf.compat.v1 alike, and the same functions in the internal modules DeepRec's own
programs and tests import them from (tensorflow.python.ops.embedding_ops,
tensorflow.python.feature_column.feature_column_v2, tensorflow.python.framework.config).
Importing sok1x patches nothing; only this call does. Named after what it stands in for: a
DeepRec program runs with sok1x's implementations of DeepRec's names.
"""
import importlib

from sok1x.deeprec import (deeprec_embedding_columns, embedding_variable_columns,
                           embedding_variables)
from sok1x.deeprec.group_embedding import (enable_distributed_strategy, enable_group_embedding,
                                           group_embedding_lookup_sparse)
from sok1x.deeprec.group_embedding_columns import group_embedding_column_scope

INSTALLED_NAMES = (
    ("nn", "group_embedding_lookup_sparse", group_embedding_lookup_sparse),
    ("feature_column", "group_embedding_column_scope", group_embedding_column_scope),
    ("config.experimental", "enable_distributed_strategy", enable_distributed_strategy),
    ("config.experimental", "enable_group_embedding", enable_group_embedding),
) + tuple(("", name, getattr(embedding_variables, name)) for name in (
    # DeepRec's EmbeddingVariable API (embedding_variables.py), on tf itself
    "get_embedding_variable", "EmbeddingVariableOption", "InitializerOption", "StorageOption",
    "CounterFilter", "CBFFilter", "GlobalStepEvict", "L2WeightEvict")) + (
    # DeepRec's EmbeddingVariable feature columns (embedding_variable_columns.py)
    ("feature_column", "categorical_column_with_embedding",
     embedding_variable_columns.categorical_column_with_embedding),
    ("feature_column", "embedding_column", deeprec_embedding_columns.embedding_column),
    ("feature_column", "shared_embedding_columns",
     deeprec_embedding_columns.shared_embedding_columns),
)

# Internal modules (not public API: set only where the module imports) -> names set there.
INTERNAL_NAMES = (
    ("tensorflow.python.ops.embedding_ops", "group_embedding_lookup_sparse",
     group_embedding_lookup_sparse),
    ("tensorflow.python.feature_column.feature_column_v2", "group_embedding_column_scope",
     group_embedding_column_scope),
    ("tensorflow.python.framework.config", "enable_distributed_strategy",
     enable_distributed_strategy),
    ("tensorflow.python.framework.config", "enable_group_embedding", enable_group_embedding),
    ("tensorflow.python.feature_column.feature_column_v2", "categorical_column_with_embedding",
     embedding_variable_columns.categorical_column_with_embedding),
)


def _modules(path):
    """The module objects at dotted `path` under tf and tf.compat.v1 (those that exist)."""
    import tensorflow as tf
    found = []
    for root in (tf, tf.compat.v1):
        module = root
        for part in path.split(".") if path else ():
            module = getattr(module, part, None)
        if module is not None and all(module is not m for m in found):
            found.append(module)
    return found


def install():
    """Sets DeepRec's GroupEmbedding names on tf and tf.compat.v1 and in the internal modules
    DeepRec's programs import (idempotent). Returns the dotted names set, e.g.
    "tf.nn.group_embedding_lookup_sparse"."""
    installed = []
    for path, name, function in INSTALLED_NAMES:
        for module in _modules(path):
            setattr(module, name, function)
        installed.append(".".join(["tf"] + ([path] if path else []) + [name]))
    for path, name, function in INTERNAL_NAMES:
        try:
            module = importlib.import_module(path)
        except ImportError:
            continue
        setattr(module, name, function)
        installed.append("%s.%s" % (path, name))
    return installed
