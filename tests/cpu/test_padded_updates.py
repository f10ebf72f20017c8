"""Every optimizer rule of the engine on the cpu backend skips padded rows: a row -1 in the rows
of an update (a step's buffers sized by its keys, not its rows: DESIGN D14) changes nothing,
whatever gradient sits beside it, so an update over padded rows equals, bit for bit, the same
update over the rows alone (NumPy would otherwise write -1 into the shard's last row)."""
import numpy as np
import pytest

from sok1x.backend import cpu
from sok1x.engine.tables import optimizer_updates

HYPER = {"lr": 0.1, "lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7,
         "momentum": 0.9, "rho": 0.9, "lr_power": -0.5, "l1": 0.01, "l2": 0.02,
         "l2_shrinkage": 0.05}
OPTIONS = {"nesterov": True, "initial_accumulator": 0.1, "initial_rms": 1.0, "centered": True,
           "amsgrad": True}
CAPACITY, DIM = 40, 3


def shard(rule, rng):
    """(var, slots) of `rule`: random values, positive slots (square roots of them stay real)."""
    var = rng.standard_normal((CAPACITY, DIM)).astype(np.float32)
    slots = {name: rng.uniform(1.0, 2.0, (CAPACITY, DIM)).astype(np.float32)
             for name, _ in optimizer_updates.RULES[rule].slots(OPTIONS)}
    return var, slots


@pytest.mark.parametrize("rule", sorted(optimizer_updates.RULES))
def test_padded_rows_change_nothing(rule):
    rng = np.random.default_rng(7)
    update = optimizer_updates.RULES[rule].update
    rows = rng.choice(CAPACITY - 1, size=12, replace=False).astype(np.int64)  # never the last
    grads = rng.standard_normal((12, DIM)).astype(np.float32)
    padded_rows = np.full(20, -1, np.int64)
    padded_grads = rng.standard_normal((20, DIM)).astype(np.float32) * 1e3  # junk at the pads
    places = np.sort(rng.choice(20, size=12, replace=False))
    padded_rows[places], padded_grads[places] = rows, grads

    want_var, want_slots = shard(rule, np.random.default_rng(3))
    got_var, got_slots = shard(rule, np.random.default_rng(3))
    update(cpu, want_var, want_slots, rows, grads, HYPER, OPTIONS)
    update(cpu, got_var, got_slots, padded_rows, padded_grads, HYPER, OPTIONS)

    assert got_var.tobytes() == want_var.tobytes()
    for name in want_slots:
        assert got_slots[name].tobytes() == want_slots[name].tobytes(), name


def test_rows_all_padding_change_nothing():
    var, slots = shard("lazy_adam", np.random.default_rng(3))
    before = var.copy(), {name: s.copy() for name, s in slots.items()}
    optimizer_updates.RULES["lazy_adam"].update(
        cpu, var, slots, np.full(4, -1, np.int64), np.ones((4, DIM), np.float32), HYPER, OPTIONS)
    assert var.tobytes() == before[0].tobytes()
    assert all(slots[name].tobytes() == before[1][name].tobytes() for name in slots)
