"""sok1x.tf.keras.optimizers (SOK's sok.tf.keras.optimizers): optimizers for dense and sok1x
embedding variables alike, with the arguments of their TensorFlow counterparts.

    Adam                 tf.keras.optimizers.Adam (Keras OptimizerV2); embedding variables get
                         its sparse update (every row's moments decay) through the engine
    LazyAdamOptimizer    tf.contrib.opt.LazyAdamOptimizer: only rows with a gradient move
"""
from sok1x.optimizers.keras_adam import Adam
from sok1x.optimizers.lazy_adam import LazyAdamOptimizer

__all__ = ["Adam", "LazyAdamOptimizer"]

# SOK v1's modules of this package: sok.tf.keras.optimizers.adam and .lazy_adam.
from sok1x.common import alias_modules  # noqa: E402

alias_modules.install(__name__, {"adam": {"Adam": Adam},
                                 "lazy_adam": {"LazyAdamOptimizer": LazyAdamOptimizer}})
