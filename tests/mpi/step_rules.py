"""The optimizer rules the engine-step tests train with (test_bounded_step, test_replayed_step):
RULES[rule] = (slot prefix, slot names), and hyper(rule, step), the step's hyper-parameters
(LazyAdam's learning rate bias-corrected for `step`, counted from 1, as SOK's LazyAdam)."""
import numpy as np

RULES = {"lazy_adam": ("Adam", ("m", "v")), "adagrad": ("Adagrad", ("accumulator",))}


def hyper(rule, step):
    """The hyper-parameters of optimizer `rule` for training step `step` (from 1)."""
    if rule == "adagrad":
        return {"lr": 0.1, "epsilon": 1e-7}
    lr = 0.01 * np.sqrt(1 - 0.999 ** step) / (1 - 0.9 ** step)
    return {"lr_t": lr, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
