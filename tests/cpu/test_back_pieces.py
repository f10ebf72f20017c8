"""back_pieces.c, the host code that makes a helper job's driver calls in one call
(backend/cuda/reserved_rows.py), built by the kernels' compile helper (compiler.host_library)
from the INSTALLED package and driven here with driver functions of this test's own: a model of
the driver's allocations, mappings, access and queued fills. Every piece is created, mapped and
opened, then every fill queued, with the arguments the driver documents; a piece that fails
gives back itself and every piece before it, and a fill that fails leaves the pieces mapped for
the caller. No GPU is needed.
"""
import ctypes
import os

import pytest
from mpi_jobs import lane_a_only

from sok1x import cuda_kernels
from sok1x.cuda_kernels import back_pieces, compiler

pytestmark = [lane_a_only(), pytest.mark.skipif(
    cuda_kernels.find_nvcc() is None, reason="nvcc not found: it builds the host code")]

STREAM = 0x5EED
PROP, ACCESS = ctypes.c_int(7), ctypes.c_int(9)  # stand-ins the C passes through untouched
OUT_OF_MEMORY, INVALID = 2, 1


class ModelDriver:
    """The driver's memory calls over a model of its state; `fail` = (function, its call
    number) makes that call return `code` and change nothing."""

    def __init__(self, fail=None, code=OUT_OF_MEMORY):
        self.handles, self.mapped, self.opened, self.fills = {}, {}, set(), []
        self.counts, self.fail, self.code, self.next_handle = {}, fail, code, 100
        c = ctypes
        types = {
            "cuMemCreate": c.CFUNCTYPE(c.c_int, c.POINTER(c.c_uint64), c.c_size_t, c.c_void_p,
                                       c.c_uint64),
            "cuMemMap": c.CFUNCTYPE(c.c_int, c.c_uint64, c.c_size_t, c.c_size_t, c.c_uint64,
                                    c.c_uint64),
            "cuMemSetAccess": c.CFUNCTYPE(c.c_int, c.c_uint64, c.c_size_t, c.c_void_p,
                                          c.c_size_t),
            "cuMemUnmap": c.CFUNCTYPE(c.c_int, c.c_uint64, c.c_size_t),
            "cuMemRelease": c.CFUNCTYPE(c.c_int, c.c_uint64),
            "cuMemsetD8Async": c.CFUNCTYPE(c.c_int, c.c_uint64, c.c_ubyte, c.c_size_t,
                                           c.c_void_p),
            "cuMemsetD32Async": c.CFUNCTYPE(c.c_int, c.c_uint64, c.c_uint, c.c_size_t,
                                            c.c_void_p),
        }
        methods = {"cuMemCreate": self.create, "cuMemMap": self.map,
                   "cuMemSetAccess": self.set_access, "cuMemUnmap": self.unmap,
                   "cuMemRelease": self.release, "cuMemsetD8Async": self.memset_d8,
                   "cuMemsetD32Async": self.memset_d32}
        self.functions = [types[name](self._counted(name, methods[name]))
                          for name in back_pieces.DRIVER_NAMES]  # kept alive with the model
        self.calls = back_pieces.DriverCalls(
            *[ctypes.cast(f, ctypes.c_void_p).value for f in self.functions])

    def _counted(self, name, method):
        def call(*args):
            self.counts[name] = self.counts.get(name, 0) + 1
            if self.fail == (name, self.counts[name]):
                return self.code
            return method(*args)
        return call

    def create(self, handle, size, prop, flags):
        assert prop == ctypes.addressof(PROP) and flags == 0
        self.next_handle += 1
        self.handles[self.next_handle] = size
        handle[0] = self.next_handle
        return 0

    def map(self, where, size, offset, handle, flags):
        assert handle in self.handles and self.handles[handle] == size
        assert offset == 0 and flags == 0 and where not in self.mapped
        self.mapped[where] = (size, handle)
        return 0

    def set_access(self, where, size, access, count):
        assert self.mapped[where][0] == size and access == ctypes.addressof(ACCESS)
        assert count == 1
        self.opened.add(where)
        return 0

    def unmap(self, where, size):
        assert self.mapped.pop(where)[0] == size
        self.opened.discard(where)
        return 0

    def release(self, handle):
        del self.handles[handle]
        return 0

    def memset_d8(self, where, value, count, stream):
        self.fills.append(("d8", where, value, count, stream))
        return 0

    def memset_d32(self, where, value, count, stream):
        self.fills.append(("d32", where, value, count, stream))
        return 0


@pytest.fixture(scope="module")
def function(tmp_path_factory):
    before = os.environ.get("SOK1X_KERNEL_CACHE_DIR")
    os.environ["SOK1X_KERNEL_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernels"))
    try:
        return back_pieces.back_pieces_function(compiler.host_library("back_pieces.c"))
    finally:
        if before is None:
            del os.environ["SOK1X_KERNEL_CACHE_DIR"]
        else:
            os.environ["SOK1X_KERNEL_CACHE_DIR"] = before


PIECES = [(0x10000000, 2 << 20), (0x10400000, 6 << 20), (0x20000000, 2 << 20)]
FILLS = [(0x10000000, 1 << 20, back_pieces.FILL_ZEROS, 0),
         (0x20000000, 4096, back_pieces.FILL_WORDS, 0x3DCCCCCD)]  # 0.1f's bits


def run(function, driver, pieces=PIECES, fills=FILLS):
    """(result, failed, handles) of one call of sok1x_back_pieces on `driver`."""
    def array(values, ctype):
        return (ctype * max(len(values), 1))(*values)
    handles = (ctypes.c_uint64 * len(pieces))()
    failed = (ctypes.c_int64 * 2)(-1, -1)
    result = function(
        ctypes.byref(driver.calls), len(pieces), array([p[0] for p in pieces], ctypes.c_uint64),
        array([p[1] for p in pieces], ctypes.c_uint64), ctypes.addressof(PROP),
        ctypes.addressof(ACCESS), handles, len(fills),
        array([f[0] for f in fills], ctypes.c_uint64),
        array([f[1] for f in fills], ctypes.c_uint64),
        array([f[3] for f in fills], ctypes.c_uint32),
        array([f[2] for f in fills], ctypes.c_int32), STREAM, failed)
    return result, list(failed), list(handles)


def test_the_package_ships_the_source():
    assert os.path.isfile(os.path.join(cuda_kernels.KERNEL_DIR, "back_pieces.c"))


def test_every_piece_is_created_mapped_and_opened_then_every_fill_queued(function):
    driver = ModelDriver()
    result, failed, handles = run(function, driver)
    assert result == 0 and failed == [-1, -1]
    assert driver.mapped == {where: (size, handle)
                             for (where, size), handle in zip(PIECES, handles)}
    assert driver.opened == {where for where, _ in PIECES}
    assert sorted(driver.handles) == sorted(handles)
    assert driver.fills == [("d8", 0x10000000, 0, 1 << 20, STREAM),
                            ("d32", 0x20000000, 0x3DCCCCCD, 1024, STREAM)]


@pytest.mark.parametrize("name, stage", [("cuMemCreate", 0), ("cuMemMap", 1),
                                         ("cuMemSetAccess", 2)])
@pytest.mark.parametrize("piece", [0, 2])
def test_a_piece_that_fails_gives_back_every_piece_of_the_call(function, name, stage, piece):
    driver = ModelDriver(fail=(name, piece + 1), code=OUT_OF_MEMORY)
    result, failed, _ = run(function, driver)
    assert result == OUT_OF_MEMORY and failed == [stage, piece]
    assert driver.handles == {} and driver.mapped == {} and driver.opened == set()
    assert driver.fills == []


def test_a_fill_that_fails_leaves_the_pieces_mapped_for_the_caller(function):
    driver = ModelDriver(fail=("cuMemsetD32Async", 1), code=INVALID)
    result, failed, handles = run(function, driver)
    assert result == INVALID and failed == [3, 1]
    assert sorted(driver.mapped) == [where for where, _ in PIECES]
    assert driver.opened == {where for where, _ in PIECES}
    assert driver.fills == [("d8", 0x10000000, 0, 1 << 20, STREAM)]
    assert driver.counts.get("cuMemUnmap", 0) == 0 and driver.counts.get("cuMemRelease", 0) == 0


def test_nothing_to_back_or_fill_calls_nothing(function):
    driver = ModelDriver()
    assert run(function, driver, pieces=[], fills=[])[:2] == (0, [-1, -1])
    assert driver.counts == {}


def test_a_cached_build_that_cannot_load_is_built_again(tmp_path, monkeypatch):
    """A cache entry under the host library's key that is not a library of this machine (one
    built elsewhere, say) is built again and replaced, not kept as the reason to fall back."""
    import platform
    monkeypatch.setenv("SOK1X_KERNEL_CACHE", "1")
    monkeypatch.setenv("SOK1X_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_libraries", {})
    text, arch = compiler._read_text("back_pieces.c"), "host-" + platform.machine()
    key = compiler._cache_key(text, arch, compiler.HOST_OPTIONS, compiler.find_nvcc())
    entry = os.path.join(compiler.private_cache_folder(), key + ".cubin")
    compiler._cache_write(entry, b"not a library of this machine")
    library = compiler.host_library("back_pieces.c")
    assert back_pieces.back_pieces_function(library) is not None
    assert compiler._cache_read(entry)[:4] == b"\x7fELF"
