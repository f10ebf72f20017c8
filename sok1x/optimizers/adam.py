"""sok1x.optimizers.Adam (SOK's sok.optimizers.Adam): Adam for sok1x embedding variables with
exactly tf.compat.v1.train.AdamOptimizer's semantics on IndexedSlices: every row's moments decay
each step (one fused pass over the shard on cuda), lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t),
var -= lr_t * m / (sqrt(v) + epsilon) for every row.
"""
from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.errors import UnsupportedOptimizerError
from sok1x.graph_ops.tf_compat import tf1
from sok1x.optimizers.initializer import InitializerMixin
from sok1x.optimizers.scope import OptimizerScope


class Adam(InitializerMixin):
    """Adam for sok1x embedding variables only (dense variables take a TensorFlow optimizer).

    learning_rate, beta_1, beta_2, epsilon: numbers, scalar tensors or callables returning them
    (a learning-rate schedule such as tf.compat.v1.train.exponential_decay is a tensor).
    It keeps TensorFlow's step state (beta1_power, beta2_power variables, created by the first
    apply_gradients); the moments m and v live in the engine beside the rows ("<name>/m", ...)."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, name="Adam"):
        self._adam = tf1.train.AdamOptimizer(learning_rate=learning_rate, beta1=beta_1,
                                             beta2=beta_2, epsilon=epsilon, name=name)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None,
                        experimental_aggregate_gradients=True):
        """Returns the op applying one Adam step to each (gradient, embedding variable) pair;
        increments `global_step` when given. experimental_aggregate_gradients: Keras' keyword,
        accepted as SOK's is and ignored (an embedding gradient is never summed over ranks).
        Raises UnsupportedOptimizerError for a variable that is not a sok1x embedding
        variable."""
        del experimental_aggregate_gradients
        pairs = list(grads_and_vars)
        for _, variable in pairs:
            if not is_embedding_variable(variable):
                raise UnsupportedOptimizerError(
                    "sok1x.optimizers.Adam updates sok1x embedding variables only; %s is not "
                    "one. Apply a TensorFlow optimizer to dense variables (their gradients "
                    "summed over ranks with sok1x.allreduce)."
                    % getattr(variable, "name", variable))
        with OptimizerScope([v for _, v in pairs]):
            return self._adam.apply_gradients(pairs, global_step=global_step, name=name)

    def get_name(self):
        return self._adam.get_name()

    def variables(self):
        """TensorFlow variables of the optimizer's step state (its moments live in the engine)."""
        return self._adam.variables()
