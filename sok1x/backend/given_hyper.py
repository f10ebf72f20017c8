"""Where the optimizer updates of either backend take their hyper-parameters from (DESIGN D14).

    with backend.hyper_given(array):   # float32 [k], the k hyper-parameters of the update
        backend.update_lazy_adam(...)  # reads array's values, not its float arguments

A replayed CUDA graph keeps the scalars its kernels were recorded with, so the update a replayed
step records reads the step's learning rate from a small array the host writes before each
replay (engine/lookup/replayed_step.py): on cuda the kernels read it from device memory when they
run (optimizers.cu's Hyper), on cpu the update reads it when it is called, as the cpu twin of a
replay calls it again. The values are in the order the update function takes them, which is the
order of its rule's hyper_names (engine/tables/optimizer_updates.py).
"""
import contextlib

import numpy as np

_given = [None]  # the array hyper_given() bound, or None
_clock = [None]  # the array time_given() bound, or None
_step = [None]  # the clock step_given() bound, or None
MOST = 6  # hyper-parameters an update takes at most (optimizers.cu's Hyper holds six)


@contextlib.contextmanager
def hyper_given(array):
    """Inside it, every optimizer update takes its hyper-parameters from `array` (module
    docstring). Nothing is read or queued here."""
    outer = _given[0]
    _given[0] = array
    try:
        yield
    finally:
        _given[0] = outer


def given(count):
    """The array hyper_given() bound, checked to hold `count` float32 values, or None where none
    is bound. Raises ValueError for another array."""
    array = _given[0]
    if array is not None and (array.dtype != np.float32 or tuple(array.shape) != (count,)):
        raise ValueError("hyper_given: an update of %d hyper-parameters was given a %s %s array"
                         % (count, array.dtype, list(array.shape)))
    return array


def written(array, values):
    """`values` as float32 [k] for backend.write_given(array, values), array being float32 [k]
    with k <= MOST; raises ValueError naming both otherwise (nothing is written then)."""
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    count = values.shape[0]
    if array.dtype != np.float32 or tuple(array.shape) != (count,) or count > MOST:
        raise ValueError("write_given: %d values do not fit a %s %s array (at most %d float32)"
                         % (count, array.dtype, list(array.shape), MOST))
    return values


@contextlib.contextmanager
def time_given(clock):
    """Inside it, backend.fill_rows writes the value `clock` (float64 [1], or [2]: step_given's)
    holds in clock[0] when the fill runs, not the value it is passed: a replayed update's time
    stamp, recorded once, stamps each replay's time (written into `clock` by write_given).
    Nothing is read or queued here."""
    checked_clock(clock, "time_given")
    outer = _clock[0]
    _clock[0] = clock
    try:
        yield
    finally:
        _clock[0] = outer


def given_time():
    """The float64 [1] array time_given() bound, or None."""
    return _clock[0]


def checked_clock(clock, who="write_given", sizes=(1, 2)):
    """Raises ValueError unless `clock` is None or float64 [k], k one of `sizes` (write_given's:
    [1] the time, [2] the time and a training step)."""
    if clock is not None and (clock.dtype != np.float64 or tuple(clock.shape) not in
                              [(k,) for k in sizes]):
        raise ValueError("%s: a clock is float64 %s, got %s %s"
                         % (who, " or ".join("[%d]" % k for k in sizes), clock.dtype,
                            list(clock.shape)))


@contextlib.contextmanager
def step_given(clock):
    """Inside it, the work that marks rows with the training step (backend.stamp_last_step,
    backend.pick_victims) takes the step from clock[1] (float64 [2]) as it is when the work
    runs, not the step it is passed: a replayed evicting step, recorded once, marks each
    replay's step (written by write_given's step). Nothing is read or queued here."""
    checked_clock(clock, "step_given", (2,))
    outer = _step[0]
    _step[0] = clock
    try:
        yield
    finally:
        _step[0] = outer


def given_step():
    """The float64 [2] clock step_given() bound, or None."""
    return _step[0]
