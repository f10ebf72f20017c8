"""CUDA graphs of the sok1x stream (DESIGN D14): work queued inside `capture()` is recorded, not
run, and replayed later with one launch (stream capture through the driver API over ctypes: the
installed PyCUDA has no capture calls).

    graph = CapturedGraph()
    with graph.capture():        # every launch, fill and device copy queued on the sok1x stream
        ...                      # is recorded; nothing runs
    graph.replay()               # all of it, queued on the sok1x stream with one launch
    graph.held_bytes             # device memory the graph keeps: what its work allocated
    graph.free()                 # the graph and its memory go (inside the context; idempotent)

What may happen inside a capture. A recorded launch reads and writes the same addresses at every
replay, so:
- Memory the pool hands out during the capture belongs to the graph until free(): no later
  allocation can reuse it, even if the capturing code dropped it (so held_bytes is the sum of
  every allocation the recorded work made, without reuse among them). Buffers made before the
  capture (a table, a step's fixed inputs) must outlive the graph: the caller keeps them.
- A host wait cannot be recorded (the host would read a value of the capture, not of a replay),
  nor an upload of host data (the recorded copy would read the staging block as it is at replay
  time, which later uploads reuse): either raises CaptureError at once, naming it, and the
  capture is abandoned (the stream is usable again, nothing was run).
- Scalars given to a kernel (a learning rate, a count) are fixed at capture: what changes per
  step must come from device memory the caller fills before replay.
Capture mode is relaxed: the pool may ask the driver for new memory while recording.

captured_work(run) is the form the engine uses (engine/lookup/replayed_step.py): run() queues its
work on fixed inputs and returns its outputs, a list of arrays the graph writes at each replay.
"""
import ctypes
import functools

from sok1x.backend.cuda import context as cuda_context
from sok1x.errors import CaptureError  # noqa: F401  (raised here, named by callers)

_CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED
_CAPTURE_STATUS_NONE = 0  # CU_STREAM_CAPTURE_STATUS_NONE


@functools.lru_cache(maxsize=None)
def _graph_api():
    """The driver's stream-capture and graph calls, through ctypes."""
    library = ctypes.CDLL("libcuda.so.1")
    pointer, handle = ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p
    for name, argtypes in (
            ("cuStreamBeginCapture_v2", [handle, ctypes.c_int]),
            ("cuStreamEndCapture", [handle, pointer]),
            ("cuStreamIsCapturing", [handle, ctypes.POINTER(ctypes.c_int)]),
            ("cuGraphInstantiateWithFlags", [pointer, handle, ctypes.c_ulonglong]),
            ("cuGraphLaunch", [handle, handle]),
            ("cuGraphGetNodes", [handle, pointer, ctypes.POINTER(ctypes.c_size_t)]),
            ("cuGraphExecDestroy", [handle]),
            ("cuGraphDestroy", [handle])):
        getattr(library, name).argtypes = argtypes
        getattr(library, name).restype = ctypes.c_int
    return library


def _checked(result, call):
    if result != 0:
        raise CaptureError("CUDA driver call %s failed with error %d" % (call, result))


class CapturedGraph:
    """One recorded stretch of the sok1x stream's work (module docstring)."""

    def __init__(self):
        self._graph = self._exec = self._launch = self._stream = None
        self._blocks = []  # (pool block, bytes): the memory the recorded work allocated
        self.nodes = 0

    @property
    def held_bytes(self):
        """Device bytes the graph keeps (every allocation its recorded work made)."""
        return sum(nbytes for _, nbytes in self._blocks)

    @property
    def ready(self):
        return self._exec is not None

    def capture(self):
        """Context manager: records the sok1x stream's work inside it into this graph (which
        must be empty); on an error inside, the capture is ended and dropped, and the error
        raised."""
        if self._graph is not None:
            raise CaptureError("this CapturedGraph holds a capture already: free() it first")
        return _Capturing(self)

    def replay(self):
        """Queues the recorded work on the sok1x stream (one launch, no host wait)."""
        if self._exec is None:
            raise CaptureError("replay of a CapturedGraph that holds no capture")
        with cuda_context.entered():
            result = self._launch(self._exec, self._stream)
        if result:
            _checked(result, "cuGraphLaunch")

    def free(self):
        """Destroys the graph and gives its memory back to the pool, waiting first for any
        replay still queued (the memory may be in use). Idempotent."""
        if self._graph is None and not self._blocks:
            return
        with cuda_context.entered():
            if self._exec is not None:
                cuda_context.wait_stream("the wait for a graph's replays before it is freed")
                _graph_api().cuGraphExecDestroy(self._exec)
            if self._graph is not None:
                _graph_api().cuGraphDestroy(self._graph)
            self._graph = self._exec = None
            self._blocks = []  # back to the pool, inside the context
            self.nodes = 0


class _Capturing:
    """CapturedGraph.capture()'s context manager."""

    def __init__(self, graph):
        self.graph = graph

    def __enter__(self):
        self._entered = cuda_context.entered()
        self._entered.__enter__()
        if cuda_context.capture_recorder() is not None:
            self._entered.__exit__(None, None, None)
            raise CaptureError("a capture inside a capture: the sok1x stream records one graph "
                               "at a time")
        api, stream = _graph_api(), cuda_context.stream_handle()
        cuda_context.set_capture_recorder(self.graph._blocks)
        try:
            _checked(api.cuStreamBeginCapture_v2(stream, _CAPTURE_MODE_RELAXED),
                     "cuStreamBeginCapture")
        except BaseException:
            cuda_context.set_capture_recorder(None)
            self._entered.__exit__(None, None, None)
            raise
        return self.graph

    def __exit__(self, kind, error, trace):
        graph, api = self.graph, _graph_api()
        handle = ctypes.c_void_p()
        try:
            cuda_context.set_capture_recorder(None)
            ended = api.cuStreamEndCapture(cuda_context.stream_handle(), ctypes.byref(handle))
            if kind is not None or ended != 0:
                if handle.value:
                    api.cuGraphDestroy(handle)
                graph._blocks = []
                if kind is None:
                    _checked(ended, "cuStreamEndCapture")
                return False
            graph._graph = handle
            count = ctypes.c_size_t(0)
            _checked(api.cuGraphGetNodes(handle, None, ctypes.byref(count)), "cuGraphGetNodes")
            graph.nodes = int(count.value)
            executable = ctypes.c_void_p()
            _checked(api.cuGraphInstantiateWithFlags(ctypes.byref(executable), handle, 0),
                     "cuGraphInstantiateWithFlags")
            graph._exec = executable
            # what each replay calls, looked up once (the stream is the context's for its life)
            graph._launch, graph._stream = api.cuGraphLaunch, cuda_context.stream_handle()
            return False
        finally:
            self._entered.__exit__(None, None, None)


class CapturedWork:
    """run()'s device work, recorded once, not done: outputs (what run() returned while it was
    recorded: the arrays every replay writes), replay(), held_bytes, free(). The cpu backend's
    twin runs run() again at each replay instead (backend/cpu/rerun.py)."""

    def __init__(self, run):
        self.graph = CapturedGraph()
        with self.graph.capture():
            self.outputs = run()

    def replay(self):
        """Queues the recorded work again (one launch): it writes self.outputs."""
        self.graph.replay()

    @property
    def held_bytes(self):
        return self.graph.held_bytes

    def free(self):
        """Gives the graph and its memory back (idempotent); the outputs are not to be read
        after."""
        self.graph.free()
        self.outputs = None


def captured_work(run):
    """Records run()'s work on the sok1x stream, without doing it; returns a CapturedWork. The
    caller runs it once eagerly before: that makes every constant the work uploads, which a
    capture cannot (CaptureError)."""
    return CapturedWork(run)


def stream_is_capturing():
    """True while the sok1x stream is being captured (asked of the driver)."""
    status = ctypes.c_int(0)
    with cuda_context.entered():
        _checked(_graph_api().cuStreamIsCapturing(cuda_context.stream_handle(),
                                                  ctypes.byref(status)), "cuStreamIsCapturing")
    return status.value != _CAPTURE_STATUS_NONE
