"""Host arrays that grow in place, the cpu twin of backend/cuda/reserved_rows.py: an address
range reserved with no access (mmap PROT_NONE, MAP_NORESERVE), pages opened behind the rows in
use only (mprotect). A row read or written before back_rows opened it faults, as on a GPU, so
the CPU tests catch a table group that touches rows its members do not hold.

    reserved_rows(shape, dtype)     a NumPy array of `shape` over the reserved range
    back_rows(array, start, stop)   opens rows [start, stop) (whole pages, those open kept) and
                                    returns the pages opened, for unback_rows; their bytes are
                                    0xFF until written (NaN as float32, -1 as integers), as a
                                    GPU's new memory holds anything: a read of a row never
                                    written shows in the CPU tests
    unback_rows(array, pages)       closes back_rows' `pages` again, their bytes dropped
    backed_bytes(array)             the bytes open now
    back_rows_ahead(ranges)         back_rows of each (array, start, stop, initial) and
                                    `initial` (None: none) written into those rows, done before
                                    it returns (cuda's runs on a helper thread): a completed
                                    concurrent.futures.Future of [(array, pages)], or of the
                                    error (what it opened closed again)
    join_ahead(future)              its result; raises its error

The range is unmapped when the array and every view of it are gone.
"""
import concurrent.futures
import ctypes
import mmap

import numpy as np

_PROT_NONE, _PROT_READ_WRITE = 0, 3
_MAP_PRIVATE_ANONYMOUS_NORESERVE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000
_MADV_DONTNEED = 4
_FAILED = ctypes.c_void_p(-1).value


def _libc():
    if "libc" not in _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        for name in ("mprotect", "madvise"):
            getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _LIBC["libc"] = libc
    return _LIBC["libc"]


_LIBC = {}


def _checked(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), "%s failed for rows that grow in place" % what)


class _Reserved:
    """A reserved range of `nbytes` at `address`; `backed` marks its open pages."""

    def __init__(self, nbytes):
        self.step = mmap.PAGESIZE
        self.nbytes = -(-max(int(nbytes), 1) // self.step) * self.step
        address = _libc().mmap(None, self.nbytes, _PROT_NONE, _MAP_PRIVATE_ANONYMOUS_NORESERVE,
                               -1, 0)
        if address in (None, _FAILED):
            raise MemoryError("could not reserve %d bytes of addresses for rows that grow in "
                              "place (errno %d)" % (self.nbytes, ctypes.get_errno()))
        self.address = int(address)
        self.backed = np.zeros(self.nbytes // self.step, dtype=bool)

    def back(self, start, stop):
        first, last = int(start) // self.step, -(-int(stop) // self.step)
        wanted = first + np.flatnonzero(~self.backed[first:last])
        if wanted.size:
            # one call over the whole span: pages open already stay open and keep their bytes
            _checked(_libc().mprotect(self.address + first * self.step,
                                      (last - first) * self.step, _PROT_READ_WRITE), "mprotect")
            for page in wanted.tolist():
                ctypes.memset(self.address + page * self.step, 0xFF, self.step)
            self.backed[wanted] = True
        return wanted

    def unback(self, pages):
        libc = _libc()
        for page in np.asarray(pages, dtype=np.int64).tolist():
            where = self.address + page * self.step
            _checked(libc.madvise(where, self.step, _MADV_DONTNEED), "madvise")
            _checked(libc.mprotect(where, self.step, _PROT_NONE), "mprotect")
            self.backed[page] = False

    def __del__(self):
        try:
            _libc().munmap(self.address, self.nbytes)
        except Exception:  # noqa: BLE001 (at interpreter exit ctypes may be gone)
            pass


def reserved_rows(shape, dtype):
    """A NumPy array of `shape` over a reserved range, no row open (module docstring)."""
    shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
    block = _Reserved(dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
    raw = (ctypes.c_char * block.nbytes).from_address(block.address)
    raw.sok1x_block = block  # the array keeps the range
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def _block(array):
    base = array
    while base is not None:
        block = getattr(base, "sok1x_block", None)
        if isinstance(block, _Reserved):
            return block
        base = getattr(base, "base", None)
    raise TypeError("not an array of reserved_rows()")


def back_rows(array, start, stop):
    """Opens rows [start, stop) of reserved_rows' `array`; returns the pages opened."""
    row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    return _block(array).back(int(start) * row_bytes, int(stop) * row_bytes)


def unback_rows(array, pages):
    """Closes back_rows' `pages` of `array` again."""
    _block(array).unback(pages)


def join_ahead(future):
    """back_rows_ahead's result; raises its error."""
    return future.result()


def back_rows_ahead(ranges):
    """back_rows of each (array, start, stop, initial) of `ranges`, and `initial` written into
    the rows, now: a completed Future."""
    future, done = concurrent.futures.Future(), []
    try:
        for array, start, stop, initial in ranges:
            done.append((array, back_rows(array, start, stop)))
            if initial is not None:
                array[start:stop] = initial
    except BaseException as exc:  # noqa: BLE001 (handed to the caller through the future)
        for array, pages in reversed(done):
            unback_rows(array, pages)
        future.set_exception(exc)
        return future
    future.set_result(done)
    return future


def backed_bytes(array):
    """The bytes of reserved_rows' `array` open now."""
    block = _block(array)
    return int(block.backed.sum()) * block.step
