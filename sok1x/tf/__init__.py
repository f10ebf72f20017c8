"""sok1x.tf: SOK v1's `sok.tf` namespace: sok1x.tf.unique, sok1x.tf.unsorted_segment_sum (as
tf.unique and tf.math.unsorted_segment_sum) and sok1x.tf.keras (optimizers, mixed_precision)."""
from sok1x.graph_ops.sparse_math_ops import unique, unsorted_segment_sum  # noqa: F401
from sok1x.tf import keras  # noqa: F401
