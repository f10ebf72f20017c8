"""The cpu backend's twin of a captured CUDA graph (backend/cuda/captured_graph.py's
captured_work): the work is kept, not done, and each replay runs it again and copies what it
returns into the arrays of its first replay, so a caller sees what it sees on cuda: the same
output arrays (64-byte aligned, as the pool's blocks are there), rewritten at every replay,
computed from the fixed inputs as they are when replay() is called."""
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
        self._run = self.outputs = None


def captured_work(run):
    """Keeps run() (no arguments, returns a list of arrays or None) as a RerunWork; nothing runs
    now, as nothing runs when cuda records it."""
    return RerunWork(run)
