"""A bounded step's lookup, its backward and its update, recorded once per shape class and
replayed (DESIGN D14, issue 45 item 2; SOK1X_CAPTURE=0 turns it off).

Several ranks (SOK1X_BOUNDED_STEP=1 and SOK1X_PEER_CAPACITY=1): a dense or keyed lookup of
dense tables replays as below, but its forward is two recorded works with its op header between
them (replayed_ranks.py: the header is read on the host before any key crosses, as without
replay, so D3 and D7 hold), its backward's rows are bounded by every rank's keys
(bounded_step.bounds_of: a backward class per pieces), and its backward's header is the whole
op header (order_checks on several ranks). A class is recorded with its op's caps and dropped
when they grow. A hash group's training lookup replays there too (replayed_ranks.py: its
insert in the exchange half, ready() asked after the header, which tells whether any shard of
it can fill up), a full hybrid group's evicting steps among them (their counts and every
rank's agreement on them left to the next op header: bounded_step.agreed_check). What follows
is the one-rank step.

Which steps. A training lookup of int64 keys (int32 ones are widened into a new array at each run,
and the part list naming it would be an upload inside the capture) of dense tables whose rows
follow from their keys (no hash table), on one rank with the bounded step on (SOK1X_BOUNDED_STEP=1,
bounded_step.py: then neither the lookup nor its backward reads a count back), whose caller passes
replay=True: it runs the lookup's backward (checks="backward") or reads the checks at the lookup's
end, and is done with the lookup's output and the backward's (values, rows) before it calls the
same lookup again, because a replay writes them into the same arrays. Two lookups replay: a dense
one of one table (api.dense_lookup: forward() here), and a keyed one (api.keyed_lookup, keyed.py)
of one table or of one TableGroup in its order, each key its own output row, unweighted (keyed.py
gives forward_of() its work and cuts: the members' keys are checked against their own limits and
moved into the group's rows, and the backward's rows come a piece per member); a keyed lookup of
dense tables whose keys are pooled by segment ids or weighted replays the same work, its segment
ids riding with its keys (forward_of's riders: copied into fixed arrays at each replay, checked in
the keys' flag), keyed.py pooling its rows after the replay and spreading the top gradient to the
keys before the replayed backward. A keyed lookup of a HashGroup, its rows in device memory or
partly in host memory (v1 hash tables, hbm and hybrid DynamicVariables), replays its insert too,
through hooks (table_group.ReplayedInsert). Before each replay the host checks that no member can
fill up in the step (near a member's capacity by counting the step's new keys, one wait; where they
do not fit, the uncaptured path runs, and grows, evicts or fails as it does; a hybrid member with
freed rows to hand out takes that path too), writes the clock its new rows are stamped with, and
writes the member list its insert hands rows out by where the graph (which moves the list past the
keys it placed) did not leave it as the indexes are. After it, the placed keys are kept (their count
copied at once, read with the next size) and the step journal records their erasing; a hybrid group
counts the lookup in its rows' access statistics once the checks passed (one launch beside the
graph, with the step's number). Where its caller runs the backward (checks="backward"), its forward
leaves its checks to it as a dense table's does: the step journal keeps the insert's undo until they
are read, before any op opens a step of its own (_checked_by); its insert passes a negative key by.
The engine's own step does (bench/). TensorFlow's ops in a session's graph (graph_ops: the dense
lookup, the keyed op) pass replay=True with a detach, since a graph may keep an output past its step
(a queue, a while loop's TensorArray). detach=True (a py_func's seam): a replayed output and
gradient come as copies of their own (detached(); the backward's kept, one per class, until its next
replay, so that the update handed them back still replays: _refill copies them, as handed back, into
the arrays the recorded update reads). detach=HELD (sok1x's TensorFlow kernels, which record what
TensorFlow holds in engine/lent_memory.py): the class's own arrays, as for the engine's step, until
a replay finds one of them still held; that step takes the uncaptured path and the class hands out
copies from then on. Whatever the detach, a replay never writes an array the framework holds, nor
does an update's _refill. Eager code and tf.function do not replay.

Shape class. A forward op (its tower, place and name), its table (or group), the keys' shape and
dtype and the checks mode, and a keyed lookup's keys per member, key limits and, with segment
ids, its output rows per member (the recorded check's ranges). First sight: the
uncaptured path, as without the switch. Second sight: the keys are copied into a fixed array, the
forward's device work runs on it eagerly (this step's result, and every constant the work uploads
made now) and is then recorded (backend.captured_work: a CUDA graph on cuda; on cpu kept to run
again, backend/cpu/rerun.py). From the third sight on, the step copies its keys into the fixed
array and replays: one launch for the key checks, the row lookup and the gather. The backward of a
replayed forward is recorded at its first sight the same way (its top gradient read in place when
it is the forward's own output, else copied into a fixed array) and replayed from the next. So is
the update (api.apply_optimizer_update(s) of one table, api.apply_keyed_update of a keyed lookup's
tables) with the (values, rows) a replayed backward returned (those arrays, other arrays over the
same memory as a seam hands them back, or its detached copies: found by address), per optimizer
rule, slot prefix
and options: its kernels read the step's hyper-parameters (a learning rate that changes every step)
from a small device array the host writes before each replay (backend.hyper_given), since a graph
keeps the scalars it was recorded with; the update's time stamp (stamp(), a scalar of the step)
is recorded with it and writes the time the same launch puts into a device clock
(backend.time_given). An update whose table's rows or slots moved (a load, say) is recorded
again. Work that cannot be recorded (CaptureError: a host wait or an upload inside it,
as the all-rows rules' dense gradient) leaves its class uncaptured from then on; the step that
found it stands.
What the host still does per op: the op header's order checks (exchange_header.order_checks: alone,
no data crosses), the copy of the flag of the key checks (backend.read_later), the stash of the
routing, and the reading of the flag where the uncaptured path reads it (bounded_step.py), so a
replayed step with bad keys fails as the uncaptured one does, on its forward (checks="end") or its
backward (checks="backward"), and changes no table. One rank, once a backward's update classes
are all recorded predicated on the step's checks (their work first drops the gradient's rows,
backend.drop_rows_if_failed, where the key checks' flag, or a hash group's count of new keys left
without a victim, says the step failed, both read on the device): that backward leaves the flag
to its update (bounded_step.leave_for_update), which reads it once its own work is queued, so the
step's one wait comes after its last launch and what the host does after the wake (a hash
group's counts handed over, the next step's launches) overlaps the GPU's backward and update; a
step with bad keys then fails in its update, still changing no table (the rows dropped, the
step journal rolled back), and an update of changed values (the uncaptured path) or any other
op reads the flag before it changes anything. Not where an update moves every row (Adam's,
Keras RMSprop's: dropped rows would not stop it), whose backward reads the checks itself; an
update reads the checks other backwards left before its own work is queued (its predicate is
its own step's alone), and one that comes after its lookup's next forward (which rewrote the
flags it is predicated on) takes the uncaptured path. Its inputs' host checks (shapes, layouts,
conversions) are skipped from a class's first replay on: the caller remembers the class under a key
of its raw inputs (remember_front), and a later step with equal inputs (the same table or tables,
op, keys' shape and dtype, layout and checks mode) goes straight to its replay (replay_known), as it
passed those checks at its first sight; a class dropped, or whose table's rows moved, takes the
whole path again. A replayed backward returns the very result of its first replay (the same
arrays), built once, unless detached.

Memory. A class holds its fixed keys (8 n bytes for n int64 keys), what its graph allocated (the
bounds and flag, the rows 8 n, the output 4 n dim) and its backward's (rows, local rows and summed
gradients as long as the keys rounded up to 8: 16 n + 4 n dim, plus a fixed gradient 4 n dim where
it is not the forward's output; a keyed lookup of a group: its keys moved into the group's rows, 8 n
more, and each member's piece rounded up to 8 rows; with segment ids, 8 n for their fixed copy;
detached, a copy of the backward's outputs), and each update class 4 bytes per hyper-parameter, 8
for its clock and what its graph allocated (nothing for a table in GPU memory); held_bytes() says
what all classes hold. On several ranks a class also holds its exchanges' buffers
(peer_capacity.py's cost: the keys and vectors sent and received, each way, and the backward's
gradients alike): on two H200s a dlrm26 class of 425,984 keys of dim 128 a rank held 1,487 MiB,
against 455 at one rank (2026-11-30, bench/NOTES.md). At most MAX_CLASSES forward classes are kept,
the oldest dropped first, and with SOK1X_REPLAY_MIB set the oldest others while the kept classes
hold more MiB than it says (_keep: the class just recorded stays whatever it holds, and a class
dropped for memory is not recorded again, its steps uncaptured; sok1x's init fails on every rank
where one's value is no budget). A class dropped is retired, not freed (_drop): its arrays may
still be read in the step that dropped it (its output handed out, its Routing in the stash for a
backward, which then runs uncaptured on them). It is freed when its op is called again (the same
name at the same place of the same tower), which by replay=True's contract ends its caller's use of
them, or a step of its tower opens (a tower's first op), and not while the framework still holds
what it handed out (lent_memory) or forwards' checks are left unread (reading them may read it);
held_bytes() counts it until then. Any change to the job's tables (made, replaced, dropped: the
TableRegistry calls Runtime._drop_replays) frees every class at once, with the memory it holds, as
does shutdown (inside the device context, so nothing is freed at the interpreter's exit); a class
whose table's rows moved is dropped at its next sight.
"""
import collections
import functools
import operator
import time

import numpy as np

from sok1x.engine import environment, lent_memory
from sok1x.engine.lookup import bounded_step, distinct_rows, peer_capacity, replayed_ranks
from sok1x.engine.lookup.replay_budget import budget_bytes
from sok1x.engine.lookup.exchange_header import order_checks
from sok1x.engine.lookup.key_exchange import (
    KeyCheck,
    Routing,
    check_error,
    padded_sums,
    start_key_checks,
)
from sok1x.engine.op_order import as_op_id
from sok1x.engine.tables import hybrid_rows, optimizer_updates
from sok1x.errors import CaptureError

ENV = "SOK1X_CAPTURE"
HELD = "held"  # api's detach=HELD: copies only where the framework held an output (lent_memory)
MAX_CLASSES = 16
_SIGHTINGS_KEPT = 1024


def enabled(runtime):
    """True when SOK1X_CAPTURE is not 0 and the bounded step applies: on one rank
    (bounded_step.enabled), or on several with the lookups sized by per-peer capacities
    (SOK1X_BOUNDED_STEP=1 and SOK1X_PEER_CAPACITY=1)."""
    if environment.get(ENV, "1") in ("0", "false", "False"):
        return False
    if runtime.size == 1:
        return bounded_step.enabled(runtime)
    return bounded_step.asked() and peer_capacity.enabled()


class _Forward:
    """One forward shape class: its table, fixed keys, recorded work, its backward's pieces
    (host piece_starts of its members' keys) and backward classes."""

    def __init__(self, op, key, table, keys, work, judge, pieces, hooks=None, prepare=None,
                 plan=None, member_keys=None, riders=()):
        self.op = as_op_id(op)  # whose next call ends the use of what it handed out (_drop)
        self.key, self.table, self.keys = key, table, keys
        self.riders = riders  # forward_of's: fixed arrays the work reads beside the keys
        self.values = _where(table)
        self.work, self.judge, self.pieces = work, judge, pieces
        self.hooks = hooks  # forward_of's: the host's part of each replay, or None
        # several ranks: the recorded half before the op header (replayed_ranks.py), the op's
        # peer_capacity.Plan and the caps both halves were recorded with, the keys per member
        self.prepare, self.plan, self.member_keys = prepare, plan, member_keys
        self.caps = None if plan is None else plan.caps
        self.routing = self.check = self.describe = None  # made at the first replay
        self.replays = 0  # one-rank replays so far: a predicated update reads this step's flag
        self.shaped = None  # the output as api.dense_lookup shapes it (remember_dense)
        self.fronts = []  # the callers' fronts remembered for it (remember_front)
        self.copies = False  # hands out copies of its output (detached())
        self.backwards = {}  # top gradient read in place (True) or copied (False) -> _Backward

    def outputs(self):
        """(bounds, flag, rows, vectors, and what else the run returned): the arrays every
        replay writes."""
        if self.prepare is not None:
            return self.prepare.outputs[:2] + self.work.outputs
        return self.work.outputs

    def handed_out(self):
        """The arrays a replay writes and hands out: [vectors], or None before the first."""
        if self.work.outputs is None:
            return None
        return [self.outputs()[3]]

    @property
    def held_bytes(self):
        return (int(self.keys.nbytes) + sum(int(r.nbytes) for r in self.riders)
                + self.work.held_bytes
                + (0 if self.prepare is None else self.prepare.held_bytes)
                + sum(b.held_bytes for b in self.backwards.values()))

    def free(self):
        for backward in self.backwards.values():
            backward.free()
        self.work.free()
        if self.prepare is not None:
            self.prepare.free()
        self.backwards = {}

    def still_held(self, backend):
        """Whether the framework still holds memory this class or a backward of it handed out
        (lent_memory)."""
        for holder in [self] + list(self.backwards.values()):
            handed = holder.handed_out()
            if handed is not None and not lent_memory.writable(backend, handed):
                return True
        return False


class _Backward:
    """One backward shape class of a _Forward: its fixed top gradient, recorded work and update
    classes."""

    def __init__(self, grads, own, work, pieces, kept=None):
        self.grads, self.own, self.work, self.pieces = grads, own, work, pieces
        self.counts = np.diff(pieces)  # each member's piece (keyed_update's counts)
        self._counts_bytes = self.counts.tobytes()
        self.kept = kept  # int8 per row of its sums: which may hold an earlier sum (kept_sums)
        self.updates = {}  # (rule, slot prefix, options) -> _Update
        self.result = None  # (values, rows, Padded) every replay returns, from the first on
        self.detached = None  # copies of its outputs the last detached replay handed out
        self.copies = False  # hands out copies of its outputs (detach)
        self.after = None  # its forward's replays when it last ran (_update_of's predicate)
        self.left = ()  # the checks it last left to its update (bounded_step.leave_for_update)

    def same_counts(self, counts):
        """Whether host `counts` (any shape) are this class's member pieces (self.counts)."""
        if (type(counts) is np.ndarray and counts.dtype == self.counts.dtype
                and counts.size == self.counts.size):
            return counts.tobytes() == self._counts_bytes
        counts = np.asarray(counts).reshape(-1)
        return counts.shape == self.counts.shape and np.array_equal(counts, self.counts)

    def handed_out(self):
        """The arrays a replay writes and hands out: [rows, summed, own rows], or None where
        there is no recorded work or it has not run."""
        return None if self.work is None or self.work.outputs is None else self.work.outputs[:3]

    @property
    def held_bytes(self):
        if self.work is None:
            return 0
        return (self.work.held_bytes + (0 if self.own else int(self.grads.nbytes))
                + sum(int(a.nbytes) for a in self.detached or ())
                + (0 if self.kept is None else int(self.kept.nbytes))
                + sum(u.held_bytes for u in self.updates.values()))

    def free(self):
        for update in self.updates.values():
            update.free()
        self.updates = {}
        self.detached = None
        if self.work is not None:
            self.work.free()


class _Update:
    """One update class of a _Backward: the arrays its kernels read the hyper-parameters and its
    stamp's time from, its table's slots (their names in the table), where the table's rows and
    those slots were when it was recorded, and its recorded work (None: refused, the update stays
    uncaptured)."""

    def __init__(self, given, clock, slots, where, work, predicated=False):
        self.given, self.clock, self.slots, self.where, self.work = given, clock, slots, where, work
        # its work drops its rows first where its step's checks failed, read on the device
        # (_failure_flags): its backward may leave the host's read of them to it
        self.predicated = predicated and work is not None

    @property
    def held_bytes(self):
        return (int(self.given.nbytes) + int(self.clock.nbytes)
                + (0 if self.work is None else self.work.held_bytes))

    def free(self):
        if self.work is not None:
            self.work.free()


class _Classes:
    """A runtime's shape classes (runtime.replays)."""

    def __init__(self, version):
        self.version = version
        self.forwards = collections.OrderedDict()
        self.by_rows = {}  # id of a class's fixed rows array -> the class (its backward's key)
        # the address of a backward's summed gradient -> (_Forward, _Backward): an update may
        # get it through a seam, as another array over the same memory
        self.by_gradient = {}
        self.detached = {}  # the same for the copies a detached backward handed out (held)
        self.sightings = collections.Counter()
        self.fronts = {}  # a caller's key of its raw inputs -> (_Forward, holder, what it kept)
        # classes whose work could not be recorded, or dropped for SOK1X_REPLAY_MIB:
        # uncaptured from then on
        self.refused = set()
        self.retired = []  # _Forwards dropped, their memory kept until nothing reads it (_drop)

    def free(self):
        for entry in list(self.forwards.values()) + self.retired:
            entry.free()
        self.forwards.clear()
        self.retired = []
        self.by_rows.clear()
        self.by_gradient.clear()
        self.detached.clear()
        self.sightings.clear()
        self.fronts.clear()
        self.refused.clear()


def _classes(runtime):
    classes = runtime.replays
    if classes is None or classes.version != runtime.tables.version:
        if classes is not None:
            classes.free()  # a table was made, replaced or dropped: its graphs may read it
        classes = runtime.replays = _Classes(runtime.tables.version)
    return classes


def _where(table):
    """Where a table's rows are: (address, shape, a group's layout). A class whose table's rows
    moved, or whose group grew in place (its members' rows and indexes changed, not its flat
    array), is dropped (the graph reads them where they were); the array itself is not kept, so
    that a table that gives its rows up (a checkpoint load, say) does not hold them through a
    class."""
    return (hybrid_rows.addresses(table.backend, table.values), tuple(table.values.shape),
            getattr(table, "layout", 0))


def _forward_run(runtime, table, keys):
    """The device work of a one-rank bounded forward of `table`'s `keys`: the key checks on the
    device, the rows, the gather (zeros past the table). Returns (KeyCheck, rows, vectors)."""
    check = start_key_checks(runtime, [table], [keys])
    rows = table.rows_of(keys, False)
    return check, rows, table.gather(rows)


def _routing(table, count, rows, deferred):
    counts = np.array([count], dtype=np.int64)
    return Routing(None, count, None, counts, counts.copy(), rows, count, False,
                   getattr(table, "row_starts", None), None, deferred)


def forward(runtime, table, op, keys, training, checks):
    """api.dense_lookup's replayed path (module docstring) for flat `keys` (backend array):
    returns (vectors [n, dim], Routing), or None where the uncaptured path must run (not such a
    step, or the first sight of its class). Raises as the uncaptured path does."""
    if not (training and checks in ("end", "backward") and enabled(runtime)
            and not table.use_hashtable and keys.dtype == np.int64 and len(keys.shape) == 1
            and keys.shape[0]):  # an empty batch (a dataset's last) has nothing to replay
        return None
    op = as_op_id(op)
    count = int(keys.shape[0])
    return forward_of(runtime, _dense_key(op, table, keys, checks), table, op, keys, checks,
                      functools.partial(_forward_run, runtime, table),
                      np.array([0, count], dtype=np.int64),
                      routed=functools.partial(_routed_run, runtime, table))


def _routed_run(runtime, table, keys):
    """The keys' part of a dense lookup on several ranks: (KeyCheck, the keys as they are)."""
    return start_key_checks(runtime, [table], [keys]), keys


def _dense_key(op, table, keys, checks):
    """The shape class of a dense lookup of `table`'s `keys` (flat or not: their size)."""
    return (op.tower, op.position, op.name, table.name, int(keys.size), keys.dtype.str, checks)


def _dense_front(table, op, keys, row_shape, training, checks):
    return (id(table), op, tuple(keys.shape), keys.dtype.str,
            None if row_shape is None else tuple(row_shape), bool(training), checks)


def dense_known(runtime, table, op, keys, row_shape, training, checks):
    """api.dense_lookup's replay of a class it replayed before with these inputs (`keys`: the
    backend array as given, any shape; replay_known): (vectors [*keys.shape, dim], Routing), or
    None where its own path must run."""
    if runtime.replays is None:
        return None
    op = as_op_id(op)
    known = replay_known(runtime, _dense_front(table, op, keys, row_shape, training, checks),
                         table, op, keys, checks)
    if known is None:
        return None
    vectors, routing, shaped = known
    backend = runtime.backend
    if runtime.size > 1 and backend.address_of(vectors) != backend.address_of(shaped):
        # its keys overflowed a cap: the step went on the counted way, into arrays of its own
        shaped = backend.reshape(vectors, tuple(keys.shape) + (table.dim,))
    return shaped, routing


def remember_dense(runtime, table, op, keys, row_shape, training, checks, shaped):
    """After forward() replayed or recorded a dense lookup of `keys` (as given), whose output
    api.dense_lookup shaped as `shaped`: remembers it for dense_known."""
    op = as_op_id(op)
    key = _dense_key(op, table, keys, checks)
    remember_front(runtime, _dense_front(table, op, keys, row_shape, training, checks), key,
                   table, shaped)
    entry = runtime.replays.forwards.get(key) if runtime.replays is not None else None
    if entry is not None and entry.routing is not None and entry.shaped is None:
        entry.shaped = shaped


def forward_of(runtime, key, table, op, keys, checks, run, cuts, hooks=None, routed=None,
               riders=()):
    """The replayed path of any bounded forward of `table` (an EmbeddingTable or a
    TableGroup of dense tables, whose rows follow from its keys, or a HashGroup with hooks) with
    flat int64 `keys`: `key` names its shape class (every input that shapes the work but the
    keys' values); run(fixed keys) queues the forward's device work on a fixed array and returns
    (KeyCheck, rows, vectors) or (KeyCheck, rows, vectors, [more arrays]); cuts: host int64
    [members + 1], where each member's keys start (its backward's pieces). hooks: None, or the
    host's part of the class's steps (kept with the class at its capture): hooks.ready(keys,
    whether the op opens a step)
    before each run or replay (False: this step takes the uncaptured path, nothing done; on
    several ranks, asked after the op header, its insert does),
    hooks.arm() once the op's order checks passed (its journal step open), hooks.done(rows,
    more arrays) after the run or replay, and hooks.checked() once its key checks passed
    (where checks="backward", as late as its backward).
    routed: on several ranks, routed(fixed keys) queues the keys' part of the forward and
    returns (KeyCheck, the keys in the table's id space), a HashGroup's with their tags after;
    the rest is replayed_ranks.py's, with hooks.insert for a HashGroup, and hooks.ready asked
    after the op header with the most keys per member an owner can get (None: no replay on
    several ranks). riders: backend arrays the
    work reads beside the keys (a pooled lookup's segment ids, whose checks then ride in the
    keys' flag), each copied into a fixed array of the class at every replay as the keys are;
    run and routed take those after the keys (`key` must tell their shapes). Returns (vectors,
    Routing), or None where the uncaptured path must run (the first sight of the class, or
    hooks not ready). `op`: an OpId."""
    plan = None
    if runtime.size > 1:  # sized by caps the ranks agreed on (the op's first lookup sets them)
        plan = None if routed is None else peer_capacity.plan_of(runtime, op, [table])
        if plan is None:
            return None
    classes = _classes(runtime)
    if classes.retired:
        _free_retired(runtime, classes, op)
    entry = classes.forwards.get(key)
    if entry is not None and (entry.table is not table or entry.values != _where(table)
                              or entry.caps is not (None if plan is None else plan.caps)):
        _drop(runtime, classes, key)  # moved rows, or caps grown since it was recorded
        entry = None
    if entry is None:
        if len(classes.sightings) >= _SIGHTINGS_KEPT:  # layouts come and go (a last batch)
            classes.sightings.clear()
        classes.sightings[key] += 1
        if classes.sightings[key] < 2 or key in classes.refused:
            return None
        if plan is not None and plan.caps is None:  # not yet agreed: the counted way sets them
            return None
        fixed_riders = _fixed_copies(runtime.backend, riders)
        if plan is not None:
            return _capture_ranks(runtime, classes, key, table, op, keys,
                                  functools.partial(routed, riders=fixed_riders)
                                  if riders else routed, cuts, plan, fixed_riders, hooks)
        return _capture_forward(runtime, classes, key, table, op, keys, checks,
                                functools.partial(run, riders=fixed_riders) if riders else run,
                                cuts, hooks, fixed_riders)
    return _replay(runtime, classes, entry, op, keys, checks, riders)


def detached(runtime, array, detach=True):
    """`array`, a lookup's output, as api's `detach` hands it out: where it is (a view of) a
    forward class's output, which the next replay writes again, a copy the caller owns for
    detach=True (a framework that may keep it past the step), and for detach=HELD where the
    class found its output still held at a replay (_found_held); `array` itself otherwise."""
    classes = runtime.replays
    if not detach or classes is None or not classes.forwards or not array.size:
        return array
    backend = runtime.backend
    address = backend.address_of(array)
    for entry in classes.forwards.values():
        if entry.routing is not None and backend.address_of(entry.outputs()[3]) == address:
            return _fixed_copies(backend, [array])[0] if _hands_copies(detach, entry) else array
    return array


def _hands_copies(detach, holder):
    """Whether a forward or backward class `holder` hands out copies for api's `detach`: always
    for True, for HELD once it found an output still held (_found_held), never for False."""
    return detach is True or (detach == HELD and holder.copies)


def _found_held(backend, holder):
    """True where the framework still holds memory of what a forward or backward class `holder`
    hands out (lent_memory: lent at an earlier step and not given back), which its replay would
    write: that step takes the uncaptured path, and the class hands out copies from then on."""
    handed = holder.handed_out()
    if handed is None or lent_memory.writable(backend, handed):
        return False
    holder.copies = True
    return True


def _fixed_copies(backend, arrays):
    """A copy of each backend array of `arrays` (a class's riders, or outputs handed out), as
    a framework takes it without a copy of its own (backend.exportable: aligned)."""
    fixed = []
    for array in arrays:
        copy = backend.empty(tuple(array.shape), array.dtype)
        backend.copy_array(copy, array)
        fixed.append(backend.exportable(copy))
    return fixed


def _copy_riders(backend, entry, riders):
    """Copies this step's riders into the class's fixed arrays; False where they do not fit."""
    if len(riders) != len(entry.riders):
        return False
    for given, fixed in zip(riders, entry.riders):
        if tuple(given.shape) != tuple(fixed.shape) or given.dtype != fixed.dtype:
            return False
    for given, fixed in zip(riders, entry.riders):
        if given is not fixed:
            backend.copy_array(fixed, given)
    return True


def _capture_ranks(runtime, classes, key, table, op, keys, routed, cuts, plan, riders=(),
                   hooks=None):
    """_capture_forward on several ranks: this step runs eagerly on fixed keys in the two
    halves around its op header, then each half is recorded (replayed_ranks.py). A step that
    overflowed a cap (or in which a HashGroup's shard might fill up, or whose `hooks` are not
    ready here) goes on uncaptured and records nothing. Returns (vectors, Routing)."""
    backend = runtime.backend
    _read_left_before(runtime, hooks)
    fixed = backend.empty(tuple(keys.shape), keys.dtype)
    backend.write_rows(fixed, 0, keys)
    member_keys, caps, count = np.diff(cuts), plan.caps, int(keys.shape[0])
    outputs, judge = replayed_ranks.prepare(runtime, table, routed, fixed, caps)
    vectors, routing, ran = _exchanged(runtime, op, table, outputs, judge, member_keys, plan,
                                       count, hooks)
    if not ran:  # the counted way, or this owner's insert uncaptured
        return vectors, routing
    insert = None if hooks is None else hooks.insert
    prepare = _recorded(backend, lambda: replayed_ranks.prepare(runtime, table, routed, fixed,
                                                                caps)[0])
    works = [prepare]
    if prepare is not None:
        works.append(_recorded(backend, lambda: replayed_ranks.exchange_half(
            runtime, table, prepare.outputs, plan, insert)))
    if None in works:
        for work in works:
            if work is not None:
                work.free()
        classes.refused.add(key)
        return vectors, routing
    _keep(runtime, classes, key, _Forward(op, key, table, fixed, works[1], judge,
                                          bounded_step.piece_starts(cuts), hooks, prepare, plan,
                                          member_keys, riders))
    return vectors, routing


def _exchanged(runtime, op, table, outputs, judge, member_keys, plan, count, hooks,
               work=None):
    """A several-rank forward after its prepare half (`outputs`): the op header, then the
    exchange half, replayed (`work`), or run now where there is none (the class's capture:
    with `hooks`' insert); an evicting group's step leaves its counts and every rank's
    agreement on them to the next op header (ReplayedInsert.agreed_check). Returns (vectors,
    Routing, whether the exchange half ran): it did not where the step went on uncaptured, the
    counted way (some rank's keys overflowed a cap, or a HashGroup's shard might fill up: every
    rank alike), sized by the caps where a class's work does not make the step the header
    tells (a full shard evicts in a class that does not evict, or an evicting class's keys all
    fit), or, where `hooks` are not ready on this rank, its insert as an uncaptured lookup
    makes it (its peers may replay: the collectives are the same); nor, for recording, where
    an evicting class's capture step fails (on this rank: its error waits for the next op
    header)."""
    sizes, telling, fitting, in_place = replayed_ranks.header(runtime, op, table, outputs,
                                                              judge, member_keys)
    if sizes.overflow or not (replayed_ranks.fits(fitting) or in_place):
        return replayed_ranks.uncaptured_rest(runtime, op, table, outputs, plan, sizes, count,
                                              fitting, in_place) + (False,)

    def routing(rows):
        return replayed_ranks.routing(runtime, table, outputs, rows, count, plan, sizes,
                                      telling, member_keys, fitting)
    evicting = hooks is not None and hooks.evicting
    if in_place and not (evicting and hooks.ready(None, False, fitting[1][0])):
        return replayed_ranks.uncaptured_rest(runtime, op, table, outputs, plan, sizes, count,
                                              fitting, True) + (False,)
    if hooks is not None and not in_place:
        if evicting or not hooks.ready(None, False, fitting[1][0]):
            rows, vectors = replayed_ranks.kept_half(runtime, table, outputs, plan)
            return vectors, routing(rows), False
    if hooks is not None:
        hooks.arm()  # (the header made the order checks: the op's journal step is open)
    if work is None:
        rows, vectors, *more = replayed_ranks.exchange_half(
            runtime, table, outputs, plan, None if hooks is None else hooks.insert)
    else:
        work.replay()
        rows, vectors, *more = work.outputs
    if evicting:  # its counts, and every rank's agreement on them, at the next op header
        fault, read = None, work is None
        try:
            hooks.done(rows, more)
            if read:  # the class's capture: its work, recorded next, reads what they settle
                fault = hooks.failure()
        except Exception as error:  # every rank fails with it there (its peers go on to it)
            fault, read = error, True
        bounded_step.leave_agreed(runtime, hooks.agreed_check(as_op_id(op).name, fault, read))
        if work is None and fault is not None:  # a capture whose step fails records nothing
            return vectors, routing(rows), False
    elif hooks is not None:  # the header read every rank's checks: they passed
        hooks.done(rows, more)
        hooks.checked()
    return vectors, routing(rows), True


def _replay_ranks(runtime, classes, entry, op, keys, riders=()):
    """One replay of a several-rank forward class: the keys copied in, the prepare half
    replayed, the op header, then the exchange half replayed (or, where some rank overflowed a
    cap, the rest the counted way, and the class dropped: its caps grew; _exchanged). Returns
    (vectors, Routing), or None where the uncaptured path must run."""
    if entry.caps is not entry.plan.caps:  # grown since it was recorded
        _drop(runtime, classes, entry.key)
        return None
    backend = runtime.backend
    if _found_held(backend, entry):
        return None
    if not _copy_riders(backend, entry, riders):
        return None
    _read_left_before(runtime, entry.hooks)
    if keys is not entry.keys:
        backend.copy_array(entry.keys, keys)
    entry.prepare.replay()
    vectors, routing, ran = _exchanged(runtime, op, entry.table, entry.prepare.outputs,
                                       entry.judge, entry.member_keys, entry.plan,
                                       int(entry.keys.shape[0]), entry.hooks, entry.work)
    if not ran:
        if entry.caps is not entry.plan.caps:  # overflowed: its caps grew
            _drop(runtime, classes, entry.key)
        return vectors, routing
    if entry.routing is None:
        classes.by_rows[id(routing.owner_rows)] = entry
    entry.routing = routing
    return vectors, routing


def _replay(runtime, classes, entry, op, keys, checks, riders=()):
    """One replay of forward class `entry` on `keys` (a backend array of its fixed keys' dtype
    and size, any shape): the order checks, the keys copied in, one launch, the flag's copy
    queued. Returns (vectors, Routing), or None where the class's hooks are not ready."""
    if entry.prepare is not None:
        return _replay_ranks(runtime, classes, entry, op, keys, riders)
    backend = runtime.backend
    if _found_held(backend, entry):
        return None
    _read_left_before(runtime, entry.hooks)
    if entry.hooks is not None and not entry.hooks.ready(keys, _opens_step(op)):
        return None  # (before the order checks: the uncaptured path makes them)
    if not _copy_riders(backend, entry, riders):
        return None
    order_checks(runtime, op)  # alone: no data crosses
    if entry.hooks is not None:  # (the op's journal step open now)
        entry.hooks.arm()
    if keys is not entry.keys:
        backend.copy_array(entry.keys, keys)
    entry.work.replay()
    entry.replays += 1
    bounds, flag, rows, vectors = entry.outputs()[:4]
    if entry.hooks is not None:
        entry.hooks.done(rows, entry.outputs()[4:])
    if entry.routing is None:  # the outputs exist from the first replay on (cpu makes them then)
        entry.routing = _routing(entry.table, int(entry.keys.shape[0]), rows, None)
        entry.check = KeyCheck(bounds, entry.judge, flag, None)
        entry.describe = functools.partial(check_error, backend, entry.check)
        classes.by_rows[id(rows)] = entry
    later = checks == "backward"  # (with hooks too: _checked_by)
    deferred = _checked_by(backend, flag, entry.describe, op, entry.hooks)
    bounded_step.defer_or_read(runtime, deferred, later)
    return vectors, entry.routing._replace(check=deferred) if later else entry.routing


def replay_known(runtime, front, holder, op, keys, checks):
    """The replay of the forward class a caller remembered under `front` (remember_front: a key
    of its raw inputs naming `holder` by its id, so that a step of a class seen before skips the
    checks and conversions its first sight passed), when the class is still held, `holder` is
    the very object remembered and the table's rows have not moved. Returns (vectors, Routing,
    what remember_front kept), or None where the caller's own path must run. `op`: an OpId;
    `keys`: a backend array of the class's keys' dtype and size."""
    classes = runtime.replays
    if classes is None or classes.version != runtime.tables.version or not enabled(runtime):
        return None
    if classes.retired:
        _free_retired(runtime, classes, op)
    known = classes.fronts.get(front)
    if known is None or known[1] is not holder:
        return None
    entry = known[0]
    if classes.forwards.get(entry.key) is not entry or entry.values != _where(entry.table):
        return None  # dropped (rows moved, too many classes): the caller's path decides
    replayed = _replay(runtime, classes, entry, op, keys, checks)
    return None if replayed is None else replayed + (known[2],)


def remember_front(runtime, front, key, holder, kept):
    """Remembers forward class `key` (held, replayed at least once) under a caller's `front`
    (naming `holder`, an object the caller passes again) for replay_known, with `kept` (what
    the caller builds its result from). At most _SIGHTINGS_KEPT fronts are kept."""
    classes = runtime.replays
    entry = None if classes is None else classes.forwards.get(key)
    if entry is None or entry.routing is None:
        return  # not yet replayed (a capture's step returns its eager arrays)
    known = classes.fronts.get(front)
    if known is not None and known[0] is entry:
        return
    if len(classes.fronts) >= _SIGHTINGS_KEPT:
        for forward in classes.forwards.values():
            forward.fronts.clear()
        classes.fronts.clear()
    classes.fronts[front] = (entry, holder, kept)  # a class recorded anew replaces its old one
    entry.fronts.append(front)


def _capture_forward(runtime, classes, key, table, op, keys, checks, run, cuts, hooks,
                     riders=()):
    """The second sight of a forward class: this step runs eagerly on fixed keys, then its work
    is recorded. Returns (vectors, Routing) of this step (its backward takes the uncaptured
    path: its rows are not the class's), or None where `hooks` are not ready."""
    backend = runtime.backend
    _read_left_before(runtime, hooks)
    if hooks is not None and not hooks.ready(keys, _opens_step(op)):
        return None
    order_checks(runtime, op)
    if hooks is not None:  # (the op's journal step open now)
        hooks.arm()
    fixed = backend.empty(tuple(keys.shape), keys.dtype)
    backend.write_rows(fixed, 0, keys)
    check, rows, vectors, more = _run_parts(run(fixed))
    # a class with hooks reads this step's checks (and counts: ReplayedInsert.checked) before
    # its work is recorded, which reads the members' rows those counts settle
    later = checks == "backward" and hooks is None
    deferred = _checked_by(backend, check.flag, functools.partial(check_error, backend, check),
                           op, hooks)
    if hooks is not None:
        hooks.done(rows, more)
        bounded_step.defer_or_read(runtime, deferred, False)

    def recorded_run():
        recorded, recorded_rows, recorded_vectors, recorded_more = _run_parts(run(fixed))
        return [recorded.bounds, recorded.flag, recorded_rows, recorded_vectors] + recorded_more
    work = _recorded(backend, recorded_run)
    if work is None:
        classes.refused.add(key)
    else:
        _keep(runtime, classes, key, _Forward(op, key, table, fixed, work, check.judge,
                                              bounded_step.piece_starts(cuts), hooks,
                                              riders=riders))
    if hooks is None:
        bounded_step.defer_or_read(runtime, deferred, later)
    return vectors, _routing(table, int(keys.shape[0]), rows, deferred if later else None)


def _opens_step(op):
    """Whether `op`'s order checks open a new step (exchange_header: a tower's first op), which a
    class's hooks are asked before they run."""
    return as_op_id(op).position == 0


def _read_left_before(runtime, hooks):
    """Before `hooks` (or None) judge a step by their tables: the checks of forwards whose
    backward never came, read now (bounded_step.read_left), since reading them settles what the
    hooks read (an evicting insert's counts: ReplayedInsert.checked)."""
    if hooks is not None and runtime.unread_checks:
        bounded_step.read_left(runtime)


def _checked_by(backend, flag, describe, op, hooks):
    """The Deferred checks of a forward (`flag`, device) whose `hooks` (or None) learn that the
    checks passed once they are read: at the forward's end, or by whoever reads them later (its
    backward, or the next op's header where no backward came: bounded_step.defer_or_read). A
    class with hooks (a hash group's insert) changed the tables in its forward: where a key is
    bad, that read fails the step before a step of its own opens (bounded_step.take,
    exchange_header), and the step journal takes the insert back; an evicting class reads its
    counts then too (ReplayedInsert.checked)."""
    return bounded_step.Deferred(backend.read_later(flag), describe, op.name,
                                 None if hooks is None else hooks.checked)


def _run_parts(result):
    """A forward run's (KeyCheck, rows, vectors, [more arrays])."""
    return tuple(result[:3]) + (list(result[3]) if len(result) > 3 else [],)


_REFUSED = [None]  # why the last class was refused (its CaptureError's message)


def _recorded(backend, run):
    """backend.captured_work(run), or None where the work cannot be recorded (CaptureError: it
    waits on the host or uploads; nothing was queued, and the step's eager result stands)."""
    try:
        return backend.captured_work(run)
    except CaptureError as error:
        _REFUSED[0] = str(error)
        return None


def last_refusal():
    """Why the work of the last class refused could not be recorded (its CaptureError's
    message), or None."""
    return _REFUSED[0]


def _keep(runtime, classes, key, entry):
    """Keeps the new forward class `entry` as `key`: the oldest classes go first where
    MAX_CLASSES are kept, and under SOK1X_REPLAY_MIB, once `entry` is kept, the oldest others
    while what the kept classes hold exceeds it. A class dropped for memory is refused from then
    on (its steps go uncaptured): two classes that take turns would otherwise record each other
    out at every step. The newest stays whatever it holds, so a job whose one class holds more
    than the budget still replays."""
    while len(classes.forwards) >= MAX_CLASSES:
        _drop(runtime, classes, next(iter(classes.forwards)))
    classes.forwards[key] = entry
    budget = budget_bytes()
    if budget is None:
        return
    held = sum(kept.held_bytes for kept in classes.forwards.values())
    while held > budget and len(classes.forwards) > 1:
        oldest = next(iter(classes.forwards))
        held -= classes.forwards[oldest].held_bytes
        _drop(runtime, classes, oldest)
        if len(classes.refused) >= _SIGHTINGS_KEPT:  # (ever new shapes: keep it small)
            classes.refused.clear()
        classes.refused.add(oldest)


def _free_retired(runtime, classes, op):
    """Frees the retired classes whose use `op`'s call ends: its own (the same name at the same
    place of the same tower: by replay=True's contract its caller is done with what they handed
    out) and, where `op` opens a step of its tower, every retired class of that tower; not one
    whose arrays the framework still holds, nor any while checks of forwards are left unread
    (reading them may read a class's arrays: a hash group's undo, its counts)."""
    if runtime.unread_checks:
        return
    op, kept = as_op_id(op), []
    for entry in classes.retired:
        if (entry.op.tower == op.tower
                and (op.position == 0 or (entry.op.position, entry.op.name)
                     == (op.position, op.name))
                and not entry.still_held(runtime.backend)):
            entry.free()
        else:
            kept.append(entry)
    classes.retired = kept


def _drop(runtime, classes, key):
    """Takes forward class `key` out of use and retires it (module docstring: freed once nothing
    of its step can read it, _free_retired)."""
    entry = classes.forwards.pop(key)
    for front in entry.fronts:  # they hold the class's arrays: let them go with it
        if classes.fronts.get(front, (None,))[0] is entry:
            del classes.fronts[front]
    if entry.routing is not None:
        classes.by_rows.pop(id(entry.routing.owner_rows), None)
    for backward in entry.backwards.values():
        if backward.work is not None and backward.work.outputs is not None:
            classes.by_gradient.pop(runtime.backend.address_of(backward.work.outputs[1]), None)
        if backward.detached is not None:
            classes.detached.pop(runtime.backend.address_of(backward.detached[1]), None)
    classes.retired.append(entry)


def replayed_routing(runtime, routing):
    """True where `routing` is a replayed forward's (its backward may replay)."""
    classes = runtime.replays
    entry = None if classes is None else classes.by_rows.get(id(routing.owner_rows))
    return entry is not None and entry.routing.owner_rows is routing.owner_rows


def backward(runtime, table, op, routing, grads, detach=False):
    """The replayed path of a one-rank bounded backward (api.dense_lookup_grad's, the keyed
    lookup's): the backward of a replayed forward's `routing` of `table` with top gradient
    `grads` (backend float32 [n, dim]). Returns (values, rows, Padded) as
    key_exchange.lookup_backward_many does for a bounded step, or None where the uncaptured path
    must run (routing not a replayed one, a gradient of another shape, outputs the framework
    still holds). detach=True: the arrays returned are copies the caller owns (a framework
    that may keep them past the step), held here until the next replay of the class so that
    their update still replays; detach=HELD: so only once the class found its outputs still
    held at a replay (lent_memory), the class's own arrays before."""
    classes = runtime.replays
    entry = None if classes is None else classes.by_rows.get(id(routing.owner_rows))
    if (entry is None or entry.routing.owner_rows is not routing.owner_rows
            or entry.table is not table or grads.dtype != np.float32):
        return None
    pieces = entry.pieces
    if entry.prepare is not None:  # several ranks: each member's piece as long as its bound
        if routing.bounds is None:
            return None
        pieces = bounded_step.piece_starts_of(routing.bounds)
    backend = runtime.backend
    vectors = entry.outputs()[3]
    if grads is entry.shaped:  # the output as the caller shaped it (remember_dense)
        grads = vectors
    elif tuple(grads.shape) != (routing.count, table.dim):
        if grads.size != routing.count * table.dim:
            return None
        grads = backend.reshape(grads, (routing.count, table.dim))
    own = grads is vectors or (backend.address_of(grads) == backend.address_of(vectors)
                               and tuple(grads.shape) == tuple(vectors.shape))  # or a view
    shape = (own, pieces.tobytes())
    recorded = entry.backwards.get(shape)
    if recorded is not None and _found_held(backend, recorded):
        return None
    deferred = bounded_step.take(runtime, [routing], op)
    order_checks(runtime, op)
    if recorded is None or recorded.work is None:  # first sight, or a work that was refused
        # own: the class's output itself, never the caller's array over it (a kernel's input
        # the engine kept would keep TensorFlow's tensor, and so the output lent, held for good)
        fixed = vectors if own else backend.empty(tuple(grads.shape), np.float32)
        if not own:
            backend.write_rows(fixed, 0, grads)
        run = functools.partial(_backward_run, runtime, table, entry.routing, fixed, pieces)
        out = run()  # this step, eagerly; then recorded for the next
        if recorded is None:  # (marks: every row may hold a sum)
            kept = backend.fill_value(backend.empty((int(pieces[-1]),), np.int8), -1)
            work = _recorded(backend, functools.partial(run, kept=kept))
            entry.backwards[shape] = _Backward(fixed, own, work, pieces,
                                               None if work is None else kept)
    else:
        if not own:
            backend.copy_array(recorded.grads, grads)
        recorded.work.replay()
        out = recorded.work.outputs
        # the same arrays at every replay
        recorded.after = entry.replays
        if recorded.result is not None and not _hands_copies(detach, recorded):
            recorded.left = ()
            if _left_for_update(runtime, recorded, deferred):
                recorded.left = bounded_step.leave_for_update(runtime, deferred)
            else:
                bounded_step.raise_if_set(runtime, deferred)
            distinct_rows.remember(recorded.result[1])
            return recorded.result
    bounded_step.raise_if_set(runtime, deferred)  # the forward's checks, this work queued
    replayed = recorded is not None and recorded.work is not None and (
        out is recorded.work.outputs)
    copies = replayed and _hands_copies(detach, recorded)
    if copies:
        out = _detached(backend, classes, recorded)
    rows = backend.exportable(out[0])
    distinct_rows.remember(rows)
    result = out[1], rows, bounded_step.Padded(pieces, out[2])
    if replayed and not copies and rows is out[0]:
        classes.by_gradient[backend.address_of(out[1])] = (entry, recorded)  # its update
        recorded.result = result
    elif copies:
        classes.detached[backend.address_of(out[1])] = (entry, recorded)
    return result


def _detached(backend, classes, recorded):
    """Copies of a replayed backward's outputs (rows, sums, own rows), kept in place of the
    last ones for its update (_replayed_gradient)."""
    if recorded.detached is not None:
        classes.detached.pop(backend.address_of(recorded.detached[1]), None)
    recorded.detached = tuple(_fixed_copies(backend, recorded.work.outputs[:3]))
    return recorded.detached


def _left_for_update(runtime, recorded, deferred):
    """Whether a replayed backward (`recorded`) leaves its forward's checks (`deferred`, a
    list) to its update: where every update recorded for it is predicated on them on the
    device (_Update.predicated), its update reads them once its work is queued, so that the
    host's one wait of the step follows the step's last launch and the work the host does
    after it (a hash group's counts handed over, the next step's launches) overlaps the GPU's
    backward and update; a step whose checks fail still updates nothing and raises in its
    update, with the step rolled back (bounded_step.read_for_update)."""
    return bool(deferred) and bool(recorded.updates) and all(
        [update.predicated for update in recorded.updates.values()])


def update(runtime, tables, rule_name, slot_prefix, options, hyper, values_list, rows_list):
    """api.apply_optimizer_update(s)' replayed path: the update of one table with the (values,
    rows) a replayed backward returned (_replayed_gradient: found by address). Returns [rows
    updated] as optimizer_updates.apply_updates does, or None where the uncaptured path must
    run. Raises as that path does for an unknown rule or a missing hyper-parameter."""
    if len(tables) != 1:
        return None
    found = _replayed_gradient(runtime, values_list[0])
    if found is None:
        return None
    entry, backward, out = found
    if not _same_array(runtime.backend, rows_list[0], out[0]) or tables[0] is not entry.table:
        return None
    if not _refill(runtime.backend, backward, out):
        return None
    if not _update_of(runtime, entry, backward, rule_name, slot_prefix, options, hyper):
        return None
    return [int(out[0].shape[0])]


def keyed_update(runtime, tables, rule_name, slot_prefix, options, hyper, values, rows, counts):
    """api.apply_keyed_update's replayed path: the update of a keyed lookup's tables with the
    (values, rows, counts) a replayed backward returned: one table's padded rows, or a whole
    TableGroup's members' own rows piece by piece (joined, or per member as rows_per_table
    gives them). Returns what keyed.keyed_update does (per
    table the rows updated, padding included), or None where the uncaptured path must run."""
    found = _replayed_gradient(runtime, values)
    if found is None:
        return None
    entry, backward, out = found
    table, backend = entry.table, runtime.backend
    members = getattr(table, "members", None)
    if members is None:
        if isinstance(rows, (list, tuple)):  # keyed_backward's rows_per_table
            rows = rows[0] if len(rows) == 1 else None
        fits = (len(tables) == 1 and tables[0] is table and rows is not None
                and _same_array(backend, rows, out[0]))
    else:
        fits = (len(tables) == len(members) and all(map(operator.is_, tables, members))
                and _same_rows(backend, rows, out[2], backward.pieces))
    if not fits or not backward.same_counts(counts):
        return None
    if not _refill(backend, backward, out):
        return None
    if not _update_of(runtime, entry, backward, rule_name, slot_prefix, options, hyper):
        return None
    return [int(out[0].shape[0])] if members is None else backward.counts.copy()


def _replayed_gradient(runtime, values):
    """(_Forward, _Backward, its outputs as handed out) whose recorded backward returned
    `values` as its sums (that very array, or one over the same memory, as a seam hands it
    back; or the copies a detached backward handed out), or None."""
    classes = runtime.replays
    if classes is None or not (classes.by_gradient or classes.detached):
        return None
    backend = runtime.backend
    address = backend.address_of(values)
    found = classes.by_gradient.get(address)
    if found is not None and found[1].work.outputs is not None and _same_array(
            backend, values, found[1].work.outputs[1]):
        return found + (found[1].work.outputs,)
    found = classes.detached.get(address)
    if found is not None and found[1].detached is not None and _same_array(
            backend, values, found[1].detached[1]):
        return found + (found[1].detached,)
    return None


def _refill(backend, backward, out):
    """Before a replayed update: where the backward's outputs were handed out as copies, those
    (as the caller hands them back, changed in place or not) are copied into the arrays the
    recorded update reads. Returns False where the framework still holds those arrays (handed
    out before the class turned to copies: lent_memory), nothing copied: the update must not
    replay. Sums lent as they are (`out` the class's own) are taken as the replay left them:
    their padded places zeros, which backward.kept then still vouches for (a framework does not
    write a gradient it was lent in place; one that changes it hands back a copy)."""
    fixed = backward.work.outputs
    if out is fixed:
        return True
    if not lent_memory.writable(backend, fixed[:3]):
        return False
    for given, into in zip(out[:3], fixed[:3]):
        backend.copy_array(into, given)
    if backward.kept is not None:  # the sums rewritten from outside: any row may hold one
        backend.fill_value(backward.kept, -1)
    return True


def _same_rows(backend, rows, own, starts):
    """True when `rows` are a replayed group backward's own rows `own` (_same_array), or per
    member its piece of them, own[starts[t]:starts[t + 1]] (keyed_backward's rows_per_table,
    as a seam hands them back: arrays over the same memory)."""
    if not isinstance(rows, (list, tuple)):
        return _same_array(backend, rows, own)
    if len(rows) != len(starts) - 1:
        return False
    base, width = backend.address_of(own), own.dtype.itemsize
    for piece, start, end in zip(rows, starts[:-1], starts[1:]):
        if tuple(piece.shape) != (int(end - start),) or piece.dtype != own.dtype:
            return False
        if end > start and backend.address_of(piece) != base + int(start) * width:
            return False
    return True


def _same_array(backend, given, held):
    """True when `given` is the array `held`, or another array over the very same memory
    (address, dtype, shape and strides): what TensorFlow's kernels or DLPack hand back of an
    output the engine lent. The engine holds `held`, so its memory cannot be anything else."""
    if given is held:
        return True
    return (backend.address_of(given) == backend.address_of(held) and given.dtype == held.dtype
            and tuple(given.shape) == tuple(held.shape)
            and tuple(given.strides) == tuple(held.strides))


def _update_of(runtime, entry, backward, rule_name, slot_prefix, options, hyper):
    """Records (first sight) or replays the update of `entry`'s table by a replayed backward's
    gradient, per (rule, slot prefix, options), its kernels reading this step's
    hyper-parameters from an array written before the replay (backend.hyper_given), and stamps
    the rows. Returns False where it must stay uncaptured (nothing done): also where its forward
    replayed since its backward ran (the flags its work is predicated on are another step's
    then). Checks other backwards left to their updates are read first, raising their error
    before anything is queued: this work is predicated on its own step's flags alone; those its
    own backward left are read once it is queued."""
    if backward.after != entry.replays:
        return False
    bounded_step.read_for_update(runtime, keep=backward.left)
    rule = optimizer_updates.checked_rule(rule_name, hyper)
    backend, table, out = runtime.backend, entry.table, backward.work.outputs
    options = dict(options) if options else {}  # a dict, or (name, value) pairs
    key = (rule_name, slot_prefix, tuple(sorted(options.items())))
    recorded = backward.updates.get(key)
    given = [hyper[name] for name in rule.hyper_names]
    failed = _failure_flags(runtime, entry)
    if recorded is not None and recorded.where == _slots_where(backend, table, recorded.slots) \
            and (recorded.predicated or recorded.work is None or failed is None):
        if recorded.work is None:
            return False
        backend.write_given(recorded.given, given, recorded.clock, time.time())
        recorded.work.replay()  # the update, then the stamp of this step's time
        bounded_step.read_for_update(runtime)
        return True
    if recorded is not None:  # rows or slots moved (a load, say), or its flags are known now
        backward.updates.pop(key).free()  # (its forward replayed since): recorded again
    slots = {name: table.slot(optimizer_updates.slot_key(slot_prefix, name), initial)
             for name, initial in rule.slots(options)}
    fixed = backend.empty((len(given),), np.float32)
    clock = backend.empty((1,), np.float64)
    backend.write_given(fixed, given, clock, time.time())
    run = functools.partial(_update_run, backend, table, rule, slots, out, fixed, clock, hyper,
                            options, failed)
    run()  # first sight: this step's update eagerly, then recorded
    names = tuple(optimizer_updates.slot_key(slot_prefix, name) for name in slots)
    # a rule that moves every row (Adam's, Keras RMSprop's) moves them whatever rows are
    # dropped: its backward keeps reading the checks itself
    backward.updates[key] = _Update(fixed, clock, names, _slots_where(backend, table, names),
                                    _recorded(backend, run),
                                    failed is not None and not optimizer_updates.moves_every_row(
                                        rule.update))
    bounded_step.read_for_update(runtime)
    return True


def _failure_flags(runtime, entry):
    """(flag, parts) on the device that say whether a replayed step of forward class `entry`
    failed, for its update to drop its rows by (backend.drop_rows_if_failed): its key checks'
    flag and, for a hash group that evicts, each member's new keys left without a victim
    (ReplayedInsert.failure_counts); both arrays its recorded work writes at every replay. None
    on several ranks (an op header agrees on the checks there) or before its first replay."""
    if runtime.size != 1 or entry.prepare is not None or entry.check is None:
        return None
    hooks = entry.hooks
    return entry.check.flag, None if hooks is None else hooks.failure_counts(entry.outputs()[4:])


def _slots_where(backend, table, names):
    """Where `table`'s rows and its slots `names` are: (_where(table), slot addresses...), or
    None where a slot is gone (never where an update was recorded)."""
    slots = table.slots
    try:
        return (_where(table),) + tuple([hybrid_rows.addresses(backend, slots[name])
                                         for name in names])
    except KeyError:
        return None


def _update_run(backend, table, rule, slots, gradient, given, clock, hyper, options,
                failed=None):
    """The device work of an update of `table` (an EmbeddingTable or a TableGroup) by optimizer
    `rule` with a replayed backward's `gradient` [rows, summed, ...], its hyper-parameters read
    from `given`, then the stamp of its rows with the time `clock` holds (both written before
    each replay: backend.write_given). failed: None, or _failure_flags' (flag, parts): the rows
    are dropped first where they say the step failed, so that nothing is updated or stamped."""
    if failed is not None:
        backend.drop_rows_if_failed(gradient[0], *failed)
    with backend.hyper_given(given):
        table.apply_update(rule.update, slots, gradient[0], gradient[1], hyper, options)
    with backend.time_given(clock):
        table.stamp(gradient[0])


def _backward_run(runtime, table, routing, grads, pieces, kept=None):
    """The device work of a bounded backward: [rows, summed, local rows], each member's rows in
    its piece (`pieces`), padded (on several ranks the gradients cross first:
    replayed_ranks.backward_run). kept: None, or the recorded work's int8 row marks, with which
    its sums zero only the places an earlier replay stored a sum in (backend/kept_sums.py)."""
    if runtime.size > 1:
        return replayed_ranks.backward_run(runtime, table, routing, grads, pieces, kept)
    backend = runtime.backend
    with backend.sums_kept(kept):  # (None: no marks, every padded place zeroed)
        rows, summed, padded = padded_sums(backend, table, routing, grads, pieces)
    return [rows, summed, padded.local]


def held_bytes(runtime):
    """Device bytes the runtime's shape classes hold, the retired ones included (module
    docstring)."""
    classes = runtime.replays
    if classes is None:
        return 0
    return sum(e.held_bytes for e in list(classes.forwards.values()) + classes.retired)


def recorded_works(runtime):
    """Per forward class, the recorded works a step of it replays, in order: the forward's, then
    each recorded backward's followed by its recorded updates' (what bench/ replays back to back
    for a replayed step's GPU floor)."""
    if runtime.replays is None:
        return []
    steps = []
    for entry in runtime.replays.forwards.values():
        works = [entry.work] if entry.prepare is None else [entry.prepare, entry.work]
        for backward in entry.backwards.values():
            if backward.work is not None:
                works.append(backward.work)
                works.extend(u.work for u in backward.updates.values() if u.work is not None)
        steps.append(works)
    return steps


def updates_recorded(runtime):
    """How many updates the runtime's shape classes replay (recorded, not refused)."""
    if runtime.replays is None:
        return 0
    return sum(1 for entry in runtime.replays.forwards.values()
               for backward in entry.backwards.values()
               for update in backward.updates.values() if update.work is not None)


def classes_held(runtime):
    """How many forward shape classes the runtime holds."""
    return 0 if runtime.replays is None else len(runtime.replays.forwards)


def free(runtime):
    """Frees every shape class (call inside the device context: runtime.entered())."""
    if runtime.replays is not None:
        runtime.replays.free()
        runtime.replays = None
