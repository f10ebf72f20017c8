"""sok1x: model-parallel GPU embedding tables for TensorFlow 1.x-style graph programs, with
SparseOperationKit's API (`import sok1x as sok`).

Embedding tables are sharded over every rank of an MPI job (one process per GPU) while dense layers
stay data parallel. Start with sok1x.Init(global_batch_size=...) (graph mode) or sok1x.init().

TensorFlow is imported only when a name that needs it is first used, so the engine
(sok1x.engine, sok1x.backend, sok1x.comm) also runs where TensorFlow is not installed.
"""
import importlib
import importlib.util

from sok1x import errors  # noqa: F401  (public: sok1x.errors)
from sok1x.engine import runtime as _runtime

__version__ = "0.1.0"

# Public name -> module that defines it; each loads (and imports TensorFlow) on first use.
_LAZY = {
    "All2AllDenseEmbedding": "sok1x.v1.layers",
    "DistributedEmbedding": "sok1x.v1.layers",
    "InitHook": "sok1x.v1.hooks",
    "BroadcastGlobalVariablesHook": "sok1x.v1.hooks",
    "allreduce": "sok1x.graph_ops.collective_ops",
    "broadcast_variables": "sok1x.graph_ops.collective_ops",
    "new_tower": "sok1x.graph_ops.ordering",
    "split_embedding_variable_from_others": "sok1x.common.handle_variable",
    "optimizers": "sok1x.optimizers",
    "OptimizerScope": "sok1x.optimizers",
    "tf": "sok1x.tf",
    "unique": "sok1x.graph_ops.sparse_math_ops",
    "unsorted_segment_sum": "sok1x.graph_ops.sparse_math_ops",
    "deeprec": "sok1x.deeprec",
    "enable_distributed_strategy": "sok1x.deeprec.group_embedding",
    "enable_group_embedding": "sok1x.deeprec.group_embedding",
    "sync_to_variables": "sok1x.deeprec.plain_variables",
    "group_embedding_lookup_sparse": "sok1x.deeprec.group_embedding",
    "group_embedding_column_scope": "sok1x.deeprec.group_embedding_columns",
    "Variable": "sok1x.v2.variables",
    "DynamicVariable": "sok1x.v2.variables",
    "lookup_sparse": "sok1x.v2.lookup",
    "OptimizerWrapper": "sok1x.v2.optimizer_wrapper",
    "export": "sok1x.v2.shard_access",
    "assign": "sok1x.v2.shard_access",
    "sparse_read_and_evict": "sok1x.v2.sok_names",
    "all2all_dense_embedding": "sok1x.v2.sok_names",
    "filter_variables": "sok1x.v2.sok_names",
    "SGD": "sok1x.v2.sok_names",
    "dump": "sok1x.v2.checkpoint_api",
    "load": "sok1x.v2.checkpoint_api",
    "incremental_model_dump": "sok1x.v2.checkpoint_api",
    "Saver": "sok1x.v1.saver",
    "kit_lib": "sok1x.kit_lib",
    "GraphKeys": "sok1x.core",
    "get_embedding": "sok1x.embeddings.layer_store",
    "set_comm_tool": "sok1x.communication",
    "DistributedVariable": "sok1x.distributed_variable",
    "LocalizedVariable": "sok1x.distributed_variable",
    "core": "sok1x.core",
    "embeddings": "sok1x.embeddings",
    "experiment": "sok1x.experiment",
    "operations": "sok1x.operations",
    "tf_version": "sok1x.kit_lib",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError("module 'sok1x' has no attribute %r" % name)
    # Every TensorFlow-side name also installs the guard on native optimizers (D2).
    importlib.import_module("sok1x.optimizers")
    loaded = importlib.import_module(module)
    value = loaded if module == "sok1x." + name else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


def Init(**kwargs):  # noqa: N802  (SOK's v1 name)
    """Returns the graph's Init op; running it brings sok1x up on every rank (collective,
    idempotent). kwargs: global_batch_size (checked equal on every rank), backend ("auto",
    "cuda" or "cpu"); other SOK options are accepted. Every sok1x variable initializer depends
    on this op, so tf.compat.v1.global_variables_initializer() also brings sok1x up.
    Executing eagerly (TensorFlow 2), as SOK's, it brings sok1x up at once and returns None."""
    from sok1x.graph_ops import init_ops
    from sok1x.graph_ops.tf_compat import tf1
    if tf1.executing_eagerly():
        _runtime.init(**kwargs)
        from sok1x.graph_ops import boundary
        boundary.announce()
        return None
    return init_ops.init_op(**kwargs)


def init(comm_tool="horovod", use_legacy_optimizer=True, **kwargs):
    """Brings sok1x up now (SOK's v2 name); same options as Init. Collective and idempotent.
    comm_tool: SOK's (sok1x talks MPI whatever it says). use_legacy_optimizer: as SOK's, on
    TensorFlow 2.11+ tf.keras.optimizers and tf.optimizers become their legacy (OptimizerV2)
    modules; False keeps (or puts back) TensorFlow's own. Without TensorFlow installed (the
    engine alone, as on the GPU test machines) only the engine comes up."""
    del comm_tool
    _runtime.init(**kwargs)
    if importlib.util.find_spec("tensorflow") is not None:
        from sok1x.graph_ops import boundary
        from sok1x.graph_ops.tf_compat import use_legacy_keras_optimizers
        use_legacy_keras_optimizers(bool(use_legacy_optimizer))
        boundary.announce()


def rank():
    """Returns this process's rank (sok1x must be initialized)."""
    return _runtime.get().rank


def num_gpus():
    """Returns the number of ranks in the job (one GPU each)."""
    return _runtime.get().size


# Not "tf": `from sok1x import *` must not shadow a program's `import tensorflow as tf`.
__all__ = sorted(["Init", "errors", "init", "num_gpus", "rank"] + [n for n in _LAZY if n != "tf"])
