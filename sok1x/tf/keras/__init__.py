"""sok1x.tf.keras: SOK's `sok.tf.keras` namespace; it holds sok1x.tf.keras.optimizers and
sok1x.tf.keras.mixed_precision."""
from sok1x.tf.keras import mixed_precision, optimizers  # noqa: F401
