"""DLPack capsules (sok1x/backend/dlpack.py) against NumPy's own DLPack, an independent producer
and consumer: a capsule NumPy makes reads back as the array it came from (address, shape, dtype,
bytes), keeps that memory alive until dropped and then gives it back (NumPy's deleter runs); a
strided tensor, a used capsule and a foreign capsule are refused with what was wrong; a capsule
sok1x makes, NumPy reads as the same memory, and sok1x holds the owner exactly as long as a
consumer or the unconsumed capsule needs it."""
import ctypes
import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

from sok1x.backend import cpu, dlpack

if not hasattr(np, "from_dlpack"):  # NumPy < 1.22: the last NumPy for Python 3.7 is 1.21
    pytest.skip("NumPy %s has no DLPack (np.from_dlpack, 1.22+), the independent producer and "
                "consumer these tests compare with" % np.__version__, allow_module_level=True)

ARRAYS = [np.arange(7, dtype=np.int64), np.linspace(0, 1, 24, dtype=np.float32).reshape(4, 6),
          np.arange(60, dtype=np.uint8).reshape(3, 4, 5), np.array(2.5, dtype=np.float64),
          np.zeros((0, 3), np.int32)]


class Producer:
    """What np.from_dlpack asks of an object: a capsule and where its memory is."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None, **_):
        return self.capsule

    def __dlpack_device__(self):
        return (dlpack.DEVICE_CPU, 0)


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: "%s%s" % (a.dtype, list(a.shape)))
def test_a_numpy_capsule_reads_as_its_array_and_gives_the_memory_back_when_dropped(array):
    array = array.copy()
    references = sys.getrefcount(array)
    imported = dlpack.import_capsule(array.__dlpack__())
    assert (imported.shape, imported.dtype, imported.nbytes) == (array.shape, array.dtype,
                                                                 array.nbytes)
    assert imported.device_type == dlpack.DEVICE_CPU and imported.device_id == 0
    if array.size:
        assert imported.address == array.ctypes.data
    assert sys.getrefcount(array) > references  # NumPy's tensor holds the array
    view = cpu.from_dlpack(array.__dlpack__())
    np.testing.assert_array_equal(view, array)
    del imported, view
    gc.collect()
    assert sys.getrefcount(array) == references  # both deleters ran


def test_a_strided_tensor_is_refused_with_its_strides_and_given_back():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    strided = base[:, ::2]
    references = sys.getrefcount(base)
    with pytest.raises(TypeError, match=r"shape \[4, 3\] has strides \[6, 2\].*C-contiguous"):
        dlpack.import_capsule(strided.__dlpack__())
    del strided
    gc.collect()
    assert sys.getrefcount(base) == references
    # a size-1 dimension may have any stride: rows 0, 1, 2 of one column, read in place
    column = np.lib.stride_tricks.as_strided(base, shape=(3, 1), strides=(4, 40))
    imported = dlpack.import_capsule(column.__dlpack__())
    assert imported.shape == (3, 1) and imported.address == base.ctypes.data


def test_a_dtype_sok1x_lacks_is_refused_and_the_tensor_given_back_at_once():
    array = np.zeros(3, dtype=np.complex64)
    references = sys.getrefcount(array)
    with pytest.raises(TypeError, match="code 5, bits 64.*int, uint and float"):
        dlpack.import_capsule(array.__dlpack__())
    assert sys.getrefcount(array) == references  # released before the error, not at collection


def test_an_import_of_a_sok1x_export_exported_again_lets_both_go():
    """An export whose owner holds an import of another export: dropping it releases that
    import, whose deleter runs inside the first one's (a lock held across it would hang)."""
    code = ("import gc, numpy as np; from sok1x.backend import cpu, dlpack\n"
            "inner = cpu.from_dlpack(cpu.to_dlpack(np.arange(8.0)))\n"
            "outer = cpu.to_dlpack(inner)\n"
            "del inner; del outer; gc.collect()\n"
            "inner = cpu.from_dlpack(cpu.to_dlpack(np.arange(8.0)))\n"
            "outer = cpu.from_dlpack(cpu.to_dlpack(inner))\n"
            "del inner; del outer; gc.collect()\n"
            "print(dlpack.live_exports())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["0"], done.stderr


def test_a_used_or_foreign_capsule_is_refused():
    capsule = np.arange(3).__dlpack__()
    dlpack.import_capsule(capsule)
    with pytest.raises(TypeError, match="consumed once"):
        dlpack.import_capsule(capsule)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                   ctypes.c_void_p]
    name = ctypes.create_string_buffer(b"something_else")
    with pytest.raises(TypeError, match="expected a DLPack capsule named 'dltensor'"):
        dlpack.import_capsule(new(ctypes.addressof(name), name, None))


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: "%s%s" % (a.dtype, list(a.shape)))
def test_a_sok1x_capsule_reads_in_numpy_as_the_same_memory_held_while_numpy_holds_it(array):
    owner = cpu.exportable(array.copy())
    alive, address = weakref.ref(owner), owner.ctypes.data
    before = dlpack.live_exports()
    capsule = cpu.to_dlpack(owner)
    del owner
    # (an empty array's aligned copy is not stable in NumPy: exportable may copy it again)
    assert dlpack.live_exports() == before + 1 and (alive() is not None or not array.size)
    got = np.from_dlpack(Producer(capsule))
    del capsule
    assert got.shape == array.shape and got.dtype == array.dtype
    np.testing.assert_array_equal(got, array)
    if array.size:  # (NumPy copies nothing of an empty tensor and may let it go at once)
        assert got.ctypes.data == address  # no copy
        assert dlpack.live_exports() == before + 1 and alive() is not None
    del got
    gc.collect()
    assert dlpack.live_exports() == before and alive() is None  # the export let go of it


def test_an_unconsumed_capsule_frees_its_export_and_an_unknown_dtype_is_refused():
    before = dlpack.live_exports()
    capsule = cpu.to_dlpack(np.arange(4, dtype=np.int16))
    assert dlpack.live_exports() == before + 1
    del capsule
    gc.collect()
    assert dlpack.live_exports() == before
    with pytest.raises(TypeError, match="cannot export dtype bool"):
        cpu.to_dlpack(np.zeros(3, dtype=bool))
    assert dlpack.live_exports() == before
