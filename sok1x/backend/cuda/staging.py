"""Every copy between host and device memory of the cuda backend, through page-locked buffers
reused across steps: one asynchronous copy each way on sok1x's stream (DESIGN D1), and no CUDA
call that blocks the host behind the stream.

    upload(device_ptr, host_array)      one host-to-device copy queued on the stream: straight
                                        from the array when it lies in one of these blocks (an
                                        output handed back as the next op's input), else through
                                        a block (one host copy, then the queued transfer)
    download(array, what) -> ndarray    one device-to-host copy into a block, then the bounded
                                        wait (cuda_context.wait_event); the result is a view of
                                        the block, which is handed out again only once no view
                                        of it is alive (a framework that adopts the array keeps
                                        the block until it drops it)

Why never pageable memory: a copy from or to pageable memory returns only once the stream has
reached it, so behind an NCCL collective whose peer never joins it blocks inside the driver,
where no time limit reaches (this is what hung a stalled-peer job on GPUs). A page-locked copy
returns at once; the host then waits in cuda_context.wait_event, which gives up after
SOK1X_NCCL_TIMEOUT_S. Allocating page-locked memory may wait for the device as well, so a new
block is taken only after a bounded wait for the stream. Blocks are powers of two from 4 KiB up
and are kept for the process's life, so a steady training loop allocates no page-locked memory
after its first steps.
"""
import bisect
import sys

import numpy as np
import pycuda.driver as driver

from sok1x.backend.cuda import context as cuda_context
from sok1x.backend.cuda.strides import elements, is_c_contiguous

_MIN_BLOCK = 4096


def _block_size(nbytes):
    size = _MIN_BLOCK
    while size < nbytes:
        size *= 2
    return size


class PinnedBlocks:
    """Page-locked host blocks, each with an event recorded after the last copy queued on it. A
    block is free when nothing but this pool refers to it and that copy has run: the host never
    writes a block a queued copy still reads, nor hands out one a queued copy still fills.

    A step takes and finds blocks a dozen times, and the pool holds as many blocks as a step
    ever had in use at once (dozens where readers keep evicted rows), so neither walks the
    whole pool: take() looks only at the blocks of the size it needs, starting after the one it
    handed out last, and index_holding() bisects the blocks' sorted addresses."""

    def __init__(self):
        self._blocks = []
        self._events = []
        self._by_size = {}  # block size -> [its blocks' indexes], and where take() looks next
        self._next = {}
        self._bases = []  # sorted (base address, index) of every block, for index_holding
        self._ends = []

    def take(self, nbytes):
        """Returns (index, a free page-locked np.uint8 block of at least `nbytes`)."""
        size = _block_size(nbytes)
        same = self._by_size.get(size, ())
        count = len(same)
        first = self._next.get(size, 0)
        for step in range(count):
            index = same[(first + step) % count]
            block = self._blocks[index]
            # References: the list, `block`, getrefcount's argument.
            if sys.getrefcount(block) <= 3 and self._events[index].query():
                self._next[size] = (first + step + 1) % count
                return index, block
        block = allocate_page_locked(size, np.uint8)
        index = len(self._blocks)
        self._blocks.append(block)
        self._events.append(driver.Event(flags=driver.event_flags.DISABLE_TIMING))
        self._by_size.setdefault(size, []).append(index)
        base = block.ctypes.data
        at = bisect.bisect(self._bases, (base, index))
        self._bases.insert(at, (base, index))
        self._ends.insert(at, base + block.nbytes)
        return index, block

    def queued(self, index, stream):
        """Records that a copy from or into block `index` is queued on `stream`; returns the
        event that passes once it has run."""
        event = self._events[index]
        event.record(stream)
        return event

    def index_holding(self, host_array):
        """Returns the index of the block `host_array` (C-contiguous) lies in, or None."""
        start = host_array.ctypes.data
        at = bisect.bisect(self._bases, (start, len(self._blocks))) - 1
        if at >= 0 and start + host_array.nbytes <= self._ends[at]:
            return self._bases[at][1]
        return None

    @property
    def total_bytes(self):
        return sum(block.nbytes for block in self._blocks)


def allocate_page_locked(shape, dtype, mem_flags=0):
    """Returns new page-locked host memory (pycuda.driver.pagelocked_empty), after a bounded
    wait for sok1x's stream: allocating page-locked memory may wait for the device to finish
    its work, inside the driver where no time limit reaches, so the stream must be idle first
    (a new block is needed only while a loop warms up, so this wait is rare)."""
    cuda_context.wait_stream("a wait before allocating page-locked host memory")
    return driver.pagelocked_empty(shape, dtype, mem_flags=mem_flags)


_blocks = PinnedBlocks()


def reserve(sizes):
    """Makes the pool hold, at the same time, a free block for each byte size in `sizes` (so a
    later loop that needs them allocates no page-locked memory). Call inside
    cuda_context.entered(), while the stream is idle."""
    held = [_blocks.take(nbytes)[1] for nbytes in sizes]  # each held: the next take skips it
    del held


def _view(block, shape, dtype):
    dtype = np.dtype(dtype)
    return block[:dtype.itemsize * elements(shape)].view(dtype).reshape(shape)


def upload(device_ptr, host_array):
    """Queues a copy of the C-contiguous, non-empty `host_array` to `device_ptr`; the host does
    not wait for the stream. Call inside cuda_context.entered()."""
    cuda_context.forbid_inside_capture("an upload of host data")  # (captured_graph.py)
    stream = cuda_context.stream()
    index = _blocks.index_holding(host_array)
    if index is None:
        index, block = _blocks.take(host_array.nbytes)
        source = _view(block, host_array.shape, host_array.dtype)
        np.copyto(source, host_array)
    else:
        source = host_array
    driver.memcpy_htod_async(device_ptr, source, stream)
    _blocks.queued(index, stream)


def download(array, what):
    """Returns the GPUArray `array` as a NumPy view of a page-locked block once the work queued
    before it is done (one copy, one bounded wait, named `what` if it times out). Call inside
    cuda_context.entered()."""
    return download_many([array], what)[0]


def download_many(arrays, what):
    """download() of several GPUArrays: every copy queued, then one bounded wait."""
    return download_later(arrays, what)()


def download_later(arrays, what, stream=None):
    """Queues download_many()'s copies (on `stream`, default the sok1x stream) and returns a
    function that waits for them and returns the host views: work queued on the stream in
    between runs while the host waits."""
    cuda_context.forbid_inside_capture("a host wait (%s)" % what)  # before anything queues
    stream = cuda_context.stream() if stream is None else stream
    hosts, last = [], None
    for array in arrays:
        if array.size == 0:
            hosts.append(np.empty(array.shape, array.dtype))
            continue
        index, block = _blocks.take(array.nbytes)
        host = _view(block, array.shape, array.dtype)
        if is_c_contiguous(array):
            driver.memcpy_dtoh_async(host, int(array.gpudata), stream)
        else:
            array.get(ary=host, async_=True, stream=stream)
        last = _blocks.queued(index, stream)
        hosts.append(host)

    def collect():
        if last is not None:
            cuda_context.wait_event(last, what)
        return hosts
    return collect


def download_beside(arrays, what):
    """download_later() on the side stream, once the work queued on the sok1x stream so far has
    run: the copies run beside the stream's later work. They read the arrays' memory, so the
    caller keeps the arrays (and their memory out of the pool) until it has collected them
    or dropped the function that collects them (a copy of memory handed out again meanwhile
    reads what is there then, harmless to it; the views would hold it)."""
    cuda_context.forbid_inside_capture("a copy beside the stream (%s)" % what)
    ready = driver.Event(flags=driver.event_flags.DISABLE_TIMING)
    ready.record(cuda_context.stream())
    side = cuda_context.side_stream()
    side.wait_for_event(ready)
    collect = download_later(arrays, what, side)
    # the event the side stream waits on lives as long as the copies that wait on it: never
    # destroyed while that wait may still be pending
    collect.ready = ready
    return collect


SMALL_BYTES = 256  # the largest array read_small_later takes (a flag, a group's 26 counts)
_SMALL_SLOTS = 32


class SmallReads:
    """A ring of page-locked slots of SMALL_BYTES in one block, an event each, for the small
    arrays a step reads later (a replayed step's flag): a read takes the next free slot without
    scanning the blocks. A slot is taken again only once the read that took it was collected
    (one never collected, after an error, is passed by); where every slot is out, the read goes
    through the blocks instead (download_later)."""

    def __init__(self):
        self._block = None
        self._events, self._out, self._next = [], [], 0

    def later(self, array, what):
        """Queues the copy of C-contiguous GPUArray `array` (at most SMALL_BYTES) into a slot;
        returns collect() -> a NumPy copy, after a bounded wait for that copy alone, the same
        copy at every call (whoever calls it shares it: read it, do not write it). None where
        every slot is still out."""
        if self._block is None:
            block = allocate_page_locked(SMALL_BYTES * _SMALL_SLOTS, np.uint8)
            self._events = [driver.Event(flags=driver.event_flags.DISABLE_TIMING)
                            for _ in range(_SMALL_SLOTS)]
            self._out = [False] * _SMALL_SLOTS
            self._block = block
        index = self._next
        for _ in range(_SMALL_SLOTS):  # a read never collected keeps its slot: pass it by
            if not self._out[index]:
                break
            index = (index + 1) % _SMALL_SLOTS
        else:
            return None
        self._next = (index + 1) % _SMALL_SLOTS
        start = index * SMALL_BYTES
        host = self._block[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
        stream = cuda_context.stream()
        driver.memcpy_dtoh_async(host, int(array.gpudata), stream)
        event = self._events[index]
        event.record(stream)
        self._out[index] = True
        kept = []

        def collect():
            if not kept:
                if not event.query():
                    cuda_context.wait_event(event, what)
                kept.append(np.array(host, copy=True))
                self._out[index] = False
            return kept[0]
        return collect


_small = SmallReads()


def read_small_later(array, what):
    """For a non-empty C-contiguous GPUArray of at most SMALL_BYTES: queues its copy to the
    host now and returns collect() -> a NumPy copy (the same one at every call: read, not
    written), waiting (bounded, named `what`) for that copy alone; None for any other array,
    or where no slot is free (the caller then takes download_later). Call inside
    cuda_context.entered()."""
    if not 0 < array.nbytes <= SMALL_BYTES or not is_c_contiguous(array):
        return None
    cuda_context.forbid_inside_capture("a host wait (%s)" % what)
    return _small.later(array, what)


def host_buffer(nbytes):
    """A uint8 view of `nbytes` of a free block, which stays taken while the view (or one of
    it) lives: upload() copies from it with no host copy. Call inside cuda_context.entered()."""
    _, block = _blocks.take(int(nbytes))
    return block[:int(nbytes)]


def pinned_bytes():
    """Bytes of page-locked memory held for staging."""
    return _blocks.total_bytes
