"""The cuda backend's bulk moves between host and device memory, for checkpoints
(engine/checkpoint*.py): a rank's rows stream through page-locked blocks (cuda_staging) in
chunks of hundreds of MB, each one copy, with no gather or scatter kernel where rows are in
order.
"""
import numpy as np
import pycuda.driver as driver

from sok1x.backend.cuda import context as cuda_context
from sok1x.backend.cuda import staging as cuda_staging
from sok1x.backend.cuda.context import uses_context
from sok1x.backend.cuda.kernel_launch import (
    copy_rows_async,
    device_array,
    elements,
    is_device_array,
    ptr,
    waited_stream,
)


@uses_context
def host_buffer(nbytes):
    """A uint8 host array of `nbytes` in a reused page-locked block (taken while the array or a
    view of it lives): write_rows uploads from it with no host copy."""
    return cuda_staging.host_buffer(nbytes)


@uses_context
def write_rows(dst, first, src):
    """dst[first:first + len(src)] = src along axis 0 (src a host or device array), queued: one
    copy straight into dst's rows (from a page-locked host array without a host copy)."""
    dst = device_array(dst, "dst")
    row_shape = tuple(dst.shape[1:])
    row_bytes = dst.dtype.itemsize * elements(row_shape)
    rows = int(src.shape[0])
    if tuple(src.shape[1:]) != row_shape or not 0 <= first <= dst.shape[0] - rows:
        raise ValueError("write_rows: %s rows at %d do not fit an array of %s"
                         % (list(src.shape), first, list(dst.shape)))
    if rows and is_device_array(src):
        copy_rows_async(dst, int(first), device_array(src, "src", dst.dtype), 0, rows)
    elif rows:
        cuda_staging.upload(ptr(dst) + int(first) * row_bytes,
                            np.ascontiguousarray(src, dst.dtype))


@uses_context
def free_device_memory():
    """Bytes of device memory new arrays can take now, once the stream is idle and the memory
    pool's unused blocks went back to the driver."""
    waited_stream()
    cuda_context.memory_pool().free_held()
    return int(driver.mem_get_info()[0])
