"""Launching sok1x's kernels for the cuda backend: kernel lookup, grid sizes, pooled device arrays,
checks that turn inputs into device arrays, and the device-wide exclusive scan several ops share.

Everything here expects to run inside cuda_context.entered() (the public ops enter it).
"""
import collections
import functools
import time

import numpy as np
import pycuda.driver as driver
from pycuda import gpuarray
from pycuda._pvt_struct import pack as _pack  # what prepared calls pack arguments with

from sok1x import cuda_kernels as kernels
from sok1x.backend.copies import copy_array_error
from sok1x.backend.cuda import context as cuda_context
from sok1x.backend.cuda import staging as cuda_staging
from sok1x.backend.cuda.strides import (  # noqa: F401  (re-exported)
    c_strides,
    elements,
    is_c_contiguous,
)

BLOCK = 256
SCAN_THREADS = 256
SCAN_TILE = 2048  # SCAN_THREADS * SCAN_ITEMS in scan.cu
_BLOCKS_PER_MULTIPROCESSOR = 16
_REGISTER_UNIT = 256  # registers a warp is given at a time
_WARP_UNIT = 4  # warps a multiprocessor's registers are handed out by
_SHARED_PER_BLOCK = 1024  # shared memory the driver keeps for each block (sm_80 and later)

# What the cuda backend has queued and waited for since the process started (the benchmarks read
# per-step figures off it): "launches" (kernels), "fills" (memsets), "copies" (host <-> device),
# "host_waits" (the host blocked until the stream caught up), "wait_us" (microseconds spent so).
COUNTS = collections.Counter()


def load_every_kernel():
    """Loads all of sok1x's kernels on the active device (once, at init); returns their number.
    See cuda_kernels.load_every_kernel for why no kernel may be loaded during a step."""
    with cuda_context.entered():
        return kernels.load_every_kernel(kernels.source_names())


def waited_stream():
    """cuda_context.wait_stream(), counted as one host wait and timed into COUNTS."""
    started = time.perf_counter()
    cuda_context.wait_stream()
    COUNTS["host_waits"] += 1
    COUNTS["wait_us"] += int((time.perf_counter() - started) * 1e6)


def memoised_per_context(builder):
    """Decorator for kernel builders: one result per (current context, arguments)."""
    built = {}

    @functools.wraps(builder)
    def build(*args):
        key = (cuda_context.context_handle(),) + args
        result = built.get(key)
        if result is None:
            result = built[key] = builder(*args)
        return result

    return build


def prepared(source_name, kernel_name, arg_types):
    """Returns kernel `kernel_name` of family `source_name`, prepared with pycuda arg types
    ("P" pointer, "q" int64, "Q" uint64, "i" int32, "d" float64)."""
    function = kernels.load_module(source_name).get_function(kernel_name)
    function.prepare(arg_types)
    return function


def resident_blocks(function, block=BLOCK):
    """Blocks of `block` threads of kernel `function` that one multiprocessor holds at once: the
    fewest its threads, registers, shared memory and block slots allow (CUDA's occupancy rules,
    from the kernel's registers and static shared memory), at least 1."""
    limits = cuda_context.multiprocessor_limits()
    warps = -(-block // 32)
    per_warp = -(-max(function.num_regs, 1) * 32 // _REGISTER_UNIT) * _REGISTER_UNIT
    by_registers = limits.registers // per_warp // _WARP_UNIT * _WARP_UNIT // warps
    shared = function.shared_size_bytes
    by_shared = limits.shared // (shared + _SHARED_PER_BLOCK) if shared else limits.blocks
    return max(1, min(limits.threads // block, by_registers, by_shared, limits.blocks))


def grid_cap(function, block=BLOCK):
    """The most blocks launch() gives a grid-stride kernel of `block` threads: 16 a
    multiprocessor, rounded up to whole waves of the blocks one holds at once, kept on the
    function. dlrm's LazyAdam update (6 blocks resident) ran 16 a multiprocessor as 2.67 waves,
    the last a third idle: 194.2 us, against 186.6 as three whole waves (bench/update_grid.py,
    one H200, 2026-11-29). Fewer blocks, one wave, slowed the uncaptured step (NOTES,
    2026-11-28): many small blocks balance uneven items, so the cap never goes below 16."""
    caps = getattr(function, "sok1x_grid_caps", None)
    if caps is None:
        caps = function.sok1x_grid_caps = {}
    cap = caps.get(block)
    if cap is None:
        resident = resident_blocks(function, block)
        per_multiprocessor = (-(-_BLOCKS_PER_MULTIPROCESSOR // resident) * resident
                              if resident < _BLOCKS_PER_MULTIPROCESSOR
                              else _BLOCKS_PER_MULTIPROCESSOR)
        cap = caps[block] = cuda_context.multiprocessor_count() * per_multiprocessor
    return cap


def launch(function, work_items, *args, block=BLOCK, blocks=None):
    """Queues a grid-stride kernel on the sok1x stream, sized for `work_items` threads, at most
    grid_cap's blocks."""
    if blocks is None:
        caps = getattr(function, "sok1x_grid_caps", None)
        limit = caps.get(block) if caps else None
        blocks = max(1, min(-(-int(work_items) // block),
                            limit or grid_cap(function, block)))
    # What prepared_async_call does for a kernel without texture references, without its
    # per-call import, keyword checks and block-shape call: a step launches dozens of kernels.
    function._launch_kernel((int(blocks), 1), (block, 1, 1), _pack(function.arg_format, *args),
                            0, cuda_context.stream())
    COUNTS["launches"] += 1


def ptr(array):
    """Device address of a GPUArray (0 for an empty one)."""
    data = array.gpudata
    if data is None:
        return 0
    # the pool's blocks carry their address (context.py): int() of one is a Python call, and
    # a step asks dozens of addresses
    address = getattr(data, "address", None)
    return int(data) if address is None else address


NOT_SPLIT = np.iinfo(np.int64).max  # SplitRows.split of a plain array (common.cuh)


def is_split(array):
    """True for a row array split between GPU and mapped host memory (engine/tables/hybrid_rows.py's
    SplitRows: parts [device part, host part], hbm_rows)."""
    return hasattr(array, "parts") and hasattr(array, "hbm_rows")


def row_bases(array):
    """The base addresses of a row array: both parts' for a split one, else its own."""
    return [ptr(part) for part in array.parts] if is_split(array) else [ptr(array)]


def split_args(array, units_per_row):
    """Kernel arguments (device base, host base, split, pieces) of common.cuh's SplitRows for a
    row array indexed in units of 1 / units_per_row rows: a split array's host part starts at
    unit hbm_rows * units_per_row; a plain GPUArray is (its base, 0, NOT_SPLIT, 0); a table
    group's rows split per member (hybrid_rows.GroupedRows) are (device block, host block,
    members, listing). None gives (0, 0, NOT_SPLIT, 0), an absent array."""
    if array is None:
        return 0, 0, NOT_SPLIT, 0
    if is_split(array):
        device, host = array.parts
        split, pieces = split_pieces(array, units_per_row)
        return ptr(device), ptr(host), split, pieces
    return ptr(array), 0, NOT_SPLIT, 0


def split_pieces(array, units_per_row):
    """(split, pieces address) of a split row array in units of 1 / units_per_row rows (see
    split_args); a GroupedRows' listing is uploaded once per units and kept with it."""
    listings = getattr(array, "device_pieces", None)
    if listings is None:
        return int(array.hbm_rows) * int(units_per_row), 0
    units = int(units_per_row)
    listing = listings.get(units)
    if listing is None:
        listing = listings[units] = to_device(array.pieces(units))
    return len(array.hbm), ptr(listing)


def empty(shape, dtype):
    """A C-contiguous GPUArray from the memory pool."""
    # Plain Python: NumPy's ndim and prod cost microseconds each on tiny inputs, and a step
    # makes dozens of arrays.
    if isinstance(shape, (int, np.integer)) or getattr(shape, "ndim", None) == 0:
        shape = (int(shape),)
    else:
        shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize * elements(shape)
    return wrap(shape, dtype, cuda_context.allocate(nbytes) if nbytes else None)


def wrap(shape, dtype, gpudata, base=None):
    """A C-contiguous GPUArray of `shape` over `gpudata` (an allocation or an address), keeping
    `base` alive. It sets what GPUArray's constructor sets, without the constructor, which asks
    the driver for the current device and works out a launch shape for every array made (a
    step makes dozens); the launch shape of PyCUDA's elementwise methods is read once per
    context instead (their kernels stride over the grid, so one shape serves any size)."""
    array = gpuarray.GPUArray.__new__(gpuarray.GPUArray)
    dtype, shape = np.dtype(dtype), tuple(int(n) for n in shape)
    size = elements(shape)
    array.shape, array.dtype = shape, dtype
    array.strides = c_strides(dtype.itemsize, shape)
    array.mem_size = array.size = size
    array.nbytes = dtype.itemsize * size
    array.itemsize = dtype.itemsize
    array.allocator = cuda_context.allocate
    array.gpudata, array.base = gpudata, base
    array._grid, array._block = _elementwise_launch_shape()
    return array


_WRAPPED_FIELDS = {}  # (context, shape, dtype) -> a wrap()'s fields, for wrap_again
# at most this many shapes kept, then forgotten at once: a step's inputs of fixed shapes (a
# replayed step's, a batch's keys) come back at once, while an uncaptured update's rows, as
# many as the step's distinct rows, bring a new shape at most steps
_WRAPPED_KEPT = 256


def wrap_again(shape, dtype, gpudata, base=None):
    """wrap() for `shape` (a tuple of ints) and `dtype` (a NumPy dtype) as given: the fields of
    an array of that shape and dtype are worked out once a context and copied (a kernel call
    wraps each of its device inputs at every step, most of them of the shapes of the last)."""
    key = (cuda_context.context_handle(), shape, dtype)
    fields = _WRAPPED_FIELDS.get(key)
    if fields is None:
        fields = dict(wrap(shape, dtype, None).__dict__)
        if len(_WRAPPED_FIELDS) >= _WRAPPED_KEPT:
            _WRAPPED_FIELDS.clear()
        _WRAPPED_FIELDS[key] = fields
    array = gpuarray.GPUArray.__new__(gpuarray.GPUArray)
    array.__dict__.update(fields)
    array.gpudata, array.base = gpudata, base
    return array


def row_view(array, start, stop):
    """Rows [start, stop) of a C-contiguous GPUArray as a GPUArray over the same memory, made
    as wrap() makes arrays (it keeps `array` alive)."""
    if array.ndim < 1:
        raise TypeError("array must have at least one dimension")
    row_shape = tuple(array.shape[1:])
    row_bytes = array.dtype.itemsize * elements(row_shape)
    return wrap((int(stop) - int(start),) + row_shape, array.dtype,
                ptr(array) + int(start) * row_bytes, base=array)


def row_views(array, cuts, stops=None):
    """Rows [cuts[t], cuts[t + 1]) of a C-contiguous GPUArray for each t (with stops, cuts are
    the starts: rows [cuts[t], stops[t]) for each t, as many as stops), as row_view makes them:
    one view made, the others copied from it with their own shape and address (a table group's
    members' parts, dozens a step)."""
    template = row_view(array, 0, 0)
    fields, row_shape = template.__dict__, template.shape[1:]
    width = elements(row_shape)
    row_bytes, base = template.dtype.itemsize * width, ptr(array)
    views = []
    for start, stop in zip(cuts, stops) if stops is not None else zip(cuts[:-1], cuts[1:]):
        count = int(stop) - int(start)
        view = gpuarray.GPUArray.__new__(gpuarray.GPUArray)
        view.__dict__.update(fields)
        view.shape = (count,) + row_shape
        view.mem_size = view.size = count * width
        view.nbytes = count * row_bytes
        view.gpudata = base + int(start) * row_bytes
        views.append(view)
    return views


@memoised_per_context
def _elementwise_launch_shape():
    return gpuarray.splay(1 << 30)


def fill_bytes(array, byte):
    """Sets every byte of `array` to `byte` (0 gives zeros, 0xFF gives -1 for ints), queued."""
    if array.size:
        driver.memset_d8_async(ptr(array), byte, array.nbytes, cuda_context.stream())
        COUNTS["fills"] += 1
    return array


def fill_float32(array, value):
    """Sets every element of a float32 GPUArray to `value`, queued on the sok1x stream (one
    32-bit memset; PyCUDA's own fill compiles a kernel at run time, on the default stream)."""
    if array.dtype != np.float32:
        raise TypeError("fill_float32 needs a float32 array, got %s" % array.dtype)
    if array.size:
        bits = int(np.array(value, dtype=np.float32).view(np.uint32))
        driver.memset_d32_async(ptr(array), bits, array.size, cuda_context.stream())
        COUNTS["fills"] += 1
    return array


def copy_rows_async(dst, dst_row, src, src_row, rows):
    """Queues a device copy of `rows` rows of src (from src_row) into dst (at dst_row)."""
    row_bytes = dst.dtype.itemsize * elements(dst.shape[1:])
    if rows:
        driver.memcpy_dtod_async(ptr(dst) + dst_row * row_bytes, ptr(src) + src_row * row_bytes,
                                 rows * row_bytes, cuda_context.stream())
        COUNTS["copies"] += 1


def copy_array(dst, src):
    """dst = src, GPUArrays of one dtype and size (any shapes), both C-contiguous: one queued
    copy on the stream (the caller is inside cuda_context.entered())."""
    error = copy_array_error(dst, src, is_device_array(src) and is_device_array(dst)
                             and is_c_contiguous(src) and is_c_contiguous(dst))
    if error is not None:
        raise error
    if src.size:
        driver.memcpy_dtod_async(ptr(dst), ptr(src), src.nbytes, cuda_context.stream())
        COUNTS["copies"] += 1


def to_device(host_array):
    """Returns a GPUArray copy of a host array: one queued copy through page-locked staging (the
    host never waits for the stream, see cuda_staging)."""
    host_array = np.ascontiguousarray(host_array)
    out = empty(host_array.shape, host_array.dtype)
    if host_array.size:
        cuda_staging.upload(ptr(out), host_array)
        COUNTS["copies"] += 1
    return out


def download(array, what="a copy to the host"):
    """Returns a GPUArray as a NumPy view of a reused page-locked block, after the work queued
    before it (one copy, one bounded wait that names `what` if it times out)."""
    return download_many([array], what)[0]


def download_many(arrays, what="a copy to the host"):
    """download() of several GPUArrays with one wait for all of them."""
    started = time.perf_counter()
    hosts = cuda_staging.download_many(arrays, what)
    copied = sum(1 for array in arrays if array.size)
    if copied:
        COUNTS["wait_us"] += int((time.perf_counter() - started) * 1e6)
        COUNTS["host_waits"] += 1
        COUNTS["copies"] += copied
    return hosts


def download_beside(arrays, what="a copy to the host beside the stream"):
    """Queues download()'s copies of GPUArrays on the side stream, after the work queued so far
    (cuda_staging.download_beside); returns a function that waits for them alone and returns
    the host views (one wait)."""
    collect = cuda_staging.download_beside(arrays, what)
    copied = sum(1 for array in arrays if array.size)
    COUNTS["copies"] += copied

    def wait():
        started = time.perf_counter()
        hosts = collect()
        if copied:
            COUNTS["wait_us"] += int((time.perf_counter() - started) * 1e6)
            COUNTS["host_waits"] += 1
        return hosts
    return wait


def to_host(array, what="a copy to the host"):
    """Returns a NumPy copy of a GPUArray the caller owns, after the work queued before it."""
    return to_host_many([array], what)[0]


def to_host_later(array, what="a copy to the host"):
    """Queues a copy of a GPUArray to the host; returns a function that waits for it and
    returns a NumPy copy (work queued in between runs during the wait), the same one at every
    call."""
    collect = cuda_staging.read_small_later(array, what)  # a flag: a slot of its own
    if collect is None:
        collect = _first_copy(cuda_staging.download_later([array], what))
    return _counted_wait(collect, 1 if array.size else 0)


def to_host_many_later(arrays, what="copies to the host"):
    """to_host_later of several GPUArrays, queued one after the other on the stream; returns a
    function that waits for them (one wait) and returns NumPy copies, the same ones at every
    call."""
    collect = cuda_staging.download_later(arrays, what)
    return _counted_wait(lambda: [np.array(host, copy=True) for host in collect()],
                         sum(1 for array in arrays if array.size))


def _counted_wait(collect, copied):
    """collect as the function a later read returns: where `copied` copies were queued, its
    wait counted (its microseconds, one host wait, the copies); its result kept, so that a
    later call returns the same copies (the staging memory may hold another copy by then)."""
    kept = []

    def wait():
        if kept:
            return kept[0]
        started = time.perf_counter()
        hosts = collect()
        if copied:
            COUNTS["wait_us"] += int((time.perf_counter() - started) * 1e6)
            COUNTS["host_waits"] += 1
            COUNTS["copies"] += copied
        kept.append(hosts)
        return hosts
    return wait


def _first_copy(collect):
    """collect() -> [host views] as a function returning a NumPy copy of the first."""
    return lambda: np.array(collect()[0], copy=True)


def to_host_many(arrays, what="a copy to the host"):
    """Copies several GPUArrays back with one wait for all of them (blocks the host, bounded);
    returns NumPy copies the caller owns."""
    return [np.array(host, copy=True) for host in download_many(arrays, what)]


def is_device_array(value):
    return isinstance(value, gpuarray.GPUArray)


def device_array(value, what, dtype=None):
    """Returns `value` as a C-contiguous GPUArray (NumPy input is copied over); raises TypeError
    naming `what` for a non-contiguous GPUArray or a dtype other than `dtype`."""
    if not is_device_array(value):
        return to_device(np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype))
    if not is_c_contiguous(value):
        raise TypeError("%s must be a C-contiguous GPUArray" % what)
    if dtype is not None and value.dtype != np.dtype(dtype):
        raise TypeError("%s must be %s on the GPU, got %s" % (what, np.dtype(dtype), value.dtype))
    return value


def count_array(count):
    """An optional uint64 [1] count as a device array (None: none); raises ValueError for
    another shape."""
    if count is None:
        return None
    count = device_array(count, "count", np.uint64)
    if count.shape != (1,):
        raise ValueError("count must be a uint64 [1] array, got shape %s" % (count.shape,))
    return count


def lane_shift(units_per_row):
    """log2 of the threads that share a row: the smallest power of two >= units_per_row, at
    most a warp (32)."""
    shift = 0
    while shift < 5 and (1 << shift) < units_per_row:
        shift += 1
    return shift


def index_array(value, what):
    """Returns `value` as a 1-D int64 GPUArray; int32 (host or device) is widened."""
    if is_device_array(value) and value.dtype == np.int32:
        value = device_array(value, what)
        wide = empty(value.shape, np.int64)
        if value.size:
            launch(_rows_kernel("widen_int32", "PqP"), value.size, ptr(value), value.size,
                   ptr(wide))
        value = wide
    value = device_array(value, what, np.int64)
    if value.ndim != 1:
        raise TypeError("%s must be 1-D, got shape %s" % (what, value.shape))
    return value


@memoised_per_context
def _rows_kernel(name, arg_types):
    return prepared("rows.cu", name, arg_types)


@memoised_per_context
def _scan_kernels():
    return {False: prepared("scan.cu", "scan_int64", "PqPP"),
            True: prepared("scan.cu", "scan_word_popcounts", "PqPP")}


def scan_tiles(n):
    """The tiles (blocks) of an exclusive scan of n values."""
    return -(-(int(n) + 1) // SCAN_TILE)


def scan_scratch_words(n):
    """int64 words of the zeroed scratch an exclusive scan of n values takes (scan.cu: a ticket,
    then a state word per tile); 0 where it takes one tile, and none."""
    tiles = scan_tiles(n)
    return 0 if tiles == 1 else 1 + tiles


def zeros_and_scan_scratch(n, dtype, scanned):
    """(zeros [n] of `dtype`, the zeroed scratch of an exclusive scan of `scanned` values or
    None where it needs none), from one allocation and one memset: an array the caller zeroes
    anyway (counts, a bitmap) carries the scratch of the scan that reads it."""
    dtype = np.dtype(dtype)
    words = scan_scratch_words(scanned)
    head = -(-int(n) * dtype.itemsize // 8) * 8  # the scratch starts 8-byte aligned
    block = fill_bytes(empty((head // 8 + words,), np.int64), 0)
    zeros = wrap((int(n),), dtype, ptr(block), base=block)
    return zeros, (row_view(block, head // 8, head // 8 + words) if words else None)


def exclusive_scan(values, n, scratch=None, popcounts=False):
    """Returns sums [n + 1] int64 with sums[i] = values[0] + ... + values[i - 1], in one launch
    (scan.cu), queued; every partial sum must lie in [-2^61, 2^61) (counts do). popcounts:
    values are uint32 words, each counted by its set bits (a bitmap's ranks). scratch: None, or
    an int64 GPUArray of at least scan_scratch_words(n) zeros the caller zeroed anyway (beside
    an array it fills with zeros), which the scan leaves dirty; else the scan zeroes its own
    (one memset)."""
    sums = empty((n + 1,), np.int64)
    tiles = scan_tiles(n)
    words = scan_scratch_words(n)
    if words and scratch is None:
        scratch = fill_bytes(empty((words,), np.int64), 0)
    elif words and (scratch.dtype != np.int64 or scratch.size < words):
        # a short scratch would hand out tickets past its tile states: a hang, not an error
        raise ValueError("exclusive_scan of %d values needs %d zeroed int64 words of scratch, "
                         "got %s %s" % (n, words, scratch.dtype, list(scratch.shape)))
    launch(_scan_kernels()[bool(popcounts)], 0, ptr(values), n, ptr(sums),
           ptr(scratch) if words else 0, block=SCAN_THREADS, blocks=tiles)
    return sums
