"""Row arrays split between GPU memory and page-locked host memory (DynamicVariable's "hybrid").

A SplitRows of shape [capacity, dim] keeps rows [0, hbm_rows) in device memory and rows
[hbm_rows, capacity) in page-locked host memory mapped into the device's address space
(backend.split_zeros). A row index at or above hbm_rows is host row index - hbm_rows. The
backend's row ops (gather_rows, put_rows, init_rows, the optimizer updates) take a SplitRows as
they take a plain array: on cuda the kernels get both parts' base pointers and each thread picks
its row's part on the device (cuda_kernels/common.cuh), so a hybrid lookup or update costs no
host split, no host wait and no host pass, only the PCIe traffic of the host rows it touches. On
cpu both parts are views of one NumPy array, which the row ops index.

A table group's flat rows (lookup/table_group.py) of members whose rows split are a GroupedRows:
member t's rows [starts[t], starts[t + 1]) of the flat numbering, its first hbm[t] rows in one
device block (all members' device rows, member after member) and the rest in one host block.
The row kernels take it as they take a SplitRows, with a per-member split: a listing of the
members' starts and splits (GroupedRows.pieces) beside the two bases, from which each access
finds its member (common.cuh). Each member's own arrays are SplitRows views of its rows in the
two blocks, so everything that reads or writes one table works on them unchanged. On cpu one
array holds the flat rows in order and a member's view is a slice of it.

The functions here take a plain backend array, a SplitRows or a GroupedRows, so a table's code
reads the same whichever it holds.
"""
import numpy as np

from sok1x.backend.cuts import cut_points


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

    @classmethod
    def over(cls, parts, whole, hbm_rows, dtype):
        """A SplitRows of existing arrays: parts [device part, host part] (whole: the one array
        both view, cpu; None on cuda), split at hbm_rows. No copy."""
        array = cls.__new__(cls)
        rows = int(parts[0].shape[0]) + int(parts[1].shape[0])
        array.shape = (rows,) + tuple(parts[0].shape[1:])
        array.dtype, array.hbm_rows = np.dtype(dtype), int(hbm_rows)
        array.parts, array.whole = list(parts), whole
        array.offsets = [0, array.hbm_rows]
        return array

    @property
    def ndim(self):
        return len(self.shape)


class GroupedRows:
    """The flat [sum(rows), *row_shape] array of a table group whose members' rows may split
    (module docstring): member t holds rows[t] rows from starts[t], the first hbm[t] of them in
    the device block. Attributes: shape, dtype, starts (host int64 [T + 1]), hbm (host int64
    [T]), hbm_rows (rows of the device block), parts ([device block, host block] on cuda; on cpu
    both are views of whole, which holds the flat rows in order), whole (cpu; None on cuda),
    device_pieces (the backend's device copies of pieces(), by units per row)."""

    def __init__(self, backend, rows, hbm, row_shape, dtype, initial=0.0):
        rows = np.asarray(rows, dtype=np.int64)
        self.hbm = np.minimum(np.asarray(hbm, dtype=np.int64), rows)
        self.starts = cut_points(rows)
        self._device_starts = cut_points(self.hbm)
        self._host_starts = cut_points(rows - self.hbm)
        self.hbm_rows = int(self._device_starts[-1])
        self.shape = (int(self.starts[-1]),) + tuple(int(n) for n in row_shape)
        self.dtype = np.dtype(dtype)
        self.parts, self.whole = backend.split_zeros(self.shape, self.dtype, self.hbm_rows)
        self.device_pieces = {}
        if initial:
            for part in self.parts:
                part.fill(initial)

    @property
    def ndim(self):
        return len(self.shape)

    def member(self, backend, t):
        """Member t's rows as an array of its own (a view, no copy): a SplitRows of its rows in
        the two blocks, or a plain array where all of them are device rows."""
        start, stop, hbm = (int(self.starts[t]), int(self.starts[t + 1]), int(self.hbm[t]))
        if self.whole is not None:  # cpu: the flat rows in order
            mine = backend.row_view(self.whole, start, stop)
            if hbm >= stop - start:
                return mine
            return SplitRows.over([mine[:hbm], mine[hbm:]], mine, hbm, self.dtype)
        device, host = self.parts
        first = int(self._device_starts[t])
        on_device = backend.row_view(device, first, first + hbm)
        if hbm >= stop - start:
            return on_device
        first = int(self._host_starts[t])
        return SplitRows.over(
            [on_device, backend.row_view(host, first, first + stop - start - hbm)], None, hbm,
            self.dtype)

    def pieces(self, units_per_row):
        """Host int64 [4T + 1], the kernels' listing of the members (common.cuh's SplitRows, in
        units of 1 / units_per_row rows): each member's start (and the end), the first unit of
        its host rows, and the shifts from a flat unit to its device and its host block unit."""
        units, first = int(units_per_row), self.starts[:-1]
        host_from = first + self.hbm
        return np.concatenate([
            self.starts, host_from, first - self._device_starts[:-1],
            host_from - self._host_starts[:-1]]).astype(np.int64) * units


_SPLIT = (SplitRows, GroupedRows)


def is_split(array):
    """True for a SplitRows or a GroupedRows (rows that may lie in host memory)."""
    return isinstance(array, _SPLIT)


def addresses(backend, array):
    """Where an array's rows lie: the address of each part of a split one (SplitRows,
    GroupedRows), else its own, as a tuple (a recorded step's check that rows did not move).
    (is_split's test inline: a replayed step asks this of every table and slot it writes.)"""
    if isinstance(array, _SPLIT):
        return tuple([backend.address_of(part) for part in array.parts])
    return (backend.address_of(array),)


def fill(backend, array, value):
    """Sets every element of `array` (plain or split) to `value` (backend.fill_value's)."""
    if not is_split(array):
        backend.fill_value(array, value)
        return
    for part in ([array.whole] if array.whole is not None else array.parts):
        backend.fill_value(part, value)


def copy_rows(backend, dst, src):
    """dst[:len(src)] = src along axis 0, for arrays plain or split (a member's rows moving into
    a new group layout, a table growing, a load): one copy where neither splits, else through
    the row kernels, which read and write either part in place, COPY_BYTES of rows at a time
    (a split table is one that device memory cannot hold whole)."""
    rows = int(src.shape[0])
    if not rows:
        return
    if not is_split(src) and not is_split(dst):
        backend.write_rows(dst, 0, src)
        return
    row_bytes = max(1, src.dtype.itemsize * int(np.prod(src.shape[1:], dtype=np.int64)))
    step = max(1, COPY_BYTES // row_bytes)
    for first in range(0, rows, step):
        kept = backend.asarray(np.arange(first, min(rows, first + step), dtype=np.int64))
        backend.put_rows(dst, kept, backend.gather_rows(src, kept))


COPY_BYTES = 256 << 20  # copy_rows' device buffer at most


def new_rows_array(backend, shape, dtype, hbm_rows, initial=0.0):
    """A plain backend array when every row fits in hbm_rows (or hbm_rows is None), else a
    SplitRows; every element `initial`."""
    if hbm_rows is None or hbm_rows >= shape[0]:
        array = backend.zeros(tuple(shape), dtype)
        if initial:
            array.fill(initial)
        return array
    return SplitRows(backend, shape, dtype, hbm_rows, initial)


def gather_rows(backend, array, rows, fill=True):
    """array[rows] as a device array, a zero row where rows == -1 (fill=False: left unwritten,
    backend.gather_rows)."""
    return backend.gather_rows(array, rows, fill)


def gather_rows_many(backend, arrays, rows, fill=True):
    """[gather_rows(backend, array, rows, fill) for array in arrays], in one launch where the
    backend can (backend.gather_rows_many)."""
    return backend.gather_rows_many(arrays, rows, fill)


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
    copy_rows(backend, bigger, array)
    return bigger
