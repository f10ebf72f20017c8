"""The cpu backend's optimizer updates: TensorFlow's sparse-apply arithmetic on one shard, in NumPy
float32. The reference the cuda versions (cuda/optimizers.py) are tested against.

Every function changes its state arrays (float32 [capacity, dim]) in place and returns nothing.
    rows:  int64 [n], DISTINCT rows of the shard that have a gradient this step; a row -1 is a
           padded position (a step's buffers sized by its keys, not its rows: DESIGN D14), skipped
           with its gradient
    grads: float32 [n, dim], the (already summed) gradient of each of those rows
Hyper-parameters are Python or NumPy scalars, used as float32 as TensorFlow does (inside
hyper_given(array): the array's values, as a replayed step's cuda kernels read them).
Functions named *_all_rows also decay the state of rows without a gradient, as TensorFlow's sparse
Adam and Keras' RMSprop without momentum do; the others touch only `rows`.
"""
import functools
import inspect

import numpy as np

from sok1x.backend import given_hyper


def _update(*hyper):
    """Decorator of an update whose hyper-parameters are the parameters named `hyper`, in order:
    it sees only the rows >= 0 of its `rows` argument and their gradients (a copy is made only
    where a row is negative), and inside hyper_given(array) the array's values as `hyper`."""
    def decorate(update):
        names = list(inspect.signature(update).parameters)
        at_rows, at_grads = names.index("rows"), names.index("grads")
        at_hyper = [names.index(name) for name in hyper]

        @functools.wraps(update)
        def on_used_rows(*args):
            rows, given = np.asarray(args[at_rows]), given_hyper.given(len(hyper))
            used = rows >= 0
            trimmed = rows.shape[0] and not used.all()
            if trimmed or given is not None:
                args = list(args)
            if trimmed:
                args[at_rows], args[at_grads] = rows[used], np.asarray(args[at_grads])[used]
            if given is not None:
                for at, value in zip(at_hyper, given):
                    args[at] = value
            return update(*args)
        return on_used_rows
    return decorate


def _f32(value):
    return np.float32(value)


@_update("lr")
def update_sgd(var, rows, grads, lr):
    """Gradient descent: var[rows] -= lr * g."""
    var[rows] -= _f32(lr) * grads


@_update("lr", "momentum")
def update_momentum(var, accum, rows, grads, lr, momentum, nesterov):
    """tf.compat.v1.train.MomentumOptimizer: accum = accum * momentum + g; var -= lr * accum
    (nesterov: var -= lr * g + lr * momentum * accum)."""
    lr, momentum = _f32(lr), _f32(momentum)
    new_accum = accum[rows] * momentum + grads
    accum[rows] = new_accum
    if nesterov:
        var[rows] -= grads * lr + new_accum * momentum * lr
    else:
        var[rows] -= new_accum * lr


@_update("lr", "momentum")
def update_keras_momentum(var, accum, rows, grads, lr, momentum, nesterov):
    """Keras SGD with momentum: accum = accum * momentum - lr * g; var += accum
    (nesterov: var += momentum * accum - lr * g)."""
    lr, momentum = _f32(lr), _f32(momentum)
    new_accum = accum[rows] * momentum - grads * lr
    accum[rows] = new_accum
    if nesterov:
        var[rows] += new_accum * momentum - grads * lr
    else:
        var[rows] += new_accum


@_update("lr", "epsilon")
def update_adagrad(var, accum, rows, grads, lr, epsilon):
    """Adagrad: accum += g^2; var -= lr * g / (sqrt(accum) + epsilon) (epsilon 0 for TF1's)."""
    new_accum = accum[rows] + grads * grads
    accum[rows] = new_accum
    var[rows] -= _f32(lr) * grads / (np.sqrt(new_accum) + _f32(epsilon))


@_update("lr", "lr_power", "l1", "l2", "l2_shrinkage")
def update_ftrl(var, accum, linear, rows, grads, lr, lr_power, l1, l2, l2_shrinkage):
    """FTRL-proximal (TensorFlow's SparseApplyFtrlV2; l2_shrinkage 0 is SparseApplyFtrl):
    g' = g + 2 * l2_shrinkage * var; new_accum = accum + g^2;
    linear += g' - (new_accum^-lr_power - accum^-lr_power) / lr * var;
    var = (clip(linear, -l1, l1) - linear) / (new_accum^-lr_power / lr + 2 * l2)."""
    lr, lr_power, l1, l2 = _f32(lr), _f32(lr_power), _f32(l1), _f32(l2)
    weights = var[rows]
    old_accum = accum[rows]
    shrunk = grads
    if l2_shrinkage > 0:
        shrunk = grads + _f32(2) * _f32(l2_shrinkage) * weights
    new_accum = old_accum + grads * grads
    if lr_power == _f32(-0.5):
        new_power, old_power = np.sqrt(new_accum), np.sqrt(old_accum)
    else:
        new_power, old_power = new_accum ** -lr_power, old_accum ** -lr_power
    new_linear = linear[rows] + shrunk - (new_power - old_power) / lr * weights
    quadratic = new_power / lr + _f32(2) * l2
    var[rows] = (np.clip(new_linear, -l1, l1) - new_linear) / quadratic
    accum[rows] = new_accum
    linear[rows] = new_linear


@_update("lr", "rho", "momentum", "epsilon")
def update_rmsprop(var, ms, mom, mg, rows, grads, lr, rho, momentum, epsilon):
    """TensorFlow's SparseApplyRMSProp (mg None) / SparseApplyCenteredRMSProp:
    ms = rho * ms + (1 - rho) * g^2; [mg = rho * mg + (1 - rho) * g]
    mom = momentum * mom + lr * g / sqrt(ms [- mg^2] + epsilon); var -= mom."""
    lr, rho, momentum, epsilon = _f32(lr), _f32(rho), _f32(momentum), _f32(epsilon)
    one_minus_rho = _f32(1) - rho
    new_ms = ms[rows] * rho + grads * grads * one_minus_rho
    ms[rows] = new_ms
    denominator = new_ms + epsilon
    if mg is not None:
        new_mg = mg[rows] * rho + grads * one_minus_rho
        mg[rows] = new_mg
        denominator = new_ms - new_mg * new_mg + epsilon
    new_mom = mom[rows] * momentum + lr * grads / np.sqrt(denominator)
    mom[rows] = new_mom
    var[rows] -= new_mom


@_update("lr_t", "beta1", "beta2", "epsilon")
def update_lazy_adam(var, m, v, rows, grads, lr_t, beta1, beta2, epsilon):
    """LazyAdam (tf.contrib.opt.LazyAdamOptimizer), rows with a gradient only:
    m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g^2; var -= lr_t * m / (sqrt(v) + eps).
    lr_t is the bias-corrected rate lr * sqrt(1 - b2^t) / (1 - b1^t)."""
    beta1, beta2 = _f32(beta1), _f32(beta2)
    new_m = m[rows] * beta1 + grads * (_f32(1) - beta1)
    new_v = v[rows] * beta2 + grads * grads * (_f32(1) - beta2)
    m[rows] = new_m
    v[rows] = new_v
    var[rows] -= _f32(lr_t) * new_m / (np.sqrt(new_v) + _f32(epsilon))


@_update("lr_t", "beta1", "beta2", "epsilon")
def update_adamax(var, m, u, rows, grads, lr_t, beta1, beta2, epsilon):
    """Keras AdaMax's sparse update, rows with a gradient only: m = b1 * m + (1 - b1) * g;
    u = max(b2 * u, |g|); var -= lr_t * m / (u + eps), lr_t = lr / (1 - b1^t)."""
    beta1, beta2 = _f32(beta1), _f32(beta2)
    new_m = m[rows] * beta1 + grads * (_f32(1) - beta1)
    new_u = np.maximum(u[rows] * beta2, np.abs(grads))
    m[rows] = new_m
    u[rows] = new_u
    var[rows] -= _f32(lr_t) * (new_m / (new_u + _f32(epsilon)))


@_update("lr", "rho", "epsilon")
def update_adadelta(var, accum, accum_update, rows, grads, lr, rho, epsilon):
    """TensorFlow's SparseApplyAdadelta: accum = rho * accum + (1 - rho) * g^2;
    update = sqrt(accum_update + eps) / sqrt(accum + eps) * g; var -= lr * update;
    accum_update = rho * accum_update + (1 - rho) * update^2."""
    lr, rho, epsilon = _f32(lr), _f32(rho), _f32(epsilon)
    one_minus_rho = _f32(1) - rho
    new_accum = accum[rows] * rho + grads * grads * one_minus_rho
    accum[rows] = new_accum
    old_update = accum_update[rows]
    update = np.sqrt(old_update + epsilon) / np.sqrt(new_accum + epsilon) * grads
    var[rows] -= update * lr
    accum_update[rows] = old_update * rho + update * update * one_minus_rho


@_update("lr_t", "beta1", "beta2", "epsilon")
def update_adam_all_rows(var, m, v, vhat, rows, grads, lr_t, beta1, beta2, epsilon):
    """Adam as TensorFlow applies it to IndexedSlices, over the whole shard: m = b1 * m and
    v = b2 * v for every row, plus (1 - b1) * g and (1 - b2) * g^2 on `rows`; with vhat (Keras'
    amsgrad) vhat = max(vhat, v); then var -= lr_t * m / (sqrt(v or vhat) + eps) for every row."""
    beta1, beta2 = _f32(beta1), _f32(beta2)
    m *= beta1
    m[rows] += grads * (_f32(1) - beta1)
    v *= beta2
    v[rows] += grads * grads * (_f32(1) - beta2)
    second = v
    if vhat is not None:
        np.maximum(vhat, v, out=vhat)
        second = vhat
    # In place, one scratch array: the same operations as var -= lr_t * m / (sqrt(v) + eps).
    step = np.sqrt(second)
    step += _f32(epsilon)
    np.divide(m, step, out=step)
    step *= _f32(lr_t)
    var -= step


@_update("lr", "rho", "epsilon")
def update_keras_rmsprop_all_rows(var, rms, mg, rows, grads, lr, rho, epsilon):
    """Keras RMSprop without momentum on IndexedSlices: rms = rho * rms for every row, plus
    (1 - rho) * g^2 on `rows` (centered: the same for mg with g); then on `rows` only
    var -= lr * g / (sqrt(rms [- mg^2]) + epsilon)."""
    lr, rho, epsilon = _f32(lr), _f32(rho), _f32(epsilon)
    one_minus_rho = _f32(1) - rho
    rms *= rho
    rms[rows] += grads * grads * one_minus_rho
    denominator = rms[rows]
    if mg is not None:
        mg *= rho
        mg[rows] += grads * one_minus_rho
        denominator = denominator - np.square(mg[rows])
    var[rows] -= lr * grads / (np.sqrt(denominator) + epsilon)
