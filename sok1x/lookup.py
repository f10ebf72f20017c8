"""SOK v2's sparse_operation_kit.lookup: lookup_sparse, all2all_dense_embedding and
sparse_read_and_evict."""
from sok1x.v2.lookup import lookup_sparse  # noqa: F401
from sok1x.v2.sok_names import all2all_dense_embedding, sparse_read_and_evict  # noqa: F401

__all__ = ["all2all_dense_embedding", "lookup_sparse", "sparse_read_and_evict"]
