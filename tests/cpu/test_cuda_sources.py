"""nvcc compiles every kernel family of the INSTALLED sok1x.cuda_kernels for sm_70, sm_80 and sm_90,
and the compile helper's disk cache behaves (no GPU needed).

Run it against the installed package, from outside the checkout, so the repository's folders are
not on sys.path:
    pip install . && cd /tmp && python -m pytest -q <repo>/tests/cpu/test_cuda_sources.py
"""
import os
import re
import warnings

import pytest
from mpi_jobs import lane_a_only

from sok1x import cuda_kernels
from sok1x.common import private_cache
from sok1x.cuda_kernels import compiler

CHECKOUT_KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "cuda_kernels")
ARCHITECTURES = ("sm_70", "sm_80", "sm_90")
pytestmark = lane_a_only()
NVCC = cuda_kernels.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set SOK1X_NVCC or CUDA_HOME "
                                "to compile the kernels)")


def _sources_in(folder):
    return sorted(name for name in os.listdir(folder) if name.endswith((".cu", ".cuh")))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SOK1X_KERNEL_CACHE", "1")
    monkeypatch.setenv("SOK1X_KERNEL_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One disk cache for the module's compiles of every source: the names' test reads the
    sm_90 cubins the compile test made (each compile once, not twice: CI time)."""
    folder = tmp_path_factory.mktemp("kernel-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SOK1X_KERNEL_CACHE", "1")
        patch.setenv("SOK1X_KERNEL_CACHE_DIR", str(folder))
        yield folder


def test_kernels_come_from_the_installed_package():
    assert os.path.realpath(cuda_kernels.KERNEL_DIR) != os.path.realpath(CHECKOUT_KERNELS), (
        "sok1x.cuda_kernels was imported from the checkout; pip install . and run pytest from "
        "outside the repository")


def test_package_data_ships_every_source():
    shipped = cuda_kernels.source_names() + cuda_kernels.header_names()
    assert sorted(shipped) == _sources_in(CHECKOUT_KERNELS)
    assert len(cuda_kernels.source_names()) >= 5


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("source", cuda_kernels.source_names())
def test_source_compiles(source, arch, shared_cache):
    known = cuda_kernels.nvcc_architectures()
    if known is not None and arch not in known:
        pytest.skip("this nvcc cannot build %s (CUDA 13 dropped sm_70; it lists %s)" % (
            arch, " ".join(sorted(known))))
    cubin = cuda_kernels.compile_cubin(source, arch)
    assert cubin[:4] == b"\x7fELF"


@needs_nvcc
@pytest.mark.parametrize("source", cuda_kernels.source_names())
def test_kernel_names_are_read_from_the_cubin(source, shared_cache):
    """What init loads (cuda_kernels.load_every_kernel): every kernel the source declares, those
    a macro stamps out included, and nothing else."""
    from sok1x.cuda_kernels.cubin_symbols import kernel_names
    text = open(os.path.join(cuda_kernels.KERNEL_DIR, source)).read()
    declared = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\(",
                              text))
    stamped = set(re.findall(r"__global__ void (\w+)##SUFFIX", text))
    names = kernel_names(cuda_kernels.compile_cubin(source, "sm_90"))
    assert names and declared <= set(names), declared - set(names)
    plain = [name for name in names if name not in declared]
    assert all(any(name.startswith(stem) for stem in stamped) for name in plain), plain
    with pytest.raises(ValueError):
        kernel_names(b"not a cubin" * 8)


@needs_nvcc
def test_disk_cache_hit_and_corrupt_entry(cache_dir):
    first = cuda_kernels.compile_cubin("scan.cu", "sm_90")
    entries = [p for p in cache_dir.rglob("*.cubin")]
    assert len(entries) == 1 and not list(cache_dir.rglob(".tmp-*"))
    assert entries[0].parent.name == compiler.package_version()
    assert cuda_kernels.compile_cubin("scan.cu", "sm_90") == first
    entries[0].write_bytes(entries[0].read_bytes()[:100])  # cut short
    assert cuda_kernels.compile_cubin("scan.cu", "sm_90") == first
    assert compiler._cache_read(str(entries[0])) == first  # rewritten
    entries[0].write_bytes(b"garbage")
    assert cuda_kernels.compile_cubin("scan.cu", "sm_90") == first


@needs_nvcc
def test_options_are_part_of_the_key(cache_dir):
    cuda_kernels.compile_cubin("scan.cu", "sm_90")
    cuda_kernels.compile_cubin("scan.cu", "sm_90", options=("-DSOK1X_TEST_OPTION=1",))
    assert len(list(cache_dir.rglob("*.cubin"))) == 2


@needs_nvcc
def test_cache_can_be_turned_off(cache_dir, monkeypatch):
    monkeypatch.setenv("SOK1X_KERNEL_CACHE", "0")
    assert cuda_kernels.compile_cubin("scan.cu", "sm_80")[:4] == b"\x7fELF"
    assert not list(cache_dir.rglob("*"))


@needs_nvcc
def test_compile_error_shows_numbered_source(cache_dir):
    source = '#include "common.cuh"\nextern "C" __global__ void broken(int64* out) {\n' \
             '  out[0] = not_declared;\n}\n'
    with pytest.raises(cuda_kernels.KernelCompileError) as caught:
        cuda_kernels.compile_text(source, "broken.cu", "sm_90")
    message = str(caught.value)
    assert "not_declared" in message and "undefined" in message
    assert "    3 |   out[0] = not_declared;" in message
    assert not list(cache_dir.rglob("*.cubin"))


# -- the disk cache is private -----------------------------------------------------------------

def _mode(path):
    return os.stat(str(path)).st_mode & 0o777


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    """A cache root that does not exist yet, under a folder only this user can write."""
    monkeypatch.setenv("SOK1X_KERNEL_CACHE", "1")
    monkeypatch.setenv("SOK1X_KERNEL_CACHE_DIR", str(tmp_path / "shared" / "kernels"))
    monkeypatch.setattr(private_cache, "_refused", set())
    return tmp_path / "shared" / "kernels"


def test_cache_folders_are_created_for_their_owner_only(cache_root, monkeypatch):
    old_umask = os.umask(0)  # even a permissive umask gives 0700
    try:
        folder = compiler.private_cache_folder()
    finally:
        os.umask(old_umask)
    assert folder == os.path.join(str(cache_root), compiler.package_version())
    for path in (cache_root.parent, cache_root, folder):
        assert _mode(path) == 0o700 and os.stat(str(path)).st_uid == os.getuid(), path


@pytest.mark.parametrize("which", ["root", "versioned"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_folder_others_can_write_is_refused(cache_root, which, mode):
    folder = compiler.private_cache_folder()
    target = cache_root if which == "root" else folder
    os.chmod(str(target), mode)
    with pytest.warns(RuntimeWarning, match="can be written by other users") as caught:
        assert compiler.private_cache_folder() is None
    message = str(caught[0].message)
    assert str(target) in message and "compiled in memory" in message and "chmod 700" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiler.private_cache_folder() is None  # said once, refused every time


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a folder to another user")
def test_a_folder_someone_else_owns_is_refused(cache_root):
    folder = compiler.private_cache_folder()
    os.chown(folder, os.getuid() + 4242, -1)
    with pytest.warns(RuntimeWarning, match="belongs to user %d" % (os.getuid() + 4242)):
        assert compiler.private_cache_folder() is None


def test_an_entry_file_others_can_write_is_a_miss(cache_root):
    folder = compiler.private_cache_folder()
    entry = os.path.join(folder, "0" * 64 + ".cubin")
    compiler._cache_write(entry, b"\x7fELF planted")
    assert _mode(entry) == 0o600
    assert compiler._cache_read(entry) == b"\x7fELF planted"
    os.chmod(entry, 0o666)
    assert compiler._cache_read(entry) is None


@needs_nvcc
def test_a_refused_folder_compiles_in_memory_and_writes_nothing(cache_root):
    folder = compiler.private_cache_folder()
    os.chmod(str(cache_root), 0o777)
    with pytest.warns(RuntimeWarning, match="compiled in memory"):
        cubin = cuda_kernels.compile_cubin("scan.cu", "sm_90")
    assert cubin[:4] == b"\x7fELF"
    assert not os.listdir(folder)
