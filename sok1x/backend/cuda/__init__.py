"""The cuda backend: sok1x.backend's op set on pycuda GPUArrays, with the kernels of cuda_kernels/.

Every op enters the device's primary context (cuda_context.entered()) and queues its work on the
one sok1x stream; buffers come from the memory pool. An op waits for the GPU only where a result
must reach the host: bucket_by_owner's counts, unique's number of distinct keys (it sizes the
outputs), HashIndex.count_missing / find_or_insert / export, and to_host. The *_deferred and
*_start variants queue the same work and leave the sizes on the device, for an op header to
read with its own (engine/lookup/exchange_header.py); header_records writes that header's records.
Index arrays (keys, rows, segment ids) are int64 (int32 is widened); NumPy inputs are copied to
the GPU first.
Call cuda_context.activate(device_ordinal) before the first op (sok1x.init does).
"""
import numpy as np
from pycuda import gpuarray

from sok1x.backend import dlpack
from sok1x.backend.cuda import context as cuda_context
from sok1x.backend.cuda import host_rows as cuda_host_rows
from sok1x.backend.cuda import segment_rows
from sok1x.backend.owner_rules import OWNER_MOD
from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.groups import (  # noqa: F401  (part of the op set: table groups)
    distinct_rows_many,
    distinct_rows_many_finish,
    distinct_rows_many_start,
    distinct_rows_padded,
    index_bounds,
    index_bounds_deferred,
    join_keys,
    join_rows,
    local_rows,
    offset_parts,
    offset_parts_many,
    rotate_parts,
    part_bounds,
    part_bounds_deferred,
    part_tags,
    row_sequence,
)
from sok1x.backend.cuda.hash_groups import (  # noqa: F401  (part of the op set: hash groups)
    hash_erase_counted,
    hash_erase_many,
    hash_find_many,
    hash_insert_many,
    hash_insert_many_done,
    hash_insert_members,
    hash_members_advance,
    hash_rehash_many,
    rebuild_flags,
)
from sok1x.backend.cuda.random_rows import (  # noqa: F401  (part of the op set)
    init_rows,
    init_rows_tagged,
)
from sok1x.backend.cuda.captured_graph import captured_work  # noqa: F401  (op set: D14)
from sok1x.backend.cuda.reserved_rows import (  # noqa: F401  (op set: groups that grow)
    back_rows,
    back_rows_ahead,
    backed_bytes,
    join_ahead,
    reserved_rows,
    unback_rows,
)
from sok1x.backend.cuda.bulk import (  # noqa: F401  (part of the op set: checkpoints)
    free_device_memory, host_buffer, write_rows)
from sok1x.backend.cuda.eviction import (  # noqa: F401  (part of the op set)
    count_evictable,
    count_new_keys,
    count_new_keys_segmented,
    pick_victims,
    stamp_last_step,
)
from sok1x.backend.cuda.hash import (  # noqa: F401  (part of the op set)
    HashIndex,
    hash_settle_sizes,
    hash_sizes,
    hash_tombstones,
)
from sok1x.backend.cuda.sizes import (  # noqa: F401  (part of the op set)
    flag_outside,
    header_records,
    peer_slots_many,
)
from sok1x.backend.cuda.unique_keys import (  # noqa: F401  (part of the op set)
    unique,
    unique_many,
    unique_many_finish,
    unique_many_padded,
    unique_many_start,
)
from sok1x.backend.cuda.rows import (  # noqa: F401  (part of the op set)
    drop_rows_if_failed,
    gather_rows,
    gather_rows_many,
    move_rows,
    put_rows,
    take_rows,
)
from sok1x.backend import given_hyper, kept_sums
from sok1x.backend.kept_sums import sums_kept  # noqa: F401  (op set: D14)
from sok1x.backend.given_hyper import (  # noqa: F401  (op set: D14)
    hyper_given,
    step_given,
    time_given,
)
from sok1x.backend.cuda.optimizers import (  # noqa: F401  (part of the op set: optimizer updates)
    update_adadelta,
    update_adagrad,
    update_adam_all_rows,
    update_adamax,
    update_ftrl,
    update_keras_momentum,
    update_keras_rmsprop_all_rows,
    update_lazy_adam,
    update_momentum,
    update_rmsprop,
    update_sgd,
    write_given,
)
from sok1x.backend.cuda.kernel_launch import (
    COUNTS,
    copy_array as _copy_array,
    copy_rows_async,
    count_array as _count_array,
    device_array,
    download as _download,
    download_many as _download_many,
    download_beside as _download_beside,
    elements,
    empty as _pooled_empty,
    exclusive_scan,
    fill_bytes,
    fill_float32,
    index_array,
    is_c_contiguous,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    row_view as _row_view,
    row_views as _row_views,
    to_device,
    to_host as _copy_to_host,
    to_host_later as _copy_to_host_later,
    to_host_many_later as _copy_many_to_host_later,
    is_device_array,
    waited_stream,
    wrap,
    wrap_again,
)

NAME = "cuda"


@uses_context
def asarray(host_array):
    """Returns a GPUArray copy of `host_array` (a GPUArray is returned as it is)."""
    if is_device_array(host_array):
        return host_array
    return to_device(host_array)


@uses_context
def to_host(array):
    """Returns `array` as a NumPy array, once the work queued before it is done."""
    if not is_device_array(array):
        return np.asarray(array)
    return _copy_to_host(array)


@uses_context
def to_host_many(arrays):
    """Returns each array as a NumPy array, with one wait for all the device arrays among them
    (the device arrays' copies are the caller's)."""
    return [np.array(host, copy=True) if is_device_array(array) else host
            for array, host in zip(arrays, download_staged_many(arrays))]


@uses_context
def read_later(array):
    """Queues a copy of device `array` to the host now; returns a function that waits for that
    copy alone (not for work queued after it) and returns a NumPy copy, the same one at every
    call (read once, as often as asked)."""
    return _copy_to_host_later(array, "a flag the host reads later")


@uses_context
def read_many_later(arrays):
    """read_later of several device arrays (GPUArrays only): their copies queued now, one after
    the other on the stream; collect() waits for them alone (one wait) and returns NumPy
    copies."""
    return _copy_many_to_host_later(list(arrays), "counts the host reads later")


def counts():
    """Returns a copy of the counts of what the backend queued and waited for (cuda_launch)."""
    return dict(COUNTS)


@uses_context
def empty(shape, dtype):
    return _pooled_empty(shape, dtype)


@uses_context
def zeros(shape, dtype):
    return fill_bytes(_pooled_empty(shape, dtype), 0)


@uses_context
def fill_value(array, value):
    """Sets every element of `array` to `value` (a float32 array, any array for 0, a signed
    integer array for -1), queued."""
    if not value:
        return fill_bytes(array, 0)
    if value == -1 and array.dtype.kind == "i":
        return fill_bytes(array, 0xFF)
    return fill_float32(array, value)


@uses_context
def host_mapped_zeros(shape, dtype):
    """A GPUArray over zeroed page-locked host memory mapped into the device's address space,
    on 2 MiB pages where the system grants them (cuda_host_rows): kernels read and write its
    rows in place over PCIe. sok1x_host_memory is a NumPy view of the same memory; the array
    and that view keep it alive."""
    shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return gpuarray.GPUArray(shape, dtype)
    block = cuda_host_rows.mapped_host_block(nbytes)
    array = gpuarray.GPUArray(shape, dtype, gpudata=block.address)
    array.sok1x_host_memory = block.host[:nbytes].view(dtype).reshape(shape)
    array.sok1x_host_block = block
    return array


@uses_context
def split_zeros(shape, dtype, hbm_rows):
    """Zeros [shape] split at row hbm_rows: ([device part, host part (host_mapped_zeros)], None).
    The kernels take both parts' bases and pick a row's part on the device (common.cuh)."""
    shape = tuple(int(n) for n in shape)
    return [zeros((hbm_rows,) + shape[1:], dtype),
            host_mapped_zeros((shape[0] - hbm_rows,) + shape[1:], dtype)], None


def device_context():
    """A context manager inside which the device's primary context is current on this thread:
    PyCUDA makes, slices and reshapes arrays only there (engine calls run inside it)."""
    return cuda_context.entered()


@uses_context
def release_unused():
    """Waits for the stream and gives the memory pool's unused blocks back to the driver (after
    a one-time move of large arrays, so that their old blocks do not stay held)."""
    waited_stream()
    cuda_context.memory_pool().free_held()


@uses_context
def synchronize():
    """Waits until every op queued on the sok1x stream is done."""
    waited_stream()


@memoised_per_context
def _routing_kernels():
    return (prepared("routing.cu", "owner_tile_counts", "PqqqqqqPP"),
            prepared("routing.cu", "owner_counts_from_offsets", "PqqP"),
            prepared("routing.cu", "owner_scatter", "PqqqqqqPPP"),
            prepared("routing.cu", "owners_of_keys", "PqqqqP"))


@uses_context
def owners_of(keys, world_size, owner_rule=OWNER_MOD, fixed_rank=0):
    """Returns the owner rank of each key (int64 GPUArray) by `owner_rule` (see cpu.owners_of)."""
    keys = index_array(keys, "keys")
    owners = _pooled_empty(keys.shape, np.int64)
    if keys.shape[0]:
        launch(_routing_kernels()[3], keys.shape[0], ptr(keys), keys.shape[0], int(world_size),
               int(owner_rule), int(fixed_rank), ptr(owners))
    return owners


@uses_context
def bucket_by_owner(keys, world_size, owner_rule=OWNER_MOD, fixed_rank=0):
    """Returns (perm, counts): keys[perm] grouped by owner (owners_of), stable inside an owner;
    perm an int64 GPUArray, counts a host int64 array [world_size]."""
    return bucket_by_owner_many([keys], world_size, [(owner_rule, fixed_rank)])[0]


@uses_context
def bucket_by_owner_many(keys_list, world_size, owner_rules):
    """bucket_by_owner() of each array (owner_rules: one (rule, fixed_rank) each), with one wait
    for all the per-owner counts. Returns a list of (perm, counts)."""
    perms, counts = bucket_by_owner_many_deferred(keys_list, world_size, owner_rules)
    counts = _copy_to_host(counts)
    return [(perm, counts[i].copy()) for i, perm in enumerate(perms)]


@uses_context
def bucket_by_owner_many_deferred(keys_list, world_size, owner_rules, valid_counts=None):
    """bucket_by_owner_many() without the wait: returns (perms, counts), counts an int64
    GPUArray [len(keys_list), world_size] that an op header carries (no host copy).
    valid_counts: None, or an int64 GPUArray [len(keys_list)]: bucket only the first
    valid_counts[i] keys of array i (unique_many_padded's output); perm i then has one entry per
    key, the first sum(counts[i]) of them meaningful and the rest 0."""
    tile_counts_kernel, counts_kernel, scatter_kernel, _ = _routing_kernels()
    world_size = int(world_size)
    all_counts = fill_bytes(_pooled_empty((max(len(keys_list), 1) * world_size,), np.int64), 0)
    perms = []
    for i, (keys, (owner_rule, fixed_rank)) in enumerate(zip(keys_list, owner_rules)):
        keys = index_array(keys, "keys")
        n = keys.shape[0]
        perm = _pooled_empty((n,), np.int64)
        perms.append(perm)
        if n == 0:
            continue
        valid = 0
        if valid_counts is not None:
            valid = ptr(valid_counts) + 8 * i
            fill_bytes(perm, 0)
        rule = (world_size, int(owner_rule), int(fixed_rank))
        keys_per_tile = 32 * min(max(world_size, 8), 256)
        num_tiles = -(-n // keys_per_tile)
        tile_counts = fill_bytes(_pooled_empty((world_size * num_tiles,), np.int64), 0)
        launch(tile_counts_kernel, 32 * num_tiles, ptr(keys), n, *rule, keys_per_tile,
               num_tiles, valid, ptr(tile_counts))
        offsets = exclusive_scan(tile_counts, world_size * num_tiles)
        launch(counts_kernel, world_size, ptr(offsets), world_size, num_tiles,
               ptr(all_counts) + 8 * world_size * i)
        launch(scatter_kernel, 32 * num_tiles, ptr(keys), n, *rule, keys_per_tile, num_tiles,
               valid, ptr(offsets), ptr(perm))
    # a view, not a slice and reshape: PyCUDA's make two arrays through GPUArray's constructor
    return perms, wrap((len(keys_list), world_size), np.int64, all_counts.gpudata,
                       base=all_counts)


@memoised_per_context
def _pooling_kernels():
    return {"column": prepared("pooling.cu", "column_int64", "PqqqP"),
            "counts": prepared("pooling.cu", "segment_counts_float32", "PqP"),
            "scale": prepared("pooling.cu", "scale_rows_float32", "PPqqiP"),
            "fill_rows": prepared("pooling.cu", "fill_rows_float64", "PPqPdP")}


@uses_context
def column(matrix, index):
    """Returns column `index` of an int64 [n, k] GPUArray as an int64 [n] GPUArray."""
    matrix = device_array(matrix, "matrix", np.int64)
    n, k = matrix.shape
    out = _pooled_empty((n,), np.int64)
    if n:
        launch(_pooling_kernels()["column"], n, ptr(matrix), n, k, int(index), ptr(out))
    return out


@uses_context
def segment_counts(segment_ids, num_segments):
    """Returns float32 [num_segments]: how many ids fall in each segment."""
    segment_ids = index_array(segment_ids, "segment_ids")
    counts = fill_bytes(_pooled_empty((int(num_segments),), np.float32), 0)
    if segment_ids.shape[0]:
        launch(_pooling_kernels()["counts"], segment_ids.shape[0], ptr(segment_ids),
               segment_ids.shape[0], ptr(counts))
    return counts


@uses_context
def fill_rows(array, rows, value, count=None):
    """array[rows] = value for a float64 1-D GPUArray, queued (no upload of the value per row;
    inside given_hyper.time_given(clock), the value clock holds when the fill runs); count: as
    init_rows' (only the first count[0] rows, negative rows skipped)."""
    rows = index_array(rows, "rows")
    if array.dtype != np.float64 or array.ndim != 1:
        raise TypeError("fill_rows needs a float64 1-D array, got %s %s" % (array.dtype,
                                                                           array.shape))
    if rows.shape[0]:
        clock = given_hyper.given_time()
        launch(_pooling_kernels()["fill_rows"], rows.shape[0], ptr(array), ptr(rows),
               rows.shape[0], _count_ptr(count), float(value),
               0 if clock is None else ptr(clock))


@uses_context
def scale_rows(values, factors, divide=False):
    """Returns float32 values [n, ...] times (divide=True: over, 0 where the factor is 0)
    float32 factors [n], one per row."""
    values = device_array(values, "values", np.float32)
    factors = device_array(factors, "factors", np.float32)
    if factors.shape != (values.shape[0],):
        raise ValueError("scale_rows: %d factors for %d rows" % (factors.size, values.shape[0]))
    out = _pooled_empty(values.shape, np.float32)
    if values.size:
        width = values.size // values.shape[0]
        launch(_pooling_kernels()["scale"], values.size, ptr(values), ptr(factors),
               values.shape[0], width, int(bool(divide)), ptr(out))
    return out


@memoised_per_context
def _floor_divide_kernel():
    return prepared("routing.cu", "floor_divide_int64", "PqqP")


@uses_context
def floor_divide(keys, divisor):
    """Returns keys // divisor (int64 GPUArray), the row of each key in a table without a hash
    table; raises ZeroDivisionError for divisor 0."""
    keys = index_array(keys, "keys")
    divisor = int(divisor)
    if divisor == 0:
        raise ZeroDivisionError("floor_divide by zero")
    quotients = _pooled_empty(keys.shape, np.int64)
    if keys.shape[0]:
        launch(_floor_divide_kernel(), keys.shape[0], ptr(keys), keys.shape[0], divisor,
               ptr(quotients))
    return quotients


row_view = uses_context(_row_view)
row_views = uses_context(_row_views)
copy_array = uses_context(_copy_array)


@uses_context
def reshape(array, shape):
    """Returns `array` in `shape` (one -1 allowed): a C-contiguous GPUArray as a view made
    without GPUArray's constructor (which asks the driver for launch sizes), any other as
    PyCUDA reshapes it."""
    if not is_device_array(array) or not is_c_contiguous(array):
        return array.reshape(shape)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    if shape.count(-1) == 1:
        known = elements(n for n in shape if n != -1)
        if known and array.size % known == 0:
            shape = tuple(array.size // known if n == -1 else n for n in shape)
    if elements(shape) != array.size or min(shape, default=0) < 0:
        raise ValueError("cannot reshape an array of %d elements (shape %s) into shape %s"
                         % (array.size, array.shape, shape))
    return wrap(shape, array.dtype, array.gpudata, base=array)


@memoised_per_context
def _add_rows_kernel(name):
    return prepared("rows.cu", "add_rows_" + name, "PPqqP")


def _add_rows_name(table, values, width):
    """rows.cu's add_rows kernel for these arrays: float32_x4 (four columns a thread) where the
    rows are float32, width % 4 == 0 and both arrays are 16-byte aligned, else the dtype's."""
    if (table.dtype == np.float32 and width % 4 == 0 and ptr(table) % 16 == 0
            and ptr(values) % 16 == 0):
        return "float32_x4"
    return table.dtype.name


def _add_rows(table, rows, values, what):
    if table.dtype not in (np.float32, np.float64):
        raise TypeError("%s: float32 or float64 values only, got %s" % (what, table.dtype))
    values = device_array(values, "values", table.dtype)
    row_shape = table.shape[1:]
    if values.shape != (rows.shape[0],) + row_shape:
        raise ValueError("%s: values have shape %s, expected %s" % (
            what, values.shape, (rows.shape[0],) + row_shape))
    if values.size:
        width = elements(row_shape)
        name = _add_rows_name(table, values, width)
        threads = values.size // 4 if name == "float32_x4" else values.size
        launch(_add_rows_kernel(name), threads, ptr(table), ptr(rows), rows.shape[0], width,
               ptr(values))


@uses_context
def segment_sum(values, segment_ids, num_segments, counts=None):
    """Returns [num_segments, ...] sums of `values` rows per segment id (absent ids give zeros),
    like tf.math.unsorted_segment_sum; the order of the additions is not fixed. counts: None,
    or the fourth value of the distinct_rows_padded(counted=True) whose inverse these ids are:
    their count per segment, so the sorted path does not count them again. It is consumed
    (counted down to zero): pass it to one segment_sum, of exactly that inverse."""
    values = device_array(values, "values")
    segment_ids = index_array(segment_ids, "segment_ids")
    out = _pooled_empty((int(num_segments),) + values.shape[1:], values.dtype)
    n = int(segment_ids.shape[0])
    dirty = kept_sums.kept(int(num_segments))  # (a replayed backward's: kept_sums.py)
    if (values.shape[0] == n and ptr(out) % 16 == 0
            and segment_rows.applies(values, n, elements(values.shape[1:]))):
        return segment_rows.sorted_segment_sum(values, segment_ids, num_segments, out, dirty,
                                               counts)
    _add_rows(fill_bytes(out, 0), segment_ids, values, "segment_sum")
    if dirty is not None:  # every row written: any may hold a sum now
        fill_value(dirty, -1)
    return out


@uses_context
def scatter_add_rows(table, rows, values):
    """table[rows] += values, repeated rows summed."""
    _add_rows(table, index_array(rows, "rows"), values, "scatter_add_rows")


@memoised_per_context
def _touch_rows_kernel():
    return prepared("dynamic_table.cu", "touch_rows", "PPqqPPqPd")


@uses_context
def touch_rows(statistics, rows, step, stamp=None):
    """For each row >= 0: statistics[row] = (step, count + 1), statistics an int64 [n, 2]
    GPUArray of (last step, count) records (a repeated row counts each time). stamp: None, or
    (times, new_rows, now, count): fill_rows(times, new_rows, now, count) in the same launch."""
    rows = index_array(rows, "rows")
    if statistics.dtype != np.int64 or statistics.ndim != 2 or statistics.shape[1] != 2:
        raise TypeError("touch_rows needs int64 [n, 2] statistics, got %s %s"
                        % (statistics.dtype, statistics.shape))
    times, new_rows, now, count = (None, None, 0.0, None) if stamp is None else stamp
    new_n = 0
    if times is not None:
        new_rows = index_array(new_rows, "new_rows")
        if times.dtype != np.float64 or times.ndim != 1:
            raise TypeError("touch_rows stamps a float64 1-D array, got %s %s"
                            % (times.dtype, times.shape))
        new_n = new_rows.shape[0]
    if rows.shape[0] or new_n:
        launch(_touch_rows_kernel(), max(rows.shape[0], new_n), ptr(statistics), ptr(rows),
               rows.shape[0], int(step), 0 if not new_n else ptr(times),
               0 if not new_n else ptr(new_rows), new_n, _count_ptr(count) if new_n else 0,
               float(now))


def _count_ptr(count):
    """Device address of an optional uint64 [1] count array (0: none); a NumPy count's device
    copy must not be freed before its use is queued, so use it in the same launch's arguments
    with nothing allocated in between."""
    count = _count_array(count)
    return 0 if count is None else ptr(count)


_ALIGNMENT = 64  # TensorFlow refuses tensors whose data is not 64-byte aligned


@uses_context
def from_dlpack(capsule):
    """Returns a GPUArray over the memory of a CUDA DLPack capsule of this process's GPU, read in
    place (no copy); the producer's memory lives as long as the array. Raises TypeError for a
    host tensor, another GPU's, a used capsule or a strided tensor."""
    imported = dlpack.import_capsule(capsule)
    ordinal = cuda_context.device_ordinal()
    if imported.device_type != dlpack.DEVICE_CUDA or imported.device_id != ordinal:
        where = (imported.device_type, imported.device_id)
        imported.release()
        raise TypeError(
            "the cuda backend reads tensors on GPU %d; this DLPack tensor is on device (type %d, "
            "id %d): place the op on this rank's GPU" % (ordinal, where[0], where[1]))
    if imported.nbytes == 0:
        return _pooled_empty(imported.shape, imported.dtype)
    return wrap(tuple(imported.shape), imported.dtype, cuda_context.foreign_block(imported))


def exportable(array):
    """Returns the GPUArray `array` as to_dlpack hands it over without a copy: C-contiguous and
    64-byte aligned (copied on the device if it is not)."""
    # the common case without entering the context: a kernel call's every output comes here
    if is_device_array(array) and is_c_contiguous(array) and not ptr(array) % _ALIGNMENT:
        return array
    return _exportable_copy(array)


@uses_context
def _exportable_copy(array):
    array = device_array(array, "array") if not is_device_array(array) else array
    if not is_c_contiguous(array):
        array = to_device(_download(array, "a copy of a strided array for DLPack"))
    elif ptr(array) % _ALIGNMENT:
        aligned = _pooled_empty(array.shape, array.dtype)
        copy_rows_async(aligned.reshape(-1), 0, array.reshape(-1), 0, array.size)
        array = aligned
    return array


@uses_context
def to_dlpack(array):
    """Returns a DLPack capsule over the GPUArray `array` (copied on the device only if it is not
    C-contiguous and 64-byte aligned); the array lives until the consumer drops the tensor."""
    array = exportable(array)
    if array.size == 0 and ptr(array) == 0:
        array = _pooled_empty((1,), array.dtype)[:0]
    return dlpack.export_capsule(ptr(array), array.shape, array.dtype, dlpack.DEVICE_CUDA,
                                 cuda_context.device_ordinal(), array)


def framework_orders():
    """(wait_for_framework, release_to_framework) as two functions of a framework's stream to
    call inside engine.runtime.entered(), which look nothing up (a kernel call orders twice)."""
    return cuda_context.stream_orders()


@uses_context
def wait_for_framework(stream=0):
    """Orders sok1x's stream after the framework's queued work (no host wait): after `stream`, a
    framework's CUstream as an int, or by default the default stream."""
    cuda_context.order_after_default_stream(stream)


@uses_context
def release_to_framework(stream=0):
    """Orders the framework's later work after sok1x's queued work (no host wait): on `stream`,
    a framework's CUstream as an int, or by default the default stream."""
    cuda_context.order_default_stream_after(stream)


def borrow(address, shape, dtype, owner=None):
    """Returns a GPUArray over C-contiguous device memory a framework owns at `address` (0 for
    no elements), read and written in place; `owner` lives as long as the array."""
    if not address:
        return _empty_in_context(shape, dtype)
    if type(shape) is tuple and isinstance(dtype, np.dtype):  # a kernel call's, every step
        return wrap_again(shape, dtype, int(address), owner)
    return wrap(shape, dtype, int(address), base=owner)  # no allocation: no context needed


@uses_context
def _empty_in_context(shape, dtype):
    return _pooled_empty(shape, dtype)


def address_of(array):
    """The device address of a GPUArray's first element (0 when it has none)."""
    return ptr(array)


def device_ordinal():
    """The ordinal of the GPU sok1x runs on."""
    return cuda_context.device_ordinal()


@uses_context
def synchronize_device():
    """Waits on the host for all work queued on the GPU, on any stream of its primary context
    (the kernel seam's host-staging fallback: a framework's stream it cannot name)."""
    import pycuda.driver as driver
    driver.Context.synchronize()


@uses_context
def memory_device(address):
    """The ordinal of the GPU whose memory `address` is, or None for any other address."""
    return cuda_context.device_of(int(address))


@memoised_per_context
def _narrow_kernel():
    return prepared("rows.cu", "narrow_int64", "PqP")


@uses_context
def narrow_indices(indices):
    """Returns int32 [n] of int64 positions `indices` [n], each below 2**31 (the caller's
    guarantee: positions into an array of fewer rows)."""
    indices = index_array(indices, "indices")
    narrow = _pooled_empty(indices.shape, np.int32)
    if indices.size:
        launch(_narrow_kernel(), indices.size, ptr(indices),
               indices.size, ptr(narrow))
    return narrow


@uses_context
def upload_staged(host_array):
    """Returns a GPUArray copy of a host array through page-locked staging (queued)."""
    return to_device(host_array)


@uses_context
def download_staged(array):
    """Returns `array` as a NumPy view of a reused page-locked buffer (one copy, one wait)."""
    if not is_device_array(array):
        return np.asarray(array)
    return _download(array, "a staged copy to the host")


@uses_context
def download_staged_later(arrays):
    """Queues download_staged's copies of device `arrays` on a second stream, once the work
    queued so far has run, so that they run beside the work queued after; returns a function
    that waits for those copies alone (one wait) and returns the host views. Keep the arrays
    until it was called or dropped."""
    return _download_beside(list(arrays))


@uses_context
def download_staged_many(arrays):
    """download_staged of several arrays with one wait for all the device arrays among them: no
    host copy, where to_host_many copies each into a new array (page faults, at megabytes)."""
    positions = [i for i, array in enumerate(arrays) if is_device_array(array)]
    views = _download_many([arrays[i] for i in positions], "a copy to the host")
    # np.asarray of a GPUArray would walk it element by element (a GPUArray per element)
    hosts = [None if is_device_array(array) else np.asarray(array) for array in arrays]
    for i, view in zip(positions, views):
        hosts[i] = view
    return hosts
