"""sok1x's embedding optimizers (DESIGN D2) and the scope for native ones.

    sok1x.optimizers.Adam                    Adam for embedding variables (TF1 Adam's semantics)
    sok1x.tf.keras.optimizers.Adam           Keras Adam for dense and embedding variables
    sok1x.tf.keras.optimizers.LazyAdamOptimizer   tf.contrib's LazyAdam, both kinds of variables
    sok1x.OptimizerScope(embedding_vars)     inside it, these native optimizers update embedding
        variables through the engine with their own math and hyper-parameters:
        tf.compat.v1.train GradientDescent, Momentum, Adagrad, Adam, Ftrl, RMSProp, Adadelta
        optimizers, and Keras (tf.compat.v1.keras.optimizers) SGD, Adam, Adagrad, RMSprop, Ftrl,
        Adamax, Adadelta.

Importing this package installs the guard (guard.py) that makes any other optimizer, or a native
one outside the scope, raise UnsupportedOptimizerError for an embedding variable.
"""
from sok1x.optimizers import guard as _guard
from sok1x.optimizers.adam import Adam
from sok1x.optimizers.keras_adam import Adam as KerasAdam
from sok1x.optimizers.lazy_adam import LazyAdamOptimizer
from sok1x.optimizers.scope import OptimizerScope

_guard.install()


def split_embedding_variable_from_others(variables):
    """SOK v1's sok.optimizers.split_embedding_variable_from_others (the same as
    sok1x.split_embedding_variable_from_others): (embedding_vars, other_vars)."""
    from sok1x.common.handle_variable import split_embedding_variable_from_others as split
    return split(variables)


__all__ = ["Adam", "KerasAdam", "LazyAdamOptimizer", "OptimizerScope",
           "split_embedding_variable_from_others"]
