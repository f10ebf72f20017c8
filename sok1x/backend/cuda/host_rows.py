"""Page-locked host memory that kernels read and write in place (a hybrid table's host rows).

The GPU reaches mapped host memory through its own page tables, and a gather of random rows
reads slower the larger the region (46 GiB/s from 0.25 GiB, 25 from 1 GiB, 10 from 4 GiB on one
H100). 2 MiB pages were expected to keep the translations cached; measured, they do not change
those rates (bench/NOTES.md, issue 21). $SOK1X_HOST_ROWS names how host rows are allocated; each
way falls back to the next when the system refuses it (see _DEFAULT):

    vmm     cuMemCreate of host memory (CU_MEM_LOCATION_TYPE_HOST_NUMA, the GPU's NUMA node) in
            2 MiB-granular pieces, mapped with cuMemMap and opened to the device and the CPU with
            cuMemSetAccess (CUDA 12.2 and later)
    thp     an anonymous mapping aligned to 2 MiB with madvise(MADV_HUGEPAGE) (transparent huge
            pages, where the kernel allows them), page-locked with cuMemHostRegister(DEVICEMAP)
    slices  an anonymous mapping page-locked with cuMemHostRegister(DEVICEMAP) in pieces of
            128 MiB (HierarchicalKV allocates its host vectors in slices of that size), one
            contiguous device range (the pieces' device addresses are their host addresses)
    pinned  cuMemHostAlloc(DEVICEMAP) through PyCUDA: the driver's own pages

mapped_host_block(nbytes) returns a HostBlock: its device address (kernels use it as a device
pointer) and `host`, a NumPy uint8 view the CPU reads and writes; the memory is freed once the
block and every view of it are gone. Every driver call is checked and raises RuntimeError naming
the call. Call inside cuda_context.entered().
"""
import ctypes
import mmap
import os

import numpy as np

from sok1x.backend.cuda.memory_driver import (  # the driver's memory calls, shared with
    ALLOCATION_PINNED as _ALLOCATION_PINNED,     # reserved_rows.py
    GRANULARITY_RECOMMENDED as _GRANULARITY_RECOMMENDED,
    LOCATION_DEVICE as _LOCATION_DEVICE,
    LOCATION_HOST_NUMA as _LOCATION_HOST_NUMA,
    PROT_READWRITE as _PROT_READWRITE,
    AccessDesc as _AccessDesc,
    AllocationProp as _AllocationProp,
    call as _call,
    ptr_t as _ptr,
    size_t as _size,
    u64 as _u64,
)

_HUGE = 2 << 20
_METHODS = ("vmm", "thp", "slices", "pinned")
_SLICE = 128 << 20
# Measured on one H100 (bench/host_rows.py, 2026-11-23): neither 2 MiB way reads faster than
# pinned at any region size (46 / 25 / 10 GiB/s from 0.25 / 1 / 4 GiB, all three alike), and
# vmm's CPU view disagreed with the kernels' in the probe: pinned is the default, the others
# are opt-in for further measurement.
_DEFAULT = "pinned"
_ATTRIBUTE_HOST_NUMA_ID = 134
_ATTRIBUTE_HOST_NUMA_VMM = 141
_REGISTER_PORTABLE_DEVICEMAP = 0x01 | 0x02
_MADV_HUGEPAGE = 14


def method():
    """The first way of allocating host rows that $SOK1X_HOST_ROWS asks for (module docstring);
    raises ValueError naming the variable for an unknown one."""
    wanted = os.environ.get("SOK1X_HOST_ROWS", _DEFAULT)
    if wanted not in _METHODS:
        raise ValueError("SOK1X_HOST_ROWS must be one of %s, got %r" % (_METHODS, wanted))
    return wanted


class HostBlock:
    """nbytes of mapped host memory: `address` (the device address, int(block) too), `host` (a
    NumPy uint8 view), `method` (how it was allocated) and `huge_bytes` (bytes the kernel reports
    on huge pages for thp, the mapped size for vmm, 0 for pinned)."""

    def __init__(self, nbytes, address, host_address, keep, method_name, release):
        self.nbytes, self.address, self.method = int(nbytes), int(address), method_name
        self._host_address, self._keep, self._release = int(host_address), keep, release
        self.huge_bytes = 0

    @property
    def host(self):
        """A NumPy uint8 view of the block that keeps the block, so the memory, alive (the
        block holds no view: no reference cycle delays the release)."""
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self._host_address)
        raw.sok1x_block = self
        return np.frombuffer(raw, np.uint8)

    def __int__(self):
        return self.address

    def __del__(self):
        if self._release is not None:
            release, self._release = self._release, None
            try:
                release()
            except Exception:  # the context may already be gone at interpreter exit
                pass


def _gpu_numa_node():
    device = ctypes.c_int()
    _call("cuCtxGetDevice", ctypes.byref(device))
    supported, node = ctypes.c_int(), ctypes.c_int()
    _call("cuDeviceGetAttribute", ctypes.byref(supported), _ATTRIBUTE_HOST_NUMA_VMM, device)
    if not supported.value:
        raise RuntimeError("the device has no host-NUMA virtual memory management")
    _call("cuDeviceGetAttribute", ctypes.byref(node), _ATTRIBUTE_HOST_NUMA_ID, device)
    return device.value, max(node.value, 0)


def _vmm_block(nbytes):
    device, node = _gpu_numa_node()
    prop = _AllocationProp()
    prop.type, prop.location.type, prop.location.id = (_ALLOCATION_PINNED, _LOCATION_HOST_NUMA,
                                                       node)
    granularity = _size()
    _call("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(prop),
          _GRANULARITY_RECOMMENDED)
    step = max(int(granularity.value), 1)
    size = -(-int(nbytes) // step) * step
    handle, address = _u64(), _u64()
    _call("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(prop), 0)
    try:
        _call("cuMemAddressReserve", ctypes.byref(address), size, step, 0, 0)
    except RuntimeError:
        _call("cuMemRelease", handle)
        raise
    mapped = []

    def release():
        if mapped:
            _call("cuMemUnmap", address, size)
        _call("cuMemAddressFree", address, size)
        _call("cuMemRelease", handle)

    try:
        _call("cuMemMap", address, size, 0, handle, 0)
        mapped.append(True)
        for where, which in ((_LOCATION_DEVICE, device), (_LOCATION_HOST_NUMA, node)):
            access = _AccessDesc()  # the device's access, then the CPU's, one call each
            access.location.type, access.location.id, access.flags = (where, which,
                                                                      _PROT_READWRITE)
            _call("cuMemSetAccess", address, size, ctypes.byref(access), 1)
    except RuntimeError:
        release()
        raise
    from pycuda import driver
    from sok1x.backend.cuda import context as cuda_context
    driver.memset_d8_async(address.value, 0, size, cuda_context.stream())  # before any kernel
    block = HostBlock(nbytes, address.value, address.value, None, "vmm", release)
    block.huge_bytes = size if step >= _HUGE else 0
    return block


def _huge_page_bytes(start, nbytes):
    """AnonHugePages (bytes) of the mappings overlapping [start, start + nbytes), or 0."""
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    low, high = (int(x, 16) for x in head.split("-"))
                    inside = low < start + nbytes and start < high
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return total


def _thp_block(nbytes):
    size = -(-int(nbytes) // _HUGE) * _HUGE
    area = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    start = -(-base // _HUGE) * _HUGE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [_ptr, _size, ctypes.c_int]
    libc.madvise(start, size, _MADV_HUGEPAGE)  # a refusal leaves 4 KiB pages: still correct
    _call("cuMemHostRegister_v2", start, size, _REGISTER_PORTABLE_DEVICEMAP)
    address = _u64()
    try:
        _call("cuMemHostGetDevicePointer_v2", ctypes.byref(address), start, 0)
    except RuntimeError:
        _call("cuMemHostUnregister", start)
        raise

    def release():
        from sok1x.backend.cuda import context as cuda_context
        with cuda_context.entered():
            _call("cuMemHostUnregister", start)

    block = HostBlock(nbytes, address.value, start, area, "thp", release)
    block.huge_bytes = _huge_page_bytes(start, size)
    return block


def _slices_block(nbytes):
    size = -(-int(nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(area))
    registered, base = [], None

    def release():  # every piece, even after one fails: the mapping goes right after
        from sok1x.backend.cuda import context as cuda_context
        failure = None
        with cuda_context.entered():
            for piece in registered:
                try:
                    _call("cuMemHostUnregister", piece)
                except RuntimeError as exc:
                    failure = failure or exc
        if failure is not None:
            raise failure

    try:
        for offset in range(0, size, _SLICE):
            _call("cuMemHostRegister_v2", start + offset, min(_SLICE, size - offset),
                  _REGISTER_PORTABLE_DEVICEMAP)
            registered.append(start + offset)
            address = _u64()
            _call("cuMemHostGetDevicePointer_v2", ctypes.byref(address), start + offset, 0)
            base = address.value if base is None else base
            if address.value != base + offset:
                raise RuntimeError("the registered pieces' device addresses are not contiguous")
    except RuntimeError:
        release()
        raise
    return HostBlock(nbytes, base, start, area, "slices", release)


def _pinned_block(nbytes):
    import pycuda.driver as driver
    from sok1x.backend.cuda.staging import allocate_page_locked
    host = allocate_page_locked((int(nbytes),), np.uint8,
                                mem_flags=driver.host_alloc_flags.DEVICEMAP)
    host.fill(0)
    return HostBlock(nbytes, host.base.get_device_pointer(), host.ctypes.data, host, "pinned",
                     None)


_MAKERS = {"slices": _slices_block, "vmm": _vmm_block, "thp": _thp_block, "pinned": _pinned_block}


def mapped_host_block(nbytes, first=None):
    """A HostBlock of nbytes (> 0) zeroed bytes, allocated the first way from `first` (default:
    method()) that the system grants; the last, pinned, raises what the driver says."""
    from sok1x.backend.cuda import context as cuda_context
    # Allocating or registering page-locked memory may wait for the device inside the driver,
    # where no time limit reaches: the stream must be idle first.
    cuda_context.wait_stream("a wait before allocating mapped host memory")
    names = _METHODS[_METHODS.index(first or method()):]
    for name in names[:-1]:
        try:
            return _MAKERS[name](nbytes)
        except (RuntimeError, OSError, ValueError):
            continue
    return _MAKERS[names[-1]](nbytes)
