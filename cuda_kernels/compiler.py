"""The one compile helper for sok1x's CUDA kernels: nvcc -> cubin -> PyCUDA module; and for the
host C beside them (host_library: nvcc's host compiler -> a shared library -> ctypes).

A kernel family (one .cu file of this folder, which may include the .cuh headers beside it) is
compiled by nvcc into a cubin for one architecture, sm_XY from the device's compute capability,
and loaded with pycuda.driver.module_from_buffer. Two caches:

- in memory, per CUDA context: load_module(name, options) gives the same Module every time;
- on disk, one file per key under <root>/<package version>/, the key a SHA-256 of the source, the
  headers, the options, the nvcc version, the architecture and the package version. An entry is
  written to a temporary name and renamed, and carries a checksum of its cubin: an entry that is
  cut short or altered is a miss (compiled again and rewritten), never a crash. A cache folder
  that cannot be written only costs the write.

The disk cache is private, as CuPy's is: a cubin found there is loaded into the job, so whoever
can write the folder could run code in it. The root and the versioned folder are made readable
and writable by their owner only (0700); a root or versioned folder that another user owns, or
that others can write, is refused with a RuntimeWarning saying why and what to do, and kernels
are compiled in memory instead; an entry file that is not this user's, or that others can
write, is a miss.

Environment:
    SOK1X_KERNEL_CACHE=0        no disk cache (still cached in memory)
    SOK1X_KERNEL_CACHE_DIR      the root (default $XDG_CACHE_HOME/sok1x/kernels, or
                                ~/.cache/sok1x/kernels)
    SOK1X_NVCC                  the nvcc to use (default: $CUDA_HOME/bin, PATH, /usr/local/cuda)

Compile errors raise KernelCompileError with the nvcc command, its output and the numbered source.

A host library (a .c file of this folder: driver calls a helper thread makes without the GIL) is
built with `nvcc -shared`, which hands it to the host compiler nvcc uses, and kept in the same disk
cache under the same kind of key (its architecture "host-<machine>"). ctypes loads a library from
a file only, so each process writes the checked bytes to a private temporary file, loads that and
removes it.
"""
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading

from sok1x.common import private_cache
from sok1x.errors import Sok1xError

KERNEL_DIR = os.path.dirname(os.path.abspath(__file__))
BASE_OPTIONS = ("-O3", "-std=c++14")
HOST_OPTIONS = ("-shared", "-Xcompiler", "-fPIC", "-O2")
_CACHE_MAGIC = b"sok1x-cubin-v1\n"
_lock = threading.RLock()
_nvcc_facts = {}
_modules = {}
_libraries = {}


class KernelCompileError(Sok1xError):
    """nvcc could not compile a kernel source; the message holds its output and the source."""


def find_nvcc():
    """Returns the path of nvcc, or None: $SOK1X_NVCC, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin."""
    candidates = [os.environ.get("SOK1X_NVCC")]
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            candidates.append(os.path.join(os.environ[variable], "bin", "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _require_nvcc():
    nvcc = find_nvcc()
    if nvcc is None:
        raise KernelCompileError(
            "nvcc was not found (looked at $SOK1X_NVCC, $CUDA_HOME/bin, PATH and "
            "/usr/local/cuda/bin); install the CUDA toolkit or set SOK1X_NVCC to its nvcc")
    return nvcc


def _nvcc_output(nvcc, flag):
    key = (nvcc, flag)
    with _lock:
        if key not in _nvcc_facts:
            done = subprocess.run([nvcc, flag], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  universal_newlines=True)
            _nvcc_facts[key] = done.stdout if done.returncode == 0 else None
        return _nvcc_facts[key]


def nvcc_version(nvcc=None):
    """Returns nvcc's --version text (part of every cache key)."""
    nvcc = nvcc or _require_nvcc()
    return (_nvcc_output(nvcc, "--version") or "").strip()


def nvcc_architectures(nvcc=None):
    """Returns the set of sm_XY codes nvcc can build, or None if it cannot say (before CUDA 11)."""
    nvcc = nvcc or _require_nvcc()
    listing = _nvcc_output(nvcc, "--list-gpu-code")
    if listing is None:
        return None
    return set(listing.split())


def package_version():
    """Returns the installed sok1x version, or '0+source' when running from a checkout."""
    try:
        try:
            from importlib import metadata  # novermin: Python >= 3.8, 3.7 below
            return metadata.version("sok1x")
        except ImportError:  # Python 3.7: setuptools' reader of the same metadata
            import pkg_resources
            return pkg_resources.get_distribution("sok1x").version
    except Exception:  # not installed, or no metadata: the source hash still keys the cache
        return "0+source"


def cache_folder():
    """Returns the versioned disk cache folder, or None when SOK1X_KERNEL_CACHE=0."""
    if os.environ.get("SOK1X_KERNEL_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    root = os.environ.get("SOK1X_KERNEL_CACHE_DIR") or private_cache.cache_root("kernels")
    return os.path.join(root, package_version())


def private_cache_folder():
    """Returns the versioned disk cache folder, made 0700 where missing, if it and its root are
    private to this user; else None (SOK1X_KERNEL_CACHE=0, a folder that cannot be made, or one
    refused with a RuntimeWarning, once per folder: kernels are then compiled in memory)."""
    folder = cache_folder()
    if folder is None:
        return None
    return private_cache.private_folder(
        folder, "Kernels it held", "kernels are compiled in memory instead",
        "point SOK1X_KERNEL_CACHE_DIR at a private folder, or set SOK1X_KERNEL_CACHE=0",
        stacklevel=4)


def _read_text(name):
    with open(os.path.join(KERNEL_DIR, name), "r") as handle:
        return handle.read()


def _headers_text():
    names = sorted(name for name in os.listdir(KERNEL_DIR) if name.endswith(".cuh"))
    return "".join("//@%s\n%s" % (name, _read_text(name)) for name in names)


def _cache_key(text, arch, options, nvcc):
    digest = hashlib.sha256()
    for part in (text, _headers_text(), "\0".join(options), nvcc_version(nvcc), arch,
                 package_version()):
        digest.update(part.encode("utf-8"))
        digest.update(b"\1")
    return digest.hexdigest()


def _cache_read(path):
    """Returns the cubin stored at path, or None if absent, unreadable or corrupt."""
    try:
        with open(path, "rb") as handle:
            if private_cache.not_private(path, os.fstat(handle.fileno())):
                return None
            blob = handle.read()
    except OSError:
        return None
    head = len(_CACHE_MAGIC)
    cubin = blob[head + 32:]
    if blob[:head] != _CACHE_MAGIC or hashlib.sha256(cubin).digest() != blob[head:head + 32]:
        return None
    return cubin


def _cache_write(path, cubin):
    """Writes atomically (temporary file + rename, mode 0600); gives up quietly if the folder is
    not usable."""
    folder = os.path.dirname(path)
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".cubin")
        with os.fdopen(handle, "wb") as stream:
            stream.write(_CACHE_MAGIC + hashlib.sha256(cubin).digest() + cubin)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)


def _numbered(text):
    return "\n".join("%5d | %s" % (number, line)
                     for number, line in enumerate(text.splitlines(), 1))


def _run_nvcc(text, label, arch, options, nvcc):
    """The bytes nvcc builds from `text`: a cubin for `arch`, or for an arch "host-<machine>" a
    shared library of host C (host_library's options)."""
    with tempfile.TemporaryDirectory(prefix="sok1x-nvcc-") as folder:
        source = os.path.join(folder, label)
        target = os.path.join(folder, "kernel.cubin")
        with open(source, "w") as handle:
            handle.write(text)
        if arch.startswith("host"):
            command = [nvcc] + list(options) + ["-o", target, source]
        else:
            command = [nvcc, "-cubin", "-arch=%s" % arch, "-I", KERNEL_DIR]
            command += list(BASE_OPTIONS) + list(options) + ["-o", target, source]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True)
        if done.returncode != 0:
            raise KernelCompileError(
                "nvcc could not compile %s for %s (exit %d)\ncommand: %s\n"
                "--- compiler output ---\n%s\n--- source %s ---\n%s" % (
                    label, arch, done.returncode, " ".join(command), done.stdout.strip(), label,
                    _numbered(text)))
        with open(target, "rb") as handle:
            return handle.read()


def compile_text(text, label, arch, options=(), cached=True):
    """Returns the cubin (bytes) of CUDA source `text` for `arch` ("sm_90"), via the disk cache
    (arch "host-<machine>": the shared library of host C source `text`). cached=False compiles
    whatever the cache holds, and replaces its entry.

    label names the source in errors; raises KernelCompileError.
    """
    nvcc = _require_nvcc()
    options = tuple(options)
    folder = private_cache_folder()
    path = None
    if folder is not None:
        path = os.path.join(folder, _cache_key(text, arch, options, nvcc) + ".cubin")
        cubin = _cache_read(path) if cached else None
        if cubin is not None:
            return cubin
    cubin = _run_nvcc(text, label, arch, options, nvcc)
    if path is not None:
        _cache_write(path, cubin)
    return cubin


def host_library(source_name):
    """Returns the ctypes.CDLL of host C source `source_name` of this folder ("back_pieces.c"),
    built through the disk cache (module docstring; keyed by this machine's architecture too),
    once per process. A cached build that cannot be loaded is built again and replaces it.
    Raises KernelCompileError where nvcc or its host compiler cannot build it, OSError where it
    cannot be loaded."""
    with _lock:
        library = _libraries.get(source_name)
        if library is None:
            text, arch = _read_text(source_name), "host-" + platform.machine()
            try:
                library = _loaded_library(compile_text(text, source_name, arch, HOST_OPTIONS),
                                          source_name)
            except OSError:  # a cached build of another machine, say: built anew here
                library = _loaded_library(compile_text(text, source_name, arch, HOST_OPTIONS,
                                                       cached=False), source_name)
            _libraries[source_name] = library
        return library


def _loaded_library(blob, source_name):
    """ctypes.CDLL of the shared library `blob`, written to a private temporary file (in the
    cache folder where there is one: /tmp may be mounted noexec) and removed once loaded."""
    with tempfile.TemporaryDirectory(prefix=".sok1x-host-", dir=private_cache_folder()) as folder:
        path = os.path.join(folder, os.path.splitext(source_name)[0] + ".so")
        with open(path, "wb") as handle:
            handle.write(blob)
        return ctypes.CDLL(path)


def compile_cubin(source_name, arch, options=()):
    """Returns the cubin of kernel family `source_name` ("rows.cu") for `arch` ("sm_90")."""
    return compile_text(_read_text(source_name), source_name, arch, options)


def load_module(source_name, options=()):
    """Returns the pycuda Module of `source_name` for the current context's device.

    Needs a current CUDA context (sok1x.backend.cuda.context.entered()); cached per context.
    """
    return _loaded(source_name, options)[0]


def _loaded(source_name, options):
    """(pycuda Module, the cubin it was loaded from) of `source_name` for the current context,
    compiled and loaded once per context."""
    import pycuda.driver as driver

    context = driver.Context.get_current()
    if context is None:
        raise Sok1xError("no CUDA context is current: call sok1x kernels inside "
                         "sok1x.backend.cuda.context.entered()")
    key = (context.handle, source_name, tuple(options))
    with _lock:
        loaded = _modules.get(key)
        if loaded is None:
            major, minor = context.get_device().compute_capability()
            cubin = compile_cubin(source_name, "sm_%d%d" % (major, minor), options)
            loaded = _modules[key] = (driver.module_from_buffer(cubin), cubin)
        return loaded


def load_every_kernel(source_names):
    """Loads each family of `source_names` and every kernel in it for the current context, so
    that no module or kernel is loaded while a step runs: a load may wait inside the driver for
    the device (CUDA loads kernels lazily, at cuModuleGetFunction), and behind a collective whose
    peer never joins that wait has no end and holds the GIL. Returns the number of kernels."""
    from .cubin_symbols import kernel_names

    count = 0
    for source_name in source_names:
        module, cubin = _loaded(source_name, ())
        for name in kernel_names(cubin):
            module.get_function(name)
            count += 1
    return count
