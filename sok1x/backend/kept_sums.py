"""Which rows of a replayed backward's sums may still hold a sum from an earlier replay (DESIGN
D14), so that the sums' kernels zero only those.

    with backend.sums_kept(dirty):      # int8 [segments], made once, filled with -1
        backend.segment_sum(values, ids, segments)

A replayed backward writes its summed gradient into the same array at every replay. Each member
of a table group has a piece of it as long as its keys, and the places past its distinct rows
must hold zeros (engine/lookup/bounded_step.py). Zeroing every such place at every step wrote
about 100 MB a step on dlrm (43 us of a 0.57 ms step on one H200). With `dirty` bound, the
cuda kernels (cuda_kernels/segment_rows.cu) zero a place only where dirty says an earlier run
may have stored a sum there (-1), and keep dirty up to date (0: zeros). The cpu backend zeros
every place whatever is bound: the results are the same. Whoever writes the array otherwise
must fill dirty with -1 again (replayed_step._refill, where the framework hands back sums of its
own); sums lent to a framework as they are must not be written in place."""
import contextlib

import numpy as np

_bound = [None]  # the int8 array sums_kept() bound, or None


@contextlib.contextmanager
def sums_kept(dirty):
    """Inside it, a segment_sum into `segments` rows reads and keeps `dirty` (module docstring);
    dirty None binds none (every row written). Nothing is read or queued here."""
    outer = _bound[0]
    _bound[0] = dirty
    try:
        yield
    finally:
        _bound[0] = outer


def kept(segments):
    """The int8 [segments] array sums_kept() bound, or None where none is bound. Raises
    ValueError for another array."""
    dirty = _bound[0]
    if dirty is not None and (dirty.dtype != np.int8 or tuple(dirty.shape) != (segments,)):
        raise ValueError("sums_kept: a sum into %d rows was given a %s %s array"
                         % (segments, dirty.dtype, list(dirty.shape)))
    return dirty
