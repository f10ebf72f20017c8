"""SOK v2's sparse_operation_kit.dynamic_variable: DynamicVariable, export and assign."""
from sok1x.v2.shard_access import assign, export  # noqa: F401
from sok1x.v2.variables import DynamicVariable  # noqa: F401

__all__ = ["DynamicVariable", "assign", "export"]
