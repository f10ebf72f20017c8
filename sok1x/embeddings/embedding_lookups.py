"""SOK v1's embeddings.embedding_ops: embedding_lookup over a layer's embedding variable, the
comm tools SOK knows and the rank's replica id."""
from sok1x.engine import runtime
from sok1x.graph_ops import embedding_ops
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.graph_ops.tf_compat import tf1

CommToolSet = set(["Strategy", "MPI", "Horovod", "OneDevice"])


def get_global_replica_id(comm_tool=None, var=None):
    """Returns this rank's id in the job (sok1x has one replica per rank, whatever comm_tool)."""
    del comm_tool, var
    return runtime.get().rank


def embedding_lookup(embedding_variable, values, training=True, dynamic_input=False):
    """Returns float32 [*values.shape, dim]: the vectors of int keys `values` from the table of
    `embedding_variable` (an All2AllDenseEmbedding's embedding_variable), as the layer looks
    them up. Raises TypeError for another variable."""
    del dynamic_input  # any key shape is accepted
    table = table_of(embedding_variable)
    if table is None:
        raise TypeError("embedding_lookup: %r is not a sok1x embedding variable (pass a layer's "
                        "embedding_variable)" % (embedding_variable,))
    keys = tf1.cast(tf1.convert_to_tensor(values), tf1.int64)
    return embedding_ops.dense_lookup(table, embedding_variable.read_value(), keys,
                                      bool(training), None, "embedding_lookup")
