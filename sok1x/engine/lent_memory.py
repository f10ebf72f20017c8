"""Engine memory a framework holds as its own tensors: lent without a copy (DESIGN D1: sok1x's
TensorFlow kernels hand TensorFlow the engine's arrays as outputs, engine/kernel_calls.py).

A replayed step writes the same arrays at every replay (engine/lookup/replayed_step.py), so it
asks here first whether the framework still holds any of them: a queue, a while loop's
TensorArray or a value the program keeps may hold an output past its step. Each lent array is a
span of memory [start, end); a query asks whether any held span meets the spans it names. The
spans are kept sorted by start, with the longest one's length, so a query looks at the spans
that can reach it, not at all of them (a step of 26 tables holds some 30 at once). TensorFlow
drops tensors on any of its threads, also while another op's kernel lends or asks, so every
change and query holds one lock. It is reentrant: a tensor the collector frees, at any allocation
inside the lock, gives its memory back through release() on the same thread. Such a release
waits until a query's walk over the spans is over (it would move the spans under the walk's
indexes and hide a span still held); one inside lend() is applied at once.

On a GPU the framework gives a tensor back once the work that reads it is queued, not done. A
kernel call orders the engine's stream after the framework's once, before the engine reads its
inputs (engine/kernel_calls.py, which names that reorder here: calling()); a tensor given back
after that may still be read by work queued after it. So writable(), which a replay asks
before it writes, orders the engine's stream after the framework's again where some tensor came
back since.
"""
import bisect
import itertools
import threading

_spans = []  # (start, end, keep), sorted
_arrays = {}  # keep -> (the array lent, its span)
_keeps = itertools.count(1)
_longest = [0]  # the longest span lent since the registry was last empty
_lock = threading.RLock()
_released = [0]  # how many releases so far
_walking = [0]  # holds() walks the spans (on the thread that holds the lock)
_deferred = []  # keeps released during that walk, applied after it
_call = threading.local()  # the running kernel call's reorder and the releases it has seen


def lend(array, start, nbytes):
    """Records that the framework holds `array`, whose memory is `nbytes` from address `start`;
    returns the keep number that release() takes. The registry keeps `array` alive."""
    with _lock:
        keep = next(_keeps)
        span = (int(start), int(start) + int(nbytes), keep)
        bisect.insort(_spans, span)
        _arrays[keep] = (array, span)
        if nbytes > _longest[0]:
            _longest[0] = int(nbytes)
    return keep


def release(keep):
    """The framework dropped the array lent as `keep` (a second release does nothing)."""
    with _lock:
        if _walking[0]:  # the collector, inside holds() on this thread (module docstring)
            _deferred.append(keep)
            return
        found = _arrays.pop(keep, None)
        if found is None:
            return
        index = bisect.bisect_left(_spans, found[1])
        if index < len(_spans) and _spans[index] == found[1]:
            del _spans[index]
        if not _spans:
            _longest[0] = 0
        _released[0] += 1
    del found  # the array itself goes after the lock (its memory may be freed now), unless
    # this release runs inside another holder of the lock on this thread


def calling(reorder, *arguments):
    """Names the running kernel call's reorder(*arguments) (engine/kernel_calls.py: the engine's
    stream ordered after the framework's work queued so far, on a GPU), or None once it ends."""
    _call.reorder, _call.arguments = reorder, arguments
    _call.released = _released[0]


def writable(backend, arrays):
    """True when the framework holds no memory of backend `arrays`, so that the engine may write
    them (a replay). Where the framework gave a tensor back since the running kernel call
    ordered the engine's stream after the framework's, that order is made again first (work the
    framework queued reading the tensor comes before the writes)."""
    if holds_arrays(backend, arrays):
        return False
    reorder = getattr(_call, "reorder", None)
    if reorder is not None and _call.released != _released[0]:
        _call.released = _released[0]
        reorder(*_call.arguments)
    return True


def count():
    """How many arrays the framework holds now."""
    return len(_arrays)


def holds(spans):
    """True when the framework holds memory that meets any of `spans` ((start, end) pairs)."""
    if not _spans:
        return False
    with _lock:
        _walking[0] += 1
        try:
            for start, end in spans:
                if end <= start:
                    continue
                # a held span meeting [start, end) starts before `end` and after
                # start - longest
                low = bisect.bisect_right(_spans, (start - _longest[0],))
                high = bisect.bisect_left(_spans, (end,))
                for held_start, held_end, _ in _spans[low:high]:
                    if held_end > start and held_end > held_start:
                        return True
            return False
        finally:
            _walking[0] -= 1
            while _deferred and not _walking[0]:
                release(_deferred.pop())


def holds_arrays(backend, arrays):
    """holds() for the memory of backend `arrays` (None entries passed by)."""
    if not _spans:
        return False
    spans = []
    for array in arrays:
        if array is not None:
            start = backend.address_of(array)
            spans.append((start, start + int(array.nbytes)))
    return holds(spans)
