"""sok1x's TensorFlow op library (graph_ops/engine_call_op.cc): built against the TensorFlow that
is installed, cached, loaded, and attached to the engine (sok1x/engine/kernel_calls.py).

The library is compiled as Horovod and SOK compile theirs, with the installed TensorFlow's own
flags (tf.sysconfig.get_compile_flags / get_link_flags; TensorFlow 1.15 also needs -std=c++14,
which its flags do not say), in a few seconds, on first use or ahead of time with
`sok1x-build-ops`. A built library is looked for, in order:

    $SOK1X_OPS_LIBRARY                      a file named by the user (used as it is)
    <sok1x>/graph_ops/prebuilt/<key>.so     what `sok1x-build-ops` put beside the package
    <cache>/<key>.so                        the private user cache ($SOK1X_OPS_CACHE_DIR, else
                                            $XDG_CACHE_HOME/sok1x/ops or ~/.cache/sok1x/ops)

and, where none is found, built into the cache (one process per node builds, the others wait
for it). <key> is a SHA-256 of the source, the flags, the compiler's --version, the TensorFlow
version and build, and sok1x's version: a new TensorFlow, ABI, compiler or source builds anew.

Where it cannot be had (no compiler, a failed build, SOK1X_OPS=0), available() is False and
reason() says why; graph ops then cross as before (DLPack or host staging: graph_ops/boundary.py)
and sok1x says so once, with what to do.

Environment:
    SOK1X_OPS=0            never use the op library
    SOK1X_OPS_LIBRARY      the .so to load
    SOK1X_OPS_CACHE_DIR    the cache's root
    SOK1X_CXX              the C++ compiler (default: $CXX, then g++, then c++)
"""
import argparse
import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings

from sok1x.common import private_cache
from sok1x.engine import kernel_calls
from sok1x.graph_ops import tf_compat
from sok1x.graph_ops.tf_compat import tf, tf1

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_call_op.cc")
PREBUILT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prebuilt")
ABI_VERSION = 1
_OPTIONS = ("-shared", "-fPIC", "-O2", "-DNDEBUG")
_lock = threading.RLock()
_state = {}  # "loaded": Loaded or None, "reason": why not


class OpLibraryError(Exception):
    """The op library could not be built or loaded; the message says why and what to do."""


class Loaded:
    """The loaded library: ops (the module tf.load_op_library gives: ops.sok1x_engine_call),
    path (the .so), gpu_stream (whether its GPU kernel reads TensorFlow's CUDA stream)."""

    def __init__(self, ops, path, gpu_stream):
        self.ops, self.path, self.gpu_stream = ops, path, gpu_stream


def compiler():
    """Returns the C++ compiler's path, or None: $SOK1X_CXX, $CXX, g++, c++ on PATH."""
    for candidate in (os.environ.get("SOK1X_CXX"), os.environ.get("CXX"), "g++", "c++"):
        if not candidate:
            continue
        path = candidate if os.path.isabs(candidate) else shutil.which(candidate)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _compiler_version(cxx):
    done = subprocess.run([cxx, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def build_flags():
    """Returns (compile flags, link flags) for the installed TensorFlow."""
    compile_flags = list(tf.sysconfig.get_compile_flags())
    link_flags = list(tf.sysconfig.get_link_flags())
    if not any(flag.startswith(("-std=", "--std=")) for flag in compile_flags):
        compile_flags.append("-std=c++14")  # TensorFlow 1.15's headers; its flags omit it
    includes = [flag[2:] for flag in compile_flags if flag.startswith("-I")]
    if any(os.path.isfile(os.path.join(folder, *relative)) for folder in includes
           for relative in (("tensorflow", "stream_executor", "stream.h"),
                            ("xla", "stream_executor", "stream.h"))):
        compile_flags.append("-DSOK1X_WITH_GPU_STREAM")
    return compile_flags, link_flags


def _package_version():
    from sok1x.cuda_kernels.compiler import package_version
    return package_version()


def library_key(cxx, compile_flags, link_flags):
    """The cache key of a build: source, flags, compiler, TensorFlow and sok1x versions."""
    digest = hashlib.sha256()
    with open(SOURCE, "rb") as handle:
        digest.update(handle.read())
    for part in (" ".join(_OPTIONS), " ".join(compile_flags), " ".join(link_flags),
                 _compiler_version(cxx),
                 tf.__version__, getattr(tf, "__git_version__", ""), sys.version,
                 _package_version(), str(ABI_VERSION)):
        digest.update(b"\1" + part.encode("utf-8"))
    return digest.hexdigest()[:32]


def cache_folder():
    """The private user cache folder of built libraries, or None where it cannot be had."""
    root = os.environ.get("SOK1X_OPS_CACHE_DIR") or private_cache.cache_root("ops")
    return private_cache.private_folder(
        root, "An op library it held", "the library is built in a temporary folder instead",
        "point SOK1X_OPS_CACHE_DIR at a private folder", stacklevel=5)


def build(target, cxx=None):
    """Compiles the library into `target` (written to a temporary name, then renamed); returns
    `target`. Raises OpLibraryError with the command and the compiler's output."""
    cxx = cxx or compiler()
    if cxx is None:
        raise OpLibraryError(
            "no C++ compiler was found (looked at $SOK1X_CXX, $CXX, g++ and c++ on PATH)")
    compile_flags, link_flags = build_flags()
    folder = os.path.dirname(os.path.abspath(target))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".so")
    os.close(handle)
    # -DNDEBUG as TensorFlow's own build: its inline headers' debug checks would otherwise be
    # compiled in here (RefCounted's destructor checks a count that Unref never lowers).
    command = [cxx] + list(_OPTIONS) + [SOURCE, "-o", temporary] + compile_flags + link_flags
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True)
        if done.returncode != 0:
            raise OpLibraryError("%s could not build sok1x's op library (exit %d)\ncommand: %s\n"
                                 "--- compiler output ---\n%s" % (
                                     cxx, done.returncode, " ".join(command),
                                     _errors_first(done.stdout)))
        os.chmod(temporary, 0o700)
        _write_checksum(temporary, target + ".sha256")
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


def _checksum(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_checksum(library, path):
    """Writes the SHA-256 of `library` to `path` (atomically): a library whose bytes do not
    match it is never loaded (a cut-short file would kill the process in dlopen)."""
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        handle.write(_checksum(library) + "\n")
    os.replace(temporary, path)


def _errors_first(output, limit=60):
    """The compiler's error lines (TensorFlow's headers warn a lot), then the rest, cut."""
    lines = output.strip().splitlines()
    errors = [line for line in lines if "error" in line]
    shown = errors[:limit] or lines[-limit:]
    return "\n".join(shown)


def _intact(path):
    """True when `path` is a library whose bytes match the checksum written beside it."""
    try:
        with open(path + ".sha256") as handle:
            return handle.read().strip() == _checksum(path)
    except OSError:
        return False


def _usable(path):
    """True for an intact file of this user's, that others cannot write (a cache entry)."""
    try:
        return (os.path.isfile(path) and private_cache.not_private(path, os.stat(path)) is None
                and _intact(path))
    except OSError:
        return False


def _built_for_this_process():
    """(The path of a library for this TensorFlow, whether it is in the cache), building one
    where there is none, or where the cached one is damaged."""
    named = os.environ.get("SOK1X_OPS_LIBRARY")
    if named:
        if not os.path.isfile(named):
            raise OpLibraryError("SOK1X_OPS_LIBRARY=%s: no such file" % named)
        return named, False
    cxx = compiler()
    if cxx is None and not os.path.isdir(PREBUILT):
        raise OpLibraryError(
            "no C++ compiler was found (looked at $SOK1X_CXX, $CXX, g++ and c++ on PATH)")
    compile_flags, link_flags = build_flags()
    key = library_key(cxx or "none", compile_flags, link_flags) if cxx else None
    found = _prebuilt(PREBUILT, key)
    if found:
        return found, False
    if cxx is None:
        raise OpLibraryError(
            "no C++ compiler was found (looked at $SOK1X_CXX, $CXX, g++ and c++ on PATH), "
            "and no library prebuilt for this TensorFlow in %s" % PREBUILT)
    folder = cache_folder() or tempfile.mkdtemp(prefix="sok1x-ops-")
    target = os.path.join(folder, key + ".so")
    if _usable(target):
        return target, True
    with open(os.path.join(folder, key + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per node; the others find its file
        try:
            if not _usable(target):
                build(target, cxx)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target, True


def _prebuilt(folder, key):
    """A library `sok1x-build-ops` left in `folder` for this TensorFlow (its key, or, where no
    compiler can say the key, the one library built for this TensorFlow version)."""
    if not os.path.isdir(folder):
        return None
    if key is not None:
        path = os.path.join(folder, key + ".so")
        return path if _intact(path) else None
    marker = os.path.join(folder, "tensorflow-%s.so" % tf.__version__)
    return marker if _intact(marker) else None


def _load(path):
    ops = tf.load_op_library(path)
    library = ctypes.CDLL(path)  # the same loaded object: its callbacks are the kernels'
    if library.sok1x_abi_version() != ABI_VERSION:
        raise OpLibraryError("%s speaks ABI %d, this sok1x %d: rebuild it (sok1x-build-ops)"
                             % (path, library.sok1x_abi_version(), ABI_VERSION))
    kernel_calls.attach(library)
    return Loaded(ops, path, bool(library.sok1x_has_gpu_stream()))


@tf.autograph.experimental.do_not_convert  # may run inside a Keras layer's converted call
def load():
    """Returns the Loaded library, building it where needed, or None where it cannot be had
    (reason() says why; the first time, a warning says it too)."""
    with _lock:
        if "loaded" in _state:
            return _state["loaded"]
        loaded, reason = None, None
        if os.environ.get("SOK1X_OPS", "1").strip().lower() in ("0", "false", "no", "off"):
            reason = "SOK1X_OPS=0"
        else:
            try:
                loaded = _load(_built_for_this_process()[0])
            except (OpLibraryError, OSError, tf1.errors.OpError) as exc:
                reason = str(exc)
        _state.update(loaded=loaded, reason=reason)
        if loaded is None and reason != "SOK1X_OPS=0":
            warnings.warn(
                "sok1x could not build or load its TensorFlow kernels, so its graph ops cross "
                "by %s instead (slower: %s). Install a C++ compiler (g++) where the job runs, "
                "or run `sok1x-build-ops` where one is and the package is shared. Why: %s" % (
                    "DLPack" if tf_compat.HAS_DLPACK else "host staging",
                    "a Python op per call" if tf_compat.HAS_DLPACK
                    else "every tensor goes through host memory", reason),
                RuntimeWarning, stacklevel=3)
        return loaded


def available():
    """True when the op library is loaded (or can be: this builds it)."""
    return load() is not None


def reason():
    """Why the op library cannot be had, or None."""
    load()
    return _state.get("reason")


def forget():
    """Forgets what load() found, so that the next call looks again (tests)."""
    with _lock:
        _state.clear()


def main(argv=None):
    """sok1x-build-ops: builds the op library for the installed TensorFlow ahead of time, for
    nodes without a compiler."""
    parser = argparse.ArgumentParser(
        prog="sok1x-build-ops", description="Builds sok1x's TensorFlow op library for the "
        "TensorFlow installed here, into sok1x's package folder (nodes that share the package "
        "find it there), or into --into.")
    parser.add_argument("--into", help="the folder to build into (default: %s, else the "
                        "user cache)" % PREBUILT)
    args = parser.parse_args(argv)
    cxx = compiler()
    if cxx is None:
        print("sok1x-build-ops: no C++ compiler (set SOK1X_CXX or CXX, or install g++)",
              file=sys.stderr)
        return 2
    compile_flags, link_flags = build_flags()
    key = library_key(cxx, compile_flags, link_flags)
    folder = args.into or PREBUILT
    try:
        os.makedirs(folder, exist_ok=True)
        target = build(os.path.join(folder, key + ".so"), cxx)
        # where a node has no compiler to compute the key, this name finds the library
        marker = os.path.join(folder, "tensorflow-%s.so" % tf.__version__)
        shutil.copyfile(target, marker + ".tmp")
        os.chmod(marker + ".tmp", 0o755)
        _write_checksum(marker + ".tmp", marker + ".sha256")
        os.replace(marker + ".tmp", marker)
    except (OpLibraryError, OSError) as exc:
        print("sok1x-build-ops: %s" % exc, file=sys.stderr)
        return 1
    os.environ["SOK1X_OPS_LIBRARY"] = target
    forget()
    loaded = load()
    if loaded is None:
        print("sok1x-build-ops: built %s, but it does not load: %s" % (target, reason()),
              file=sys.stderr)
        return 1
    print("sok1x-build-ops: %s (TensorFlow %s, GPU stream: %s)" % (
        target, tf.__version__, "yes" if loaded.gpu_stream else "no"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
