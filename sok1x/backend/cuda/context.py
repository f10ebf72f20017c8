"""The CUDA device, context, stream and memory pool that all of sok1x's GPU work shares.

sok1x never creates a CUDA context of its own: it retains the device's primary context, the one
the CUDA runtime (and so TensorFlow and NCCL) uses. PyCUDA's context stack is per thread and
TensorFlow calls in from its own threads, so every entry into GPU code makes the primary context
current and pops it again on the way out.

    activate(device_ordinal)   once per process, at init (the engine calls it): retain the primary
                               context of that device, create the stream and the memory pool.
                               Again with the same ordinal: nothing; another one: InitError.
    entered()                  `with cuda_context.entered():` the primary context is current on
                               this thread inside (nesting is cheap: only the outermost pushes)
    uses_context               decorator form of entered(), for every public GPU op
    stream()                   the pycuda Stream every sok1x kernel runs on (one stream)
    wait_until(what, is_done), wait_stream(what), wait_event(event, what)
                               the host waits, bounded once a communicator set its waiter
                               (set_stream_waiter): never a plain synchronize
    stream_handle()            the same stream as an int CUstream (for NCCL's ncclAllToAll etc.)
    allocate(nbytes)           a block of the memory pool, usable as a GPUArray allocator
    memory_pool()              the pool (a pycuda.tools.DeviceMemoryPool behind a wrapper): its
                               allocate() blocks may be dropped on any thread, inside entered()
                               or not (PyCUDA's own pool aborts the process when a block comes
                               back with no current context); held_blocks, free_held()
    visible_device_count()     GPUs this process sees (before activate)
    foreign_block(imported)    a pointer holder for memory another framework owns (DLPack)
    order_after_default_stream(stream)   sok1x's stream waits for work queued before on
                               `stream` (a framework's CUstream), by default the default stream,
                               and so on every blocking stream (TensorFlow's Python ops)
    order_default_stream_after(stream)   `stream` (by default the default stream, and every
                               blocking stream after it) waits for work queued so far on sok1x's
    device_of(address)         the GPU ordinal of device memory, None for any other address
    device_ordinal(), is_active(), context()
    release()                  wait for the stream, free the pool's held blocks, forget it all
    capture_recorder(), set_capture_recorder(list or None)
                               while the stream is captured (captured_graph.py): the blocks the
                               pool hands out are recorded for the graph; a host wait raises

A caller that launches its own work (the NCCL communicator) does it inside entered() and on
stream_handle(), so it is ordered with sok1x's kernels without any host synchronisation. PyCUDA
makes and slices GPUArrays only with a current context: do that inside entered() too.
"""
import atexit
import collections
import functools
import threading
import time

from sok1x.errors import CaptureError, DeviceMemoryError, InitError, NotInitializedError

_state = {}
_waiter = {}
_capture = {"recorder": None}
_SPIN_S = 0.002
_activation_lock = threading.Lock()
_thread = threading.local()


def activate(device_ordinal):
    """Makes device `device_ordinal` the one sok1x's GPU work runs on; raises InitError."""
    import pycuda.driver as driver
    from pycuda.tools import DeviceMemoryPool

    device_ordinal = int(device_ordinal)
    with _activation_lock:
        if _state:
            if _state["ordinal"] == device_ordinal:
                return
            raise InitError("the cuda backend is already on GPU %d, not %d: one process drives "
                            "one GPU" % (_state["ordinal"], device_ordinal))
        try:
            driver.init()
            count = driver.Device.count()
            if not 0 <= device_ordinal < count:
                raise InitError("GPU %d asked for, but %d GPU(s) are visible; check "
                                "CUDA_VISIBLE_DEVICES" % (device_ordinal, count))
            device = driver.Device(device_ordinal)
            primary = device.retain_primary_context()
            primary.push()
        except driver.Error as exc:
            raise InitError("could not open GPU %d: %s" % (device_ordinal, exc)) from exc
        try:
            stream = driver.Stream()
            pool = _ContextSafePool(DeviceMemoryPool(), primary, driver.Context.pop)
        finally:
            driver.Context.pop()
        _state.update(ordinal=device_ordinal, device=device, context=primary,
                      context_handle=primary.handle, stream=stream,
                      pool=pool,
                      multiprocessors=device.get_attribute(
                          driver.device_attribute.MULTIPROCESSOR_COUNT),
                      multiprocessor_limits=_multiprocessor_limits(device))
        atexit.register(release)


def is_active():
    return bool(_state)


def _get(name):
    try:
        return _state[name]
    except KeyError:
        raise NotInitializedError("the cuda backend has no GPU yet: call sok1x.init() (or "
                                  "sok1x.backend.cuda.context.activate(device_ordinal)) "
                                  "first") from None


def device_ordinal():
    return _get("ordinal")


def context():
    """Returns the pycuda Context of the device's primary context."""
    return _get("context")


def context_handle():
    """The CUcontext of context() as an int (read once: PyCUDA's property asks the driver)."""
    return _get("context_handle")


def stream():
    return _get("stream")


def side_stream():
    """A second stream of the context (made on first use, inside entered()): copies to the host
    that run beside the sok1x stream's later work (staging.download_beside)."""
    import pycuda.driver as driver
    side = _state.get("side_stream")
    if side is None:
        _get("stream")  # raises where the backend has no GPU yet
        side = _state["side_stream"] = driver.Stream()
    return side


def set_stream_waiter(waiter):
    """Makes wait_until() call `waiter(what, is_done)` (the NCCL communicator's wait_until, which
    polls `is_done` and NCCL's asynchronous error and gives up after SOK1X_NCCL_TIMEOUT_S), or
    poll without limit again with None (no communicator: nothing on the stream waits for a
    peer). Without it, a host wait behind a collective whose peer never joins would not end."""
    _waiter["wait"] = waiter


def wait_until(what, is_done):
    """The one host wait of the cuda backend: returns once `is_done()` (a stream's or an event's
    query) is True. Bounded where a communicator set a waiter (raises its CommError naming
    `what`). Never call a blocking CUDA call (a synchronize, a copy to pageable memory, PyCUDA's
    GPUArray.get()) behind a collective instead: it cannot be bounded or interrupted."""
    forbid_inside_capture("a host wait (%s)" % what)
    # Most waits end within microseconds: query at full speed first (as synchronize spins), and
    # only a longer wait goes to the communicator's polling, which backs off to 1 ms pauses.
    deadline = time.monotonic() + _SPIN_S
    while not is_done():
        if time.monotonic() > deadline:
            waiter = _waiter.get("wait")
            if waiter is not None:
                waiter(what, is_done)
                return
            time.sleep(_SPIN_S / 2)
        else:
            time.sleep(0)  # let TensorFlow's other Python threads run


def capture_recorder():
    """The list a capture of the sok1x stream records the pool's blocks in, or None while no
    capture runs (captured_graph.py)."""
    return _capture["recorder"]


def forbid_inside_capture(what):
    """Raises CaptureError while the sok1x stream is being captured: `what` (a host wait, an
    upload) cannot be recorded. One dictionary read outside a capture."""
    if _capture["recorder"] is not None:
        raise CaptureError("%s inside a captured CUDA graph: a graph replays device work only "
                           "(DESIGN D14); do it before the capture or read it after a replay"
                           % what)


def set_capture_recorder(recorder):
    """Starts (a list) or ends (None) the pool's recording of blocks for a capture."""
    _capture["recorder"] = recorder


def wait_stream(what="a wait for the sok1x stream"):
    """Blocks until the work queued on stream() has finished (wait_until)."""
    wait_until(what, _get("stream").is_done)


def wait_event(event, what):
    """Blocks until the pycuda Event `event` has passed (wait_until)."""
    wait_until(what, event.query)


def stream_handle():
    """Returns the CUstream of stream() as an int."""
    return _get("stream").handle


def memory_pool():
    return _get("pool")


@functools.lru_cache(maxsize=None)
def _pooled_block_class():
    """Returns the class of the pool's blocks as sok1x hands them out (built once PyCUDA loads).

    PyCUDA's pool needs a current context when a block returns to it (and aborts the process if
    there is none), while GPUArrays die wherever Python drops them; these blocks make the context
    current around the return, and hold everything they need, so they work at interpreter exit
    too. They derive from PointerHolderBase, the type PyCUDA's copies and kernel launches accept
    as a device pointer.
    """
    import pycuda.driver as driver

    class PooledBlock(driver.PointerHolderBase):
        def __init__(self, allocation, context, pop):
            super(PooledBlock, self).__init__()
            self._allocation, self._context, self._pop = allocation, context, pop
            self.address = int(allocation)  # read as an attribute: no Python call (ptr)

        def get_pointer(self):
            return int(self._allocation)

        def __int__(self):
            return int(self._allocation)

        __index__ = __int__

        def __del__(self):
            # Inside entered() of the same context it is current already (push and pop are two
            # driver calls, and a step frees dozens of blocks). At interpreter exit this
            # module's globals may be gone already: then push, as for any other thread.
            try:
                nested = getattr(_thread, "depth", 0) and _state.get("context") is self._context
            except Exception:  # noqa: BLE001 (_thread or _state torn down)
                nested = False
            if nested:
                self._allocation.free()
                return
            self._context.push()
            try:
                self._allocation.free()
            finally:
                self._pop()

    return PooledBlock


class _ContextSafePool:
    """The DeviceMemoryPool as sok1x hands it out: its blocks are _pooled_block_class()'s."""

    def __init__(self, pool, context, pop):
        self.pool, self._context, self._pop = pool, context, pop

    def allocate(self, nbytes):
        """Returns a block of `nbytes` (call inside entered()); int() gives its address.
        Raises DeviceMemoryError, with what to do, when the GPU is full."""
        import pycuda.driver as driver
        try:
            allocation = self.pool.allocate(nbytes)
        except driver.MemoryError as exc:
            free, total = driver.mem_get_info()
            raise DeviceMemoryError(
                "GPU %d has no room for %.1f MiB (%.1f of %.1f GiB free): %s. TensorFlow takes "
                "all GPU memory by default; leave room for sok1x's tables with "
                "config.gpu_options.allow_growth = True (or a per_process_gpu_memory_fraction) "
                "in the tf.compat.v1.ConfigProto of your Session, or make "
                "max_vocabulary_size_per_gpu smaller." % (
                    _state.get("ordinal", -1), nbytes / 2.0 ** 20, free / 2.0 ** 30,
                    total / 2.0 ** 30, exc)) from exc
        block = _pooled_block_class()(allocation, self._context, self._pop)
        recorder = _capture["recorder"]
        if recorder is not None:  # the graph being captured owns it (captured_graph.py)
            recorder.append((block, int(nbytes)))
        return block

    @property
    def held_blocks(self):
        return self.pool.held_blocks

    @property
    def active_blocks(self):
        return self.pool.active_blocks

    def free_held(self):
        """Gives the pool's unused blocks back to the driver."""
        with _ENTERED:
            self.pool.free_held()

    def stop_holding(self):
        """Gives blocks that come back to the pool from now on straight to the driver."""
        with _ENTERED:
            self.pool.stop_holding()


@functools.lru_cache(maxsize=None)
def _foreign_block_class():
    """Returns the pointer-holder class of memory another framework owns (a DLPack import)."""
    import pycuda.driver as driver

    class ForeignBlock(driver.PointerHolderBase):
        def __init__(self, imported):
            super(ForeignBlock, self).__init__()
            self.imported = imported
            self.address = imported.address  # (as the pool's blocks: see PooledBlock)

        def get_pointer(self):
            return self.imported.address

        def __int__(self):
            return self.imported.address

        __index__ = __int__

    return ForeignBlock


def foreign_block(imported):
    """Returns a device pointer holder (usable as GPUArray gpudata) for a
    sok1x.backend.dlpack.ImportedTensor; the tensor lives as long as the holder."""
    return _foreign_block_class()(imported)


@functools.lru_cache(maxsize=None)
def _driver_api():
    """The few CUDA driver calls PyCUDA does not offer for the default stream, through ctypes."""
    import ctypes
    library = ctypes.CDLL("libcuda.so.1")
    for name, argtypes in (("cuEventCreate", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]),
                           ("cuEventRecord", [ctypes.c_void_p, ctypes.c_void_p]),
                           ("cuStreamWaitEvent", [ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_uint]),
                           ("cuPointerGetAttribute", [ctypes.c_void_p, ctypes.c_int,
                                                      ctypes.c_void_p])):
        getattr(library, name).argtypes = argtypes
        getattr(library, name).restype = ctypes.c_int
    return library


_LEGACY_STREAM = 0  # the default stream: every blocking stream orders itself around it
_EVENT_DISABLE_TIMING = 0x2


def _checked(result, call):
    if result != 0:
        raise RuntimeError("CUDA driver call %s failed with error %d" % (call, result))


def _event(name):
    """Returns this process's reusable CUevent `name` (made once, inside entered())."""
    import ctypes
    events = _state.setdefault("events", {})
    if name not in events:
        handle = ctypes.c_void_p()
        _checked(_driver_api().cuEventCreate(ctypes.byref(handle), _EVENT_DISABLE_TIMING),
                 "cuEventCreate")
        events[name] = handle
    return events[name]


def stream_orders():
    """Returns (after_framework, framework_after), this context's two stream orders as plain
    functions of a framework's CUstream (an int), for callers already inside entered() that
    order once per call (a TensorFlow kernel's call, engine/kernel_calls.py): each is one event
    record and one stream wait, the driver's functions, events and stream looked up once.
    after_framework(stream): sok1x's stream waits (on the GPU) for the work queued so far on
    `stream`. framework_after(stream): `stream` waits for the work queued so far on sok1x's."""
    orders = _state.get("stream_orders")
    if orders is None:
        orders = _made_stream_orders()
    return orders


def _made_stream_orders():
    # made once a context, under the activation lock (a release meanwhile would otherwise find
    # them put back into its emptied state) and inside the context (the events are made here)
    with _activation_lock, _ENTERED:
        orders = _state.get("stream_orders")
        if orders is not None:
            return orders
        api = _driver_api()
        record, wait = api.cuEventRecord, api.cuStreamWaitEvent
        ready, done, own = _event("framework_ready"), _event("outputs_ready"), stream_handle()

        def ordering(event, framework_first):
            """The order one way: the second stream waits, on the GPU, for the work queued so
            far on the first (framework_first: the framework's stream first, else sok1x's).
            Each driver result is tested inline: a kernel call orders twice, every call a cost."""
            def order(stream):
                first, then = (stream, own) if framework_first else (own, stream)
                failed = record(event, first)
                if failed:
                    _checked(failed, "cuEventRecord")
                failed = wait(then, event, 0)
                if failed:
                    _checked(failed, "cuStreamWaitEvent")
            return order

        after_framework, framework_after = ordering(ready, True), ordering(done, False)
        orders = _state["stream_orders"] = (after_framework, framework_after)
        return orders


def order_after_default_stream(stream=_LEGACY_STREAM):
    """Makes sok1x's stream wait (on the GPU, no host wait) for everything queued before on
    `stream`, a framework's CUstream as an int (default: the default stream, which itself waits
    for the blocking streams TensorFlow's Python ops queue on): a framework's tensors are
    complete before sok1x's kernels read them. Call inside entered()."""
    stream_orders()[0](stream)


def order_default_stream_after(stream=_LEGACY_STREAM):
    """Makes `stream` (default: the default stream, and so every blocking stream after it) wait,
    on the GPU, for the work queued so far on sok1x's stream: a framework reading sok1x's
    outputs reads them complete. Call inside entered()."""
    stream_orders()[1](stream)


_POINTER_DEVICE_ORDINAL = 9  # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
_POINTER_MEMORY_TYPE = 2  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
_MEMORY_DEVICE = 2  # CU_MEMORYTYPE_DEVICE


def device_of(address):
    """The ordinal of the GPU whose memory `address` is, or None for memory that is not a GPU's
    (host memory, or an address the driver does not know). Call inside entered()."""
    import ctypes
    api = _driver_api()
    memory_type, ordinal = ctypes.c_uint(0), ctypes.c_int(-1)
    if api.cuPointerGetAttribute(ctypes.byref(memory_type), _POINTER_MEMORY_TYPE,
                                 ctypes.c_void_p(address)) != 0:
        return None
    if memory_type.value != _MEMORY_DEVICE:
        return None
    if api.cuPointerGetAttribute(ctypes.byref(ordinal), _POINTER_DEVICE_ORDINAL,
                                 ctypes.c_void_p(address)) != 0:
        return None
    return ordinal.value


def allocate(nbytes):
    """Returns a pooled block of `nbytes` (inside entered()); int() gives its device address."""
    return _get("pool").allocate(nbytes)


def visible_device_count():
    """Returns how many GPUs this process sees; raises InitError if the driver does not start."""
    import pycuda.driver as driver

    try:
        driver.init()
        return driver.Device.count()
    except driver.Error as exc:
        raise InitError("the CUDA driver did not start: %s" % exc) from exc


def multiprocessor_count():
    return _get("multiprocessors")


MultiprocessorLimits = collections.namedtuple("MultiprocessorLimits",
                                              "threads registers shared blocks")


def multiprocessor_limits():
    """What one multiprocessor of the active GPU holds at once: MultiprocessorLimits(threads,
    registers, shared memory bytes, blocks)."""
    return _get("multiprocessor_limits")


def _multiprocessor_limits(device):
    import pycuda.driver as driver
    attribute = driver.device_attribute
    return MultiprocessorLimits(
        device.get_attribute(attribute.MAX_THREADS_PER_MULTIPROCESSOR),
        device.get_attribute(attribute.MAX_REGISTERS_PER_MULTIPROCESSOR),
        device.get_attribute(attribute.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        device.get_attribute(attribute.MAX_BLOCKS_PER_MULTIPROCESSOR))


class _Entered:
    """Pushes the primary context on this thread's stack unless an outer entry already did."""

    def __enter__(self):
        primary = _get("context")
        depth = getattr(_thread, "depth", 0)
        if depth == 0:
            primary.push()
        _thread.depth = depth + 1
        return primary

    def __exit__(self, *exc_info):
        _thread.depth -= 1
        if _thread.depth == 0:
            import pycuda.driver as driver
            driver.Context.pop()
        return False


_ENTERED = _Entered()


def entered():
    """Returns a context manager inside which the primary context is current on this thread."""
    return _ENTERED


def uses_context(function):
    """Decorator: runs `function` inside entered()."""
    @functools.wraps(function)
    def run_in_context(*args, **kwargs):
        with _ENTERED:
            return function(*args, **kwargs)

    return run_in_context


def release():
    """Waits for the stream, frees the pool's held memory, makes the pool free what comes back
    to it from now on (arrays the program still holds), and forgets the device. At exit: a
    block returned to a pool that holds none makes PyCUDA ask for a current context, and where
    there is none (interpreter teardown) it aborts the process."""
    with _activation_lock:
        if not _state:
            return
        try:
            with _ENTERED:
                wait_stream("the wait for the sok1x stream at release")
                if "side_stream" in _state:
                    wait_until("the wait for the side stream at release",
                               _state["side_stream"].is_done)
                _state["pool"].free_held()
                _state["pool"].stop_holding()
        except Exception:  # at interpreter exit the driver (or NCCL) may already be gone
            pass
        _state.clear()
