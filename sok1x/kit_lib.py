"""SOK's `sok.kit_lib` and `sok.tf_version` names, which SOK programs read to tell TensorFlow
versions apart."""
from sok1x.graph_ops.tf_compat import VERSION, tf2_behavior

tf_version = tuple(VERSION)


def in_tensorflow2():
    """SOK's kit_lib.in_tensorflow2: True when TensorFlow 2 behaviour is on (False on 1.15, and
    on TensorFlow 2 after tf.compat.v1.disable_v2_behavior(), where a TF1 program runs)."""
    return tf2_behavior()
