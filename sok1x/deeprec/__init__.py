"""DeepRec's front door: GroupEmbedding (DESIGN D12) on sok1x's engine.

    group_embedding.py          group_embedding_lookup_sparse, enable_distributed_strategy
    group_embedding_columns.py  group_embedding_column_scope (feature columns looked up together)
    embedding_variables.py      get_embedding_variable and its options (EmbeddingVariable)
    embedding_variable_columns.py  categorical_column_with_embedding (EmbeddingVariable ids)
    deeprec_embedding_columns.py   embedding_column / shared_embedding_columns that take it
    deeprec_names.py            install(): DeepRec's names on the running TensorFlow

`sok1x.deeprec.install()` is the one explicit opt-in call; importing sok1x patches nothing.
"""
from sok1x.deeprec.deeprec_names import INSTALLED_NAMES, install  # noqa: F401
from sok1x.deeprec.deeprec_embedding_columns import (  # noqa: F401
    embedding_column, shared_embedding_columns)
from sok1x.deeprec.embedding_variable_columns import (  # noqa: F401
    categorical_column_with_embedding)
from sok1x.deeprec.embedding_variables import (  # noqa: F401
    CBFFilter, CounterFilter, EmbeddingVariableOption, GlobalStepEvict, InitializerOption,
    L2WeightEvict, StorageOption, get_embedding_variable)
