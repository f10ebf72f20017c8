"""SOK v1's sparse_operation_kit.embeddings: the modules all2all_dense_embedding,
distributed_embedding, get_embedding_op, embedding_ops and tf_distributed_embedding."""
from sok1x.common import alias_modules
from sok1x.embeddings.embedding_lookups import CommToolSet, embedding_lookup
from sok1x.embeddings.embedding_lookups import get_global_replica_id
from sok1x.embeddings.layer_store import get_embedding
from sok1x.v1.layers import All2AllDenseEmbedding, DistributedEmbedding

alias_modules.install(__name__, {
    "all2all_dense_embedding": {"All2AllDenseEmbedding": All2AllDenseEmbedding},
    "distributed_embedding": {"DistributedEmbedding": DistributedEmbedding},
    "get_embedding_op": {"get_embedding": get_embedding},
    "embedding_ops": {"CommToolSet": CommToolSet, "embedding_lookup": embedding_lookup,
                      "get_global_replica_id": get_global_replica_id},
})
