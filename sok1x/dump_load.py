"""SOK v2's sparse_operation_kit.dump_load: dump, load and incremental_model_dump."""
from sok1x.v2.checkpoint_api import dump, incremental_model_dump, load  # noqa: F401

__all__ = ["dump", "incremental_model_dump", "load"]
