"""The cuda backend's optimizer updates: the kernels of cuda_kernels/optimizers.cu on GPUArrays.

The same functions, arguments and formulas as cpu/optimizers.py (the reference): state arrays are
float32 [capacity, dim] GPUArrays changed in place (or split arrays, tables/hybrid_rows.py, whose
rows the kernels find in either part), `rows` distinct int64 rows (int32 is widened; a row -1 is
padding, skipped), `grads` float32 [len(rows), dim]; NumPy rows or grads are copied to the GPU
first. All work is queued on the sok1x stream inside the primary context; nothing waits for the
GPU. The kernels take the hyper-parameters by value, or inside backend.given_hyper.hyper_given
read them from device memory when they run (a replayed graph's update).
"""
import numpy as np

from sok1x.backend import given_hyper
from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.host_row_order import host_order, walk_blocks
from sok1x.backend.cuda.kernel_launch import (
    device_array,
    empty,
    fill_bytes,
    index_array,
    is_c_contiguous,
    is_device_array,
    is_split,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_bases,
    split_args,
)
from sok1x.backend.cuda.rows import take_rows

_ROWS_ARGS = "PPqq"  # rows, grads, n, dim
_STATE = "PPqP"  # a state array: common.cuh's SplitRows (device base, host base, split, pieces)
_HYPER = "Pffffff"  # optimizers.cu's Hyper: where given, else six values
_UNUSED = (0.0,) * given_hyper.MOST
_WIDTHS = {1: "", 4: "_x4"}  # a row kernel's name suffix for the elements a thread updates


@memoised_per_context
def _kernel(name, arg_types):
    return prepared("optimizers.cu", name, arg_types)


def _state(array, what, like=None):
    """Checks a state array (updated in place, so it must already live on the GPU)."""
    if array is None:
        return None
    parts = array.parts if is_split(array) else [array]
    if not all(is_device_array(part) and is_c_contiguous(part) for part in parts) or \
            array.dtype != np.float32 or len(array.shape) != 2:
        raise TypeError("%s must be a C-contiguous float32 [rows, dim] GPUArray (or a split "
                        "array of them), got %s %s"
                        % (what, type(array).__name__, getattr(array, "shape", None)))
    if like is not None and array.shape != like.shape:
        raise ValueError("%s has shape %s, the table %s" % (what, array.shape, like.shape))
    return array


def _gradient(var, rows, grads, ordered=True):
    """Returns (rows, grads, n, dim, order) checked against var [capacity, dim]; for a split var
    and `ordered`, rows and grads permuted so the kernels walk host rows in ascending regions
    (cuda_host_order; rows -1, padding the kernels skip, go among the device rows; the all-rows
    kernels walk the whole shard in order anyway), and that order (None where there is none),
    for the launch's blocks (cuda_host_order.walk_blocks)."""
    _state(var, "var")
    rows = index_array(rows, "rows")
    grads = device_array(grads, "grads", np.float32)
    dim = var.shape[1]
    if grads.shape != (rows.shape[0], dim):
        raise ValueError("grads has shape %s, expected %s" % (grads.shape, (rows.shape[0], dim)))
    order = host_order(var, rows, zero_negative=True) if ordered else None
    if order is not None:  # rows are distinct: the update does not depend on their order
        rows, grads = take_rows(rows, order), take_rows(grads, order)
    return rows, grads, rows.shape[0], dim, order


def _lanes(dim, grads, *states):
    """How many elements of a row one thread of a row kernel updates (optimizers.cu's
    update_rows): 4 where dim % 4 == 0 and the gradient and every state part are 16-byte aligned
    (the *_x4 kernel: one 16-byte access per array), else 1."""
    if dim % 4:
        return 1
    bases = [ptr(grads)] + [base for state in states for base in row_bases(state)]
    return 4 if all(base % 16 == 0 for base in bases) else 1


def _hyper(*values):
    """The kernel's Hyper argument (optimizers.cu): 0 and the values, or the address of the
    array backend.given_hyper.hyper_given() bound, where the kernel reads them when it runs."""
    given = given_hyper.given(len(values))
    if given is None:
        return (0,) + tuple(float(value) for value in values) + _UNUSED[len(values):]
    return (ptr(given),) + _UNUSED


@uses_context
def write_given(array, values, clock=None, now=0.0, step=None):
    """array[:] = values, queued: float32 hyper-parameters for the array an update reads them
    from (given_hyper.py), and clock[0] = now where a clock (float64 [1] or [2] GPUArray) is
    given (the time a replayed stamp writes), clock[1] = step where a step is given (a clock of
    two: given_hyper.step_given's), carried by one launch's arguments (optimizers.cu's
    write_hyper) rather than uploaded through a host buffer."""
    if not (is_device_array(array) and is_c_contiguous(array)) or not (
            clock is None or is_device_array(clock)):
        raise TypeError("write_given writes into C-contiguous GPUArrays, got %s and %s"
                        % (type(array).__name__, type(clock).__name__))
    values = given_hyper.written(array, values)
    given_hyper.checked_clock(clock, sizes=(1, 2) if step is None else (2,))
    count = values.shape[0]
    if count or clock is not None:
        launch(_kernel("write_hyper", "Pq" + _HYPER + "Pdqd"), max(count, 1), ptr(array),
               count, 0, *values.tolist(), *_UNUSED[count:], 0 if clock is None else ptr(clock),
               float(now), int(step is not None), float(step or 0))


@uses_context
def update_sgd(var, rows, grads, lr):
    """Gradient descent: var[rows] -= lr * g."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    if n * dim:
        launch(_kernel("update_sgd", _STATE + _ROWS_ARGS + _HYPER), n * dim, *split_args(var, dim),
               ptr(rows), ptr(grads), n, dim, *_hyper(lr),
               blocks=walk_blocks(order, n * dim))


@uses_context
def update_momentum(var, accum, rows, grads, lr, momentum, nesterov):
    """tf.compat.v1.train.MomentumOptimizer's sparse update (see cpu_optimizers)."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    _state(accum, "accum", var)
    if n * dim:
        launch(_kernel("update_momentum", _STATE * 2 + _ROWS_ARGS + _HYPER + "i"), n * dim,
               *split_args(var, dim), *split_args(accum, dim), ptr(rows), ptr(grads), n, dim,
               *_hyper(lr, momentum), int(bool(nesterov)),
               blocks=walk_blocks(order, n * dim))


@uses_context
def update_keras_momentum(var, accum, rows, grads, lr, momentum, nesterov):
    """Keras SGD with momentum, sparse update (see cpu_optimizers)."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    _state(accum, "accum", var)
    if n * dim:
        launch(_kernel("update_keras_momentum", _STATE * 2 + _ROWS_ARGS + _HYPER + "i"), n * dim,
               *split_args(var, dim), *split_args(accum, dim), ptr(rows), ptr(grads), n, dim,
               *_hyper(lr, momentum), int(bool(nesterov)),
               blocks=walk_blocks(order, n * dim))


@uses_context
def update_adagrad(var, accum, rows, grads, lr, epsilon):
    """Adagrad's sparse update (see cpu_optimizers)."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    _state(accum, "accum", var)
    if n * dim:
        lanes = _lanes(dim, grads, var, accum)
        launch(_kernel("update_adagrad" + _WIDTHS[lanes], _STATE * 2 + _ROWS_ARGS + _HYPER),
               n * dim // lanes, *split_args(var, dim), *split_args(accum, dim), ptr(rows),
               ptr(grads), n, dim, *_hyper(lr, epsilon),
               blocks=walk_blocks(order, n * dim // lanes))


@uses_context
def update_ftrl(var, accum, linear, rows, grads, lr, lr_power, l1, l2, l2_shrinkage):
    """FTRL-proximal's sparse update (see cpu_optimizers)."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    _state(accum, "accum", var)
    _state(linear, "linear", var)
    if n * dim:
        launch(_kernel("update_ftrl", _STATE * 3 + _ROWS_ARGS + _HYPER), n * dim,
               *split_args(var, dim), *split_args(accum, dim), *split_args(linear, dim),
               ptr(rows), ptr(grads), n, dim, *_hyper(lr, lr_power, l1, l2, l2_shrinkage),
               blocks=walk_blocks(order, n * dim))


@uses_context
def update_rmsprop(var, ms, mom, mg, rows, grads, lr, rho, momentum, epsilon):
    """TensorFlow's sparse (centered when mg is given) RMSProp update (see cpu_optimizers)."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    _state(ms, "ms", var)
    _state(mom, "mom", var)
    _state(mg, "mg", var)
    if n * dim:
        launch(_kernel("update_rmsprop", _STATE * 4 + _ROWS_ARGS + _HYPER), n * dim,
               *split_args(var, dim), *split_args(ms, dim), *split_args(mom, dim),
               *split_args(mg, dim), ptr(rows), ptr(grads), n, dim,
               *_hyper(lr, rho, momentum, epsilon),
               blocks=walk_blocks(order, n * dim))


@uses_context
def update_lazy_adam(var, m, v, rows, grads, lr_t, beta1, beta2, epsilon):
    """LazyAdam: the rows with a gradient only (see cpu_optimizers)."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    _state(m, "m", var)
    _state(v, "v", var)
    if n * dim:
        lanes = _lanes(dim, grads, var, m, v)
        launch(_kernel("update_lazy_adam" + _WIDTHS[lanes], _STATE * 3 + _ROWS_ARGS + _HYPER),
               n * dim // lanes, *split_args(var, dim), *split_args(m, dim), *split_args(v, dim),
               ptr(rows), ptr(grads), n, dim, *_hyper(lr_t, beta1, beta2, epsilon),
               blocks=walk_blocks(order, n * dim // lanes))


@uses_context
def update_adamax(var, m, u, rows, grads, lr_t, beta1, beta2, epsilon):
    """Keras AdaMax's sparse update: the rows with a gradient only (see cpu_optimizers)."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    _state(m, "m", var)
    _state(u, "u", var)
    if n * dim:
        launch(_kernel("update_adamax", _STATE * 3 + _ROWS_ARGS + _HYPER), n * dim,
               *split_args(var, dim), *split_args(m, dim), *split_args(u, dim), ptr(rows),
               ptr(grads), n, dim, *_hyper(lr_t, beta1, beta2, epsilon),
               blocks=walk_blocks(order, n * dim))


@uses_context
def update_adadelta(var, accum, accum_update, rows, grads, lr, rho, epsilon):
    """TensorFlow's sparse Adadelta update (see cpu_optimizers)."""
    rows, grads, n, dim, order = _gradient(var, rows, grads)
    _state(accum, "accum", var)
    _state(accum_update, "accum_update", var)
    if n * dim:
        launch(_kernel("update_adadelta", _STATE * 3 + _ROWS_ARGS + _HYPER), n * dim,
               *split_args(var, dim), *split_args(accum, dim), *split_args(accum_update, dim),
               ptr(rows), ptr(grads), n, dim, *_hyper(lr, rho, epsilon),
               blocks=walk_blocks(order, n * dim))


def _positions_of_rows(num_rows, rows):
    """int64 [num_rows]: the position of each row in `rows`, -1 for rows not in it."""
    positions = fill_bytes(empty((num_rows,), np.int64), 0xFF)
    if rows.shape[0]:
        launch(_kernel("mark_rows", "PqP"), rows.shape[0], ptr(rows), rows.shape[0],
               ptr(positions))
    return positions


@uses_context
def update_adam_all_rows(var, m, v, vhat, rows, grads, lr_t, beta1, beta2, epsilon):
    """Adam as TensorFlow applies it to IndexedSlices, in one pass over the shard (see
    cpu_optimizers)."""
    rows, grads, _, dim, _ = _gradient(var, rows, grads, ordered=False)
    for name, state in (("m", m), ("v", v), ("vhat", vhat)):
        _state(state, name, var)
    num_rows = var.shape[0]
    if num_rows * dim:
        positions = _positions_of_rows(num_rows, rows)
        launch(_kernel("update_adam_all_rows", _STATE * 4 + "PPqq" + _HYPER), num_rows * dim,
               *split_args(var, dim), *split_args(m, dim), *split_args(v, dim),
               *split_args(vhat, dim), ptr(positions), ptr(grads), num_rows, dim,
               *_hyper(lr_t, beta1, beta2, epsilon))


@uses_context
def update_keras_rmsprop_all_rows(var, rms, mg, rows, grads, lr, rho, epsilon):
    """Keras RMSprop without momentum, in one pass over the shard (see cpu_optimizers)."""
    rows, grads, _, dim, _ = _gradient(var, rows, grads, ordered=False)
    _state(rms, "rms", var)
    _state(mg, "mg", var)
    num_rows = var.shape[0]
    if num_rows * dim:
        positions = _positions_of_rows(num_rows, rows)
        launch(_kernel("update_keras_rmsprop_all_rows", _STATE * 3 + "PPqq" + _HYPER),
               num_rows * dim,
               *split_args(var, dim), *split_args(rms, dim), *split_args(mg, dim), ptr(positions),
               ptr(grads), num_rows, dim, *_hyper(lr, rho, epsilon))
