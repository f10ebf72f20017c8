"""sok1x.optimizers.Adam (SOK's sok.optimizers.Adam): Adam for sok1x embedding variables with
exactly tf.compat.v1.train.AdamOptimizer's semantics on IndexedSlices: every row's moments decay
each step (one fused pass over the shard on cuda), lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t),
var -= lr_t * m / (sqrt(v) + epsilon) for every row.
"""
from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.errors import UnsupportedOptimizerError
from sok1x.graph_ops.tf_compat import tf1, trackable_base
from sok1x.optimizers.initializer import InitializerMixin
from sok1x.optimizers.scope import OptimizerScope


class Adam(InitializerMixin, trackable_base()):
    """Adam for sok1x embedding variables only (dense variables take a TensorFlow optimizer).

    learning_rate, beta_1, beta_2, epsilon: numbers, scalar tensors or callables returning them
    (a learning-rate schedule such as tf.compat.v1.train.exponential_decay is a tensor).
    It keeps TensorFlow's step state (beta1_power, beta2_power variables, created by the first
    apply_gradients), which Savers, a tf.train.Checkpoint of it (TensorFlow 2.x) and sok1x.dump
    / sok1x.load with it carry; the moments m and v live in the engine beside the rows
    ("<name>/m", ...)."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, name="Adam"):
        self._adam = tf1.train.AdamOptimizer(learning_rate=learning_rate, beta1=beta_1,
                                             beta2=beta_2, epsilon=epsilon, name=name)
        if hasattr(self, "_track_trackable"):
            self._track_trackable(self._adam, "adam")

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

    def get_slot_names(self):
        """The slot names ("m", "v") once a step or a dump / load made them."""
        return self._adam.get_slot_names()

    def get_slot(self, var, name):
        """The slot `name` of embedding variable `var`: a view of its engine slot."""
        return self._adam.get_slot(var, name)

    def _applier(self):
        """The optimizer whose update sok1x runs (its slot prefix is the tables' slots')."""
        return self._adam

    def step_variables(self, var_list=()):
        """[(name, variable)] of the step state (beta1_power, beta2_power), made now (with the
        slots of var_list, the embedding variables it updates) where the first step would."""
        if var_list:
            with tf1.init_scope():
                self._adam._create_slots(list(var_list))
        graph = None if tf1.executing_eagerly() else tf1.get_default_graph()
        return sorted(((name, variable) for (name, where), variable
                       in self._adam._non_slot_dict.items() if where is graph),
                      key=lambda pair: pair[0])

    def variables(self):
        """TensorFlow variables of the optimizer's step state (its moments live in the engine)."""
        return self._adam.variables()
