"""SOK v1's sok.get_embedding: a graph's embedding layers by name, made on first request."""
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import tf1

_STORE_KEY = "embedding_layer_store"


def get_embedding(name, constructor=None, **kwargs):
    """Returns the current graph's embedding layer called `name`, made by constructor(**kwargs)
    (and kept) the first time. Raises ValueError when there is none yet and no constructor."""
    layers = per_graph(tf1.get_default_graph(), _STORE_KEY, dict)
    layer = layers.get(name)
    if layer is None:
        if constructor is None:
            raise ValueError("embedding layer %r does not exist and cannot be made without a "
                             "constructor: pass constructor=sok1x.All2AllDenseEmbedding (or "
                             "another layer class) and its arguments" % (name,))
        layer = layers[name] = constructor(**kwargs)
    return layer
