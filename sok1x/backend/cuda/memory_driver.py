"""The CUDA driver's memory calls that PyCUDA does not offer, through ctypes: virtual memory
management (an address range reserved, physical memory created and mapped into it, access
granted) and host registration. host_rows.py maps host memory for the device with them,
reserved_rows.py grows device arrays in place.

call(name, *args) runs one and raises DriverCallError (a RuntimeError: the call's name and the
driver's error number, `code`) on any result but success. Call inside cuda_context.entered().
address(name) is a driver function's address, for host code that calls it itself
(reserved_rows' helper: cuda_kernels/back_pieces.c).
"""
import ctypes

LOCATION_DEVICE = 1
LOCATION_HOST_NUMA = 3
ALLOCATION_PINNED = 1
PROT_READWRITE = 3
GRANULARITY_MINIMUM = 0
GRANULARITY_RECOMMENDED = 1
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY


class Location(ctypes.Structure):  # CUmemLocation
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


u64, size_t, ptr_t = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
_PROTOTYPES = (
    # CUresult cuCtxGetDevice(CUdevice *device)
    ("cuCtxGetDevice", [ctypes.POINTER(ctypes.c_int)]),
    # CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
    ("cuDeviceGetAttribute", [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]),
    # CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, int option)
    ("cuMemGetAllocationGranularity", [ctypes.POINTER(size_t), ctypes.POINTER(AllocationProp),
                                       ctypes.c_int]),
    # CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const prop *p, u64 flags)
    ("cuMemCreate", [ctypes.POINTER(u64), size_t, ctypes.POINTER(AllocationProp), u64]),
    # CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
    #                              u64 flags)
    ("cuMemAddressReserve", [ctypes.POINTER(u64), size_t, size_t, u64, u64]),
    # CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, handle h, u64 flags)
    ("cuMemMap", [u64, size_t, size_t, u64, u64]),
    # CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *d, size_t n)
    ("cuMemSetAccess", [u64, size_t, ctypes.POINTER(AccessDesc), size_t]),
    # CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
    ("cuMemUnmap", [u64, size_t]),
    # CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
    ("cuMemAddressFree", [u64, size_t]),
    # CUresult cuMemRelease(CUmemGenericAllocationHandle h)
    ("cuMemRelease", [u64]),
    # CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
    ("cuMemHostRegister_v2", [ptr_t, size_t, ctypes.c_uint]),
    # CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
    ("cuMemHostGetDevicePointer_v2", [ctypes.POINTER(u64), ptr_t, ctypes.c_uint]),
    # CUresult cuMemHostUnregister(void *p)
    ("cuMemHostUnregister", [ptr_t]),
)
_library = {}


class DriverCallError(RuntimeError):
    """A driver call that did not succeed: `code` is the driver's CUresult."""

    def __init__(self, name, code):
        super().__init__("CUDA driver call %s failed with error %d" % (name, code))
        self.code = code


def _driver():
    if "cuda" not in _library:
        library = ctypes.CDLL("libcuda.so.1")
        for name, argtypes in _PROTOTYPES:
            getattr(library, name).argtypes = argtypes
            getattr(library, name).restype = ctypes.c_int
        _library["cuda"] = library
    return _library["cuda"]


def call(name, *args):
    """Runs driver call `name` on `args`; raises DriverCallError unless it succeeds."""
    result = getattr(_driver(), name)(*args)
    if result != 0:
        raise DriverCallError(name, result)


def address(name):
    """The address of driver function `name` ("cuMemCreate") in libcuda."""
    return ctypes.cast(getattr(_driver(), name), ctypes.c_void_p).value


def current_device():
    """The CUdevice of the current context."""
    device = ctypes.c_int()
    call("cuCtxGetDevice", ctypes.byref(device))
    return device.value
