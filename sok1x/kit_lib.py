"""SOK's `sok.kit_lib` and `sok.tf_version` names, which SOK programs read to tell TensorFlow
versions apart."""
from sok1x.graph_ops.tf_compat import VERSION

tf_version = tuple(VERSION)


def in_tensorflow2():
    """True on TensorFlow 2.x (SOK's kit_lib.in_tensorflow2)."""
    return VERSION[0] >= 2
