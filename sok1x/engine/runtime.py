"""The process-wide engine state: process group, backend, communicators and tables.

`init()` brings it up once per process (idempotent); `get()` returns it or raises the
"call sok1x.Init() first" error. Every engine entry point holds `LOCK`, so TensorFlow's inter-op
threads never run two engine calls, and never two collectives, at the same time in one process.
"""
import itertools
import logging
import threading

from sok1x.backend import load_backend
from sok1x.comm.mpi import MpiCommunicator
from sok1x.comm.process_group import ProcessGroup
from sok1x.engine import failure_guard
from sok1x.engine.lookup import replay_budget
from sok1x.errors import InitError, NotInitializedError

LOCK = threading.RLock()
_log = logging.getLogger("sok1x")
_runtime = None
_NAMED_KEPT = 256  # name lists whose tables tables_named() remembers
_versions = itertools.count(1)  # TableRegistry versions, never repeated in a process


def _counted(method):
    """dict's `method`, counting a change of the TableRegistry first (and forgetting the name
    lists it resolved: they may hold a table the change drops, whose memory must go with it)."""
    def changing(self, *args, **kwargs):
        self.version = next(_versions)
        self._named.clear()
        if self.on_change is not None:
            self.on_change()
        return method(self, *args, **kwargs)
    changing.__name__ = method.__name__
    return changing


class TableRegistry(dict):
    """name -> EmbeddingTable. `version` changes (to a number no registry of the process had
    before) at every binding, rebinding and removal of a name through the methods below, so what
    was derived from the tables of some names (named(), a TableGroup's liveness) holds while it
    is unchanged: per step, no look at each table. (`|=` and dict's own functions called on it
    bypass the count; nothing uses them.) on_change: None, or called at each such change, before
    it."""

    def __init__(self, on_change=None):
        super().__init__()
        self.on_change = on_change
        self.version = next(_versions)
        self._named = {}  # tuple of names -> tuple of their tables, until the next change

    def named(self, names):
        """Returns the tables of `names` as a tuple, the same tuple while no table is made,
        replaced or dropped, or None when a name has no table."""
        key = names if type(names) is tuple else tuple(names)
        tables = self._named.get(key)
        if tables is None:
            tables = tuple(map(self.get, key))
            if None in tables:
                return None
            if len(self._named) >= _NAMED_KEPT:
                self._named.clear()
            self._named[key] = tables
        return tables

    __setitem__ = _counted(dict.__setitem__)
    __delitem__ = _counted(dict.__delitem__)
    pop = _counted(dict.pop)
    popitem = _counted(dict.popitem)
    setdefault = _counted(dict.setdefault)
    update = _counted(dict.update)
    clear = _counted(dict.clear)


class Runtime:
    """What init() brought up. Attributes: group (ProcessGroup), host (MpiCommunicator for small
    host-side exchanges), backend (module), data (communicator for the backend's arrays),
    rank, size, global_batch_size (or None), device_ordinal (or None on cpu), tables (a
    TableRegistry: name -> EmbeddingTable), pending_tables (name -> settings of shards declared
    but not made yet), stash (forward state kept for the backward pass), towers (the last
    communicating op, for the run-time order check), journal (the current step's undo
    actions, engine/lookup/step_journal.py) and read_later ((backend array, callback) pairs: counts
    the host needs some time, read in the next op header's wait and handed to callback),
    capacities (per lookup op, its per-peer capacities: engine/lookup/peer_capacity.py),
    unread_checks (forwards' key checks their backward reads: engine/lookup/bounded_step.py),
    replays (recorded shape classes of replayed steps, or None: engine/lookup/replayed_step.py). On
    cpu, `data` is an MpiCommunicator of its own over the same communicator as `host`, so each
    counts its own calls (stats())."""

    def __init__(self, group, host, backend, data, global_batch_size, device_ordinal):
        from sok1x.engine.op_order import TowerTracker
        from sok1x.engine.lookup.stash import Stash
        from sok1x.engine.lookup.step_journal import StepJournal
        self.group = group
        self.host = host
        self.backend = backend
        self.data = data
        self.rank = group.rank
        self.size = group.size
        self.global_batch_size = global_batch_size
        self.device_ordinal = device_ordinal
        self.tables = TableRegistry(self._drop_replays)
        self.pending_tables = {}
        self.stash = Stash()
        self.towers = TowerTracker()
        self.journal = StepJournal()
        self.read_later = []
        self.capacities = {}
        self.unread_checks = []
        self.replays = None

    def _drop_replays(self):
        """A table is made, replaced or dropped: the recorded steps that may read the old one
        go now, with their memory (engine/lookup/replayed_step.py)."""
        if self.replays is not None:  # (freed through the object: no import back from here)
            self.replays.free()
            self.replays = None

    def tables_named(self, names):
        """Returns the tables of `names` as a tuple, the same tuple while no table is made,
        replaced or dropped (a step's lookups find their tables without a look per name), or
        None when a name has no table (TableRegistry.named)."""
        return self.tables.named(names)

    def stats(self):
        """Returns counts since init, for benchmarks and tests: host_waits (the host blocked
        until the device caught up or read sizes; on cpu, where cuda would block),
        data_collectives (collectives on the data channel: NCCL on cuda) and host_collectives
        (MPI calls outside it)."""
        data_calls = getattr(self.data, "collectives_enqueued", None)
        return {"host_waits": int(self.backend.counts().get("host_waits", 0)),
                "data_collectives": int(self.data.calls if data_calls is None else data_calls),
                "host_collectives": int(self.host.calls)}


def is_initialized():
    """Returns True once init() has completed in this process."""
    return _runtime is not None


def get():
    """Returns the Runtime; raises NotInitializedError if init() has not run."""
    if _runtime is None:
        raise NotInitializedError(
            "sok1x is not initialized: run sok1x.Init() (graph mode: sess.run(sok1x.Init(...)), "
            "or add sok1x.InitHook() to MonitoredTrainingSession) or call sok1x.init() before "
            "using sok1x layers, variables or collectives.")
    return _runtime


class _Entered:
    """entered()'s context manager, a class rather than a generator: every engine call and
    every kernel call enters it (a generator's frame costs about twice as much)."""
    __slots__ = ("_device",)

    def __enter__(self):
        LOCK.acquire()
        try:
            runtime = get()
            self._device = runtime.backend.device_context()
            self._device.__enter__()
        except BaseException:
            LOCK.release()
            raise
        return runtime

    def __exit__(self, *exc_info):
        try:
            return self._device.__exit__(*exc_info)
        finally:
            LOCK.release()


def entered():
    """Holds LOCK with the backend's device context current on this thread (the cuda backend
    makes and reshapes device arrays only there); a context manager that gives the Runtime.
    Raises NotInitializedError before init()."""
    return _Entered()


def _check_start_settings(host, global_batch_size):
    """Raises InitError on every rank where ranks disagree on global_batch_size, where it is no
    positive multiple of the ranks, or where some rank's SOK1X_REPLAY_MIB is no budget
    (engine/lookup/replay_budget.py, naming those ranks): what every rank must start with
    alike, in one all-gather."""
    seen = host.all_gather_object((global_batch_size, replay_budget.budget_error()))
    sizes = [size for size, _ in seen]
    if len(set(sizes)) != 1:
        raise InitError(
            "ranks disagree on global_batch_size: %s. Pass the same global_batch_size to "
            "sok1x.Init() on every rank." % ", ".join(
                "rank %d: %r" % (r, v) for r, v in enumerate(sizes)))
    if global_batch_size is not None and (
            int(global_batch_size) <= 0 or int(global_batch_size) % host.size):
        raise InitError(
            "global_batch_size=%r must be a positive multiple of the number of ranks (%d)"
            % (global_batch_size, host.size))
    bad = ["rank %d: %s" % (rank, error) for rank, (_, error) in enumerate(seen) if error]
    if bad:
        raise InitError("; ".join(bad))


def _load_kernels(rank):
    """Loads every CUDA kernel now, not during a step (cuda_launch.load_every_kernel says why);
    raises InitError."""
    from sok1x.backend.cuda import kernel_launch as cuda_launch
    try:
        cuda_launch.load_every_kernel()
    except Exception as exc:  # a compile or driver error: fail every rank at init, not later
        raise InitError("loading sok1x's CUDA kernels on rank %d failed: %s" % (rank, exc)) \
            from exc


def _bring_up_backend(group, host, backend_name):
    """Loads the backend on every rank and agrees on it; returns (backend, data, device)."""
    backend, device, error = None, None, None
    try:
        backend = load_backend(backend_name)
        if backend.NAME == "cuda":
            from sok1x.backend.cuda import context as cuda_context
            device = group.device_for_local_rank(cuda_context.visible_device_count())
            cuda_context.activate(device)
            _load_kernels(group.rank)
    except InitError as exc:
        error = exc
    host.raise_together(error, "sok1x.Init (backend=%r)" % backend_name)
    names = host.all_gather_object(backend.NAME)
    if len(set(names)) != 1:
        raise InitError(
            "ranks picked different backends (%s): with backend='auto' every rank must see a GPU "
            "or none. Pass backend='cpu' or 'cuda' explicitly." % ", ".join(
                "rank %d: %s" % (r, n) for r, n in enumerate(names)))
    if backend.NAME == "cpu":
        return backend, MpiCommunicator(group), None
    from sok1x.comm.nccl import NcclCommunicator
    from sok1x.backend.cuda import context as cuda_context
    error, data = None, None
    try:
        data = NcclCommunicator(group, device, cuda_context.stream())
    except Exception as exc:  # NCCL reports through its own error types; fail on every rank
        error = InitError("NCCL communicator on rank %d failed: %s" % (group.rank, exc))
    host.raise_together(error, "sok1x.Init (NCCL)")
    cuda_context.set_stream_waiter(data.wait_until)  # host waits bounded like NCCL's own
    return backend, data, device


def init(backend="auto", global_batch_size=None, **sok_options):
    """Collective: brings the engine up once; later calls return the same Runtime.

    backend: "auto" (cuda where PyCUDA and a GPU are there), "cuda" or "cpu".
    global_batch_size: the job's batch size, checked equal on every rank.
    Other SOK Init options are accepted and ignored with a log line.
    From here on, a rank that fails (uncaught exception, sys.exit(non-zero), SIGTERM...) ends
    the whole job with MPI_Abort (engine/failure_guard.py; SOK1X_ABORT_ON_FAILURE=0 opts out).
    Raises InitError on every rank if any rank cannot come up.
    """
    global _runtime
    with LOCK:
        if _runtime is not None:
            return _runtime
        if sok_options:
            _log.info("sok1x.Init ignores options it does not use: %s", sorted(sok_options))
        group = ProcessGroup()
        host = MpiCommunicator(group)
        _check_start_settings(host, global_batch_size)
        backend_module, data, device = _bring_up_backend(group, host, backend)
        _runtime = Runtime(group, host, backend_module, data, global_batch_size, device)
        failure_guard.install()
        _log.info("sok1x up: %r backend=%s device=%s", group, backend_module.NAME, device)
        return _runtime


def shutdown():
    """Drops the Runtime (tables included) and closes an NCCL communicator; for tests and exit."""
    global _runtime
    with LOCK:
        if _runtime is not None and _runtime.replays is not None:
            with _runtime.backend.device_context():  # graphs go inside their context
                _runtime._drop_replays()
        if _runtime is not None and _runtime.backend.NAME != "cpu":
            from sok1x.backend.cuda import context as cuda_context
            cuda_context.set_stream_waiter(None)
            _runtime.data.close()
        _runtime = None
