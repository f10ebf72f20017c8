"""A one-rank training step whose host waits for nothing but its key checks: its buffers are
sized before it, and its checks are read once its own work is queued (DESIGN D14 on one rank;
SOK1X_BOUNDED_STEP=1). Its backward serves the dense, keyed and pooled lookups (api.dense_lookup,
keyed_lookup, pooled_lookup, sparse_lookup) of tables whose rows follow from their keys, and the
training lookups of hash groups (each member's rows lie in its own range of the group's rows, as
a dense group's do; a hash table alone keeps its count), its forward the dense and keyed ones
without segment ids of tables without a hash table; a seam that sends the rows over the host
(engine/lookup/compact.py) keeps them counted, as every lookup on several ranks does.

Forward. A training lookup of tables whose rows follow from their keys (no hash table: no insert
happens in it), without segment ids, starts its key checks on the device, queues a copy of their
flag to the host (backend.read_later, so reading it waits for the checks alone) and queues its
gather before anything reads them. The gather gives a zero row for a key outside the shard, so
nothing is read out of place whatever the keys. Then either the lookup reads the checks' flag
itself, once its work is queued (checks="end", what a framework's op does: it cannot know
whether the step runs a backward), or, where its caller promises to run the backward
(checks="backward", the engine's own training step), it keeps the flag (defer_or_read) for the
backward, which reads it once its own work is queued (take, raise_if_set); so a step waits once,
in its backward. A promise broken (no backward came) is caught by the next collective op
(read_left), which fails with the forward's error. No table has changed by then: the update is a
later op, and a failed backward hands it nothing. A replayed backward whose update is recorded
predicated on the checks leaves them to that update instead (leave_for_update,
read_for_update; engine/lookup/replayed_step.py): the wait then follows the step's last launch.

Backward. The distinct rows of the keys are not counted on the host: they go into pieces whose
size is known before the step, backend.distinct_rows_padded. Member t of a table group (or the
one table) gets piece t, with a place for each of its keys, rounded up to ALIGN_ROWS, so every
piece starts 64 bytes aligned and a framework takes it without a copy. Member t's distinct rows
fill the front of its piece in ascending order; a place no row fills holds row -1 and a zero
gradient, which every optimizer update skips (backend/*/optimizers.py). The backward returns the
pieces, and each piece's size stands for the member's count of rows.

    keys of member t:   cuts[t] .. cuts[t + 1]        (host, from the forward)
    piece of member t:  piece_starts[t] .. piece_starts[t + 1],
                        piece_starts = 0, cumsum(ceil((cuts[t + 1] - cuts[t]) / 8) * 8)

Cost, one lookup of n keys of dim d, of which u are distinct: the backward's rows, local rows
and summed gradients are as long as the keys (rounded up by at most 7 a member), not as the
distinct keys: (16 + 4 d) (n - u) bytes more, and the update reads n - u more rows (-1, skipped
at once). Nothing crosses a network on one rank.

Several ranks. With SOK1X_PEER_CAPACITY=1 too (peer_capacity.py), a dense or keyed lookup of
tables without a hash table is bounded the same way in its backward: its forward's op header
tells every rank each rank's keys per member (told_keys: SHARED_WIDTH values at most, else the
backward counts), so every owner knows, before any gradient crosses, that member m's distinct
rows on it are at most min(every rank's keys of m, m's rows in its shard, the rows it can
receive) (bounds_of, kept in Routing.bounds), and lays them out in pieces of those lengths,
rounded up to ALIGN_ROWS. So is a training lookup of a hash group sized by the caps (no shard
of it can fill up in the step): its header tells every rank each rank's keys per member beside
its room (key_exchange.room_and_keys), and rows_bound takes those. The forward still reads its
header (its checks and overflow ride in it), so the key checks are never deferred there; what
the next op header reads there is an evicting step's counts (agreed_check, which an uncaptured
one-rank evicting step leaves too). Cost: a
member's piece is up to the job's keys of that member where the counted way holds this
owner's share of them, about `size` times the rows (and the update's padded rows) of the
counted backward when keys spread evenly; a rank whose header told nothing (its lookup not
bounded) makes every rank's backward count, which crosses the network as the bounded one does
(same header, same caps), so the ranks never disagree on an exchange.
"""
import collections
import functools

import numpy as np

from sok1x.backend.cuts import cut_points
from sok1x.engine import environment
from sok1x.engine.op_order import as_op_id
from sok1x.engine.lookup.group_gradients import (  # noqa: F401  (the layout is a group's)
    ALIGN_ROWS,
    Padded,
    piece_starts,
)

ENV = "SOK1X_BOUNDED_STEP"
TOLD = 1  # the first of a table's values in told_keys: a rank whose header carries it told

NO_BACKWARD = " (its checks read by the next op: it had no backward pass)"
NO_UPDATE = " (its checks read by an op before its update)"

Deferred = collections.namedtuple("Deferred", "read describe op_name passed left",
                                  defaults=(None, NO_BACKWARD))
Deferred.__doc__ = """A forward's key checks left unread: read() -> the host copy of their flag
(backend.read_later: the copy queued with the checks, so reading waits for them alone; nonzero
where a key is bad), describe() -> the error that names it, op_name (for the message), passed:
None, or what runs once the flag is read clear (a hash group's replayed insert counts its
lookup then: table_group.ReplayedInsert.checked), left: what the message adds where the next
op reads them (read_left): NO_BACKWARD, or NO_UPDATE for checks a replayed backward left to
its update (leave_for_update). read None: an agreed check (agreed_check)."""


def agreed_check(describe, op_name, passed):
    """The Deferred of a step whose outcome every rank learns at the next op header
    (read_left, before its own records cross: the backward's, or the next op's): there
    describe() reads what it needs (a wait) and returns this rank's error or None, every rank
    agrees (one all-gather; one rank alone, none), and the step fails on every rank, taken
    back, or passed() runs on each. An evicting step in place leaves its counts so
    (key_exchange._agreed_in_place, table_group.ReplayedInsert.agreed_check): no wait between
    its exchanges. Every rank leaves one at the same place of the same op, whether it replays
    or not."""
    return Deferred(None, describe, op_name, passed, "")


def leave_agreed(runtime, deferred):
    """Leaves an agreed check (agreed_check) to the next op header; a rollback of its step
    before then (its forward failed after this) takes it back, so that no later header runs
    its passed() over what the rollback put back."""
    runtime.unread_checks.append(deferred)
    runtime.journal.record(functools.partial(_forget, runtime, deferred))


def _forget(runtime, deferred):
    runtime.unread_checks = [d for d in runtime.unread_checks if d is not deferred]

def enabled(runtime):
    """True when SOK1X_BOUNDED_STEP=1 and the job has one rank."""
    return runtime.size == 1 and environment.get(ENV, "0") in ("1", "true", "True")


def asked():
    """True when SOK1X_BOUNDED_STEP=1, whatever the number of ranks."""
    return environment.get(ENV, "0") in ("1", "true", "True")


def told_keys(runtime, member_keys, width):
    """What a bounded lookup on several ranks sized by per-peer capacities tells every rank in
    its op header (exchange_header's shared values), so that each owner can bound its backward's
    rows: per table TOLD, then this rank's keys per member. member_keys: None, or per table
    None or host int64 [members]; width, how many values the header holds. Returns a function
    making those host int64 values, or None where the backward stays counted (one rank, the
    switch off, a table without its counts, more values than the header holds)."""
    if runtime.size == 1 or not asked() or not member_keys or any(
            counts is None for counts in member_keys):
        return None
    values = np.concatenate([np.concatenate([[TOLD], np.asarray(counts, np.int64)])
                             for counts in member_keys]).astype(np.int64)
    if values.shape[0] > width:
        return None
    return functools.partial(np.copy, values)


def bounds_of(tables, member_keys, told, caps_here):
    """Per table of a bounded lookup on several ranks (told_keys) the host int64 [members]
    bounds of its backward's rows on this rank: member m's distinct rows here are at most every
    rank's keys of m (told: host int64 [size, k], the header's shared values), the member's rows
    in this rank's shard, and the keys this rank can receive (caps_here: per table its cap for
    this rank, times the ranks). A rank that told nothing (its lookup not bounded) leaves every
    table None: the backward counts its rows."""
    out, position = [], 0
    for table, counts in zip(tables, member_keys):
        members = len(counts)
        if not np.all(told[:, position] == TOLD):
            return [None] * len(tables)
        keys = told[:, position + 1:position + 1 + members].sum(axis=0)
        out.append(rows_bound(table, keys, told.shape[0], caps_here[len(out)]))
        position += 1 + members
    return out


def rows_bound(table, keys, size, cap_here):
    """Host int64 [members]: the most distinct rows of each member of `table` a backward on
    this rank can hold, where every rank's keys of the members sum to `keys` (host int64
    [members]) and this rank receives at most `cap_here` slots of the table from each of the
    `size` ranks: at most those keys, the member's rows in this rank's shard and what it can
    receive."""
    held = getattr(table, "held_rows", None)  # a group's members' rows
    rows = held if held is not None else np.array([int(table.values.shape[0])], np.int64)
    return np.minimum(np.minimum(keys, rows), size * int(cap_here))


def piece_starts_of(bounds):
    """piece_starts of a several-rank bounded backward: member t's piece as long as its bound
    (bounds: host int64 [members]), rounded up to ALIGN_ROWS."""
    return piece_starts(cut_points(bounds))


def defers(runtime, tables, training, flag):
    """True if a lookup of `tables` leaves its key checks' `flag` unread (see the module)."""
    return (flag is not None and training and enabled(runtime)
            and not any(table.use_hashtable for table in tables))


def defer_or_read(runtime, deferred, backward):
    """Keeps a forward's Deferred checks for its backward (backward=True; the next collective
    op reads them if it never comes), or reads them now (raising the bad input's error)."""
    if backward:
        runtime.unread_checks.append(deferred)
    else:
        raise_if_set(runtime, [deferred])


def take(runtime, routings, op):
    """The Deferred checks of `routings` (each once), no longer left for the next op, for the
    backward `op` (an OpId or a name) to read once its work is queued. Where `op` opens a step
    (a tower's first op, as a bare name is), those whose forward changed a table (passed set: a
    hash group's insert, which the step journal undoes only until the next step opens) are read
    now, raising a bad key's error, and the rest returned. Checks read already (by an op
    between: read_left) are not taken again."""
    taken = []
    for routing in routings:
        deferred = getattr(routing, "check", None)
        if deferred is None:
            continue
        for position, unread in enumerate(runtime.unread_checks):  # (each taken once)
            if unread is deferred:
                del runtime.unread_checks[position]
                taken.append(deferred)
                break
    if as_op_id(op).position != 0 or all(deferred.passed is None for deferred in taken):
        return taken
    raise_if_set(runtime, [deferred for deferred in taken if deferred.passed is not None])
    return [deferred for deferred in taken if deferred.passed is None]


def raise_if_set(runtime, taken, note=""):
    """Reads the flags of `taken` (a wait each, for its checks alone; an agreed check's
    describe() reads what it needs) and raises the first error, a bad input's or an agreed
    check's, as the forward's op header would have (runtime.host.raise_together), `note` after
    its name."""
    for deferred in taken:  # (raise_together raises nothing for None: an agreed check passed)
        if deferred.read is None or int(deferred.read()[0]):
            runtime.host.raise_together(deferred.describe(), deferred.op_name + note)
        if deferred.passed is not None:
            deferred.passed()


def read_left(runtime):
    """Reads the checks of forwards whose backward never came (and of replayed backwards whose
    update never came) and raises the first bad input's error, naming its lookup, with their
    step rolled back (the journal's step is still theirs: a hash group's insert is taken back,
    whether the op reading them is a step's or a checkpoint's, which no api._Step undoes). On
    several ranks every rank agrees on them first (_agree_on_left); one rank reads an agreed
    check (an evicting step's counts) through its describe(). Nothing
    left: nothing read, no collective (every rank leaves the same checks)."""
    if not runtime.unread_checks:
        return
    taken, runtime.unread_checks = list(runtime.unread_checks), []
    try:
        if runtime.size > 1:
            _agree_on_left(runtime, taken)
            return
        for deferred in taken:
            raise_if_set(runtime, [deferred], deferred.left)
    except BaseException as exc:
        runtime.journal.failed(exc)  # (api._Step's own rollback then finds nothing to undo)
        raise


def _agree_on_left(runtime, taken):
    """read_left on several ranks: this rank's first error among the checks `taken` (an agreed
    check's describe(), a key check's where its flag is set; a fault while reading them is the
    error), agreed with every rank (each leaves the same checks at the same op), then raised on
    every rank, or each check's passed() run."""
    error, what = None, taken[0].op_name
    for deferred in taken:
        try:
            if deferred.read is None or int(deferred.read()[0]):
                error = deferred.describe()
        except Exception as fault:  # (its peers wait in the agreement below)
            error = fault
        if error is not None:
            what = deferred.op_name + deferred.left
            break
    runtime.host.raise_together(error, what)
    for deferred in taken:
        if deferred.passed is not None:
            deferred.passed()


def leave_for_update(runtime, taken):
    """Leaves a replayed backward's Deferred checks `taken` (on one rank) to the update that
    follows it, which reads them once its work, predicated on them on the device, is queued
    (read_for_update), so that the host's wait for them comes after the step's last launch;
    the next op reads them where no update comes (read_left). Returns them as left (what
    read_for_update's keep names)."""
    left = [deferred._replace(left=NO_UPDATE) for deferred in taken]
    runtime.unread_checks.extend(left)
    return left


def read_for_update(runtime, keep=()):
    """Reads the checks replayed backwards left to their update (leave_for_update; nothing
    where none are left), but those of `keep` (an update's own, read once its predicated work
    is queued), and raises the first bad input's error as the backward would have, with the
    step rolled back (an update op opens no api._Step)."""
    unread = runtime.unread_checks
    if not unread:
        return
    kept = set(map(id, keep))  # (by identity: two checks may compare equal)
    taken = [deferred for deferred in unread if deferred.left is NO_UPDATE
             and id(deferred) not in kept]
    if not taken:
        return
    read = set(map(id, taken))
    runtime.unread_checks = [deferred for deferred in unread if id(deferred) not in read]
    try:
        raise_if_set(runtime, taken)
    except BaseException as exc:
        runtime.journal.failed(exc)
        raise
