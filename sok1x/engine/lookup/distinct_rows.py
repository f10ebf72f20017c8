"""Row arrays the engine itself made distinct and in range (a backward pass's rows), known by
their memory while the array lives. An update handed the same memory back, directly or through
a framework and DLPack (TensorFlow passes the backward op's output to the update op as it is),
skips de-duplicating and checking them again: on cuda that is two host waits and a dozen kernel
launches per table and step. Any other array (a framework's own tensor, a copy, rows the user
changed) is new memory and gets the full treatment.

The lock is reentrant: a weak reference's callback runs wherever the collector happens to run,
which may be an allocation inside this module's own lock on the same thread (a remembered
holder in a reference cycle dies there); with a plain lock that thread waited on itself.
"""
import threading
import weakref

_known = {}  # (address, rows) -> weak reference to the array that holds them
_lock = threading.RLock()


def address(array):
    """(device or host address, length) of an array: what this module knows arrays by."""
    return _key(array)


def _key(array):
    gpudata = getattr(array, "gpudata", None)
    address = int(gpudata) if gpudata is not None else array.__array_interface__["data"][0]
    return address, int(array.shape[0])


def remember(array):
    """Records that `array` (1-D, non-empty) holds distinct, in-range rows of a shard."""
    if len(array.shape) != 1 or array.shape[0] == 0:
        return
    key = _key(array)

    def forget(_reference, key=key):
        with _lock:
            if _known.get(key) is _reference:
                del _known[key]
    reference = weakref.ref(array, forget)
    with _lock:
        _known[key] = reference


def remember_all(holder, arrays):
    """remember() for arrays that all live in `holder`'s memory (row views of it), with one weak
    reference to `holder` for all of them."""
    keys = [_key(array) for array in arrays if len(array.shape) == 1 and array.shape[0]]

    def forget(reference, keys=keys):
        with _lock:
            for key in keys:
                if _known.get(key) is reference:
                    del _known[key]
    reference = weakref.ref(holder, forget)
    with _lock:
        for key in keys:
            _known[key] = reference


def is_known(array):
    """True if `array` lies exactly on rows the engine remembered, and those are still alive."""
    if len(array.shape) != 1 or array.shape[0] == 0:
        return False
    key = _key(array)
    with _lock:
        reference = _known.get(key)
    return reference is not None and reference() is not None
