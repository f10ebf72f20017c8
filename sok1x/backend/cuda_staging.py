"""Host staging for frameworks without DLPack (TensorFlow 1.15's py_func): page-locked host
buffers reused across steps, and one asynchronous copy each way on sok1x's stream (DESIGN D1).

    upload(host_array) -> GPUArray      one host-to-device copy queued on the stream: straight
                                        from the array when it lies in one of these blocks (an
                                        output handed back as the next op's input), else from
                                        pageable memory through the driver's own staging (no
                                        host copy of ours in between)
    download(array) -> np.ndarray       one device-to-host copy into a page-locked block, then a
                                        wait; the result is a view of the block, which is handed
                                        out again only once no view of it is alive (a framework
                                        that adopts the array keeps the block until it drops it)

Blocks are powers of two from 4 KiB up and are kept for the process's life, so a steady training
loop allocates no page-locked memory after its first steps.
"""
import sys

import numpy as np
import pycuda.driver as driver

from sok1x.backend import cuda_context
from sok1x.backend.cuda_launch import COUNTS, empty, ptr, waited_stream

_MIN_BLOCK = 4096


def _block_size(nbytes):
    size = _MIN_BLOCK
    while size < nbytes:
        size *= 2
    return size


class PinnedBlocks:
    """Page-locked host blocks. A block is free when nothing but this pool refers to it: every
    copy into or out of a block is queued on sok1x's one stream, so a block taken again is
    written only after the copies queued before."""

    def __init__(self):
        self._blocks = []

    def take(self, nbytes):
        """Returns a free page-locked np.uint8 block of at least `nbytes`."""
        size = _block_size(nbytes)
        for block in self._blocks:
            # References: the list, the loop variable, getrefcount's argument.
            if block.nbytes == size and sys.getrefcount(block) <= 3:
                return block
        block = driver.pagelocked_empty(size, np.uint8)
        self._blocks.append(block)
        return block

    def holds(self, host_array):
        """True if `host_array` (C-contiguous) lies inside one of the blocks."""
        start = host_array.ctypes.data
        end = start + host_array.nbytes
        for block in self._blocks:
            base = block.ctypes.data
            if base <= start and end <= base + block.nbytes:
                return True
        return False

    @property
    def total_bytes(self):
        return sum(block.nbytes for block in self._blocks)


_blocks = PinnedBlocks()


def _view(block, shape, dtype):
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return block[:nbytes].view(dtype).reshape(shape)


def upload(host_array):
    """Returns a GPUArray copy of `host_array` (one copy, queued; from pageable memory the driver
    returns once it has staged the data)."""
    host_array = np.ascontiguousarray(host_array)
    out = empty(host_array.shape, host_array.dtype)
    if host_array.size:
        driver.memcpy_htod_async(ptr(out), host_array, cuda_context.stream())
        COUNTS["copies"] += 1
        if not _blocks.holds(host_array):
            COUNTS["host_waits"] += 1  # a pageable copy waits for the stream first
    return out


def download(array):
    """Returns the GPUArray `array` as a NumPy view of a page-locked block, after the work queued
    before it (one copy, one wait)."""
    if array.size == 0:
        return np.empty(array.shape, array.dtype)
    block = _blocks.take(array.nbytes)
    host = _view(block, array.shape, array.dtype)
    stream = cuda_context.stream()
    driver.memcpy_dtoh_async(host, ptr(array), stream)
    waited_stream()
    COUNTS["copies"] += 1
    return host


def pinned_bytes():
    """Bytes of page-locked memory held for staging."""
    return _blocks.total_bytes
