"""SOK v1's sparse_operation_kit.core: EmbeddingVariable (isinstance of a sok1x embedding
variable), GraphKeys, InPlaceInitializer, in_tensorflow2, and its modules context_scope,
graph_keys, initialize, inplace_initializer, embedding_variable_v1 and embedding_variable_v2."""
from sok1x.common import alias_modules
from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.kit_lib import in_tensorflow2
from sok1x.optimizers.scope import OptimizerScope


class _EmbeddingVariableType(type):
    def __instancecheck__(cls, instance):
        return is_embedding_variable(instance)


class EmbeddingVariable(metaclass=_EmbeddingVariableType):
    """SOK's EmbeddingVariable as a type to test against: isinstance(v, EmbeddingVariable) is
    True for the variables of sok1x's layers and tables (layer.embedding_variable). Made by the
    layers only: constructing one raises TypeError."""

    def __init__(self, *args, **kwargs):
        raise TypeError("sok1x embedding variables are made by the layers (sok1x."
                        "All2AllDenseEmbedding, DistributedEmbedding) or sok1x.Variable")


class GraphKeys(object):
    """SOK's graph collection names."""
    SparseOperationKitEmbeddingLayers = "SparseOperationKitEmbeddingLayers"
    SparseOperationKitOptimizer = "SparseOperationKitOptimizer"


class InPlaceInitializer(object):
    """SOK's record of initializer options: keyword arguments become attributes; serialize()
    returns them as a dict, deserialize(dict) makes one back."""

    def __init__(self, **kwargs):
        for key, value in kwargs.items():
            setattr(self, key, value)

    def serialize(self):
        return self.__dict__

    @classmethod
    def deserialize(cls, *args, **unused):
        initializer = cls.__new__(cls)
        for key, value in args[0].items():
            setattr(initializer, key, value)
        return initializer


def _init(**kwargs):
    import sok1x
    return sok1x.Init(**kwargs)


alias_modules.install(__name__, {
    "context_scope": {"OptimizerScope": OptimizerScope},
    "graph_keys": {"GraphKeys": GraphKeys},
    "initialize": {"Init": _init},
    "inplace_initializer": {"InPlaceInitializer": InPlaceInitializer},
    "embedding_variable_v1": {"EmbeddingVariable": EmbeddingVariable},
    "embedding_variable_v2": {"EmbeddingVariable": EmbeddingVariable},
})
__all__ = ["EmbeddingVariable", "GraphKeys", "InPlaceInitializer", "in_tensorflow2"]
