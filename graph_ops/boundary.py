"""The seam between TensorFlow and the engine (DESIGN D1): the one place where a step's tensors
cross to sok1x and back. Every per-step graph op (lookups, their gradients, table updates, the
dense collectives, the tickers) is made here by engine_op() or host_op(); nothing else converts
tensors.

Three paths, chosen once when an op is built:

    kernels (every TensorFlow,      the op Sok1xEngineCall of sok1x's op library, compiled
    graph mode; the default)        against the installed TensorFlow (graph_ops/op_library.py).
                                    Its CPU and GPU kernels hand the engine TensorFlow's own
                                    buffers and, on GPU, the op's CUDA stream; the engine's
                                    arrays become the outputs (sok1x/engine/kernel_calls.py).
    zero-copy (TensorFlow >= 2.2,   a tf.py_function. Each input tensor crosses as a DLPack
    eagerly, or without kernels)    capsule that the backend reads in place (a GPU tensor stays
                                    on the GPU); outputs cross back as capsules TensorFlow adopts.
    host staging (TensorFlow 1.15   a tf.compat.v1.py_func, which hands over NumPy arrays. On
    without kernels)                cuda they go through page-locked buffers kept across steps,
                                    one asynchronous copy each way on the engine's stream.

SOK1X_SEAM=kernels, =dlpack or =host forces one (the tests run each on the TensorFlow they
have). Executing eagerly there is no op to build: the function runs at once (_call_now).

Stream order on cuda: TensorFlow queues its kernels on its own streams, sok1x on its stream.
Before the engine reads an input, backend.wait_for_framework() makes sok1x's stream wait on the
GPU for the work queued before (on the kernel's own stream, or the default stream); before
outputs go back, backend.release_to_framework() makes TensorFlow's later work wait for sok1x's.
Neither waits on the host.
"""
import os
import sys

import numpy as np

from sok1x.engine import api, kernel_calls, runtime
from sok1x.graph_ops import op_library, tf_compat
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import tf1

SEAM_ENV = "SOK1X_SEAM"
KERNELS, ZERO_COPY, HOST_STAGING = "kernels", "dlpack", "host"
PATHS = (KERNELS, ZERO_COPY, HOST_STAGING)
KERNEL_OP = "Sok1xEngineCall"
_OP_TYPES = {KERNELS: KERNEL_OP, ZERO_COPY: "EagerPyFunc", HOST_STAGING: "PyFunc"}
_KERNEL_GRADIENT = "%s@kernels"  # the name a gradient is registered under for kernel ops


def seam_path():
    """Returns KERNELS where sok1x's op library can be had (built on first use), else ZERO_COPY
    where TensorFlow has DLPack, else HOST_STAGING, unless SOK1X_SEAM forces one; raises
    ValueError for a value it does not know, or a forced path this TensorFlow cannot take."""
    forced = os.environ.get(SEAM_ENV, "").strip().lower()
    if forced not in ("",) + PATHS:
        raise ValueError("%s=%r: use %s" % (SEAM_ENV, forced, ", ".join(map(repr, PATHS))))
    if forced == ZERO_COPY and not tf_compat.HAS_DLPACK:
        raise ValueError("%s=dlpack, but TensorFlow %s has no DLPack (2.2 or newer has); use "
                         "%s=host" % (SEAM_ENV, ".".join(map(str, tf_compat.VERSION)), SEAM_ENV))
    if forced == KERNELS and not op_library.available():
        raise ValueError("%s=kernels, but sok1x's op library cannot be had: %s"
                         % (SEAM_ENV, op_library.reason()))
    if forced:
        return forced
    if op_library.available():
        return KERNELS
    return ZERO_COPY if tf_compat.HAS_DLPACK else HOST_STAGING


def replay_detach():
    """api's detach for a replayed lookup of a session's graph, which may keep an output past
    its step (a queue, a while loop's TensorArray): through sok1x's kernels the engine knows
    what TensorFlow holds (engine/lent_memory.py), so the class's own arrays cross unless one
    is still held (api.DETACH_HELD); a py_func may hold the engine's memory unseen (DLPack, or
    host memory TensorFlow's tensor shares with NumPy), so its outputs are copies (True)."""
    return api.DETACH_HELD if seam_path() == KERNELS else True


def eager_path(path):
    """The path of a call made eagerly, where there is no graph op: DLPack where TensorFlow has
    it, else host staging (a forced SOK1X_SEAM=host stays host)."""
    if path == KERNELS:
        return ZERO_COPY if tf_compat.HAS_DLPACK else HOST_STAGING
    return path


def op_type(path=None):
    """The TensorFlow op type engine_op makes on `path` (for gradient_override_map)."""
    return _OP_TYPES[path or seam_path()]


def describe(path=None):
    """One line saying how this process's graph ops cross (what sok1x.Init says)."""
    path = path or seam_path()
    if path == KERNELS:
        loaded = op_library.load()
        return "graph ops run as sok1x's TensorFlow kernels (%s%s)" % (
            loaded.path, "" if loaded.gpu_stream else "; GPU kernels order by the default stream")
    why = "" if os.environ.get(SEAM_ENV) else ": %s" % op_library.reason()
    return "graph ops cross by %s%s" % (
        "DLPack (tf.py_function)" if path == ZERO_COPY else "host staging (tf.py_func)", why)


_announced = []


def announce():
    """Writes, once per process and on rank 0 only, the line saying how the job's graph ops
    cross (sok1x.Init and sok1x.init call it once sok1x is up; SOK1X_QUIET=1 leaves it out)."""
    if _announced or not runtime.is_initialized():
        return
    _announced.append(True)
    rt = runtime.get()
    if rt.rank != 0 or os.environ.get("SOK1X_QUIET", "").strip() in ("1", "true", "yes"):
        return
    sys.stderr.write("sok1x: %d rank(s) on the %s backend; %s\n" % (rt.size, rt.backend.NAME,
                                                                     describe()))
    sys.stderr.flush()


def register_gradient(name):
    """Decorator: registers gradient function fn(op, *grads) as `name` for sok1x's ops on every
    path. A kernel op takes its device inputs and outputs before its host ones; fn sees the op's
    inputs and outputs in engine_op's order all the same, and returns its input gradients so."""
    def register(function):
        tf1.RegisterGradient(name)(function)
        tf1.RegisterGradient(_KERNEL_GRADIENT % name)(_in_call_order(function))
        return function
    return register


class _OpInCallOrder:
    """A kernel op whose inputs and outputs read in engine_op's order (else as the op)."""

    def __init__(self, op, call):
        self._op = op
        inputs, outputs = [None] * len(op.inputs), [None] * len(op.outputs)
        for k, i in enumerate(call.input_order):
            inputs[i] = op.inputs[k]
        for k, i in enumerate(call.output_order):
            outputs[i] = op.outputs[k]
        self.inputs = inputs
        self.outputs = outputs[:-1] if call.check else outputs  # not the first-step flag

    def __getattr__(self, name):
        return getattr(self._op, name)


def _in_call_order(function):
    def gradient(op, *grads):
        call = kernel_calls.call_of(op.get_attr("function"))
        ordered = [None] * len(grads)
        for k, i in enumerate(call.output_order):
            ordered[i] = grads[k]
        if call.check:
            ordered = ordered[:-1]
        result = list(function(_OpInCallOrder(op, call), *ordered))
        return [result[i] for i in call.input_order]
    return gradient


def _is_on_gpu(tensor):
    return "GPU" in (getattr(tensor, "device", "") or "").upper()


def _tensor_to_engine(backend, tensor):
    """An eager tensor as a backend array, read in place where the memory is the backend's."""
    if tensor.shape.num_elements() == 0:
        return backend.asarray(np.zeros(tensor.shape, tensor.dtype.as_numpy_dtype))
    if _is_on_gpu(tensor) != (backend.NAME == "cuda"):
        return backend.asarray(tensor.numpy())  # on the other side of the bus: one copy
    return backend.from_dlpack(tf_compat.to_dlpack(tensor))


def _result_to_tensor(backend, result, dtype):
    """An engine result as an eager tensor for tf.py_function to return: an adopted tensor for
    arrays, a converted one for host values (made here, not by TensorFlow, so that
    tf_compat.release_eager_tensors reaches it)."""
    numpy_dtype = dtype.as_numpy_dtype
    if isinstance(result, (np.ndarray, np.generic)) or np.isscalar(result):
        result = np.asarray(result, dtype=numpy_dtype)
        if backend.NAME != "cpu" or result.ndim == 0 or result.size == 0:
            return tf1.convert_to_tensor(result)
    elif result.dtype != numpy_dtype:
        raise TypeError("engine result of dtype %s where the op declares %s"
                        % (result.dtype, dtype.name))
    if result.size == 0:
        return tf1.convert_to_tensor(np.zeros(result.shape, numpy_dtype))
    return tf_compat.from_dlpack(backend.to_dlpack(result))


def _result_to_host(backend, result, dtype):
    if isinstance(result, (np.ndarray, np.generic)) or np.isscalar(result):
        return np.asarray(result, dtype=dtype.as_numpy_dtype)
    return backend.download_staged(result)


def _inputs_to_engine(path, backend, values, host_positions, unread=frozenset()):
    """An op's inputs as the engine takes them: eager tensors (zero-copy) or NumPy values (host
    staging) become backend arrays; those at host_positions NumPy values; those at `unread`
    None (inputs only for the graph's gradients: nothing crosses)."""
    arrays = []
    for i, value in enumerate(values):
        if i in unread:
            arrays.append(None)
            continue
        if path == ZERO_COPY and i not in host_positions:
            arrays.append(_tensor_to_engine(backend, value))  # never through the host
            continue
        host = value.numpy() if hasattr(value, "numpy") else value
        arrays.append(host if i in host_positions else backend.upload_staged(host))
    return arrays


def _call_now(path, function, inputs, dtypes, host_positions, prepare, unread):
    """Executing eagerly there is no op to build: runs `function` at once on the inputs' values
    and returns tensors of its results. (tf.py_function executed eagerly would keep every call,
    its inputs and outputs in TensorFlow's registry of the default graph for good.) Results are
    copied into TensorFlow's memory: an engine array lent to TensorFlow through DLPack carries a
    Python deleter, which must not outlive the interpreter, and an eager program's tensors may
    (its globals do)."""
    if prepare is not None:
        prepare()
    backend = runtime.get().backend
    tensors = [tf1.convert_to_tensor(t) for t in inputs]
    arrays = _inputs_to_engine(eager_path(path), backend, tensors, host_positions, unread)
    backend.wait_for_framework()
    results = function(*arrays)
    backend.release_to_framework()
    results = [results] if len(dtypes) == 1 and not isinstance(results, (list, tuple)) else results
    return [tf1.convert_to_tensor(np.array(backend.to_host(r), dtype=d.as_numpy_dtype))
            for r, d in zip(results, dtypes)]


def engine_op(function, inputs, output_dtypes, name, gradient=None, host_inputs=(),
              prepare=None, unread_inputs=(), host_outputs=()):
    """Returns the outputs of a new op that runs `function` in the engine.

    function(*arrays) takes backend arrays (NumPy on cpu, device arrays on cuda) and returns one
    backend array or NumPy value per output dtype (one, or a list when output_dtypes is a list).
    inputs: tensors; host_inputs: positions of inputs to hand over as NumPy values (tokens and
    other small control values); prepare(): runs first, before any conversion (brings sok1x up,
    makes tables). gradient: the name of a registered gradient for this op (graph mode; executing
    eagerly the function runs at once, and a gradient comes from tf.custom_gradient).
    unread_inputs: positions of inputs the function does not read (a lookup's handle variables,
    there for the gradient): they do not cross, and the function gets None. host_outputs:
    positions of outputs that are host values (a token, counts: on a GPU the kernel gives them
    in host memory)."""
    path = seam_path()
    single = not isinstance(output_dtypes, (list, tuple))
    dtypes = [tf1.as_dtype(d) for d in ([output_dtypes] if single else output_dtypes)]
    host_positions, unread = frozenset(host_inputs), frozenset(unread_inputs)
    if tf1.executing_eagerly():
        outputs = _call_now(path, function, inputs, dtypes, host_positions, prepare, unread)
        return outputs[0] if single else outputs

    if path == KERNELS:
        outputs = _kernel_op(function, inputs, output_dtypes, name, gradient, host_positions,
                             frozenset(host_outputs), prepare, unread)
        return outputs[0] if single else outputs

    def finish(backend, results, convert):
        results = [results] if single else list(results)
        return [convert(backend, r, d) for r, d in zip(results, dtypes)]

    if path == ZERO_COPY:
        def run(*tensors):
            try:
                if prepare is not None:
                    prepare()
                backend = runtime.get().backend
                arrays = _inputs_to_engine(path, backend, tensors, host_positions, unread)
                backend.wait_for_framework()
                results = function(*arrays)
                backend.release_to_framework()
                outputs = finish(backend, results, _result_to_tensor)
            finally:
                tf_compat.release_eager_tensors(tensors)  # else 16 B each a step, for good
            return tf_compat.release_eager_tensors(outputs)
        make = tf_compat.py_function
    else:
        def run(*values):
            if prepare is not None:
                prepare()
            backend = runtime.get().backend
            arrays = _inputs_to_engine(path, backend, values, host_positions, unread)
            return finish(backend, function(*arrays), _result_to_host)
        make = tf_compat.py_func
    graph = tf1.get_default_graph()
    with graph.gradient_override_map({op_type(path): gradient} if gradient else {}):
        outputs = make(run, list(inputs), dtypes, name)
    return outputs[0] if single else outputs


def _kernel_op(function, inputs, output_dtypes, name, gradient, host_positions, host_outputs,
               prepare, unread, check=None):
    """engine_op's kernel path: one Sok1xEngineCall op; returns its outputs in engine_op's
    order. check: whether the op checks its first step (default: first_step_checks())."""
    single = not isinstance(output_dtypes, (list, tuple))
    dtypes = [tf1.as_dtype(d) for d in ([output_dtypes] if single else output_dtypes)]
    kinds = ["unread" if i in unread else "host" if i in host_positions else "device"
             for i in range(len(inputs))]
    output_kinds = ["host" if i in host_outputs else "device" for i in range(len(dtypes))]
    check = first_step_checks() if check is None else check
    call = kernel_calls.KernelCall(
        function, kinds, output_kinds,
        dtypes[0].as_numpy_dtype if single else [d.as_numpy_dtype for d in dtypes], name,
        prepare, check=check)
    graph = tf1.get_default_graph()
    per_graph(graph, "kernel_calls", list).append(call)  # the registry holds it weakly
    tensors = [tf1.convert_to_tensor(t) for t in inputs]
    device_inputs = [tensors[i] for i, k in zip(call.input_order, call.input_kinds)
                     if k != "host"]
    host_inputs = [tensors[i] for i, k in zip(call.input_order, call.input_kinds) if k == "host"]
    ops = op_library.load().ops
    overrides = {KERNEL_OP: _KERNEL_GRADIENT % gradient} if gradient else {}
    number = kernel_calls.register(call)
    all_dtypes = dtypes + ([tf1.bool] if check else [])
    # an op after another's first-step check: its own first step runs only once that one ran
    with graph.gradient_override_map(overrides), tf1.control_dependencies(
            _checks_before(graph, tensors)):
        device_outputs, host_outputs_ = ops.sok1x_engine_call(
            device_inputs=device_inputs, host_inputs=host_inputs,
            Tout=[all_dtypes[i] for i, k in zip(call.output_order, call.output_kinds)
                  if k == "device"],
            Thost_out=[all_dtypes[i] for i, k in zip(call.output_order, call.output_kinds)
                       if k == "host"],
            function=number, name=name)
    outputs = [None] * len(all_dtypes)
    for i, tensor in zip(call.output_order, list(device_outputs) + list(host_outputs_)):
        outputs[i] = tensor
    if check:
        outputs = _with_first_step_check(
            graph, number, [t for t, k in zip(tensors, kinds) if k != "unread"], outputs,
            output_kinds, name)
    return outputs


CHECK_ENV = "SOK1X_SEAM_CHECK"
_gpus_seen = []


def first_step_checks():
    """Whether kernel ops check their first step (kernel_calls.compare_first_step): where
    TensorFlow sees a GPU (the GPU kernel's C++ half is checked where it first runs), unless
    SOK1X_SEAM_CHECK=0; everywhere with SOK1X_SEAM_CHECK=1 (the CPU kernel's tests)."""
    forced = os.environ.get(CHECK_ENV, "").strip().lower()
    if forced in ("0", "1"):
        return forced == "1"
    if not _gpus_seen:
        lister = getattr(getattr(tf_compat.tf.config, "experimental", None),
                         "list_physical_devices", None)
        _gpus_seen.append(bool(lister("GPU")) if lister is not None else False)
    return _gpus_seen[0]


def _checks_before(graph, tensors, depth=8):
    """The first-step checks of the kernel ops that `tensors` were computed from (within
    `depth` ops): the op made from them waits for them, so each check runs in the step."""
    checks = per_graph(graph, "seam_checks", dict)
    if not checks:
        return []
    found, seen, pending = [], set(), [(t.op, 0) for t in tensors]
    while pending:
        op, level = pending.pop()
        if op.name in seen or level > depth:
            continue
        seen.add(op.name)
        if op.name in checks:
            found.append(checks[op.name])
        pending.extend((t.op, level + 1) for t in op.inputs)
    return found


def _with_first_step_check(graph, number, read, outputs, output_kinds, name):
    """Adds the first-step check of kernel op `number` (its last output: True on its first
    call): a py_func, run that once, handing kernel_calls.compare_first_step TensorFlow's own
    host copies of the read inputs and the outputs. Returns the outputs without the flag, the
    host ones made to wait for the check (an update op's count is what its step runs)."""
    flag, outputs = outputs[-1], outputs[:-1]

    def compare(*values):
        kernel_calls.compare_first_step(number, values)
        return np.int64(0)

    values = list(read) + list(outputs)
    done = tf1.cond(flag, lambda: tf_compat.py_func(compare, values, tf1.int64,
                                                    name + "_seam_check"),
                    lambda: tf1.constant(0, tf1.int64), name=name + "_first_step")
    per_graph(graph, "seam_checks", dict)[flag.op.name] = done.op
    kept = []
    for tensor, kind in zip(outputs, output_kinds):
        if kind == "host":
            with tf1.device("/cpu:0"), tf1.control_dependencies([done]):
                tensor = tf1.identity(tensor)
        kept.append(tensor)
    return kept


def host_op(function, inputs, output_dtypes, name, gradient=None):
    """Returns the outputs of a new op running `function` on host NumPy values and returning
    host values (a tower's ticker, a table's flags, work the engine does on the host): on the
    kernel path a Sok1xEngineCall op whose every input and output is in host memory, else a
    py_func. gradient: a name registered with register_gradient. Graph mode only."""
    if seam_path() != KERNELS:
        with tf1.get_default_graph().gradient_override_map(
                {"PyFunc": gradient} if gradient else {}):
            return tf_compat.py_func(function, inputs, output_dtypes, name)
    single = not isinstance(output_dtypes, (list, tuple))
    count = 1 if single else len(output_dtypes)
    outputs = _kernel_op(function, inputs, output_dtypes, name, gradient,
                         frozenset(range(len(inputs))), frozenset(range(count)), None,
                         frozenset(), check=False)  # host memory only: nothing GPU to check
    return outputs[0] if single else outputs
