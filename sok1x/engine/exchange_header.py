"""The header that opens every communicating op (DESIGN D3, D7, D13).

Each rank sends each other rank one record of RECORD_WIDTH int64:

    0 op      the 63-bit id of the op's name            (op_order.op_key)
    1 tower   the id of its tower                       (op_order.tower_key)
    2 call    which call of the tower this is           (op_order.CLOCK)
    3 place   the op's position in its tower
    4 error   1 if this rank found bad input or cannot run the op (D7)
    5 tables  how many per-table row counts follow
    6...      rows this rank sends that peer, per table (INLINE_TABLES of them)

The records travel in ONE all-to-all of the data channel (NCCL on cuda, the MPI data path on
cpu), and the host reads them, with its own, in one wait: that gives the sizes of the op's data
exchange, tells whether every rank is in the same op of the same call (else OrderError on every
rank, naming each rank's op and call), and whether a rank must fail the step (then every rank
raises that rank's error, before any table changes). The record has one size whatever the op,
so ranks in different ops still meet here and can tell. A fused exchange of more than
INLINE_TABLES tables sends its per-table counts in a second all-to-all, once every rank is known
to be in the same op.
"""
import os

import numpy as np

from sok1x.engine.checks import first_error
from sok1x.engine.op_order import CLOCK, as_op_id, op_key, tower_key
from sok1x.errors import OrderError

ORDER_CHECK_ENV = "SOK1X_ORDER_CHECK"
_OP, _TOWER, _CALL, _PLACE, _ERROR, _TABLES = range(6)
_FIELDS = 6
INLINE_TABLES = 58
RECORD_WIDTH = _FIELDS + INLINE_TABLES  # 64 int64: 512 bytes per peer


def order_check_enabled():
    """False only when SOK1X_ORDER_CHECK=0. Then collectives whose sizes are static (dense
    all-reduce, broadcast) skip their header, saving one small exchange each, and a rank
    that reaches a different collective may hang instead of raising."""
    return os.environ.get(ORDER_CHECK_ENV, "1") not in ("0", "false", "False")


def _local_records(runtime, op, call, counts, local_error):
    """Returns host int64 [size, RECORD_WIDTH]: the record this rank sends each peer."""
    size = runtime.size
    records = np.zeros((size, RECORD_WIDTH), dtype=np.int64)
    records[:, _OP], records[:, _TOWER] = op_key(op), tower_key(op)
    records[:, _CALL], records[:, _PLACE] = call, op.position
    records[:, _ERROR] = 0 if local_error is None else 1
    if counts is not None and local_error is None:
        tables = counts.shape[1]
        records[:, _TABLES] = tables
        inline = min(tables, INLINE_TABLES)
        records[:, _FIELDS:_FIELDS + inline] = counts[:, :inline]
    return records


def _exchange_records(runtime, records):
    """One all-to-all of the records on the data channel; returns the host records received
    (one per source rank), read in one wait. Alone, the own record."""
    backend = runtime.backend
    if runtime.size == 1:
        return records
    ones = np.ones(runtime.size, dtype=np.int64)
    received = runtime.data.all_to_all_v(backend.asarray(records), ones, ones)
    return backend.to_host_many([received])[0]


def _raise_order_error(runtime, op, call, received):
    """Every rank sees the same records, so every rank is here: gathers each rank's op and call
    and raises OrderError naming them. Ranks in the same op whose calls differ (one skipped a
    step) re-align their tower's count first, so the next call meets again; ranks in different
    ops take back the call a tower's first op counted, as that call failed everywhere."""
    names = runtime.host.all_gather_object((op.name, int(call)))
    lines = ["rank %d: %s (call %d of its tower)" % (r, n, c) for r, (n, c) in enumerate(names)]
    same_op = np.all(received[:, _OP] == received[0, _OP]) and np.all(
        received[:, _PLACE] == received[0, _PLACE])
    if same_op:
        CLOCK.catch_up(op.tower, int(received[:, _CALL].max()))
        advice = (
            "The ranks are in different steps: a step failed on some ranks before sok1x ran "
            "(for example TensorFlow rejected one rank's input) while the others went on. This "
            "step fails on every rank; the ranks are in step again from the next one.")
    else:
        if op.position == 0:
            CLOCK.take_back(op.tower)
        advice = (
            "Every rank must run the same communicating ops in the same order. Usual causes: a "
            "train and an eval tower fetched in one sess.run (fetch them in separate sess.run "
            "calls), ranks fetching different ops, or sok1x.dump on some ranks only. Build an "
            "independent tower inside `with sok1x.new_tower():`.")
    raise OrderError("ranks reached different sok1x collectives (rank %d is in %s, call %d):"
                     "\n  %s\n%s" % (runtime.rank, op.name, call, "\n  ".join(lines), advice))


def exchange_header(runtime, op, send_counts=None, local_error=None):
    """Collective on every rank. op: an OpId (or a name); send_counts: int64 [size] rows this rank
    sends to each rank, or [size, tables] for a fused exchange of several tables (None: no data
    exchange follows, or this rank found an error). Returns recv_counts of send_counts' shape;
    raises OrderError or the reported input error on every rank."""
    op = as_op_id(op)
    if op.position == 0:  # a tower's first op opens a step (engine/step_journal.py)
        runtime.journal.begin_step()
    call = CLOCK.call_of(op)
    local_error = first_error(runtime.towers.check(op), local_error)
    counts = None if send_counts is None else np.asarray(send_counts, dtype=np.int64)
    fused = counts is not None and counts.ndim == 2
    if counts is not None and not fused:
        counts = counts.reshape(-1, 1)
    received = _exchange_records(runtime, _local_records(runtime, op, call, counts, local_error))
    agree = [_OP, _TOWER, _CALL, _PLACE]
    if np.any(received[:, agree] != received[0, agree]):
        _raise_order_error(runtime, op, call, received)
    if np.any(received[:, _ERROR]):
        runtime.host.raise_together(local_error, op.name)
    if counts is None:
        return None
    tables = counts.shape[1]
    if tables <= INLINE_TABLES:
        recv_counts = received[:, _FIELDS:_FIELDS + tables].copy()
    else:
        recv_counts = _exchange_counts(runtime, counts)
    return recv_counts if fused else recv_counts.reshape(-1)


def _exchange_counts(runtime, counts):
    """The per-table counts of a fused exchange of more than INLINE_TABLES tables: one more
    all-to-all on the data channel and one more wait."""
    if runtime.size == 1:
        return counts.copy()
    ones = np.ones(runtime.size, dtype=np.int64)
    backend = runtime.backend
    received = runtime.data.all_to_all_v(backend.asarray(counts), ones, ones)
    return backend.to_host_many([received])[0]


def confirm_same_op(runtime, op):
    """Makes every rank confirm it is in `op` (an OpId or name) before a collective whose sizes
    are static. With SOK1X_ORDER_CHECK=0 only the local tower check runs, raising on this rank."""
    if order_check_enabled():
        exchange_header(runtime, op)
        return
    error = runtime.towers.check(as_op_id(op))
    if error is not None:
        raise error
