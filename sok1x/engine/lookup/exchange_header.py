"""The header that opens every communicating op (DESIGN D3, D7, D13).

Each rank sends each other rank one record of RECORD_WIDTH int64:

    0 op      the 63-bit id of the op's name            (op_order.op_key)
    1 tower   the id of its tower                       (op_order.tower_key)
    2 call    which call of the tower this is           (op_order.CLOCK)
    3 place   the op's position in its tower
    4 error   bit 0: this rank found bad input or cannot run the op (D7); bit 1: this rank
              asks every rank to cross the seam by host staging (engine/kernel_calls.py);
              bit 2: this rank's keys overflow a per-peer capacity, bit 3: this rank sizes
              the lookup by per-peer capacities (lookup/peer_capacity.py)
    5 tables  how many per-table row counts follow
    6...      rows this rank sends that peer, per table (INLINE_TABLES of them)
    SHARED_AT...  values this rank tells every rank alike (SHARED_WIDTH of them): a hash
              group's room and keys, so that every rank can tell whether any shard may fill
              up in this step (engine/lookup/key_exchange.py)

The records are written on the device (backend.header_records: the per-owner counts and the
input checks' flag come from kernels, never through the host), travel in ONE all-to-all of the
data channel (NCCL on cuda, the MPI data path on cpu), and the host reads them, with its own and
any other sizes the op needs (also_read), in one wait: that gives the sizes of the op's data
exchange, tells whether every rank is in the same op of the same call (else OrderError on every
rank, naming each rank's op and call), and whether a rank must fail the step (then every rank
raises that rank's error, before any table changes). The record has one size whatever the op,
so ranks in different ops still meet here and can tell. A fused exchange of more than
INLINE_TABLES tables sends its per-table counts in a second all-to-all, once every rank is known
to be in the same op.
"""
import collections

import numpy as np

from sok1x.backend import cpu as host_ops
from sok1x.engine import environment, kernel_calls
from sok1x.engine.lookup import bounded_step
from sok1x.engine.lookup.checks import first_error
from sok1x.engine.op_order import CLOCK, as_op_id, op_key, tower_key
from sok1x.errors import InitError, OrderError

ORDER_CHECK_ENV = "SOK1X_ORDER_CHECK"
_OP, _TOWER, _CALL, _PLACE, _ERROR, _TABLES = range(6)
_FAILED, _NOTICE, OVERFLOW, _SIZED = 1, 2, 4, 8  # the error field's bits
_FIELDS = 6
INLINE_TABLES = 58
SHARED_AT = _FIELDS + INLINE_TABLES
SHARED_WIDTH = 128
RECORD_WIDTH = SHARED_AT + SHARED_WIDTH  # 192 int64: 1.5 KB per peer


def order_check_enabled():
    """False only when SOK1X_ORDER_CHECK=0. Then collectives whose sizes are static (dense
    all-reduce, broadcast) skip their header, saving one small exchange each, and a rank
    that reaches a different collective may hang instead of raising."""
    return environment.get(ORDER_CHECK_ENV, "1") not in ("0", "false", "False")


def _records(runtime, fields, counts, error_flag, also_read, shared=None):
    """Returns (host records this rank sends [size, RECORD_WIDTH], host records received, host
    copies of also_read): the one exchange on the data channel and the one wait."""
    backend, size = runtime.backend, runtime.size
    on_host = counts is None or isinstance(counts, np.ndarray)
    if size == 1 and on_host and error_flag is None:  # alone: the sizes are this rank's own
        records = host_ops.header_records(fields, size, counts, None, RECORD_WIDTH, shared,
                                          SHARED_AT)
        return records, records, backend.to_host_many(also_read) if also_read else []
    if on_host and counts is not None:
        counts = backend.asarray(np.ascontiguousarray(counts, dtype=np.int64))
    records = backend.header_records(fields, size, counts, error_flag, RECORD_WIDTH, shared,
                                     SHARED_AT)
    received = records
    if size > 1:
        ones = np.ones(size, dtype=np.int64)
        received = runtime.data.all_to_all_v(records, ones, ones)
    hosts = backend.to_host_many([records, received] + list(also_read))
    return hosts[0], hosts[1], hosts[2:]


def _in_skewed_steps(received):
    """Whether every rank is in the same op (op, tower, place) but not the same call of it: a
    step failed on some ranks before sok1x ran while the others went on."""
    same = received[:, [_OP, _TOWER, _PLACE]]
    return bool((same == same[0]).all()) and bool((received[:, _CALL] != received[0, _CALL]).any())


def _skipped_step_error(runtime, op, call, received):
    """The OrderError of a rank whose call is behind its peers' (they skipped this step): it
    fails this step alone (the others wait for its next one, which meets theirs)."""
    lines = ["rank %d: %s (call %d of its tower)" % (r, op.name, c)
             for r, c in enumerate(received[:, _CALL])]
    return OrderError(
        "ranks reached different sok1x collectives (rank %d is in %s, call %d):\n  %s\nThe ranks "
        "are in different steps: this step failed on ranks %s before sok1x ran (for example "
        "TensorFlow rejected their input), so it fails here too and changes nothing; the ranks "
        "go on together from the next step." % (
            runtime.rank, op.name, call, "\n  ".join(lines),
            [r for r, c in enumerate(received[:, _CALL]) if c > call]))


def _raise_order_error(runtime, op, call, received):
    """Every rank sees the same records, so every rank is here: gathers each rank's op and call
    and raises OrderError naming them. Ranks in different ops take back the call a tower's first
    op counted, as that call failed everywhere."""
    names = runtime.host.all_gather_object((op.name, int(call)))
    lines = ["rank %d: %s (call %d of its tower)" % (r, n, c) for r, (n, c) in enumerate(names)]
    if op.position == 0:
        CLOCK.take_back(op.tower)
    advice = (
        "Every rank must run the same communicating ops in the same order. Usual causes: a "
        "train and an eval tower fetched in one sess.run (fetch them in separate sess.run "
        "calls), ranks fetching different ops, or sok1x.dump on some ranks only. Build an "
        "independent tower inside `with sok1x.new_tower():`.")
    raise OrderError("ranks reached different sok1x collectives (rank %d is in %s, call %d):"
                     "\n  %s\n%s" % (runtime.rank, op.name, call, "\n  ".join(lines), advice))


Sizes = collections.namedtuple("Sizes", "sent received extra shared overflow")
Sizes.__new__.__defaults__ = (False,)
Sizes.__doc__ = """What an op header told the host: sent and received (host int64 [size, tables],
rows this rank sends each rank and receives from each, per table; None when no counts went),
extra (host copies of the arrays passed as also_read), shared (host int64 [size, k]: the
values each rank passed as shared, None when none went), overflow (True when some rank's
error_flag had bit OVERFLOW: a per-peer capacity was exceeded, lookup/peer_capacity.py)."""


def exchange_sizes(runtime, op, counts=None, local_error=None, error_flag=None, also_read=(),
                   describe_error=None, shared=None, sized=None):
    """Collective on every rank: the op header. op: an OpId (or a name); counts: backend int64
    [tables, size], rows this rank sends each rank per table (on the device on cuda; None: no data
    exchange follows); local_error: an error this rank found; error_flag: backend int64 [1], bit 0
    set on the device when this rank's input is bad (describe_error() returns that error), bit
    OVERFLOW when its keys overflow a per-peer capacity; also_read: backend arrays whose host copies
    the caller needs now (read in the same wait); shared: None, or a function returning host int64
    [k <= SHARED_WIDTH] this rank tells every rank (every rank's k the same), called again when a
    joined checkpoint (a restore may replace tables) repeats the header; sized: None, or whether
    this rank sizes the lookup by per-peer capacities (lookup/peer_capacity.py; every rank must).
    Returns Sizes; raises OrderError, the input error of any rank, or InitError where ranks size the
    lookup differently, on every rank."""
    op = as_op_id(op)
    # a forward's checks its backward never read (one rank), an evicting step's counts (any
    # number of ranks: every rank leaves them here alike, bounded_step.agreed_check): read first
    if runtime.unread_checks:
        bounded_step.read_left(runtime)
    if op.position == 0:  # a tower's first op opens a step (engine/lookup/step_journal.py)
        runtime.journal.begin_step()
    call = CLOCK.call_of(op)
    local_error = first_error(runtime.towers.check(op), local_error)
    if local_error is not None:
        counts = None
    later, runtime.read_later = runtime.read_later, []  # read in this wait, handed back
    told = _shared_values(shared)
    if runtime.size == 1:
        return _alone(runtime, op, counts, local_error, error_flag, also_read, later, told,
                      describe_error)
    tables = 0 if counts is None else int(counts.shape[0])
    fields = [op_key(op), tower_key(op), call, op.position,
              int(local_error is not None) | (_NOTICE if kernel_calls.fallback_asked() else 0)
              | (_SIZED if sized else 0), tables]
    sent, received, extra = _records(runtime, fields, counts, error_flag,
                                     list(also_read) + [array for array, _ in later], told)
    extra, late = extra[:len(also_read)], extra[len(also_read):]
    for (_, settle), host in zip(later, late):
        settle(host)
    while True:
        while _joined_checkpoint(runtime, op, received[:, _OP], fields[_OP]):
            told = _shared_values(shared)
            sent, received, extra = _records(runtime, fields, counts, error_flag, also_read,
                                             told)
        agree = received[:, _OP:_PLACE + 1]  # op, tower, call, place: the leading fields
        if not (agree != agree[0]).any():
            break
        if not _in_skewed_steps(received):
            _raise_order_error(runtime, op, call, received)
        if call < received[:, _CALL].max():  # the others skipped this step: it fails here
            raise _skipped_step_error(runtime, op, call, received)
        # This rank is in the step after one that failed elsewhere before sok1x ran (this
        # rank's own call of it failed too): it meets the others' next call of the op.
        sent, received, extra = _records(runtime, fields, counts, error_flag, also_read, told)
    if (received[:, _ERROR] & _NOTICE).any():
        kernel_calls.fall_back_with(np.flatnonzero(received[:, _ERROR] & _NOTICE).tolist())
    if (received[:, _ERROR] & _FAILED).any():
        if local_error is None and sent[0, _ERROR] & _FAILED and describe_error is not None:
            local_error = describe_error()
        runtime.host.raise_together(local_error, op.name)
    if sized is not None and len(set((received[:, _ERROR] & _SIZED).tolist())) > 1:
        raise InitError(
            "%s: ranks %s size their lookups by per-peer capacities and ranks %s do not: start "
            "every rank with the same SOK1X_PEER_CAPACITY" % (
                op.name, np.flatnonzero(received[:, _ERROR] & _SIZED).tolist(),
                np.flatnonzero((received[:, _ERROR] & _SIZED) == 0).tolist()))
    if told is not None:
        told = received[:, SHARED_AT:SHARED_AT + told.shape[0]].copy()
    overflow = bool((received[:, _ERROR] & OVERFLOW).any())
    if counts is None:
        return Sizes(None, None, extra, told, overflow)
    if tables > INLINE_TABLES:
        return _exchange_all_counts(runtime, counts, extra)._replace(shared=told,
                                                                     overflow=overflow)
    columns = slice(_FIELDS, _FIELDS + tables)
    return Sizes(sent[:, columns].copy(), received[:, columns].copy(), extra, told, overflow)


def order_checks(runtime, op):
    """exchange_sizes(runtime, op) of an op that sends no data and reads nothing (a replayed
    step's): in a job of one rank with nothing left to read (no unread checks, no counts to
    settle, no fallback to tell), only its order checks run, with the same errors; else the
    whole header. `op`: an OpId (or a name)."""
    op = as_op_id(op)
    if (runtime.size != 1 or runtime.unread_checks or runtime.read_later
            or kernel_calls.fallback_asked()):
        exchange_sizes(runtime, op)
        return
    if op.position == 0:
        runtime.journal.begin_step()
    CLOCK.call_of(op)
    error = runtime.towers.check(op)
    if error is not None:
        runtime.host.raise_together(error, op.name)


def _alone(runtime, op, counts, local_error, error_flag, also_read, later, told,
           describe_error):
    """exchange_sizes of a job of one rank: nothing crosses and one rank agrees with itself, so
    no record is built; the counts and the flag (where on the device) are read with also_read
    in the one wait, and the same Sizes and errors come out as the records would give."""
    wanted = list(also_read) + [array for array, _ in later]
    own = [array for array in (counts, error_flag) if array is not None]
    hosts = runtime.backend.to_host_many(wanted + own) if wanted or own else []
    extra = hosts[:len(also_read)]
    for (_, settle), host in zip(later, hosts[len(also_read):len(wanted)]):
        settle(host)
    flag = int(hosts[-1][0]) if error_flag is not None else 0
    if kernel_calls.fallback_asked() or flag & _NOTICE:
        kernel_calls.fall_back_with([0])
    if local_error is not None or flag & _FAILED:
        if local_error is None and describe_error is not None:
            local_error = describe_error()
        runtime.host.raise_together(local_error, op.name)
    if told is not None:
        told = told.reshape(1, -1).copy()
    overflow = bool(flag & OVERFLOW)
    if counts is None:
        return Sizes(None, None, extra, told, overflow)
    counts = np.asarray(hosts[len(wanted)], dtype=np.int64)
    if counts.ndim != 2 or counts.shape[1] != 1:
        raise ValueError("%s: an op header's counts are [tables, ranks], got %s at one rank"
                         % (op.name, list(counts.shape)))
    sent = counts.T.copy()  # the caller's array may be refilled: the Sizes are the header's own
    return Sizes(sent, sent.copy(), extra, told, overflow)


def _shared_values(shared):
    """exchange_sizes' shared values, made now (None: none)."""
    if shared is None:
        return None
    values = np.ascontiguousarray(shared(), dtype=np.int64).reshape(-1)
    if values.shape[0] > SHARED_WIDTH:
        raise ValueError("an op header shares at most %d values, got %d"
                         % (SHARED_WIDTH, values.shape[0]))
    return values


def exchange_header(runtime, op, send_counts=None, local_error=None):
    """Collective on every rank: exchange_sizes with host counts. send_counts: int64 [size] rows
    this rank sends to each rank, or [size, tables] for a fused exchange (None: no data exchange
    follows, or this rank found an error). Returns recv_counts of send_counts' shape (None
    without counts); raises OrderError or the reported input error on every rank."""
    counts = None if send_counts is None else np.asarray(send_counts, dtype=np.int64)
    fused = counts is not None and counts.ndim == 2
    if counts is not None:
        counts = np.ascontiguousarray(counts.reshape(counts.shape[0], -1).T)
    received = exchange_sizes(runtime, op, counts, local_error).received
    if received is None or fused:
        return received
    return received.reshape(-1)


def _exchange_all_counts(runtime, counts, extra):
    """The per-table counts of a fused exchange of more than INLINE_TABLES tables (counts:
    backend [tables, size]), once every rank is known to be in the same op: one more all-to-all
    on the data channel and two more waits. Returns Sizes."""
    backend = runtime.backend
    sent = np.ascontiguousarray(np.asarray(backend.to_host_many([counts])[0], np.int64).T)
    if runtime.size == 1:
        return Sizes(sent, sent.copy(), extra, None)
    ones = np.ones(runtime.size, dtype=np.int64)
    received = runtime.data.all_to_all_v(backend.asarray(sent), ones, ones)
    return Sizes(sent, backend.to_host_many([received])[0], extra, None)


# Checkpoints (DESIGN D8, engine/checkpoint/join.py): a save or restore opens with a marker in
# an op header's place, and ranks in an op take part in rank 0's before their own op goes on.
def exchange_marker(runtime, key):
    """Collective: sends every rank a header record whose op is `key` (a checkpoint marker), on
    the op headers' channel; returns the op keys every rank sent (host int64 [size]). No step,
    tower or call bookkeeping."""
    _, received, _ = _records(runtime, [key, 0, 0, 0, 0, 0], None, None, ())
    return received[:, _OP].copy()


_MARKER_HANDLER = []  # checkpoint_join.join_if_asked, set when that module is imported


def handle_markers_with(handler):
    """Makes handler(runtime, keys, own_key) -> bool see every header's op keys (the checkpoint
    module registers itself: importing it from here would close an import circle)."""
    _MARKER_HANDLER[:] = [handler]


def _joined_checkpoint(runtime, op, keys, own_key):
    """Takes part in rank 0's checkpoint if it asks (True: repeat the header). A rank other than
    0 checkpointing alone fails this call of the op everywhere: its tower's count is taken back,
    as for ranks in different ops."""
    if runtime.size == 1 or not _MARKER_HANDLER:
        return False
    try:
        return _MARKER_HANDLER[0](runtime, keys, own_key)
    except Exception:
        if op is not None and op.position == 0:
            CLOCK.take_back(op.tower)
        raise


def confirm_same_op(runtime, op):
    """Makes every rank confirm it is in `op` (an OpId or name) before a collective whose sizes
    are static. With SOK1X_ORDER_CHECK=0 only the local tower check runs, raising on this rank,
    after the checks forwards left unread (bounded_step.read_left: a step whose insert they
    judge must not be saved before they are read)."""
    if order_check_enabled():
        exchange_header(runtime, op)
        return
    if runtime.unread_checks:
        bounded_step.read_left(runtime)
    error = runtime.towers.check(as_op_id(op))
    if error is not None:
        raise error
