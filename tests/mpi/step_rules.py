"""The optimizer rules the engine-step tests train with (test_bounded_step, test_replayed_step):
RULES[rule] = (slot prefix, slot names), and hyper(rule, step), the step's hyper-parameters
(LazyAdam's learning rate bias-corrected for `step`, counted from 1, as SOK's LazyAdam); and
every_rule_hyper(rule, step), hyper-parameters of any engine rule that all change per step."""
import numpy as np

from sok1x.engine.tables import optimizer_updates

RULES = {"lazy_adam": ("Adam", ("m", "v")), "adagrad": ("Adagrad", ("accumulator",))}


def hyper(rule, step):
    """The hyper-parameters of optimizer `rule` for training step `step` (from 1)."""
    if rule == "adagrad":
        return {"lr": 0.1, "epsilon": 1e-7}
    lr = 0.01 * np.sqrt(1 - 0.999 ** step) / (1 - 0.9 ** step)
    return {"lr_t": lr, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}


_BASE = {"lr": 0.05, "lr_t": 0.02, "epsilon": 1e-6, "beta1": 0.9, "beta2": 0.999,
         "momentum": 0.8, "rho": 0.9, "lr_power": -0.5, "l1": 0.001, "l2": 0.01,
         "l2_shrinkage": 0.02}


def every_rule_hyper(rule, step):
    """Hyper-parameters of engine rule `rule` (optimizer_updates.RULES) for step `step`: each
    moves a little every step, so an update that kept an earlier step's values (or read them
    in another order) differs."""
    names = optimizer_updates.RULES[rule].hyper_names
    return {name: _BASE[name] * (1.0 - 0.002 * step * (1 + position))
            for position, name in enumerate(names)}
