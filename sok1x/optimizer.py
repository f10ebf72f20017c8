"""SOK v2's sparse_operation_kit.optimizer: OptimizerWrapper (one class serves SOK's
OptimizerWrapperV1 and OptimizerWrapperV2, TF1 and Keras optimizers) and SGD."""
from sok1x.v2.optimizer_wrapper import OptimizerWrapper
from sok1x.v2.sok_names import SGD  # noqa: F401

OptimizerWrapperV1 = OptimizerWrapperV2 = OptimizerWrapper
__all__ = ["OptimizerWrapper", "OptimizerWrapperV1", "OptimizerWrapperV2", "SGD"]
