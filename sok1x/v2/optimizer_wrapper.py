"""sok1x.OptimizerWrapper (SOK's v2 name): a TensorFlow optimizer that also updates sok1x
variables, with that optimizer's own sparse update math on the touched rows and their slots,
run by the engine's update rules (sok1x/engine/tables/optimizer_updates.py; DESIGN D2, D11).

The tf.compat.v1.train optimizers and the Keras OptimizerV2 ones (tf.compat.v1.keras.optimizers,
tf.keras.optimizers.legacy in TF 2.11+) are applied as they are, inside OptimizerScope, so their
hyper-parameter tensors, step counters and global_step are TensorFlow's (native_rules.py says
which). The Keras optimizers of TF 2.11+ (tf.keras.optimizers.SGD, ...) have no per-variable
sparse apply to redirect: for sok1x variables the wrapper applies a twin OptimizerV2 of the same
class and hyper-parameters whose sparse math is the same (the rule follows the twin); dense
variables keep the optimizer given.
"""
from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.errors import UnsupportedOptimizerError
from sok1x.graph_ops.tf_compat import keras_optimizer_base, tf1, trackable_base
from sok1x.optimizers import native_rules
from sok1x.optimizers.scope import OptimizerScope
from sok1x.v2 import wrapper_steps


def _lr(optimizer):
    """The twin's learning rate: the optimizer's LearningRateSchedule itself, which the twin
    applies at its own step count (the optimizer's own count never advances: its sparse steps
    are the twin's), else a callable reading the optimizer's current rate."""
    schedule = getattr(optimizer, "_learning_rate", None)
    if isinstance(schedule, tf1.keras.optimizers.schedules.LearningRateSchedule):
        return schedule

    def learning_rate():
        value = optimizer.learning_rate
        return tf1.cast(value() if callable(value) else value, tf1.float32)
    return learning_rate


def _hyper(optimizer, name):
    return float(tf1.keras.backend.get_value(getattr(optimizer, name)))


def _sgd_twin(optimizer):
    """Without momentum OptimizerV2's SGD; with it, one whose momentum decays on every row."""
    momentum = _hyper(optimizer, "momentum")
    if not momentum:
        return tf1.keras.optimizers.SGD(_lr(optimizer))
    return native_rules.all_rows_twin(tf1.keras.optimizers.SGD, _lr(optimizer), momentum=momentum,
                                      nesterov=bool(optimizer.nesterov))


def _ftrl_twin(o):
    return native_rules.all_rows_twin(
        tf1.keras.optimizers.Ftrl, _lr(o), learning_rate_power=_hyper(o, "learning_rate_power"),
        initial_accumulator_value=_hyper(o, "initial_accumulator_value"),
        l1_regularization_strength=_hyper(o, "l1_regularization_strength"),
        l2_regularization_strength=_hyper(o, "l2_regularization_strength"),
        l2_shrinkage_regularization_strength=_hyper(o, "l2_shrinkage_regularization_strength"),
        beta=_hyper(o, "beta"))


# Keras (TF 2.11+) optimizer class name -> twin OptimizerV2 with the same sparse math (checked
# against them in tests/cpu/jobs/new_keras_refusal_job.py and v2_eager_job.py). SGD with
# momentum, Adamax, Adadelta and Ftrl decay (or recompute) every row's state and move every row
# on a sparse gradient: their twins' rules run on every row (native_rules.all_rows_twin).
_TWINS = {
    "SGD": _sgd_twin,
    "Adamax": lambda o: native_rules.all_rows_twin(
        tf1.keras.optimizers.Adamax, _lr(o), beta_1=_hyper(o, "beta_1"),
        beta_2=_hyper(o, "beta_2"), epsilon=_hyper(o, "epsilon")),
    "Adadelta": lambda o: native_rules.all_rows_twin(
        tf1.keras.optimizers.Adadelta, _lr(o), rho=_hyper(o, "rho"),
        epsilon=_hyper(o, "epsilon")),
    "Ftrl": _ftrl_twin,
    "Adam": lambda o: tf1.keras.optimizers.Adam(
        _lr(o), beta_1=_hyper(o, "beta_1"), beta_2=_hyper(o, "beta_2"),
        epsilon=_hyper(o, "epsilon"), amsgrad=bool(o.amsgrad)),
    "Adagrad": lambda o: tf1.keras.optimizers.Adagrad(
        _lr(o), initial_accumulator_value=_hyper(o, "initial_accumulator_value"),
        epsilon=_hyper(o, "epsilon")),
}
# Not here (refused, as SOK refuses every TF 2.11+ Keras optimizer): RMSprop, Nadam, AdamW,
# Lion...; use their OptimizerV2 forms (tf.keras.optimizers.legacy).


def _new_keras_base():
    base = keras_optimizer_base()
    legacy_base = tf1.keras.optimizers.Optimizer
    return None if base is None or base is legacy_base else base


def is_new_keras(optimizer):
    """True for a TF 2.11+ Keras optimizer (not the legacy OptimizerV2): sok1x applies it to its
    variables through a twin OptimizerV2 (see _TWINS), or refuses it."""
    base = _new_keras_base()
    return base is not None and isinstance(optimizer, base)


def _twin_of(optimizer):
    """The OptimizerV2 standing in for a TF 2.11+ Keras optimizer on sok1x variables, None for
    an optimizer sok1x applies as it is; raises UnsupportedOptimizerError."""
    if not is_new_keras(optimizer):
        return None
    make = _TWINS.get(type(optimizer).__name__)
    twin = make(optimizer) if make is not None else None
    if twin is None:
        raise UnsupportedOptimizerError(
            "sok1x.OptimizerWrapper: the TF 2.11+ Keras optimizer %s is not supported for sok1x "
            "variables (SOK refuses these too: its wrapper needs the legacy OptimizerV2). On a "
            "sparse gradient it updates state, and rows, beyond the gradient's rows, which "
            "sok1x's row updates do not reproduce. Call sok1x.init() first (as SOK's programs "
            "do: use_legacy_optimizer=True makes tf.keras.optimizers and tf.optimizers the "
            "legacy ones) or use tf.keras.optimizers.legacy.%s. TF 2.11+ Keras optimizers "
            "supported through a twin: SGD, Adam, Adagrad, Adamax, Adadelta and Ftrl."
            % (type(optimizer).__name__, type(optimizer).__name__))
    return twin


class OptimizerWrapper(trackable_base()):
    """Wraps a TensorFlow optimizer so that it updates sok1x.Variable / DynamicVariable handles
    (and v1 embedding variables) beside dense variables. Steps applied through the wrapper
    count on its own step counter (SOK's), which checkpoints of the optimizer hold
    (wrapper_steps.py); on TensorFlow 2.x a tf.train.Checkpoint takes the wrapper itself too.
    Raises UnsupportedOptimizerError for an optimizer whose math sok1x does not reproduce."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        self._own_steps = wrapper_steps.OwnStepState(optimizer)
        self._twin = _twin_of(optimizer)
        applied = self._twin if self._twin is not None else optimizer
        if native_rules.builder_for(applied) is None:
            raise UnsupportedOptimizerError(
                "sok1x.OptimizerWrapper: %s is not supported for sok1x variables. Supported: %s"
                % (type(optimizer).__name__, native_rules.SUPPORTED))
        if self._twin is not None:
            wrapper_steps.track_twin(optimizer, self._twin)
        if hasattr(type(self), "_track_trackable") and hasattr(optimizer, "_track_trackable"):
            self._track_trackable(optimizer, "optimizer")

    @property
    def optimizer(self):
        """The wrapped TensorFlow optimizer."""
        return self._optimizer

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, **keras_options):
        """Applies one step to every (gradient, variable) pair: sok1x variables through the
        engine, others by the wrapped optimizer. keras_options (a Keras optimizer's
        experimental_aggregate_gradients, skip_gradients_aggregation) go to the wrapped
        optimizer's own apply_gradients. Returns its op (graph mode) or result."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        embedding = [v for _, v in pairs if is_embedding_variable(v)]
        kwargs = dict(keras_options)
        if name is not None:
            kwargs["name"] = name
        if global_step is not None:
            kwargs["global_step"] = global_step
        if self._twin is None:
            with OptimizerScope(embedding), self._own_steps:
                return self._optimizer.apply_gradients(pairs, **kwargs)
        dense = [(g, v) for g, v in pairs if not is_embedding_variable(v)]
        sparse = [(g, v) for g, v in pairs if is_embedding_variable(v)]
        results = []
        if sparse:
            # Never all-reduced over a strategy's replicas: each rank's embedding gradients are
            # its own shard's rows (under MultiWorkerMirroredStrategy an all-reduce would mix
            # the ranks' shards), whatever the caller asked of the dense half.
            with OptimizerScope(embedding):
                results.append(self._twin.apply_gradients(
                    sparse, experimental_aggregate_gradients=False))
        if dense:
            results.append(self._optimizer.apply_gradients(dense, **keras_options))
        if tf1.executing_eagerly():
            return results[-1] if results else None
        return tf1.group(*results)

    def _applier(self):
        """The optimizer that updates sok1x variables: the twin, or the wrapped one."""
        return self._twin if self._twin is not None else self._optimizer

    def get_slot_names(self):
        """The slot names of the optimizer that updates sok1x variables."""
        return self._applier().get_slot_names()

    def get_slot(self, var, name):
        """The slot `name` of `var`: for a sok1x variable a view of its engine slot
        (sok1x/v2/slot_views.py), as SOK's wrapper gives its DynamicVariable slot."""
        return self._applier().get_slot(var, name)

    def step_variables(self, var_list=()):
        """[(name, variable)]: the step state the wrapper updates sok1x variables with (its
        twin's `iterations`, or its own step counters). Makes it, and the slots of var_list
        (the sok1x variables it updates), now where the first step would make them."""
        if self._twin is not None:
            wrapper_steps.make_keras_v2_state(self._twin, var_list)
            return [("iterations", self._twin.iterations)]
        self._own_steps.make(var_list)
        return self._own_steps.variables()

    def __getattr__(self, name):
        if name.startswith("_self_") or name == "_optimizer":
            # Trackable's own state (made on first use) is the wrapper's, never the optimizer's
            raise AttributeError(name)
        return getattr(self._optimizer, name)
