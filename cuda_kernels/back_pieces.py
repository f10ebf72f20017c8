"""The ctypes face of back_pieces.c, the host code reserved_rows' helper thread calls once a job
(sok1x/backend/cuda/reserved_rows.py): its struct of driver functions, its stages and fill kinds,
and its function with the argument types set. Needs neither PyCUDA nor a GPU, so a CPU test can
drive the C with driver functions of its own.
"""
import ctypes

FILL_ZEROS, FILL_WORDS = 1, 2  # back_pieces.c's fill kinds


CALLS = (("mem_create", "cuMemCreate"), ("mem_map", "cuMemMap"),
         ("mem_set_access", "cuMemSetAccess"), ("mem_unmap", "cuMemUnmap"),
         ("mem_release", "cuMemRelease"), ("memset_d8_async", "cuMemsetD8Async"),
         ("memset_d32_async", "cuMemsetD32Async"))  # (field, the driver function it holds)
DRIVER_NAMES = tuple(name for _, name in CALLS)


class DriverCalls(ctypes.Structure):  # back_pieces.c's struct sok1x_driver_calls
    _fields_ = [(field, ctypes.c_void_p) for field, _ in CALLS]


STAGES = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "a fill")  # back_pieces.c's stages


def back_pieces_function(library):
    """back_pieces.c's sok1x_back_pieces of the loaded `library`, its argument types set."""
    function, u64p = library.sok1x_back_pieces, ctypes.POINTER(ctypes.c_uint64)
    function.argtypes = [ctypes.POINTER(DriverCalls), ctypes.c_int64, u64p, u64p,
                         ctypes.c_void_p, ctypes.c_void_p, u64p, ctypes.c_int64, u64p, u64p,
                         ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_int32),
                         ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    function.restype = ctypes.c_int
    return function
