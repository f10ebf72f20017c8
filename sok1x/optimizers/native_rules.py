"""How each supported native optimizer updates a sok1x table: the engine rule, the hyper-parameter
tensors it reads and its constants, taken from the optimizer itself, so the math and the
hyper-parameters (tensors, schedules, step counters) are those of its own sparse apply (DESIGN D2).

A builder runs inside the optimizer's apply_gradients, after the optimizer prepared its tensors.
Optimizers are matched by exact class: a subclass may change the math, so it is not supported.
"""
import collections

from sok1x.engine.tables import optimizer_updates
from sok1x.graph_ops.tf_compat import tf1

Update = collections.namedtuple("Update", "rule hyper options")
Update.__doc__ = ("rule: a sok1x.engine.tables.optimizer_updates rule; hyper: name -> scalar "
                  "tensor or number; options: name -> Python constant.")

_FLOAT = tf1.float32

SUPPORTED = (
    "sok1x.optimizers.Adam, sok1x.tf.keras.optimizers.Adam and "
    "sok1x.tf.keras.optimizers.LazyAdamOptimizer; and, inside "
    "`with sok1x.OptimizerScope(embedding_vars):`, tf.compat.v1.train.GradientDescentOptimizer, "
    "MomentumOptimizer, AdagradOptimizer, AdamOptimizer, FtrlOptimizer, RMSPropOptimizer and "
    "AdadeltaOptimizer, and the Keras optimizers SGD, Adam, Adagrad, RMSprop, Ftrl, Adamax and "
    "Adadelta of tf.compat.v1.keras.optimizers "
    "(tf.keras.optimizers in TF 1.15, tf.keras.optimizers.legacy in TF 2.11+), and TF 2.11+ "
    "Keras SGD, Adam, Adagrad, Adamax, Adadelta and Ftrl (tf.keras.optimizers)")


def _float(value):
    return tf1.cast(value, _FLOAT)


def _accumulator_options(opt):
    return {"initial_accumulator": float(opt._initial_accumulator_value)}


# ---- tf.compat.v1.train ---------------------------------------------------------------------

def _v1_gradient_descent(opt):
    return Update("sgd", {"lr": opt._learning_rate_tensor}, {})


def _v1_momentum(opt):
    return Update("momentum", {"lr": opt._learning_rate_tensor, "momentum": opt._momentum_tensor},
                  {"nesterov": bool(opt._use_nesterov)})


def _v1_adagrad(opt):
    return Update("adagrad", {"lr": opt._learning_rate_tensor, "epsilon": 0.0},
                  _accumulator_options(opt))


def v1_adam_hyper(opt):
    """Hyper-parameters of a tf.compat.v1.train.AdamOptimizer step, lr_t bias-corrected with its
    beta1_power / beta2_power variables (read before its _finish advances them)."""
    beta1_power, beta2_power = opt._get_beta_accumulators()
    beta1_power, beta2_power = _float(beta1_power), _float(beta2_power)
    lr_t = _float(opt._lr_t) * tf1.sqrt(1 - beta2_power) / (1 - beta1_power)
    return {"lr_t": lr_t, "beta1": opt._beta1_t, "beta2": opt._beta2_t, "epsilon": opt._epsilon_t}


def _v1_adam(opt):
    return Update("adam", v1_adam_hyper(opt), {})


def v1_lazy_adam(opt):
    """tf.contrib.opt.LazyAdamOptimizer's update: AdamOptimizer's hyper-parameters, touched rows."""
    return Update("lazy_adam", v1_adam_hyper(opt), {})


def _v1_ftrl(opt):
    # TF 2.x folds `beta` into an adjusted l2; TF 1.15 has the plain one.
    l2 = getattr(opt, "_adjusted_l2_regularization_strength_tensor", None)
    if l2 is None:
        l2 = opt._l2_regularization_strength_tensor
    hyper = {"lr": opt._learning_rate_tensor, "lr_power": opt._learning_rate_power_tensor,
             "l1": opt._l1_regularization_strength_tensor, "l2": l2,
             "l2_shrinkage": opt._l2_shrinkage_regularization_strength_tensor}
    return Update("ftrl", hyper, _accumulator_options(opt))


def _v1_adadelta(opt):
    return Update("adadelta", {"lr": opt._lr_t, "rho": opt._rho_t, "epsilon": opt._epsilon_t}, {})


def _v1_rmsprop(opt):
    hyper = {"lr": opt._learning_rate_tensor, "rho": opt._decay_tensor,
             "momentum": opt._momentum_tensor, "epsilon": opt._epsilon_tensor}
    return Update("rmsprop", hyper, {"initial_rms": 1.0, "centered": bool(opt._centered)})


# ---- Keras OptimizerV2 (tf.compat.v1.keras.optimizers) --------------------------------------

def _keras_lr(opt):
    return opt._decayed_lr(_FLOAT)


def _keras_hyper(opt, name):
    return opt._get_hyper(name, _FLOAT)


def _keras_sgd(opt):
    if not opt._momentum:
        return Update("sgd", {"lr": _keras_lr(opt)}, {})
    hyper = {"lr": _keras_lr(opt), "momentum": _keras_hyper(opt, "momentum")}
    return Update("keras_momentum", hyper, {"nesterov": bool(opt.nesterov)})


class AllRows:
    """Marks a Keras OptimizerV2 that stands for its TF 2.11+ Keras namesake on sok1x tables:
    its rule runs on every row (optimizer_updates.ALL_ROWS), as that one's sparse update does.
    Made by all_rows_twin."""


_ALL_ROWS_CLASSES = {}


def all_rows_twin(keras_v2_class, *args, **kwargs):
    """A `keras_v2_class` (a tf.compat.v1.keras.optimizers class) optimizer made with
    (*args, **kwargs) whose updates of sok1x tables run on every row (AllRows)."""
    cls = _ALL_ROWS_CLASSES.get(keras_v2_class)
    if cls is None:
        cls = type("AllRows" + keras_v2_class.__name__, (AllRows, keras_v2_class), {})
        _ALL_ROWS_CLASSES[keras_v2_class] = cls
    return cls(*args, **kwargs)


def _base_class(optimizer):
    """The OptimizerV2 class an AllRows optimizer is made of (else its own class)."""
    cls = type(optimizer)
    return cls.__mro__[2] if isinstance(optimizer, AllRows) else cls


def _on_every_row(rule):
    return rule if rule.endswith(optimizer_updates.ALL_ROWS) or rule == "sgd" else (
        rule + optimizer_updates.ALL_ROWS)


def keras_adam(opt):
    """Keras Adam's sparse update: moments of every row decay; amsgrad keeps vhat."""
    step = _float(opt.iterations + 1)
    beta1, beta2 = _keras_hyper(opt, "beta_1"), _keras_hyper(opt, "beta_2")
    lr_t = _keras_lr(opt) * tf1.sqrt(1 - tf1.pow(beta2, step)) / (1 - tf1.pow(beta1, step))
    hyper = {"lr_t": lr_t, "beta1": beta1, "beta2": beta2, "epsilon": opt.epsilon}
    return Update("adam", hyper, {"amsgrad": bool(opt.amsgrad)})


def _keras_adamax(opt):
    step = _float(opt.iterations + 1)
    beta1 = _keras_hyper(opt, "beta_1")
    hyper = {"lr_t": _keras_lr(opt) / (1 - tf1.pow(beta1, step)), "beta1": beta1,
             "beta2": _keras_hyper(opt, "beta_2"), "epsilon": opt.epsilon}
    return Update("adamax", hyper, {})


def _keras_adadelta(opt):
    hyper = {"lr": _keras_lr(opt), "rho": _keras_hyper(opt, "rho"), "epsilon": opt.epsilon}
    return Update("adadelta", hyper, {})


def _keras_adagrad(opt):
    return Update("adagrad", {"lr": _keras_lr(opt), "epsilon": opt.epsilon},
                  _accumulator_options(opt))


def _keras_rmsprop(opt):
    hyper = {"lr": _keras_lr(opt), "rho": _keras_hyper(opt, "rho"), "epsilon": opt.epsilon}
    if not opt._momentum:
        return Update("keras_rmsprop", hyper, {"centered": bool(opt.centered)})
    hyper["momentum"] = _keras_hyper(opt, "momentum")
    return Update("rmsprop", hyper, {"initial_rms": 0.0, "centered": bool(opt.centered)})


def _keras_ftrl(opt):
    lr = _keras_lr(opt)
    l2 = _keras_hyper(opt, "l2_regularization_strength")
    if "beta" in opt._hyper:  # TF 2.x
        l2 = l2 + _keras_hyper(opt, "beta") / (2.0 * lr)
    hyper = {"lr": lr, "lr_power": _keras_hyper(opt, "learning_rate_power"),
             "l1": _keras_hyper(opt, "l1_regularization_strength"), "l2": l2,
             "l2_shrinkage": float(opt._l2_shrinkage_regularization_strength)}
    return Update("ftrl", hyper, _accumulator_options(opt))


_builders = {}


# The slots each optimizer names, as the engine rule (tables/optimizer_updates.py) names them. Per
# class: (rule and options from the optimizer, {its slot name: the rule's slot name}).
def _same(*names):
    return {name: name for name in names}


_slot_maps = {}


def _slot_map_of(optimizer):
    if not _slot_maps:
        keras_v2 = tf1.keras.optimizers
        _slot_maps.update({
            tf1.train.MomentumOptimizer: (lambda o: ("momentum", {}), _same("momentum")),
            tf1.train.AdagradOptimizer: (lambda o: ("adagrad", _accumulator_options(o)),
                                         _same("accumulator")),
            tf1.train.AdamOptimizer: (lambda o: ("adam", {}), _same("m", "v")),
            tf1.train.FtrlOptimizer: (lambda o: ("ftrl", _accumulator_options(o)),
                                      {"accum": "accumulator", "linear": "linear"}),
            tf1.train.RMSPropOptimizer: (
                lambda o: ("rmsprop", {"initial_rms": 1.0, "centered": bool(o._centered)}),
                _same("rms", "momentum", "mg")),
            tf1.train.AdadeltaOptimizer: (lambda o: ("adadelta", {}),
                                          _same("accum", "accum_update")),
            keras_v2.SGD: (lambda o: ("keras_momentum", {}), _same("momentum")),
            keras_v2.Adam: (lambda o: ("adam", {"amsgrad": bool(o.amsgrad)}),
                            _same("m", "v", "vhat")),
            keras_v2.Adagrad: (lambda o: ("adagrad", _accumulator_options(o)),
                               _same("accumulator")),
            keras_v2.RMSprop: (lambda o: ("rmsprop" if o._momentum else "keras_rmsprop",
                                          {"initial_rms": 0.0, "centered": bool(o.centered)}),
                               _same("rms", "momentum", "mg")),
            keras_v2.Ftrl: (lambda o: ("ftrl", _accumulator_options(o)),
                            _same("accumulator", "linear")),
            keras_v2.Adamax: (lambda o: ("adamax", {}), {"m": "m", "v": "u"}),
            keras_v2.Adadelta: (lambda o: ("adadelta", {}),
                                {"accum_grad": "accum", "accum_var": "accum_update"}),
        })
    found = _slot_maps.get(_base_class(optimizer))
    if found is None or not isinstance(optimizer, AllRows):
        return found
    rule_and_options, names = found

    def on_every_row(opt):
        rule, options = rule_and_options(opt)
        return _on_every_row(rule), options
    return on_every_row, names


def engine_slot(optimizer, slot_name):
    """Returns (the engine rule's slot name, its initial value) of the slot `slot_name` that a
    supported native `optimizer` keeps for a sok1x table, or None where it keeps none such."""
    found = _slot_map_of(optimizer)
    if found is None:
        return None
    rule_and_options, names = found
    rule, options = rule_and_options(optimizer)
    initial = dict(optimizer_updates.RULES[rule].slots(options))
    engine_name = names.get(slot_name)
    if engine_name not in initial:
        return None
    return engine_name, initial[engine_name]


def builder_for(optimizer):
    """Returns the function optimizer -> Update for a supported native optimizer, else None."""
    if not _builders:
        keras_v2 = tf1.keras.optimizers
        _builders.update({
            tf1.train.GradientDescentOptimizer: _v1_gradient_descent,
            tf1.train.MomentumOptimizer: _v1_momentum,
            tf1.train.AdagradOptimizer: _v1_adagrad,
            tf1.train.AdamOptimizer: _v1_adam,
            tf1.train.FtrlOptimizer: _v1_ftrl,
            tf1.train.RMSPropOptimizer: _v1_rmsprop,
            tf1.train.AdadeltaOptimizer: _v1_adadelta,
            keras_v2.SGD: _keras_sgd,
            keras_v2.Adam: keras_adam,
            keras_v2.Adagrad: _keras_adagrad,
            keras_v2.RMSprop: _keras_rmsprop,
            keras_v2.Ftrl: _keras_ftrl,
            keras_v2.Adamax: _keras_adamax,
            keras_v2.Adadelta: _keras_adadelta,
        })
    build = _builders.get(_base_class(optimizer))
    if build is None or not isinstance(optimizer, AllRows):
        return build

    def on_every_row(opt):
        update = build(opt)
        return update._replace(rule=_on_every_row(update.rule))
    return on_every_row
