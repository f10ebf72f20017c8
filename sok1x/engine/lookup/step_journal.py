"""The per-step input guarantee (issue 13, DESIGN D7 per step, not per lookup).

A step opens at a tower's position-0 communicating op (engine/op_order.py) and lasts until the
next one. Everything a lookup changes in a table's key set during the step (keys inserted, rows
taken from the free list, keys evicted with their vectors and slots) is recorded here as an undo
action. When any collective engine call of the step raises (bad input found in a header exchange,
a full table, an order error), the caller rolls the step back: the undo actions run newest first,
so every table, slot and hash index is as it was before the step. Collective errors are raised on
every rank (exchange_header), so every rank rolls back the same step.

Not undone: optimizer updates already applied in the failed step (they run after the step's
lookups and their gradients, so an input error comes before them), a table's growth (its capacity
only), and the access statistics of keys that were looked up.
"""
from sok1x.errors import CommError


class StepJournal:
    """Undo actions of the current step. Attributes: step (a counter, +1 per step opened)."""

    def __init__(self):
        self.step = 0
        self._undo = []

    def begin_step(self):
        """Commits the step before (its changes stay) and opens a new one."""
        self._undo = []
        self.step += 1

    def record(self, undo):
        """Adds `undo` (a callable with no arguments) to the current step."""
        self._undo.append(undo)

    def rollback(self):
        """Runs the step's undo actions, newest first, and empties the journal."""
        undo, self._undo = self._undo, []
        while undo:
            undo.pop()()

    def failed(self, exc):
        """Rolls the step back after `exc` ended a collective call of it (the caller then lets
        exc go on). After a CommError the communicator is aborted and the job must restart: an
        undo that fails then (it waits on the aborted stream) must not hide the error that says
        why; after any other error an undo that fails raises its own error."""
        try:
            self.rollback()
        except Exception:
            if not isinstance(exc, CommError):
                raise
