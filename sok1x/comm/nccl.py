"""Collectives over NCCL on PyCUDA GPUArrays: the data path of the cuda backend.

`NcclCommunicator` offers MpiCommunicator's collectives with the same argument order and meaning
(counts are host NumPy int64 arrays, in rows of the leading dimension), on device arrays.

Ordering: each collective is enqueued on the communicator's stream and returns without waiting
(D9). The stream it creates is a blocking one, so later work on it or on the legacy default stream
(PyCUDA's `stream=None`, `GPUArray.get()`) sees the results; call `synchronize()` before reading
them from another non-blocking stream. Input and output buffers are kept alive until the stream
has passed them.

Waiting never hangs on a failed peer: `synchronize()`, `barrier()`, `close()` and `wait_until()`
(the cuda backend's every host wait: sok1x.backend.cuda.context) poll the stream or an event
and ncclCommGetAsyncError; on an asynchronous NCCL error, or after `timeout_s` seconds
(environment variable SOK1X_NCCL_TIMEOUT_S, default 300, 0 = no limit), the communicator is
aborted and CommError names the collectives that were in flight. Within a host, ncclCommAbort
waits until the other ranks abort too, so it runs in a background thread that the caller waits
for at most 10 s. An aborted communicator stays unusable; every rank has to build a new one (in
practice the job restarts).

Contexts: PyCUDA is used on the device's primary context (the one the CUDA runtime, TensorFlow
and NCCL use), never one of its own. PyCUDA's context stack is per thread, so every public method
makes that context current and restores the previous one on return. Where the cuda backend is
active on the same device (sok1x.backend.cuda.context), its context entry and memory pool are
used; otherwise this module retains the primary context itself.
"""
import contextlib
import functools
import threading
import time

import numpy as np

from sok1x.backend.cuda.strides import elements, is_c_contiguous
from sok1x.comm import nccl_library, wait_watch
from sok1x.errors import CommError, InitError

ENV_TIMEOUT = "SOK1X_NCCL_TIMEOUT_S"
# A failed peer ends the job within seconds (sok1x's failure guard aborts it; mpiexec ends a job
# whose process died); this bound catches the rest, a peer alive that never joins (a deadlock, a
# rank stuck elsewhere). Five minutes is above any wait of a healthy step, first kernel compiles
# and a rank-0 checkpoint included, and short enough that a stuck job is not left for half an hour.
DEFAULT_TIMEOUT_S = 300.0
_POLL_FIRST_S = 1e-5
_POLL_MAX_S = 1e-3
_ABORT_WAIT_S = 10.0


def _import_pycuda():
    """Returns (pycuda.driver, pycuda.gpuarray), or raises InitError saying how to get them."""
    try:
        import pycuda.driver as driver
        import pycuda.gpuarray as gpuarray
    except ImportError as exc:
        raise InitError(
            "the NCCL communicator needs PyCUDA: `pip install pycuda` (built for this CUDA), or "
            "use sok1x.Init(backend='cpu'). Import failed: %s" % exc) from exc
    return driver, gpuarray


def _timeout_from_env():
    """Returns the wait limit in seconds from $SOK1X_NCCL_TIMEOUT_S, or None for no limit."""
    return wait_watch.seconds_from_env(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)


def _never():
    return None


@contextlib.contextmanager
def _primary_context_current(driver, context):
    """Makes `context` current on this thread for the block; the previous one is current after."""
    context.push()
    try:
        yield
    finally:
        driver.Context.pop()


def _displacements(counts):
    """Returns the exclusive prefix sum of `counts` as a list of ints."""
    displs, total = [], 0
    for count in counts:
        displs.append(total)
        total += int(count)
    return displs


def _row_layout(array):
    """Returns (row_shape, elements per row, bytes per row) of an array of rows."""
    row_shape = tuple(array.shape[1:])
    row_elems = elements(row_shape)
    return row_shape, row_elems, row_elems * np.dtype(array.dtype).itemsize


class NcclCommunicator:
    """One NCCL communicator over every rank of `group`, on GPU `device_ordinal`.

    group: a ProcessGroup (its `world` carries the unique id and host-side counts).
    stream: a pycuda.driver.Stream to enqueue on, or None for a new blocking stream.
    allocator: makes device buffers for results (e.g. a DeviceMemoryPool's `allocate`); default
        the cuda backend's memory pool where it is active on this device, else
        pycuda.driver.mem_alloc.
    Collective: every rank constructs it together; raises InitError on every rank if any rank
    cannot set up its device, PyCUDA or NCCL.
    """

    def __init__(self, group, device_ordinal, stream=None, allocator=None):
        self.group = group
        self.rank = group.rank
        self.size = group.size
        self.device_ordinal = int(device_ordinal)
        self.timeout_s = _timeout_from_env()
        self._lock = threading.RLock()
        self._comm = None
        self._state = "not initialised"
        self._pending = []  # (collective name, event recorded after it, buffers it uses)
        self._spare_events = []  # events of collectives that have run, for the next ones
        self._fast_empty = None
        self._capturing = _never  # the backend's: whether its stream is being recorded
        self.collectives_enqueued = 0  # for the benchmarks' per-step counts
        error = None
        try:
            self._driver, self._gpuarray = _import_pycuda()
            self._driver.init()
            self.device = self._driver.Device(self.device_ordinal)
            from sok1x.backend.cuda import context as cuda_context
            if (cuda_context.is_active()
                    and cuda_context.device_ordinal() == self.device_ordinal):
                self.context = cuda_context.context()
                self._enter_context = cuda_context.entered
                default_allocator = cuda_context.memory_pool().allocate
                self._capturing = cuda_context.capture_recorder
                if allocator is None:  # the backend's arrays, made without GPUArray's constructor
                    from sok1x.backend.cuda import kernel_launch as cuda_launch
                    self._fast_empty = cuda_launch.empty
            else:
                self.context = self.device.retain_primary_context()
                self._enter_context = functools.partial(
                    _primary_context_current, self._driver, self.context)
                default_allocator = self._driver.mem_alloc
            self.library = nccl_library.load_nccl_library()
            self.allocator = allocator if allocator is not None else default_allocator
            with self._context():
                self.stream = stream if stream is not None else self._driver.Stream()
                self._barrier_flag = self._gpuarray.zeros(1, np.int32, allocator=self.allocator)
        except Exception as exc:  # any rank's failure must reach every rank, not hang them
            error = exc
        self._agree_or_raise(error, "setup")
        self._stream_handle = int(self.stream.handle)

        unique_id, error_text = None, None
        if self.rank == 0:
            try:
                unique_id = self.library.get_unique_id()
            except CommError as exc:
                error_text = str(exc)
        try:
            unique_id, error_text = group.world.bcast((unique_id, error_text), root=0)
        except Exception as exc:
            raise InitError("MPI broadcast of the NCCL unique id failed on rank %d: %s" % (
                self.rank, exc)) from exc
        if error_text is not None:
            raise InitError("rank 0 could not make the NCCL unique id: %s" % error_text)
        with self._context():
            try:
                self._comm = self.library.comm_init_rank(self.size, unique_id, self.rank)
            except CommError as exc:
                raise InitError("NCCL communicator on rank %d (GPU %d) failed: %s" % (
                    self.rank, self.device_ordinal, exc)) from exc
        self._state = "open"

    def __repr__(self):
        return "NcclCommunicator(rank=%d, size=%d, device=%d, nccl=%s, %s)" % (
            self.rank, self.size, self.device_ordinal, self.library.version_text, self._state)

    # -- collectives ------------------------------------------------------------------------

    def all_to_all_v(self, send, send_counts, recv_counts):
        """`send` holds rows bucketed by destination rank, `send_counts[j]` of them for rank j;
        returns the rows received, bucketed by source rank, `recv_counts[i]` from rank i.
        Grouped ncclSend/ncclRecv; empty pieces are skipped, the own piece is a device copy."""
        name = "all_to_all_v"
        dtype = self._nccl_dtype(name, send, rows=True)
        send_counts = self._counts(name, "send_counts", send_counts)
        recv_counts = self._counts(name, "recv_counts", recv_counts)
        self._check_rows(name, send, sum(send_counts), "sum(send_counts)")
        if send_counts[self.rank] != recv_counts[self.rank]:
            raise CommError("NcclCommunicator.%s on rank %d: send_counts[%d]=%d but "
                            "recv_counts[%d]=%d (rows a rank sends itself)" % (
                                name, self.rank, self.rank, send_counts[self.rank], self.rank,
                                recv_counts[self.rank]))
        row_shape, row_elems, row_bytes = _row_layout(send)
        with self._collective(name) as comm:
            recv = self._empty((sum(recv_counts),) + row_shape, send.dtype)
            self._exchange_rows(comm, dtype, send, _displacements(send_counts), send_counts,
                                recv, _displacements(recv_counts), recv_counts,
                                row_elems, row_bytes)
            self._enqueued(name, send, recv)
        return recv

    def all_to_all_v_many(self, sends, send_counts, recv_counts):
        """Several all_to_all_v exchanges in one NCCL group: `sends[t]` with `send_counts[t]` and
        `recv_counts[t]` (host int64 [size] each; arrays may differ in dtype and row shape).
        Returns the list of received arrays. One group means one launch of NCCL's kernels for
        all the pieces, so a lookup of many tables costs one exchange."""
        name = "all_to_all_v_many"
        pieces = []
        for send, sc, rc in zip(sends, send_counts, recv_counts):
            dtype = self._nccl_dtype(name, send, rows=True)
            sc = self._counts(name, "send_counts", sc)
            rc = self._counts(name, "recv_counts", rc)
            self._check_rows(name, send, sum(sc), "sum(send_counts)")
            if sc[self.rank] != rc[self.rank]:
                raise CommError("NcclCommunicator.%s on rank %d: a rank sends itself %d rows but "
                                "expects %d" % (name, self.rank, sc[self.rank], rc[self.rank]))
            pieces.append((send, dtype, sc, rc) + _row_layout(send))
        with self._collective(name) as comm:
            outs = [self._empty((sum(rc),) + row_shape, send.dtype)
                    for send, _, _, rc, row_shape, _, _ in pieces]
            if self.size == 1:
                for (send, dtype, sc, rc, _, row_elems, row_bytes), recv in zip(pieces, outs):
                    self._exchange_rows(comm, dtype, send, _displacements(sc), sc, recv,
                                        _displacements(rc), rc, row_elems, row_bytes)
            else:
                with self._group():
                    for (send, dtype, sc, rc, _, row_elems, row_bytes), recv in zip(pieces, outs):
                        self._post_rows(comm, dtype, send, _displacements(sc), sc, recv,
                                        _displacements(rc), rc, row_elems, row_bytes)
            self._enqueued(name, *(list(sends) + outs))
        return outs

    def all_gather_v(self, send):
        """Every rank contributes `send` (any number of rows); returns (rows of all ranks in rank
        order, counts per rank as host int64). The counts travel over MPI first; equal counts use
        ncclAllGather, unequal ones grouped send/recv straight into place (no padded buffers,
        no compaction pass, only the bytes that exist cross the links)."""
        name = "all_gather_v"
        dtype = self._nccl_dtype(name, send, rows=True)
        row_shape, row_elems, row_bytes = _row_layout(send)
        counts = self._exchange_row_counts(name, int(send.shape[0]))
        with self._collective(name) as comm:
            total = int(counts.sum())
            recv = self._empty((total,) + row_shape, send.dtype)
            if total * row_elems == 0:
                return recv, counts
            if np.all(counts == counts[0]):
                self.library.all_gather(send.ptr, recv.ptr, int(counts[0]) * row_elems, dtype,
                                        comm, self._stream_handle)
            else:
                send_counts = np.full(self.size, send.shape[0], dtype=np.int64)
                self._exchange_rows(comm, dtype, send, np.zeros(self.size, dtype=np.int64),
                                    send_counts, recv, _displacements(counts), counts,
                                    row_elems, row_bytes)
            self._enqueued(name, send, recv)
        return recv, counts

    def reduce_scatter(self, send, recv_counts, op="sum"):
        """`send` holds sum(recv_counts) rows on every rank; rank i gets the element-wise reduction
        over ranks of rows [displs[i], displs[i] + recv_counts[i]). Equal counts: one
        ncclReduceScatter. Unequal: each rank's block is copied into a buffer padded to the
        largest count, reduce-scattered, and the own rows cut out of the block."""
        name = "reduce_scatter"
        dtype = self._nccl_dtype(name, send, rows=True)
        nccl_op = self._nccl_op(name, op)
        recv_counts = np.array(self._counts(name, "recv_counts", recv_counts), dtype=np.int64)
        self._check_rows(name, send, int(recv_counts.sum()), "sum(recv_counts)")
        row_shape, row_elems, row_bytes = _row_layout(send)
        mine = int(recv_counts[self.rank])
        with self._collective(name) as comm:
            recv = self._empty((mine,) + row_shape, send.dtype)
            if int(recv_counts.sum()) * row_elems == 0:
                return recv
            if np.all(recv_counts == recv_counts[0]):
                self.library.reduce_scatter(send.ptr, recv.ptr, mine * row_elems, dtype, nccl_op,
                                            comm, self._stream_handle)
                self._enqueued(name, send, recv)
                return recv
            width = int(recv_counts.max())
            padded = self._empty((self.size * width,) + row_shape, send.dtype)
            block = self._empty((width,) + row_shape, send.dtype)
            for peer, (start, rows) in enumerate(zip(_displacements(recv_counts), recv_counts)):
                if rows > 0:
                    self._driver.memcpy_dtod_async(
                        padded.ptr + peer * width * row_bytes, send.ptr + int(start) * row_bytes,
                        int(rows) * row_bytes, self.stream)
            self.library.reduce_scatter(padded.ptr, block.ptr, width * row_elems, dtype, nccl_op,
                                        comm, self._stream_handle)
            if mine > 0:
                self._driver.memcpy_dtod_async(recv.ptr, block.ptr, mine * row_bytes, self.stream)
            self._enqueued(name, send, recv, padded, block)
        return recv

    def all_reduce(self, array, op="sum"):
        """Returns the element-wise reduction of `array` over all ranks (a new array)."""
        name = "all_reduce"
        dtype = self._nccl_dtype(name, array)
        nccl_op = self._nccl_op(name, op)
        with self._collective(name) as comm:
            recv = self._empty(array.shape, array.dtype)
            if array.size:
                self.library.all_reduce(array.ptr, recv.ptr, int(array.size), dtype, nccl_op,
                                        comm, self._stream_handle)
                self._enqueued(name, array, recv)
        return recv

    def broadcast(self, array, root=0):
        """Returns rank `root`'s `array` on every rank (same shape and dtype everywhere)."""
        name = "broadcast"
        dtype = self._nccl_dtype(name, array)
        if not 0 <= int(root) < self.size:
            raise CommError("NcclCommunicator.%s: root=%r is not a rank of %d" % (
                name, root, self.size))
        with self._collective(name) as comm:
            recv = self._empty(array.shape, array.dtype)
            if array.size:
                self.library.broadcast(array.ptr, recv.ptr, int(array.size), dtype, int(root),
                                       comm, self._stream_handle)
                self._enqueued(name, array, recv)
        return recv

    def barrier(self):
        """Blocks until every rank has called barrier() (a 1-element all-reduce, then a wait)."""
        name = "barrier"
        with self._collective(name) as comm:
            flag = self._barrier_flag
            self.library.all_reduce(flag.ptr, flag.ptr, 1, nccl_library.NCCL_DTYPES[flag.dtype],
                                    nccl_library.NCCL_OPS["sum"], comm, self._stream_handle)
            self._enqueued(name)
            self._wait(name, self.stream.is_done)

    def synchronize(self):
        """Waits until everything enqueued on the stream has finished; raises CommError naming
        the collectives in flight if NCCL reports an error or `timeout_s` passes."""
        self.wait_until("synchronize", self.stream.is_done)

    def wait_until(self, what, is_done):
        """The bounded host wait behind collectives: polls `is_done()` (a stream's or an event's
        query) and NCCL's asynchronous error until it returns True; on an error, or after
        `timeout_s`, aborts the communicator and raises CommError naming `what` and the
        collectives in flight. Every host wait of the cuda backend comes here."""
        with self._collective(what):
            self._wait(what, is_done)

    # -- life cycle -------------------------------------------------------------------------

    def close(self):
        """Waits for pending work (bounded like synchronize()), then destroys the communicator.
        Every rank should close; closing twice does nothing."""
        with self._lock:
            if self._comm is None:
                return
            with self._context():
                self._wait("close", self.stream.is_done)
                comm, self._comm = self._comm, None
                self._state = "closed"
                self._barrier_flag = None
                self.library.comm_destroy(comm)

    def abort(self):
        """Stops whatever the communicator has in flight and frees it (for error paths). Returns
        True once NCCL has finished, False if it still waits after 10 s: within a host NCCL's
        abort waits for the other ranks to abort too, so it goes on in a background thread."""
        with self._lock:
            return self._abort("aborted by the caller")

    # -- internals --------------------------------------------------------------------------

    def _context(self):
        """A context manager making the device's primary context current on this thread."""
        return self._enter_context()

    @contextlib.contextmanager
    def _collective(self, name):
        """Holds the lock and the device context; yields the ncclComm_t. A failure once NCCL or
        the device was touched aborts the communicator, so peers stop waiting for this rank."""
        with self._lock:
            if self._comm is None:
                raise CommError(
                    "NcclCommunicator.%s on rank %d: the communicator is %s; every rank must "
                    "build a new one (restart the job, or sok1x.shutdown() then sok1x.init())" % (
                        name, self.rank, self._state))
            with self._context():
                try:
                    self._prune()
                    yield self._comm
                except CommError as exc:
                    self._abort("%s failed: %s" % (name, exc))
                    raise
                except Exception as exc:
                    self._abort("%s failed: %s" % (name, exc))
                    raise CommError("NCCL %s failed on rank %d: %s; the communicator was "
                                    "aborted" % (name, self.rank, exc)) from exc

    @contextlib.contextmanager
    def _group(self):
        """ncclGroupStart ... ncclGroupEnd; the group is closed even when a call inside fails."""
        self.library.group_start()
        try:
            yield
        except BaseException:
            try:
                self.library.group_end()
            except CommError:
                pass
            raise
        self.library.group_end()

    def _exchange_rows(self, comm, dtype, send, send_displs, send_counts, recv, recv_displs,
                       recv_counts, row_elems, row_bytes):
        """Enqueues grouped send/recv of row pieces. With peers, this rank's own piece is a send
        to itself in the same group, so NCCL copies it while the other pieces travel (a device
        copy before the group would run first, alone, on the stream); alone, it is a copy."""
        me = self.rank
        if self.size == 1:
            if send_counts[me] * row_elems > 0:
                self._driver.memcpy_dtod_async(
                    recv.ptr + int(recv_displs[me]) * row_bytes,
                    send.ptr + int(send_displs[me]) * row_bytes,
                    int(send_counts[me]) * row_bytes, self.stream)
            return
        with self._group():
            self._post_rows(comm, dtype, send, send_displs, send_counts, recv, recv_displs,
                            recv_counts, row_elems, row_bytes)

    def _post_rows(self, comm, dtype, send, send_displs, send_counts, recv, recv_displs,
                   recv_counts, row_elems, row_bytes):
        """Posts the send/recv pairs of one all-to-all-v (call inside a group)."""
        for peer in range(self.size):
            if send_counts[peer] * row_elems > 0:
                self.library.send(send.ptr + int(send_displs[peer]) * row_bytes,
                                  int(send_counts[peer]) * row_elems, dtype, peer, comm,
                                  self._stream_handle)
            if recv_counts[peer] * row_elems > 0:
                self.library.recv(recv.ptr + int(recv_displs[peer]) * row_bytes,
                                  int(recv_counts[peer]) * row_elems, dtype, peer, comm,
                                  self._stream_handle)

    def _exchange_row_counts(self, name, rows):
        """Host all-gather of one row count per rank over MPI; returns int64 counts."""
        counts = np.empty(self.size, dtype=np.int64)
        try:
            self.group.world.Allgather(np.array([rows], dtype=np.int64), counts)
        except Exception as exc:
            raise CommError("MPI Allgather of the row counts of %s failed on rank %d: %s" % (
                name, self.rank, exc)) from exc
        return counts

    def _empty(self, shape, dtype):
        if self._fast_empty is not None:
            return self._fast_empty(shape, dtype)
        return self._gpuarray.GPUArray(tuple(int(n) for n in shape), dtype,
                                       allocator=self.allocator)

    def _nccl_dtype(self, name, array, rows=False):
        """Returns the ncclDataType_t of a C-contiguous GPUArray; raises CommError otherwise."""
        if not isinstance(array, self._gpuarray.GPUArray):
            raise CommError("NcclCommunicator.%s expects a pycuda GPUArray, got %s; upload host "
                            "data with pycuda.gpuarray.to_gpu()" % (name, type(array).__name__))
        dtype = np.dtype(array.dtype)
        code = nccl_library.NCCL_DTYPES.get(dtype)
        if code is None:
            raise CommError("NcclCommunicator.%s: dtype %s is not supported by NCCL; use one of "
                            "%s" % (name, dtype, ", ".join(sorted(
                                str(d) for d in nccl_library.NCCL_DTYPES))))
        if not is_c_contiguous(array):
            raise CommError("NcclCommunicator.%s needs a C-contiguous array (shape %s, strides "
                            "%s); pass a contiguous copy" % (name, array.shape, array.strides))
        if rows and len(array.shape) == 0:
            raise CommError("NcclCommunicator.%s needs an array of rows, got a 0-d array" % name)
        return code

    def _nccl_op(self, name, op):
        code = nccl_library.NCCL_OPS.get(op)
        if code is None:
            raise CommError("NcclCommunicator.%s: reduce op must be one of %s, got %r" % (
                name, tuple(nccl_library.NCCL_OPS), op))
        return code

    def _counts(self, name, what, counts):
        """Returns `counts` as a list of ints, checking one non-negative integer per rank (a
        list: the counts are a few numbers, which Python adds faster than NumPy)."""
        if not isinstance(counts, np.ndarray):
            counts = np.asarray(counts)
        values = counts.tolist()
        if (counts.shape != (self.size,) or counts.dtype.kind not in "iu"
                or any(v < 0 for v in values)):
            raise CommError("NcclCommunicator.%s: %s must hold %d non-negative integers (one per "
                            "rank), got %r" % (name, what, self.size, counts))
        return values

    def _check_rows(self, name, array, expected, what):
        if int(array.shape[0]) != expected:
            raise CommError("NcclCommunicator.%s on rank %d: the array has %d rows but %s = %d" % (
                name, self.rank, array.shape[0], what, expected))

    def _enqueued(self, name, *buffers):
        """Records that `name` is on the stream; keeps its buffers alive until it has run. A
        collective recorded into a CUDA graph (backend/cuda/captured_graph.py) is not run now:
        the graph keeps its buffers, and no event may be recorded inside a capture that the
        host polls later."""
        if self._capturing() is not None:
            return
        self.collectives_enqueued += 1
        event = self._spare_events.pop() if self._spare_events else self._driver.Event(
            flags=self._driver.event_flags.DISABLE_TIMING)
        event.record(self.stream)
        self._pending.append((name, event, buffers))

    def _prune(self):
        """Forgets collectives the stream has passed (their events are recorded again later)."""
        while self._pending and self._pending[0][1].query():
            self._spare_events.append(self._pending.pop(0)[1])

    def _in_flight(self, what):
        names = []
        for name, _, _ in self._pending:
            if name not in names:
                names.append(name)
        return "%s (in flight: %s)" % (what, ", ".join(names)) if names else what

    def _wait(self, what, is_done):
        """Polls `is_done()` and NCCL's asynchronous error; aborts and raises CommError on an
        error or after `timeout_s`."""
        started = time.monotonic()
        pause = _POLL_FIRST_S
        while True:
            try:
                done = is_done()
            except self._driver.Error as exc:
                described = self._in_flight(what)
                self._abort("the CUDA stream failed: %s" % exc)
                raise CommError("NCCL %s failed on rank %d: the CUDA stream failed: %s; the "
                                "communicator was aborted" % (described, self.rank, exc)) from exc
            result = self.library.comm_get_async_error(self._comm)
            if result not in (nccl_library.NCCL_SUCCESS, nccl_library.NCCL_IN_PROGRESS):
                reason = self.library.get_error_string(result)
                described = self._in_flight(what)
                self._abort("asynchronous error: %s" % reason)
                raise CommError(
                    "NCCL %s failed on rank %d: %s (asynchronous error %d; a peer may have "
                    "failed). The communicator was aborted; restart the job." % (
                        described, self.rank, reason, result))
            if done:
                self._prune()
                return
            if self.timeout_s is not None and time.monotonic() - started > self.timeout_s:
                described = self._in_flight(what)
                finished = self._abort("timed out after %.1f s" % self.timeout_s)
                raise CommError(
                    "NCCL %s on rank %d timed out after %.1f s: a peer never joined (it may have "
                    "failed or be in another collective). The communicator was aborted%s; raise "
                    "%s if steps legitimately take longer." % (
                        described, self.rank, self.timeout_s,
                        "" if finished else " (NCCL is still aborting in the background)",
                        ENV_TIMEOUT))
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)

    def _abort(self, reason):
        """ncclCommAbort, once; later calls raise CommError naming `reason`. Returns True if NCCL
        finished within _ABORT_WAIT_S. The abort runs in a daemon thread because, within a host,
        it waits until the other ranks abort too; the buffers of the stopped collectives are freed
        only after it (freeing memory a running kernel uses would block)."""
        comm, self._comm = self._comm, None
        if comm is None:
            return True
        self._state = "aborted (%s)" % reason
        in_flight, self._pending = self._pending, []
        finished = threading.Event()

        def abort_and_release():
            try:
                with self._context():
                    try:
                        self.library.comm_abort(comm)
                    finally:
                        del in_flight[:]
            except Exception:  # nothing left to report to; the caller already raises
                pass
            finally:
                finished.set()

        threading.Thread(target=abort_and_release, name="sok1x-nccl-abort", daemon=True).start()
        return finished.wait(_ABORT_WAIT_S)

    def _agree_or_raise(self, error, step):
        """Collective over MPI: raises InitError on every rank if any rank passed an error."""
        text = None if error is None else "%s: %s" % (type(error).__name__, error)
        try:
            found = self.group.world.allgather(text)
        except Exception as exc:
            raise InitError("MPI allgather during NcclCommunicator %s failed on rank %d: %s" % (
                step, self.rank, exc)) from exc
        failures = ["rank %d: %s" % (r, t) for r, t in enumerate(found) if t is not None]
        if failures:
            raise InitError("NcclCommunicator %s failed on %d of %d ranks:\n  %s" % (
                step, len(failures), self.size, "\n  ".join(failures))) from error
