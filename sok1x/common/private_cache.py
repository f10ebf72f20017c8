"""The private on-disk cache folders of what sok1x compiles: CUDA kernels (cuda_kernels/compiler.py)
and its TensorFlow op library (graph_ops/op_library.py).

What such a folder holds is loaded into the job, so whoever can write it could run code in it
(CuPy keeps its cache private for the same reason): folders are made readable and writable by
their owner only (0700); a folder another user owns, or that others can write, is refused with a
RuntimeWarning saying why and what to do (once per folder), and an entry file that is not this
user's, or that others can write, is not used.

    cache_root(kind)              $XDG_CACHE_HOME/sok1x/<kind> (or ~/.cache/sok1x/<kind>)
    private_folder(folder, ...)   `folder`, made 0700 where missing, if it and its parent are
                                  private to this user; else None
    not_private(path, status)     why a file or folder may not feed a cache, or None
"""
import os
import stat
import threading
import warnings

_lock = threading.Lock()
_refused = set()  # folders warned about once per process


def cache_root(kind):
    """Returns the default root of the cache of `kind` ("kernels", "ops")."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sok1x", kind)


def not_private(path, status):
    """Returns why a file or folder with os.stat() `status` may not feed the cache, or None."""
    if status.st_uid != os.getuid():
        return "%s belongs to user %d, not to this user (%d)" % (path, status.st_uid,
                                                                os.getuid())
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "%s can be written by other users (mode %03o)" % (
            path, stat.S_IMODE(status.st_mode))
    return None


def make_private_folders(folder):
    """Creates `folder` and its missing parents with mode 0700 (the umask can only narrow it)."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def private_folder(folder, what, instead, advice, stacklevel=3):
    """Returns `folder`, made 0700 where missing, if it and its parent are private to this user;
    else None (a folder that cannot be made, or one refused with a RuntimeWarning, once per
    folder). what: what the cache holds ("Kernels it held"); instead: what happens without it;
    advice: how to point the cache elsewhere."""
    try:
        make_private_folders(folder)
        reasons = [not_private(path, os.stat(path)) for path in (os.path.dirname(folder),
                                                                 folder)]
    except OSError:
        return None  # not usable: only the cache is lost
    reasons = [reason for reason in reasons if reason]
    if not reasons:
        return folder
    with _lock:
        first = folder not in _refused
        _refused.add(folder)
    if first:
        warnings.warn(
            "sok1x does not use the cache folder %s: %s. %s would be loaded into this job, so it "
            "must be a folder only you can write; %s. Make it yours with `chmod 700` (and "
            "chown), or %s." % (folder, "; ".join(reasons), what, instead, advice),
            RuntimeWarning, stacklevel=stacklevel)
    return None
