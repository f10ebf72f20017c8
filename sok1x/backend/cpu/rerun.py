"""The cpu backend's twin of a captured CUDA graph (backend/cuda/captured_graph.py's
captured_work): the work is kept, not done, and each replay runs it again and copies what it
returns into the arrays of its first replay, so a caller sees what it sees on cuda: the same
output arrays (64-byte aligned, as the pool's blocks are there), rewritten at every replay,
computed from the fixed inputs as they are when replay() is called. free() poisons those arrays
(floats NaN, integers their dtype's largest value), as cuda's pool hands a freed graph's blocks to
the next allocation: a read of a freed class's arrays fails the cpu tests, not only a GPU's."""
import numpy as np

from sok1x.backend.cpu.aligned import exportable


class RerunWork:
    """run()'s work, kept to run at each replay: outputs (the arrays every replay writes; made
    by the first), replay(), held_bytes, free()."""

    def __init__(self, run):
        self._run = run
        self.outputs = None

    def replay(self):
        """Runs the work, writing its results into self.outputs."""
        fresh = self._run()
        if self.outputs is None:
            self.outputs = fresh and [None if out is None else exportable(out) for out in fresh]
            return
        for kept, out in zip(self.outputs, fresh):
            if kept is not None:
                np.copyto(kept, out)

    @property
    def held_bytes(self):
        return sum(int(out.nbytes) for out in self.outputs or () if out is not None)

    def free(self):
        for out in self.outputs or ():
            if out is not None and out.flags.writeable:
                _poison(out)
        self._run = self.outputs = None


def _poison(array):
    if array.dtype.kind == "f":
        array.fill(np.nan)
    elif array.dtype.kind in "iu":
        array.fill(np.iinfo(array.dtype).max)
    elif array.dtype.kind == "b":
        array.fill(True)


def captured_work(run):
    """Keeps run() (no arguments, returns a list of arrays or None) as a RerunWork; nothing runs
    now, as nothing runs when cuda records it."""
    return RerunWork(run)
