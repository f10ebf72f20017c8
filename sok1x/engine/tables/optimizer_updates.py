"""Optimizer updates of one shard (DESIGN D2): each supported optimizer's TensorFlow sparse-apply
semantics, on the backend's update kernels, with its state in the table's slots beside the rows.

The gradient arrives as backend arrays (values [n, dim], rows [n]) of this rank's shard; a row -1
that a lookup's backward made is padding (DESIGN D14), which every rule skips. Rows may
repeat (a table looked up twice in one graph), so they are first summed per row with the
backend's unique and segment_sum, as TensorFlow's optimizers do. The update is local: the
exchange already happened in the lookup's backward pass.

    rule            slots (initial value)                 hyper-parameters      options
    sgd             -                                     lr
    momentum        momentum                              lr momentum           nesterov
    keras_momentum  momentum                              lr momentum           nesterov
    adagrad         accumulator (initial_accumulator)     lr epsilon            initial_accumulator
    ftrl            accumulator (initial_accumulator),    lr lr_power l1 l2     initial_accumulator
                    linear                                l2_shrinkage
    rmsprop         rms (initial_rms), momentum,          lr rho momentum       initial_rms
                    mg if centered                        epsilon               centered
    keras_rmsprop   rms, mg if centered  [all rows]       lr rho epsilon        centered
    adam            m, v, vhat if amsgrad  [all rows]     lr_t beta1 beta2      amsgrad
                                                          epsilon
    lazy_adam       m, v                                  lr_t beta1 beta2 epsilon
    adamax          m, u                                  lr_t beta1 beta2 epsilon
    adadelta        accum, accum_update                   lr rho epsilon

momentum and keras_momentum are tf.compat.v1.train.MomentumOptimizer's and Keras SGD's forms;
keras_momentum, adamax, adadelta and ftrl + "_all_rows" are TF 2.11+ Keras SGD's, Adamax's,
Adadelta's and Ftrl's forms: the rule on every row, zero gradient where none came [all rows];
rmsprop is TensorFlow's SparseApply(Centered)RMSProp (TF1 RMSProp, Keras RMSprop with momentum);
keras_rmsprop is Keras RMSprop without momentum. [all rows]: state decays on every row of the
shard each step. lr_t is the bias-corrected rate lr * sqrt(1 - beta2^t) / (1 - beta1^t) (adamax:
lr / (1 - beta1^t)), which the caller computes from its own step counter. adamax is Keras'
AdaMax, adadelta TensorFlow's SparseApplyAdadelta (TF1 and Keras Adadelta). A slot is named
"<slot_prefix>/<slot>".
"""
import collections

import numpy as np

from sok1x.engine.lookup import distinct_rows
from sok1x.engine.lookup import group_gradients
from sok1x.errors import InvalidInputError, Sok1xError

Rule = collections.namedtuple("Rule", "hyper_names slots update")
Rule.__doc__ = """hyper_names: the hyper-parameters it reads; slots(options) -> [(name, initial)];
update(backend, var, slots dict, rows, grads, hyper dict, options dict)."""


def _no_slots(options):
    return []


def _sgd(backend, var, slots, rows, grads, hyper, options):
    backend.update_sgd(var, rows, grads, hyper["lr"])


def _momentum(backend, var, slots, rows, grads, hyper, options):
    backend.update_momentum(var, slots["momentum"], rows, grads, hyper["lr"], hyper["momentum"],
                            bool(options.get("nesterov")))


def _keras_momentum(backend, var, slots, rows, grads, hyper, options):
    backend.update_keras_momentum(var, slots["momentum"], rows, grads, hyper["lr"],
                                  hyper["momentum"], bool(options.get("nesterov")))


def moves_every_row(update):
    """True for a rule's update function that moves every row of the arrays it is given, not
    only the rows with a gradient (Adam's and Keras RMSprop's kernels, the TF 2.11+ Keras
    rules of _on_every_row)."""
    return getattr(update, "moves_every_row", False)


def _on_every_row(update):
    """The update of a TF 2.11+ Keras optimizer on a sparse gradient from `update` (its
    OptimizerV2 form's): `update` on every row of the shard, the rows without a gradient taking
    a zero one, so every row's state decays and every row moves by it, as that optimizer's dense
    state update does."""
    def every_row(backend, var, slots, rows, grads, hyper, options):
        num_rows, dim = int(var.shape[0]), int(grads.shape[1])
        dense = backend.zeros((num_rows, dim), np.float32)
        positions = backend.asarray(np.arange(int(rows.shape[0]), dtype=np.int64))
        backend.move_rows(grads, positions, dense, rows)  # a row -1 (padding) moves nothing
        every = backend.asarray(np.arange(num_rows, dtype=np.int64))
        update(backend, var, slots, every, dense, hyper, options)
    every_row.moves_every_row = True
    return every_row


def _accumulator_slots(options):
    return [("accumulator", float(options.get("initial_accumulator", 0.1)))]


def _adagrad(backend, var, slots, rows, grads, hyper, options):
    backend.update_adagrad(var, slots["accumulator"], rows, grads, hyper["lr"], hyper["epsilon"])


def _ftrl_slots(options):
    return _accumulator_slots(options) + [("linear", 0.0)]


def _ftrl(backend, var, slots, rows, grads, hyper, options):
    backend.update_ftrl(var, slots["accumulator"], slots["linear"], rows, grads, hyper["lr"],
                        hyper["lr_power"], hyper["l1"], hyper["l2"], hyper["l2_shrinkage"])


def _rmsprop_slots(options):
    slots = [("rms", float(options.get("initial_rms", 0.0))), ("momentum", 0.0)]
    return slots + ([("mg", 0.0)] if options.get("centered") else [])


def _rmsprop(backend, var, slots, rows, grads, hyper, options):
    backend.update_rmsprop(var, slots["rms"], slots["momentum"], slots.get("mg"), rows, grads,
                           hyper["lr"], hyper["rho"], hyper["momentum"], hyper["epsilon"])


def _keras_rmsprop_slots(options):
    return [("rms", 0.0)] + ([("mg", 0.0)] if options.get("centered") else [])


def _keras_rmsprop(backend, var, slots, rows, grads, hyper, options):
    backend.update_keras_rmsprop_all_rows(var, slots["rms"], slots.get("mg"), rows, grads,
                                          hyper["lr"], hyper["rho"], hyper["epsilon"])


def _adam_slots(options):
    return [("m", 0.0), ("v", 0.0)] + ([("vhat", 0.0)] if options.get("amsgrad") else [])


def _adam(backend, var, slots, rows, grads, hyper, options):
    backend.update_adam_all_rows(var, slots["m"], slots["v"], slots.get("vhat"), rows, grads,
                                 hyper["lr_t"], hyper["beta1"], hyper["beta2"], hyper["epsilon"])


_keras_rmsprop.moves_every_row = _adam.moves_every_row = True


def _lazy_adam(backend, var, slots, rows, grads, hyper, options):
    backend.update_lazy_adam(var, slots["m"], slots["v"], rows, grads, hyper["lr_t"],
                             hyper["beta1"], hyper["beta2"], hyper["epsilon"])


def _adamax(backend, var, slots, rows, grads, hyper, options):
    backend.update_adamax(var, slots["m"], slots["u"], rows, grads, hyper["lr_t"],
                          hyper["beta1"], hyper["beta2"], hyper["epsilon"])


def _adadelta(backend, var, slots, rows, grads, hyper, options):
    backend.update_adadelta(var, slots["accum"], slots["accum_update"], rows, grads,
                            hyper["lr"], hyper["rho"], hyper["epsilon"])


_ADAM_HYPER = ("lr_t", "beta1", "beta2", "epsilon")
RULES = {
    "sgd": Rule(("lr",), _no_slots, _sgd),
    "momentum": Rule(("lr", "momentum"), lambda o: [("momentum", 0.0)], _momentum),
    "keras_momentum": Rule(("lr", "momentum"), lambda o: [("momentum", 0.0)], _keras_momentum),
    "adagrad": Rule(("lr", "epsilon"), _accumulator_slots, _adagrad),
    "ftrl": Rule(("lr", "lr_power", "l1", "l2", "l2_shrinkage"), _ftrl_slots, _ftrl),
    "rmsprop": Rule(("lr", "rho", "momentum", "epsilon"), _rmsprop_slots, _rmsprop),
    "keras_rmsprop": Rule(("lr", "rho", "epsilon"), _keras_rmsprop_slots, _keras_rmsprop),
    "adam": Rule(_ADAM_HYPER, _adam_slots, _adam),
    "lazy_adam": Rule(_ADAM_HYPER, lambda o: [("m", 0.0), ("v", 0.0)], _lazy_adam),
    "adamax": Rule(_ADAM_HYPER, lambda o: [("m", 0.0), ("u", 0.0)], _adamax),
    "adadelta": Rule(("lr", "rho", "epsilon"), lambda o: [("accum", 0.0), ("accum_update", 0.0)],
                     _adadelta),
}


# TF 2.11+ Keras SGD (momentum), Adamax, Adadelta and Ftrl: their OptimizerV2 rules on every row.
ALL_ROWS = "_all_rows"
for _name in ("keras_momentum", "adamax", "adadelta", "ftrl"):
    RULES[_name + ALL_ROWS] = RULES[_name]._replace(update=_on_every_row(RULES[_name].update))


def slot_key(slot_prefix, slot):
    """The table slot name of an optimizer's slot, e.g. "Adam/m"."""
    return "%s/%s" % (slot_prefix, slot)


def slot_names(rule, options=None):
    """Returns the slot names (without prefix) that `rule` keeps with these options."""
    return [name for name, _ in _rule(rule).slots(dict(options or {}))]


def _rule(name):
    rule = RULES.get(name)
    if rule is None:
        raise Sok1xError("unknown optimizer rule %r; the engine knows %s" % (name, sorted(RULES)))
    return rule


def checked_rule(rule_name, hyper):
    """The Rule named `rule_name`; raises Sok1xError for an unknown rule or a hyper-parameter
    it reads that `hyper` (name -> float) lacks."""
    rule = _rule(rule_name)
    missing = [name for name in rule.hyper_names if name not in hyper]
    if missing:
        raise Sok1xError("optimizer rule %r needs hyper-parameters %s" % (rule_name, missing))
    return rule


def _checked_gradient(backend, table, values, rows):
    """Returns backend (values float32 [n, dim], rows int64 [n], whether the rows are known
    distinct); raises InvalidInputError. Rows a lookup's backward pass made (distinct_rows) are
    trusted; others are checked from their bounds (one wait on cuda)."""
    values, rows = backend.asarray(values), backend.asarray(rows)
    if values.dtype != np.float32:
        values = backend.asarray(backend.to_host(values).astype(np.float32))
    if len(rows.shape) != 1 or tuple(values.shape) != (rows.shape[0], table.dim) or (
            rows.dtype not in (np.int64, np.int32)):
        raise InvalidInputError(
            "%s: an update needs gradient values [n, %d] and int rows [n], got %s and %s %s"
            % (table.name, table.dim, list(values.shape), rows.dtype, list(rows.shape)))
    known = rows.dtype == np.int64 and distinct_rows.is_known(rows)
    if rows.shape[0] and not known:
        low, high = (int(b) for b in backend.index_bounds([rows])[0])
        if low < -1 or high >= table.values.shape[0]:  # -1: padding, skipped
            raise InvalidInputError(
                "%s: gradient rows must be in [0, %d) (this rank's shard), got %d..%d. Apply the "
                "gradient of this table's own lookup." % (table.name, table.values.shape[0], low,
                                                         high))
    return values, rows, known


def apply_update(backend, table, rule_name, slot_prefix, options, hyper, values, rows):
    """Applies optimizer `rule_name` to `table` with gradient (values, rows) of its shard.
    options: dict of constants (see the table above); hyper: dict name -> float for this step.
    Returns the number of distinct rows that had a gradient. Raises InvalidInputError for a
    gradient that does not fit the shard, before anything changes."""
    rule = checked_rule(rule_name, hyper)
    options = dict(options or {})
    values, rows, known_distinct = _checked_gradient(backend, table, values, rows)
    if known_distinct:  # the lookup's own backward rows: nothing to sum
        unique_rows, summed = rows, values
    else:
        unique_rows, inverse = backend.unique(rows, ordered=False)
        summed = backend.segment_sum(values, inverse, int(unique_rows.shape[0]))
    count = int(unique_rows.shape[0])
    slots = {name: table.slot(slot_key(slot_prefix, name), initial)
             for name, initial in rule.slots(options)}
    table.apply_update(rule.update, slots, unique_rows, summed, hyper, options)
    table.stamp(unique_rows)
    return count


def apply_updates(backend, tables, rule_name, slot_prefix, options, hyper, values_list,
                  rows_list):
    """apply_update for several tables with one rule and hyper-parameters. The members of a
    table group (engine/lookup/table_group.py), when all are here, are updated in one pass over the
    group's rows and slots; any other table alone. Returns per table the number of distinct rows
    that had a gradient. Raises InvalidInputError for a gradient that does not fit, before any
    group changes."""
    checked_rule(rule_name, hyper)
    options = dict(options or {})
    counts = [None] * len(tables)
    joined = group_gradients.group_gradients(backend, tables, values_list, rows_list)
    for group, rows, summed, positions, distinct_counts in joined:
        apply_group_update(backend, group, rule_name, slot_prefix, options, hyper, rows, summed)
        for position, count in zip(positions, distinct_counts):
            counts[position] = count
    for position, count in enumerate(counts):
        if count is None:
            counts[position] = apply_update(backend, tables[position], rule_name, slot_prefix,
                                            options, hyper, values_list[position],
                                            rows_list[position])
    return counts


def apply_group_update(backend, group, rule_name, slot_prefix, options, hyper, rows, summed):
    """Applies optimizer `rule_name` to a TableGroup's flat rows: rows distinct (flat row ids),
    summed their gradient values."""
    rule = checked_rule(rule_name, hyper)
    options = dict(options or {})
    slots = {name: group.slot(slot_key(slot_prefix, name), initial)
             for name, initial in rule.slots(options)}
    group.apply_update(rule.update, slots, rows, summed, hyper, options)
    group.stamp(rows)
