"""Shape arithmetic of GPUArrays in plain Python: element counts and C-order strides. NumPy's
prod and PyCUDA's general stride code and flags object (which computes both orders on first use)
cost microseconds each on shapes of one or two, and a step makes and checks dozens of arrays."""


def elements(shape):
    """The number of elements of `shape` (any iterable of ints)."""
    count = 1
    for n in shape:
        count *= int(n)
    return count


def c_strides(itemsize, shape):
    """The strides of a C-contiguous array of `shape` with elements of `itemsize` bytes (PyCUDA's
    rule: an axis of length 0 counts as 1)."""
    if len(shape) == 1:
        return (itemsize,)
    if len(shape) == 2:
        return (itemsize * max(1, shape[1]), itemsize)
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(1, n)
    return tuple(reversed(strides))


def is_c_contiguous(array):
    """GPUArray.flags.c_contiguous, without building the flags object for an array with C
    strides (the flags decide only the rare other cases, such as a length-1 axis)."""
    return (tuple(array.strides) == c_strides(array.dtype.itemsize, array.shape)
            or array.flags.c_contiguous)
