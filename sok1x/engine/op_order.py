"""Which communicating op is running: its name, its tower, its place in the tower's chain, and
which call of the tower it belongs to.

graph_ops/ordering.py chains the communicating ops of a tower with control dependencies, so in one
sess.run they run one after the other in creation order. Here each rank checks at run time that
an op at place p > 0 directly follows place p - 1 of its own tower. Anything else means two towers
(or two sess.run calls) are interleaving, which can order collectives differently on different
ranks; the finding rides in the op header, so every rank raises it together.

The tower clock counts the calls of each tower: in graph mode a small op (ordering.py's ticker)
ticks it at the start of every sess.run that runs the tower, before TensorFlow can fail the step
on this rank alone (a RaggedTensor whose splits disagree with its values, say); executed eagerly,
or for an op named without a tower, the op's own header ticks it. The count rides in every
header, so a rank whose step failed before sok1x ran meets its peers' previous step with a
higher count: the ranks behind raise OrderError for that step (the others skipped it), and the
ranks ahead meet their next call, so every rank fails the skipped step and all go on together
from the next, never pairing two different steps.
"""
import collections
import threading

from sok1x.engine.op_keys import name_key
from sok1x.errors import OrderError

OpId = collections.namedtuple("OpId", "name tower position ticked")
OpId.__new__.__defaults__ = (False,)
OpId.__doc__ = ("A communicating op: name (str), tower (str), position (int, 0 = first in "
                "tower), ticked (True when a ticker op counts the tower's calls, graph mode).")


def as_op_id(op):
    """Returns `op` as an OpId; a bare name is a one-op tower of its own."""
    if isinstance(op, OpId):
        return op
    return OpId(str(op), str(op), 0, False)


class TowerClock:
    """Process-wide count of each tower's calls (sess.runs, or eager calls)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = collections.Counter()

    def tick(self, tower):
        """Counts one more call of `tower` (str); returns the new count."""
        with self._lock:
            self._calls[tower] += 1
            return self._calls[tower]

    def call_of(self, op):
        """Returns the call of `op`'s tower it belongs to, ticking first for a tower's first op
        that no ticker counts."""
        if op.position == 0 and not op.ticked:
            return self.tick(op.tower)
        with self._lock:
            return self._calls[op.tower]

    def take_back(self, tower):
        """Uncounts the latest call of `tower`: it failed on every rank before it ran (ranks met
        in different ops), so its count must not put this rank a call ahead of its peers."""
        with self._lock:
            self._calls[tower] = max(self._calls[tower] - 1, 0)


CLOCK = TowerClock()


class TowerTracker:
    """Remembers the last communicating op this process ran."""

    def __init__(self):
        self._last = None

    def check(self, op):
        """Records `op` (an OpId) and returns an OrderError if it may not run now, else None."""
        last, self._last = self._last, op
        if op.position == 0:
            return None
        if last is not None and last.tower == op.tower and last.position == op.position - 1:
            return None
        before = "nothing" if last is None else "%s (tower %s)" % (last.name, last.tower)
        return OrderError(
            "%s is op %d of tower %s but ran after %s. Two towers (for example a training and "
            "an evaluation tower) were fetched in one sess.run, or two sess.run calls ran at once; "
            "their collectives could run in a different order on each rank. Fetch each tower in "
            "its own sess.run, one at a time." % (op.name, op.position, op.tower, before))


def op_key(op):
    """Returns the 63-bit id of the op's name, compared across ranks in the op header."""
    return name_key(op.name)


def tower_key(op):
    """Returns the 63-bit id of the op's tower."""
    return name_key(op.tower)
