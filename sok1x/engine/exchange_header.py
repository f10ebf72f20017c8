"""The small host-side exchange that opens every communicating op.

Each rank sends each other rank one record: how many rows it will send it, the id of the op it is
in, and whether it found bad input. Receiving it tells every rank the sizes of the data exchange,
whether all ranks are in the same op (else OrderError on every rank, naming the ops), and whether
any rank must fail the step (then every rank raises that rank's error, D7).
"""
import os

import numpy as np

from sok1x.engine.checks import first_error
from sok1x.engine.op_order import as_op_id, op_key
from sok1x.errors import OrderError

ORDER_CHECK_ENV = "SOK1X_ORDER_CHECK"


def order_check_enabled():
    """False only when SOK1X_ORDER_CHECK=0. Then collectives whose sizes are static (dense
    all-reduce, broadcast) skip their header, saving one small host exchange each, and a rank
    that reaches a different collective may hang instead of raising."""
    return os.environ.get(ORDER_CHECK_ENV, "1") not in ("0", "false", "False")


def exchange_header(runtime, op, send_counts=None, local_error=None):
    """Collective on every rank. op: an OpId (or a name); send_counts: int64 [size] rows this rank
    sends to each rank, or [size, tables] for a fused exchange of several tables (None: no data
    exchange follows, or this rank found an error). Returns recv_counts of send_counts' shape;
    raises OrderError or the reported input error on every rank.

    The record every rank sends has one size whatever the op, so ranks in different ops still
    meet here and can tell; the per-table counts of a fused exchange of several tables follow in
    a second small exchange once every rank is known to be in the same op."""
    op = as_op_id(op)
    op_name = op.name
    if op.position == 0:  # a tower's first op opens a step (engine/step_journal.py)
        runtime.journal.begin_step()
    local_error = first_error(runtime.towers.check(op), local_error)
    size = runtime.size
    counts = None if send_counts is None else np.asarray(send_counts, dtype=np.int64)
    fused = counts is not None and counts.ndim == 2
    record = np.zeros((size, 3), dtype=np.int64)
    record[:, 0] = op_key(op)
    record[:, 1] = 0 if local_error is None else 1
    if counts is not None and local_error is None and counts.size == size:
        record[:, 2] = counts.reshape(size)
    ones = np.ones(size, dtype=np.int64)
    received = runtime.host.all_to_all_v(record, ones, ones)
    while _joined_checkpoint(runtime, received[:, 0], record[0, 0]):
        received = runtime.host.all_to_all_v(record, ones, ones)
    keys = received[:, 0]
    if np.any(keys != keys[0]):
        # Every rank sees the same keys, so every rank is here: the names can be gathered.
        names = runtime.host.all_gather_object(op_name)
        lines = ["rank %d: %s" % (r, n) for r, n in enumerate(names)]
        raise OrderError(
            "ranks reached different sok1x collectives (rank %d is in %s):\n  %s\n"
            "Every rank must run the same communicating ops in the same order. Usual causes: a "
            "train and an eval tower fetched in one sess.run (fetch them in separate sess.run "
            "calls), or ranks fetching different ops. Build an independent tower inside "
            "`with sok1x.new_tower():`." % (runtime.rank, op_name, "\n  ".join(lines)))
    if np.any(received[:, 1]):
        runtime.host.raise_together(local_error, op_name)
    if not fused:
        return received[:, 2].copy()
    if counts.shape[1] == 1:
        return received[:, 2:3].copy()
    return runtime.host.all_to_all_v(counts, ones, ones)


# Checkpoints (DESIGN D8, engine/checkpoint_join.py): a save or restore opens with a marker in
# an op header's place, and ranks in an op take part in rank 0's before their own op goes on.
def exchange_marker(runtime, key):
    """Collective: sends every rank a header record whose op is `key` (a checkpoint marker);
    returns the op keys every rank sent (int64 [size]). No step or tower bookkeeping."""
    record = np.zeros((runtime.size, 3), dtype=np.int64)
    record[:, 0] = key
    ones = np.ones(runtime.size, dtype=np.int64)
    return runtime.host.all_to_all_v(record, ones, ones)[:, 0].copy()


def _joined_checkpoint(runtime, keys, own_key):
    if runtime.size == 1:
        return False
    from sok1x.engine import checkpoint_join
    return checkpoint_join.join_if_asked(runtime, keys, own_key)


def confirm_same_op(runtime, op):
    """Makes every rank confirm it is in `op` (an OpId or name) before a collective whose sizes
    are static. With SOK1X_ORDER_CHECK=0 only the local tower check runs, raising on this rank."""
    if order_check_enabled():
        exchange_header(runtime, op)
        return
    error = runtime.towers.check(as_op_id(op))
    if error is not None:
        raise error
