"""Row arrays split between GPU memory and page-locked host memory (DynamicVariable's "hybrid").

A SplitRows of shape [capacity, dim] keeps rows [0, hbm_rows) in device memory and rows
[hbm_rows, capacity) in page-locked host memory mapped into the device's address space
(backend.split_zeros). A row index at or above hbm_rows is host row index - hbm_rows. The
backend's row ops (gather_rows, put_rows, init_rows, the optimizer updates) take a SplitRows as
they take a plain array: on cuda the kernels get both parts' base pointers and each thread picks
its row's part on the device (cuda_kernels/common.cuh), so a hybrid lookup or update costs no
host split, no host wait and no host pass, only the PCIe traffic of the host rows it touches. On
cpu both parts are views of one NumPy array, which the row ops index.

The functions here take a plain backend array or a SplitRows, so a table's code reads the same
whichever it holds.
"""
import numpy as np


class SplitRows:
    """A [capacity, *row] array of `dtype` split at row hbm_rows. Attributes: shape, dtype,
    hbm_rows, parts ([device part, host part]), offsets ([0, hbm_rows]) and whole (the one array
    both parts view, cpu; None on cuda)."""

    def __init__(self, backend, shape, dtype, hbm_rows, initial=0.0):
        shape = tuple(int(n) for n in shape)
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.hbm_rows = min(int(hbm_rows), shape[0])
        self.parts, self.whole = backend.split_zeros(shape, self.dtype, self.hbm_rows)
        self.offsets = [0, self.hbm_rows]
        if initial:
            for part in self.parts:
                part.fill(initial)

    @property
    def ndim(self):
        return len(self.shape)


def is_split(array):
    """True for a SplitRows."""
    return isinstance(array, SplitRows)


def new_rows_array(backend, shape, dtype, hbm_rows, initial=0.0):
    """A plain backend array when every row fits in hbm_rows (or hbm_rows is None), else a
    SplitRows; every element `initial`."""
    if hbm_rows is None or hbm_rows >= shape[0]:
        array = backend.zeros(tuple(shape), dtype)
        if initial:
            array.fill(initial)
        return array
    return SplitRows(backend, shape, dtype, hbm_rows, initial)


def gather_rows(backend, array, rows):
    """array[rows] as a device array, a zero row where rows == -1."""
    return backend.gather_rows(array, rows)


def put_rows(backend, array, rows, src):
    """array[rows] = src (rows without repeats)."""
    backend.put_rows(array, rows, backend.asarray(src))


def init_rows(backend, array, rows, keys, spec, table_id, count=None):
    """Writes the initial vectors of `keys` into array[rows] (random_init's recipe); count: see
    backend.init_rows."""
    backend.init_rows(array, rows, keys, spec, table_id, count)


def apply_update(backend, update, var, slots, rows, grads, hyper, options):
    """Runs optimizer rule `update` (tables/optimizer_updates.py) on var and its slots (arrays
    split alike, or plain) for distinct `rows` with gradient `grads`: one kernel over both
    parts (a rule that decays every row decays every row of both)."""
    update(backend, var, slots, rows, grads, hyper, options)


def grown(backend, array, capacity, hbm_rows, initial=0.0):
    """A new array of `capacity` rows (split at hbm_rows if needed) holding array's rows at the
    same indices, the new rows `initial`."""
    bigger = new_rows_array(backend, (capacity,) + tuple(array.shape[1:]), array.dtype, hbm_rows,
                            initial)
    kept = backend.asarray(np.arange(array.shape[0], dtype=np.int64))
    if not is_split(array) and not is_split(bigger):
        backend.put_rows(bigger, kept, array)
    else:
        backend.put_rows(bigger, kept, backend.gather_rows(array, kept))
    return bigger
