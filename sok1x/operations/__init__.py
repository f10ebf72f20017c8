"""SOK v1's sparse_operation_kit.operations: unique and unsorted_segment_sum (SOK's compat ops,
the same as sok1x.tf.unique / sok1x.tf.unsorted_segment_sum)."""
from sok1x.common import alias_modules
from sok1x.graph_ops.sparse_math_ops import unique, unsorted_segment_sum

alias_modules.install(__name__, {"compat_ops_lib": {
    "unique_op": unique, "unsorted_segment_sum_op": unsorted_segment_sum}})
__all__ = ["unique", "unsorted_segment_sum"]
