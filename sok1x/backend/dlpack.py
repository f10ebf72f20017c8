"""DLPack capsules, read and made with ctypes, so that no framework is needed (DESIGN D1).

A DLPack capsule is a PyCapsule named "dltensor" holding a DLManagedTensor: a pointer to the data,
its device, dtype, shape and strides, and a deleter the consumer calls when it no longer needs the
memory. The consumer renames the capsule "used_dltensor", so it is consumed once, and the
producer's capsule destructor frees an unconsumed tensor only. TensorFlow
(tf.experimental.dlpack), PyTorch (torch.utils.dlpack) and CuPy speak it.

    import_capsule(capsule) -> ImportedTensor   consume a capsule; the object owns the memory
                                                 until it is dropped (then the producer's deleter
                                                 runs)
    export_capsule(address, shape, dtype, device_type, device_id, owner) -> capsule
                                                 a new capsule over memory that `owner` keeps
                                                 alive until the consumer's deleter runs

The numpy and PyCUDA arrays the backends make from these live in sok1x.backend.cpu and .cuda.
"""
import ctypes
import struct
import threading

import numpy as np

DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3

_CODES = {"i": 0, "u": 1, "f": 2}
_KINDS = {code: kind for kind, code in _CODES.items()}
BOOL_CODE = 6  # DLPack's kDLBool (one byte a value)

# A DLManagedTensor, read and written whole with one struct call (a crossing of the seam reads or
# writes one per tensor, and ctypes' Structure fields cost a microsecond each): DLTensor (data,
# device type and id, ndim, dtype code / bits / lanes, shape, strides, byte_offset), then
# manager_ctx and the deleter, 64 bytes on the 64-bit hosts sok1x runs on.
_MANAGED = struct.Struct("=QiiiBBHQQQQQ")
_DELETER_FIELD = struct.Struct("=Q")  # the last field, read alone when the tensor is let go
_DELETER_AT = _MANAGED.size - _DELETER_FIELD.size
_EXTENTS = {}  # ndim -> struct of ndim int64s (a shape or strides array)


def _extents(ndim):
    found = _EXTENTS.get(ndim)
    if found is None:
        found = _EXTENTS[ndim] = struct.Struct("=%dq" % ndim)
    return found


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void deleter(DLManagedTensor *)
_deleters = {}  # a producer's deleter address -> its callable (one per producer, made once)

# The C API calls hold the GIL (pythonapi is a PyDLL). Capsule names must outlive the capsules.
_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_NAME = ctypes.create_string_buffer(b"dltensor")
_USED_NAME = ctypes.create_string_buffer(b"used_dltensor")
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# The same two functions taking a raw PyObject*, for the capsule destructor: the capsule is dying
# there (refcount 0) and must not be handed to ctypes as an object, which would count it again.
_raw_api = ctypes.PyDLL(None)
_raw_is_valid = _raw_api.PyCapsule_IsValid
_raw_is_valid.restype = ctypes.c_int
_raw_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_raw_get_pointer = _raw_api.PyCapsule_GetPointer
_raw_get_pointer.restype = ctypes.c_void_p
_raw_get_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


_DTYPES = {}  # (code, bits) -> NumPy dtype, filled as met (every crossing looks one up)


def numpy_dtype(code, bits, lanes=1):
    """Returns the NumPy dtype of a DLPack (code, bits); raises TypeError for one sok1x lacks."""
    found = _DTYPES.get((code, bits)) if lanes == 1 else None
    if found is not None:
        return found
    if int(code) == BOOL_CODE and int(bits) == 8 and int(lanes) == 1:
        found = _DTYPES[(code, bits)] = np.dtype(np.bool_)
        return found
    kind = _KINDS.get(int(code))
    if kind is None or int(lanes) != 1 or int(bits) % 8:
        raise TypeError("DLPack dtype (code %d, bits %d, lanes %d) is not supported; sok1x "
                        "takes int, uint and float tensors" % (code, bits, lanes))
    found = _DTYPES[(code, bits)] = np.dtype("%s%d" % (kind, int(bits) // 8))
    return found


def type_code(dtype):
    """Returns the DLPack (code, bits) of a NumPy dtype; raises TypeError for one sok1x lacks."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return BOOL_CODE, 8
    code = _CODES.get(dtype.kind)
    if code is None:
        raise TypeError("dtype %s has no DLPack code sok1x uses" % dtype)
    return code, dtype.itemsize * 8


class ImportedTensor:
    """A consumed DLPack tensor. Attributes: address (int, data + byte_offset), shape (tuple),
    dtype (NumPy), device_type, device_id, nbytes. The producer's deleter runs when this object
    is dropped, so keep it alive as long as the memory is used (the backends' arrays hold it)."""

    def __init__(self, capsule):
        self._managed = None
        pointer = _api.PyCapsule_GetPointer(capsule, _NAME) if _api.PyCapsule_IsValid(
            capsule, _NAME) else None
        if not pointer:
            used = _api.PyCapsule_IsValid(capsule, _USED_NAME)
            raise TypeError(
                "a DLPack capsule can be consumed once, and this one was already consumed" if used
                else "expected a DLPack capsule named 'dltensor', got %r" % (capsule,))
        _api.PyCapsule_SetName(capsule, _USED_NAME)
        self._managed = pointer
        (data, self.device_type, self.device_id, ndim, code, bits, lanes, shape, strides,
         offset, _, _) = _MANAGED.unpack(ctypes.string_at(pointer, _MANAGED.size))
        try:  # the capsule is used now: a refused tensor goes back to its producer at once
            if ndim < 0 or (ndim and not shape):
                raise TypeError("a DLPack tensor with ndim %d and %s shape is malformed"
                                % (ndim, "a" if shape else "no"))
            self.dtype = numpy_dtype(code, bits, lanes)
        except TypeError:
            self.release()
            raise
        extents = _extents(ndim)
        self.shape = extents.unpack(ctypes.string_at(shape, extents.size)) if ndim else ()
        self.address = data + offset
        elements = 1
        for extent in self.shape:
            elements *= extent
        self.nbytes = elements * self.dtype.itemsize
        if strides and ndim:
            strides = extents.unpack(ctypes.string_at(strides, extents.size))
            if not _is_compact(self.shape, strides):
                self.release()
                raise TypeError("the DLPack tensor of shape %s has strides %s: sok1x needs a "
                                "C-contiguous tensor" % (list(self.shape), list(strides)))

    def release(self):
        """Calls the producer's deleter now (once)."""
        managed, self._managed = self._managed, None
        if not managed:
            return
        deleter, = _DELETER_FIELD.unpack(ctypes.string_at(managed + _DELETER_AT,
                                                          _DELETER_FIELD.size))
        if deleter:
            call = _deleters.get(deleter)
            if call is None:
                call = _deleters[deleter] = _DELETER(deleter)
            call(managed)

    def __del__(self):
        self.release()



def _is_compact(shape, strides):
    """True if element strides describe C order (sizes-1 dimensions may have any stride)."""
    expected = 1
    for axis in range(len(shape) - 1, -1, -1):
        if shape[axis] != 1 and strides[axis] != expected:
            return False
        expected *= shape[axis]
    return True


def import_capsule(capsule):
    """Consumes `capsule` and returns its ImportedTensor; raises TypeError for a used or foreign
    capsule, a strided tensor or an unsupported dtype."""
    return ImportedTensor(capsule)


_exports = {}  # a live export's DLManagedTensor address -> (its memory, the owner)
_exports_lock = threading.RLock()


# The owner an export held is let go after the lock: dropping it may release a tensor sok1x
# imported from another of its exports, whose deleter takes the lock again. The lock is
# reentrant all the same: a capsule the collector frees at an allocation inside it (the entry's
# tuple) runs its destructor on the same thread.
@_DELETER
def _delete_export(managed):
    with _exports_lock:
        held = _exports.pop(managed, None)
    del held


@_CAPSULE_DESTRUCTOR
def _destroy_capsule(capsule_address):
    # Called as the capsule dies: only an unconsumed capsule still owns its tensor.
    if _raw_is_valid(capsule_address, _NAME):
        with _exports_lock:
            held = _exports.pop(_raw_get_pointer(capsule_address, _NAME), None)
        del held


_DELETE_EXPORT = ctypes.cast(_delete_export, ctypes.c_void_p).value
_DESTROY_CAPSULE = ctypes.cast(_destroy_capsule, ctypes.c_void_p)


def export_capsule(address, shape, dtype, device_type, device_id, owner):
    """Returns a new "dltensor" capsule over `address` (C-contiguous `shape` of NumPy `dtype` on
    the DLPack device (device_type, device_id)); `owner` is kept alive until the consumer's deleter
    runs, or until the capsule dies unconsumed."""
    dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    code = _CODES.get(dtype.kind)
    if code is None:
        raise TypeError("cannot export dtype %s through DLPack" % dtype)
    shape = tuple(shape)
    extents = _extents(len(shape))
    # the DLManagedTensor and, after it, its shape (a 0-d tensor's points at one unused int64)
    memory = ctypes.create_string_buffer(_MANAGED.size + max(extents.size, 8))
    key = ctypes.addressof(memory)
    _MANAGED.pack_into(memory, 0, address, device_type, device_id, len(shape), code,
                       dtype.itemsize * 8, 1, key + _MANAGED.size, 0, 0, 0, _DELETE_EXPORT)
    extents.pack_into(memory, _MANAGED.size, *shape)
    with _exports_lock:
        _exports[key] = (memory, owner)
    return _api.PyCapsule_New(key, _NAME, _DESTROY_CAPSULE)


def live_exports():
    """How many exported tensors are still held for a consumer (for leak tests)."""
    with _exports_lock:
        return len(_exports)
