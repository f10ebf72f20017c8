"""The seam between TensorFlow and the engine (DESIGN D1): the one place where a step's tensors
cross to sok1x and back. Every per-step graph op (lookups, their gradients, table updates) is
made here by engine_op(); nothing else converts tensors.

Two paths, chosen once when an op is built:

    zero-copy (TensorFlow >= 2.2)   a tf.py_function. Each input tensor crosses as a DLPack capsule
                                    that the backend reads in place (a GPU tensor stays on the
                                    GPU); outputs cross back as capsules TensorFlow adopts.
    host staging (TensorFlow 1.15)  a tf.compat.v1.py_func, which hands over NumPy arrays. On cuda
                                    they go through page-locked buffers kept across steps, one
                                    asynchronous copy each way on the engine's stream.

SOK1X_SEAM=dlpack or =host forces one (the tests run both on the TensorFlow they have).

Stream order on cuda: TensorFlow queues its kernels on its own (blocking) streams, sok1x on its
stream. Before the engine reads an input, backend.wait_for_framework() makes sok1x's stream wait
on the GPU for the work queued before; before outputs go back, backend.release_to_framework()
makes TensorFlow's later work wait for sok1x's. Neither waits on the host.
"""
import os

import numpy as np

from sok1x.engine import runtime
from sok1x.graph_ops import tf_compat
from sok1x.graph_ops.tf_compat import tf1

SEAM_ENV = "SOK1X_SEAM"
ZERO_COPY, HOST_STAGING = "dlpack", "host"
_OP_TYPES = {ZERO_COPY: "EagerPyFunc", HOST_STAGING: "PyFunc"}


def seam_path():
    """Returns ZERO_COPY where TensorFlow has DLPack, else HOST_STAGING, unless SOK1X_SEAM forces
    one; raises ValueError for a value it does not know or dlpack on a TensorFlow without it."""
    forced = os.environ.get(SEAM_ENV, "").strip().lower()
    if forced not in ("", ZERO_COPY, HOST_STAGING):
        raise ValueError("%s=%r: use %r or %r" % (SEAM_ENV, forced, ZERO_COPY, HOST_STAGING))
    if forced == ZERO_COPY and not tf_compat.HAS_DLPACK:
        raise ValueError("%s=dlpack, but TensorFlow %s has no DLPack (2.2 or newer has); use "
                         "%s=host" % (SEAM_ENV, ".".join(map(str, tf_compat.VERSION)), SEAM_ENV))
    if forced:
        return forced
    return ZERO_COPY if tf_compat.HAS_DLPACK else HOST_STAGING


def op_type(path=None):
    """The TensorFlow op type engine_op makes on `path` (for gradient_override_map)."""
    return _OP_TYPES[path or seam_path()]


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
    arrays = _inputs_to_engine(path, backend, tensors, host_positions, unread)
    backend.wait_for_framework()
    results = function(*arrays)
    backend.release_to_framework()
    results = [results] if len(dtypes) == 1 and not isinstance(results, (list, tuple)) else results
    return [tf1.convert_to_tensor(np.array(backend.to_host(r), dtype=d.as_numpy_dtype))
            for r, d in zip(results, dtypes)]


def engine_op(function, inputs, output_dtypes, name, gradient=None, host_inputs=(),
              prepare=None, unread_inputs=()):
    """Returns the outputs of a new op that runs `function` in the engine.

    function(*arrays) takes backend arrays (NumPy on cpu, device arrays on cuda) and returns one
    backend array or NumPy value per output dtype (one, or a list when output_dtypes is a list).
    inputs: tensors; host_inputs: positions of inputs to hand over as NumPy values (tokens and
    other small control values); prepare(): runs first, before any conversion (brings sok1x up,
    makes tables). gradient: the name of a registered gradient for this op (graph mode; executing
    eagerly the function runs at once, and a gradient comes from tf.custom_gradient).
    unread_inputs: positions of inputs the function does not read (a lookup's handle variables,
    there for the gradient): they do not cross, and the function gets None."""
    path = seam_path()
    single = not isinstance(output_dtypes, (list, tuple))
    dtypes = [tf1.as_dtype(d) for d in ([output_dtypes] if single else output_dtypes)]
    host_positions, unread = frozenset(host_inputs), frozenset(unread_inputs)
    if tf1.executing_eagerly():
        outputs = _call_now(path, function, inputs, dtypes, host_positions, prepare, unread)
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
