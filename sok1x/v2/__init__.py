"""SOK's v2 front door: Variable and DynamicVariable, lookup_sparse, OptimizerWrapper,
export/assign/sparse_read_and_evict, dump/load/incremental_model_dump. Public names are indexed
in sok1x/__init__.py."""
