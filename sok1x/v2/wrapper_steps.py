"""The step state sok1x.OptimizerWrapper keeps apart from the optimizer it wraps, and how it is
saved: a TF 2.11+ Keras optimizer's twin OptimizerV2 (its `iterations`), or the wrapper's own
step counter (a Keras OptimizerV2's `iterations`, a tf.compat.v1.train optimizer's non-slot
variables such as Adam's beta powers), as SOK's wrapper counts its steps apart.

Every piece is a TensorFlow variable, so tf.compat.v1.train.Saver and MonitoredTrainingSession
carry it in graph mode; each is also a checkpoint dependency of the wrapped optimizer (the twin
as "sok1x_twin", the own counters as "sok1x_wrapper_<name>"), so a tf.train.Checkpoint of the
optimizer (or of the wrapper, which depends on it as "optimizer") saves it and restores it,
also into a state made after the restore. sok1x.dump / sok1x.load with the wrapper carry it
beside the tables (variables() below; sok1x/v2/checkpoint_api.py).
"""
from sok1x.graph_ops.tf_compat import tf1

TWIN_DEPENDENCY = "sok1x_twin"
OWN_PREFIX = "sok1x_wrapper_"


def _tracks(optimizer):
    return callable(getattr(optimizer, "_track_trackable", None))


def track_twin(optimizer, twin):
    """Makes the twin OptimizerV2 `twin` a checkpoint dependency of the Keras `optimizer`."""
    if _tracks(optimizer):
        optimizer._track_trackable(twin, TWIN_DEPENDENCY, overwrite=True)


def _keras_v2(optimizer):
    return isinstance(optimizer, tf1.keras.optimizers.Optimizer)


def _v1_train(optimizer):
    return isinstance(optimizer, tf1.train.Optimizer)


def _current_graph():
    return None if tf1.executing_eagerly() else tf1.get_default_graph()


def make_keras_v2_state(optimizer, var_list):
    """Makes what a Keras OptimizerV2's first step makes (its `iterations`, hyper-parameter
    variables, the slots of `var_list`), now."""
    with tf1.init_scope():
        _ = optimizer.iterations  # made on first use
        optimizer._create_hypers()
        if var_list:
            optimizer._create_slots(list(var_list))


class OwnStepState:
    """As SOK's wrapper: the steps applied through it count on a step counter of its own, not on
    the wrapped optimizer's (a Keras OptimizerV2's `iterations`, a tf.compat.v1.train
    optimizer's non-slot variables such as Adam's beta powers), so a program may apply the same
    optimizer object to its dense variables too without advancing the wrapper's bias
    corrections twice a step. Inside `with state:` the optimizer counts on them."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        self._iterations = None
        self._non_slot_dict = {}
        self._saved = None

    def __enter__(self):
        opt = self._optimizer
        if _keras_v2(opt):
            if self._iterations is None:
                self._make_iterations()
            self._saved = [("_iterations", opt._iterations)]
            opt._iterations = self._iterations
        elif _v1_train(opt):
            own = vars(opt)
            self._saved = [("_non_slot_dict", opt._non_slot_dict)]
            if "_create_non_slot_variable" in own:
                self._saved.append(("_create_non_slot_variable", own["_create_non_slot_variable"]))
            opt._non_slot_dict = self._non_slot_dict
            opt._create_non_slot_variable = self._tracked_non_slot_maker()
        return self

    def __exit__(self, *exc):
        if self._saved is None:
            return
        own = vars(self._optimizer)
        own.pop("_create_non_slot_variable", None)
        for name, value in self._saved:
            setattr(self._optimizer, name, value)
        self._saved = None

    def _make_iterations(self):
        with tf1.init_scope():
            self._iterations = tf1.Variable(
                0, dtype=tf1.int64, trainable=False, use_resource=True,
                name="sok1x_wrapper_iterations")
        if _tracks(self._optimizer):  # restores it now where a restore waits for it
            self._optimizer._track_trackable(self._iterations, OWN_PREFIX + "iterations",
                                             overwrite=True)

    def _tracked_non_slot_maker(self):
        """The optimizer's _create_non_slot_variable, tracking what it makes for the wrapper
        (a restore waiting for it is applied before the variable is first read)."""
        opt = self._optimizer
        make = type(opt)._create_non_slot_variable

        def create_non_slot_variable(initial_value, name, colocate_with):
            known = set(map(id, self._non_slot_dict.values()))
            variable = make(opt, initial_value, name, colocate_with)
            if id(variable) not in known and _tracks(opt):
                opt._track_trackable(variable, OWN_PREFIX + name, overwrite=True)
            return variable
        return create_non_slot_variable

    def make(self, var_list):
        """Makes the step state, and the wrapped optimizer's slots of `var_list` (the variables
        it will update), now, as its first step would (a load before the first step restores
        into them)."""
        opt = self._optimizer
        if _keras_v2(opt):
            with self:
                make_keras_v2_state(opt, var_list)
        elif _v1_train(opt) and var_list:
            with self, tf1.init_scope():
                opt._create_slots(list(var_list))

    def variables(self):
        """[(name, variable)] of the step state made so far, in the current graph."""
        if self._iterations is not None:
            return [("iterations", self._iterations)]
        graph = _current_graph()
        return sorted(((name, variable) for (name, where), variable
                       in self._non_slot_dict.items() if where is graph), key=lambda x: x[0])
