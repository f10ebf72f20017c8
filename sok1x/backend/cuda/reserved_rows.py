"""Device arrays that grow in place: an address range reserved for all the rows an array may
ever hold, device memory behind the rows in use only (CUDA's virtual memory management, as
PyTorch's expandable segments do). A table group that grows maps memory behind its members'
new rows instead of laying every array out again (engine/lookup/table_group.py): no copy, and
the old rows never move.

    reserved_rows(shape, dtype)     a GPUArray of `shape` over a reserved range with no memory
                                    behind any row yet (reading one faults: back it first)
    back_rows(array, start, stop)   device memory behind rows [start, stop) (whole granules of
                                    the driver's allocation granularity, 2 MiB on H100/H200,
                                    those backed already kept). Returns the pieces it mapped,
                                    for unback_rows; their bytes hold anything until written.
                                    Raises DeviceMemoryError where the GPU has no room (nothing
                                    new is backed then).
    unback_rows(array, pieces)      gives back_rows' pieces back to the driver
    backed_bytes(array)             the device memory behind the array now
    back_rows_ahead(ranges)         back_rows of each (array, start, stop, initial) on a helper
                                    thread, while the caller goes on, and `initial` (None: no
                                    fill) written into those rows on the helper's own stream:
                                    a concurrent.futures.Future of [(array, pieces)] (on a
                                    failure, what it backed is given back and the future holds
                                    the error)
    join_ahead(future)              back_rows_ahead's result, once its thread is done, with the
                                    sok1x stream ordered after its fills (no host wait for the
                                    device); raises its error

Each piece is one cuMemCreate, cuMemMap and cuMemSetAccess (a run of granules not backed yet).
The memory is freed, and the range given back, when the array and every view of it are gone,
with the context made current for it (as the pool's blocks do, at interpreter exit too).
Each function enters the context itself.

The helper makes a job's driver calls and fills in one call of host code
(cuda_kernels/back_pieces.c), with every block of the job locked: a Python thread takes the GIL
back after each foreign call, and beside a main thread that runs a step's Python that wait, not
the driver, was most of a job (bench/back_ahead.py). Where that library cannot be built (a
RuntimeWarning says why, once) or SOK1X_BACK_AHEAD_NATIVE=0, the helper calls the driver from
Python, a call at a time.
"""
import collections
import concurrent.futures
import ctypes
import os
import threading
import time
import warnings

import numpy as np

from sok1x.backend.cuda import context as cuda_context
from sok1x.backend.cuda import memory_driver as driver
from sok1x.backend.cuda.kernel_launch import elements, wrap
from sok1x.cuda_kernels.back_pieces import (
    DRIVER_NAMES,
    FILL_WORDS,
    FILL_ZEROS,
    STAGES,
    DriverCalls,
    back_pieces_function,
)
from sok1x.errors import DeviceMemoryError



def _device_prop():
    prop = driver.AllocationProp()
    prop.type = driver.ALLOCATION_PINNED
    prop.location.type, prop.location.id = driver.LOCATION_DEVICE, driver.current_device()
    return prop


def granularity():
    """The bytes of one granule: back_rows maps whole granules."""
    size = driver.size_t()
    driver.call("cuMemGetAllocationGranularity", ctypes.byref(size),
                ctypes.byref(_device_prop()), driver.GRANULARITY_MINIMUM)
    return max(int(size.value), 1)


def _block_class():
    """The pointer holder of a reserved range (built once PyCUDA loads: its base class)."""
    if "class" in _CLASS:
        return _CLASS["class"]
    import pycuda.driver as pycuda_driver

    class ReservedBlock(pycuda_driver.PointerHolderBase):
        """A reserved range of `nbytes` at `address`; `backed` marks its granules that have
        memory behind them, `pieces` maps a piece's first granule to (granules, handle)."""

        def __init__(self, nbytes):
            super(ReservedBlock, self).__init__()
            self.step = granularity()
            self.nbytes = -(-max(int(nbytes), 1) // self.step) * self.step
            self.prop = _device_prop()
            self.access = driver.AccessDesc()
            self.access.location.type = driver.LOCATION_DEVICE
            self.access.location.id = self.prop.location.id
            self.access.flags = driver.PROT_READWRITE
            address = driver.u64()
            try:
                driver.call("cuMemAddressReserve", ctypes.byref(address), self.nbytes, self.step,
                            0, 0)
            except driver.DriverCallError as exc:
                raise DeviceMemoryError("sok1x could not reserve %.1f GiB of device addresses "
                                        "for rows that grow in place: %s"
                                        % (self.nbytes / 2.0 ** 30, exc)) from exc
            self.address = int(address.value)
            self.backed = np.zeros(self.nbytes // self.step, dtype=bool)
            self.pieces = {}
            self.lock = threading.Lock()  # back_rows_ahead's thread backs beside the caller
            self._context, self._pop = cuda_context.context(), pycuda_driver.Context.pop

        def get_pointer(self):
            return self.address

        def __int__(self):
            return self.address

        __index__ = __int__

        def runs(self, start, stop, backed=None):
            """[(first granule, granules)] of the runs of granules of bytes [start, stop) that
            `backed` (default: the block's own marks) does not mark. Call with the lock held."""
            backed = self.backed if backed is None else backed
            first, last = int(start) // self.step, -(-int(stop) // self.step)
            wanted = ~backed[first:last]
            if not wanted.any():
                return []
            edges = np.flatnonzero(np.diff(np.concatenate([[False], wanted, [False]]))).tolist()
            return [(first + begin, end - begin) for begin, end in zip(edges[0::2], edges[1::2])]

        def back(self, start, stop):
            """Backs bytes [start, stop) (module docstring); returns the pieces mapped."""
            with self.lock:
                made = []
                try:
                    for granule, count in self.runs(start, stop):
                        made.append(self._map(granule, count))
                except BaseException:
                    self._unmap(made)  # nothing was queued on them yet
                    raise
                return made

        def _map(self, granule, count):
            handle, size = driver.u64(), count * self.step
            where = self.address + granule * self.step
            try:
                driver.call("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(self.prop), 0)
            except driver.DriverCallError as exc:
                if exc.code != driver.OUT_OF_MEMORY:
                    raise
                raise _no_room(size) from exc
            try:
                driver.call("cuMemMap", where, size, 0, handle, 0)
            except BaseException:
                driver.call("cuMemRelease", handle)
                raise
            try:
                driver.call("cuMemSetAccess", where, size, ctypes.byref(self.access), 1)
            except BaseException:
                driver.call("cuMemUnmap", where, size)
                driver.call("cuMemRelease", handle)
                raise
            return self.mapped(granule, count, handle.value)

        def mapped(self, granule, count, handle):
            """Marks `count` granules from `granule` as backed by `handle`; returns granule."""
            self.pieces[granule] = (count, handle)
            self.backed[granule:granule + count] = True
            return granule

        def unback(self, pieces):
            """Unmaps and frees `pieces` (back's), after the work queued on them is done."""
            if pieces:
                cuda_context.wait_stream("a wait before unmapping rows a growth backed")
            with self.lock:
                self._unmap(pieces)

        def _unmap(self, pieces):
            for granule in pieces:
                count, handle = self.pieces.pop(granule)
                driver.call("cuMemUnmap", self.address + granule * self.step, count * self.step)
                driver.call("cuMemRelease", handle)
                self.backed[granule:granule + count] = False

        def backed_bytes(self):
            with self.lock:
                return int(self.backed.sum()) * self.step

        def __del__(self):
            # as the pool's blocks (context.py): the context made current around the release
            try:
                self._context.push()
            except Exception:  # noqa: BLE001 (the driver is gone at interpreter exit)
                return
            try:
                self._unmap(list(self.pieces))  # (cuMemUnmap waits for work on it, as cuMemFree)
                driver.call("cuMemAddressFree", self.address, self.nbytes)
            except Exception:  # noqa: BLE001 (at interpreter exit the driver may refuse)
                pass
            finally:
                self._pop()

    _CLASS["class"] = ReservedBlock
    return ReservedBlock


_CLASS = {}


def _memory_info():
    import pycuda.driver as pycuda_driver
    return pycuda_driver.mem_get_info()


def _no_room(size):
    """The DeviceMemoryError of a cuMemCreate of `size` bytes that found no room."""
    free, total = _memory_info()
    return DeviceMemoryError(
        "GPU %d has no room for %.1f MiB more rows of a table group that grows (%.1f of %.1f GiB "
        "free). Leave room for sok1x's tables (TensorFlow's allow_growth), or make max_capacity "
        "smaller." % (cuda_context.device_ordinal(), size / 2.0 ** 20, free / 2.0 ** 30,
                      total / 2.0 ** 30))


@cuda_context.uses_context
def reserved_rows(shape, dtype):
    """A GPUArray of `shape` over a reserved address range, no row backed (module docstring)."""
    shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
    block = _block_class()(dtype.itemsize * elements(shape))
    return wrap(shape, dtype, block)


def _block(array):
    block = array.gpudata
    if not isinstance(block, _block_class()):
        raise TypeError("not an array of reserved_rows()")
    return block


@cuda_context.uses_context
def back_rows(array, start, stop):
    """Device memory behind rows [start, stop) of reserved_rows' `array`; returns the pieces
    mapped for unback_rows (module docstring)."""
    row_bytes = array.dtype.itemsize * elements(array.shape[1:])
    return _block(array).back(int(start) * row_bytes, int(stop) * row_bytes)


@cuda_context.uses_context
def unback_rows(array, pieces):
    """Gives back_rows' `pieces` of `array` back to the driver."""
    _block(array).unback(pieces)


def back_rows_ahead(ranges):
    """back_rows of each (array, start, stop, initial) of `ranges` on a helper thread, with
    `initial` written into the rows (module docstring): a Future of [(array, pieces)]."""
    if "executor" not in _CLASS:
        _CLASS["executor"] = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sok1x-back-rows")
    return _CLASS["executor"].submit(_back_all, list(ranges))


# (start, end, bytes) of the helper's last jobs, perf_counter seconds: how long backing ahead
# takes beside the steps (bench/growth_step.py reads it)
AHEAD_LOG = collections.deque(maxlen=256)


def _back_all(ranges):
    start = time.perf_counter()
    try:
        return _back_all_in_context(ranges)
    finally:
        AHEAD_LOG.append((start, time.perf_counter(),
                          sum(array.dtype.itemsize * elements(array.shape[1:]) * (stop - first)
                              for array, first, stop, _ in ranges)))


def _fill(array, start, stop, initial):
    """(address, bytes, kind, word) of the fill of rows [start, stop) of `array` with `initial`:
    FILL_ZEROS, or FILL_WORDS of a float32 value's bits; None where there is nothing to write.
    Raises ValueError for any other value."""
    if initial is None or stop <= start:
        return None
    row_bytes = array.dtype.itemsize * elements(array.shape[1:])
    where, nbytes = int(array.gpudata) + start * row_bytes, (stop - start) * row_bytes
    if not initial:
        return where, nbytes, FILL_ZEROS, 0
    if array.dtype != np.float32:
        raise ValueError("rows backed ahead are filled with zeros, or float32 values; got %r "
                         "for %s rows" % (initial, array.dtype))
    return where, nbytes, FILL_WORDS, int(np.array(initial, np.float32).view(np.uint32))


@cuda_context.uses_context  # (on the helper thread: the context made current there)
def _back_all_in_context(ranges):
    import pycuda.driver as pycuda_driver
    if "stream" not in _CLASS:  # the helper's own: its fills never wait for sok1x's work
        _CLASS["stream"] = pycuda_driver.Stream()
    stream, done = _CLASS["stream"], []
    fills = [_fill(*one) for one in ranges]
    native = _native()
    if native is not None:
        return _back_all_at_once(native, ranges, fills, stream)
    try:
        for (array, start, stop, _), fill in zip(ranges, fills):
            done.append((array, back_rows(array, start, stop)))
            if fill is not None and fill[2] == FILL_ZEROS:
                pycuda_driver.memset_d8_async(fill[0], 0, fill[1], stream)
            elif fill is not None:
                pycuda_driver.memset_d32_async(fill[0], fill[3], fill[1] // 4, stream)
    except BaseException:
        stream.synchronize()  # (the helper's own fills, on rows no one else uses)
        for array, pieces in reversed(done):
            block = _block(array)
            with block.lock:
                block._unmap(pieces)
        raise
    return done


def _native():
    """(sok1x_back_pieces, DriverCalls of libcuda), or None: SOK1X_BACK_AHEAD_NATIVE=0, or
    back_pieces.c could not be built or loaded (a RuntimeWarning, once)."""
    if "native" not in _CLASS:
        native = None
        if os.environ.get("SOK1X_BACK_AHEAD_NATIVE", "1").strip().lower() not in (
                "0", "false", "no", "off"):
            from sok1x.cuda_kernels import compiler
            try:
                calls = DriverCalls(*[driver.address(name) for name in DRIVER_NAMES])
                native = back_pieces_function(compiler.host_library("back_pieces.c")), calls
            except (compiler.KernelCompileError, OSError, AttributeError) as exc:
                _CLASS["native"] = None  # decided before the warning (which may raise)
                warnings.warn("sok1x backs a growing group's rows ahead a driver call at a "
                              "time from Python (slower beside the steps): its host code "
                              "(back_pieces.c) could not be had: %s" % exc, RuntimeWarning,
                              stacklevel=2)
        _CLASS["native"] = native
    return _CLASS["native"]


def _array_of(values, ctype):
    return (ctype * max(len(values), 1))(*values)


def _back_all_at_once(native, ranges, fills, stream):
    """_back_all_in_context's work in one call of back_pieces.c, every block of `ranges` locked
    meanwhile (a back_rows of one of them waits for the whole job): the runs of granules none
    backs yet (a granule two ranges share, once), mapped, then `fills` (_fill's, per range)
    queued on `stream`. Returns [(array, pieces)]; a failure gives back every piece of the job
    (the members that share a job share its failure: each then backs its rows itself)."""
    function, calls = native
    if not ranges:
        return []
    blocks = list(collections.OrderedDict(
        (id(block), block) for block in (_block(array) for array, _, _, _ in ranges)).values())
    locked = []
    try:
        for block in blocks:
            block.lock.acquire()
            locked.append(block)
        marks = {id(block): block.backed.copy() for block in blocks}  # granules planned so far
        pieces, own = [], []  # (block, granule, granules) each; per range its pieces' places
        for array, start, stop, _ in ranges:
            block = _block(array)
            row_bytes = array.dtype.itemsize * elements(array.shape[1:])
            own.append([])
            for granule, count in block.runs(start * row_bytes, stop * row_bytes,
                                             marks[id(block)]):
                marks[id(block)][granule:granule + count] = True
                own[-1].append(len(pieces))
                pieces.append((block, granule, count))
        fills = [fill for fill in fills if fill is not None]
        where = _array_of([b.address + g * b.step for b, g, _ in pieces], ctypes.c_uint64)
        sizes = _array_of([n * b.step for b, _, n in pieces], ctypes.c_uint64)
        handles = (ctypes.c_uint64 * max(len(pieces), 1))()
        failed = (ctypes.c_int64 * 2)()
        result = function(
            ctypes.byref(calls), len(pieces), where, sizes, ctypes.addressof(blocks[0].prop),
            ctypes.addressof(blocks[0].access), handles, len(fills),
            _array_of([f[0] for f in fills], ctypes.c_uint64),
            _array_of([f[1] for f in fills], ctypes.c_uint64),
            _array_of([f[3] for f in fills], ctypes.c_uint32),
            _array_of([f[2] for f in fills], ctypes.c_int32), stream.handle, failed)
        if result != 0 and failed[0] < STAGES.index("a fill"):  # nothing is left mapped
            if failed[0] == 0 and result == driver.OUT_OF_MEMORY:
                raise _no_room(sizes[failed[1]])
            raise driver.DriverCallError(STAGES[failed[0]], result)
        for (block, granule, count), handle in zip(pieces, handles):
            block.mapped(granule, count, handle)
        if result != 0:  # a fill failed: its fills are the helper's own, on rows no one uses
            stream.synchronize()
            for block, granule, _ in reversed(pieces):
                block._unmap([granule])
            raise driver.DriverCallError(
                "cuMemsetD%dAsync" % (8 if fills[failed[1]][2] == FILL_ZEROS else 32), result)
    finally:
        for block in locked:
            block.lock.release()
    return [(array, [pieces[i][1] for i in places])
            for (array, _, _, _), places in zip(ranges, own)]


@cuda_context.uses_context
def join_ahead(future):
    """back_rows_ahead's result (module docstring); raises its error."""
    done = future.result()
    cuda_context.order_after_default_stream(_CLASS["stream"].handle)
    return done


@cuda_context.uses_context
def backed_bytes(array):
    """The bytes of device memory behind reserved_rows' `array` now."""
    return _block(array).backed_bytes()
