"""The Python half of sok1x's TensorFlow kernels (DESIGN D1), framework-free.

graph_ops/engine_call_op.cc's kernel (op Sok1xEngineCall, on CPU and GPU) calls on_call() with
one CallRecord: the number of a registered KernelCall, TensorFlow's input buffers (addresses,
dtypes, shapes: device inputs, then host inputs), on GPU the op's CUDA stream, and room for the
outputs. on_call() reads the inputs in place as backend arrays, orders the engine's stream after
TensorFlow's (events, never a synchronize), runs the call's function, orders TensorFlow's stream
after the engine's, and writes one TensorRecord per output:

    keep != 0   the engine's array is lent: the output IS its memory (no copy, on the device or
                the host, 64-byte aligned as TensorFlow requires); TensorFlow calls release(keep)
                when it drops the tensor. engine/lent_memory.py keeps the record, so that a
                replayed step never writes memory TensorFlow still holds
    keep == 0   an output TensorFlow allocated (sok1x_allocate_output) and on_call filled with
                the result's bytes: small and unaligned host outputs, every host output on GPU,
                and empty outputs

An input the engine still holds after the call (the stash of a forward pass keeps a view of its
keys, say) is retained through the C library (sok1x_retain_input), so TensorFlow cannot reuse its
memory while the engine reads it, and released when the engine drops it.

The first-step check (DESIGN D1; TensorFlow cannot run on the GPU machines here, so the GPU
kernel's C++ half is checked where it first runs): an op built with check=True has one more host
output, True on its first call, when on_call also keeps host copies of what it read and what it
handed back; a py_func that TensorFlow runs then (graph_ops/boundary.py) hands
compare_first_step() TensorFlow's own host copies of the same tensors. On any difference this
rank falls back at once, and asks the others through the next op header
(engine/lookup/exchange_header.py): from then on every rank's calls cross by host staging (the
whole device waited for before inputs are read, the inputs copied through the host, the outputs
complete before the call returns), each rank saying so once.

Nothing here needs TensorFlow: the GPU tests drive on_call() with PyTorch's pointers and stream
standing in (tests/gpu/test_kernel_calls_cuda.py), and graph_ops/op_library.py attaches it to
the compiled library with attach().
"""
import collections
import ctypes
import functools
import itertools
import struct
import sys
import traceback
import weakref

import numpy as np

from sok1x.backend import dlpack
from sok1x.engine import lent_memory, runtime

MAX_DIMS = 8
TENSOR_RECORD = struct.Struct("=QQqqq%dq" % MAX_DIMS)  # data, keep, code, bits, ndim, dims
CALL_RECORD = struct.Struct("=qqQQqQqQqQq")
CALL_FUNCTION = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)
RELEASE_FUNCTION = ctypes.CFUNCTYPE(None, ctypes.c_uint64)
_ERROR_CODE_AT = 8 * 8  # CallRecord.error_code's offset
_ALIGNMENT = 64
_NO_DIMS = (0,) * MAX_DIMS

# TensorFlow's error codes for Python exceptions, as py_func maps them.
INVALID_ARGUMENT, UNKNOWN, RESOURCE_EXHAUSTED, OUT_OF_RANGE, UNIMPLEMENTED = 3, 2, 8, 11, 12
_CODES = ((StopIteration, OUT_OF_RANGE), ((ValueError, TypeError), INVALID_ARGUMENT),
          (MemoryError, RESOURCE_EXHAUSTED), (NotImplementedError, UNIMPLEMENTED))

_calls = {}  # number -> weak reference to its KernelCall (its graph holds it)
_numbers = itertools.count(1)
_library = {}  # "retain", "release", "allocate": the C library's functions, once attached


class KernelCall:
    """One graph op's call into the engine.

    function(*arrays) -> one result or a list, as boundary.engine_op's; inputs: per input of the
    function "device", "host" (a NumPy value) or "unread" (None, nothing read); outputs: per
    result "device" or "host" (a host value: tokens, counts); output_dtypes: NumPy dtypes;
    prepare(): runs first (brings sok1x up); name: the op's, for errors."""

    def __init__(self, function, inputs, outputs, output_dtypes, name, prepare=None,
                 check=False):
        self.function, self.prepare, self.name = function, prepare, name
        self.single = not isinstance(output_dtypes, (list, tuple))
        self.output_dtypes = [np.dtype(d) for d in ([output_dtypes] if self.single
                                                    else output_dtypes)]
        outputs = list(outputs)
        self.check = check  # one more host output: True on the first call (the check's)
        if check:
            outputs.append("host")
            self.output_dtypes.append(np.dtype(np.bool_))
        self.first_seen = None  # (what the first call read, what it handed back), op order
        self.first_done = False
        kinds = list(inputs)
        # the op takes device inputs first, then host inputs (graph_ops/engine_call_op.cc)
        self.input_order = ([i for i, k in enumerate(kinds) if k != "host"]
                            + [i for i, k in enumerate(kinds) if k == "host"])
        self.input_kinds = [kinds[i] for i in self.input_order]
        self.kinds = kinds  # per argument of the function
        self.output_order = ([i for i, k in enumerate(outputs) if k == "device"]
                             + [i for i, k in enumerate(outputs) if k == "host"])
        self.output_kinds = [outputs[i] for i in self.output_order]
        # per output of the op (its order): the result's place, dtype and DLPack type code
        self.outputs = [(i, kind, self.output_dtypes[i], dlpack.type_code(self.output_dtypes[i]))
                        for i, kind in zip(self.output_order, self.output_kinds)]
        self.checked_device = False

    def __call__(self, *arrays, first=False):
        results = self.function(*arrays)
        results = [results] if self.single else list(results)
        if self.check:
            results.append(np.bool_(first))
        return results


def register(call):
    """Returns the number the op's attr carries for KernelCall `call`. The registry holds it
    weakly: keep `call` alive as long as the op may run (its graph holds it)."""
    number = next(_numbers)
    _calls[number] = weakref.ref(call, lambda _, number=number: _calls.pop(number, None))
    return number


def call_of(number):
    """The KernelCall registered as `number`, or None when its graph is gone."""
    reference = _calls.get(number)
    return None if reference is None else reference()


def _code(exception):
    for kinds, code in _CODES:
        if isinstance(exception, kinds):
            return code
    return UNKNOWN


def _write_error(address, fields, exception):
    """Writes the error code and message of `exception` into the CallRecord at `address`."""
    text = "%s: %s\n%s" % (type(exception).__name__, exception,
                           "".join(traceback.format_tb(exception.__traceback__)))
    data = text.encode("utf-8", "replace")[:max(fields[10] - 1, 0)] + b"\0"
    ctypes.memmove(fields[9], data, len(data))
    ctypes.memmove(address + _ERROR_CODE_AT, struct.pack("=q", _code(exception)), 8)


class _Input:
    """Owner of one borrowed input's memory: retained through the C library when the engine
    keeps it past the call, released when the engine drops it."""
    __slots__ = ("handle",)

    def __init__(self):
        self.handle = None

    def __del__(self):
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                _library["release"](handle)
            except Exception:  # at exit: the library detached, or this module torn down
                pass


def _read_inputs(backend, call, fields, on_gpu):
    """Returns (the function's arguments, the owners of the borrowed inputs)."""
    count = fields[4]
    raw = ctypes.string_at(fields[5], count * TENSOR_RECORD.size) if count else b""
    arguments = [None] * len(call.input_order)
    owners = []
    numpy_dtype, borrow, host_backend = dlpack.numpy_dtype, backend.borrow, backend.NAME == "cpu"
    for (data, _, code, bits, ndim, *dims), kind, place in zip(
            TENSOR_RECORD.iter_unpack(raw), call.input_kinds, call.input_order):
        if kind == "unread":
            owners.append(None)
            continue
        dtype = numpy_dtype(code, bits)
        shape = tuple(dims[:ndim])
        owner = _Input()
        owners.append(owner)
        if kind == "host" or not on_gpu:
            array = np.asarray(_HostView(data, shape, dtype, owner)) if data else np.zeros(
                shape, dtype)
            if kind == "device" and not host_backend:  # the op on TensorFlow's CPU
                array = backend.upload_staged(array)
            arguments[place] = array
            continue
        if not call.checked_device and data:
            _check_device(backend, call, data, len(owners) - 1)
        arguments[place] = borrow(data, shape, dtype, owner)
    call.checked_device = True
    return arguments, owners


def _check_device(backend, call, address, index):
    """On a call's first step: TensorFlow's device input lies on sok1x's GPU."""
    if backend.NAME == "cpu":
        raise RuntimeError(
            "%s: TensorFlow placed this op on a GPU, but sok1x runs on its cpu backend; "
            "give sok1x.Init backend='cuda' (or 'auto'), or place the model on the CPU"
            % call.name)
    device, own = backend.memory_device(address), backend.device_ordinal()
    if device != own:
        raise RuntimeError(
            "%s: input %d is not in the memory of sok1x's GPU (it is on %s): place the op on "
            "this rank's GPU (one GPU per rank; TensorFlow's visible_device_list)"
            % (call.name, index, "host memory" if device is None else "GPU %d" % device))


class _HostView:
    """Host memory TensorFlow owns, as NumPy sees it; keeps its owner alive."""
    __slots__ = ("_owner", "__array_interface__")

    def __init__(self, address, shape, dtype, owner):
        self._owner = owner
        self.__array_interface__ = {"data": (address, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}


_OWNED_ONCE = 2  # sys.getrefcount of an owner only the owners list holds (and the argument)


def _retain_kept(address, owners):
    """Retains, through the C library, each input whose owner something besides the owners
    list still holds once the call is over: the engine keeps a view of it."""
    retain = _library.get("retain")
    if retain is None:
        return
    for index, owner in enumerate(owners):
        if owner is not None and sys.getrefcount(owner) > _OWNED_ONCE:
            owner.handle = retain(address, index)


_HOST_RESULTS = (np.ndarray, np.generic, int, float, bool)  # a function's host results
_SMALL_BYTES = 4096  # host results up to this size are copied out through bytes


def _output_record(backend, result, dtype, code_bits, kind, on_gpu, allocate, index, lend=True):
    """The TensorRecord of output `index`, `result`: lent, or copied into allocate(index, shape)
    (an output TensorFlow allocated: its address; every host result when not `lend`)."""
    host = isinstance(result, _HOST_RESULTS)
    if host:
        result = np.asarray(result, dtype=dtype)
        if not result.flags.c_contiguous:  # (ascontiguousarray would make a scalar 1-D)
            result = np.ascontiguousarray(result)
        if kind == "device" and on_gpu:
            result = backend.asarray(result)
            host = False
    elif result.dtype != dtype:
        raise TypeError("engine result of dtype %s where the op declares %s"
                        % (result.dtype, dtype))
    elif not on_gpu:  # a device result of an op TensorFlow placed on its CPU
        result, host = np.array(backend.to_host(result), order="C"), True
    shape = result.shape
    tail = _record_tail(shape, code_bits)  # (raises for too many dims, before any lending)
    keep = 0
    if not result.size:
        address = 0
        allocate(index, shape)
    elif host:
        copied = on_gpu or not lend
        # tokens, counts: copied out through their bytes, no address asked for
        address = (0 if copied and result.nbytes <= _SMALL_BYTES
                   else result.__array_interface__["data"][0])
        # lent where TensorFlow can take it (the engine knows its own rows by their memory)
        if not copied and not address % _ALIGNMENT:
            keep = lent_memory.lend(result, address, result.nbytes)
        else:
            ctypes.memmove(allocate(index, shape), address or result.tobytes(), result.nbytes)
            address = 0
    else:
        result = backend.exportable(result)
        address = backend.address_of(result)
        keep = lent_memory.lend(result, address, result.nbytes)
    return _RECORD_HEAD.pack(address, keep) + tail


_RECORD_HEAD = struct.Struct("=QQ")  # a TensorRecord's data and keep
_TAILS = {}  # (shape, (code, bits)) -> the rest of a TensorRecord, packed (_record_tail)
_TAILS_KEPT = 1024  # at most this many kept, then forgotten at once (wrap_again's reason)


def _record_tail(shape, code_bits):
    """A TensorRecord's fields after data and keep (DLPack code and bits, ndim, dims) for an
    output of `shape` (a tuple) and `code_bits`, packed; raises ValueError past MAX_DIMS."""
    key = (shape, code_bits)
    tail = _TAILS.get(key)
    if tail is None:
        if len(shape) > MAX_DIMS:
            raise ValueError("an engine result of %d dims (at most %d cross)" % (len(shape),
                                                                                  MAX_DIMS))
        tail = TENSOR_RECORD.pack(0, 0, code_bits[0], code_bits[1], len(shape),
                                  *(tuple(shape) + _NO_DIMS[len(shape):]))[_RECORD_HEAD.size:]
        if len(_TAILS) >= _TAILS_KEPT:
            _TAILS.clear()
        _TAILS[key] = tail
    return tail


def on_call(address, allocator=None):
    """The kernel's callback: runs the KernelCall of the CallRecord at `address`; returns 0, or
    1 with the error written into the record (TensorFlow raises it from sess.run).
    allocator(index, shape) -> address: TensorFlow's output allocation (default: the C
    library's sok1x_allocate_output)."""
    fields = CALL_RECORD.unpack(ctypes.string_at(address, CALL_RECORD.size))
    owners, records = (), []
    try:
        call = call_of(fields[0])
        if call is None:
            raise RuntimeError("no sok1x engine call %d in this process (an op of a graph "
                               "imported from another process?)" % fields[0])
        if call.prepare is not None:
            call.prepare()
        with runtime.entered() as rt:  # the device context made current once for the call
            backend = rt.backend
            on_gpu, stream = bool(fields[1]), fields[2]
            staging = _seam["fallback"]
            if staging and on_gpu:
                backend.synchronize_device()  # TensorFlow's work, whatever stream it is on
            arguments, owners = _read_inputs(backend, call, fields, on_gpu)
            if on_gpu and not staging:
                after_framework, framework_after = backend.framework_orders()
                after_framework(stream)
                lent_memory.calling(after_framework, stream)
            if staging:
                arguments = [_staged(backend, a, k) for a, k in zip(arguments, call.kinds)]
            first = call.check and not call.first_done
            if first:
                read = [_host_copy(backend, a) for a, k in zip(arguments, call.kinds)
                        if k != "unread"]
            results = call(*arguments, first=first)
            del arguments
            if first:  # what it hands back (the check flag left out)
                call.first_seen = read + [_host_copy(backend, r) for r in results[:-1]]
                call.first_done = True
            allocator = allocator or functools.partial(_allocate, address)
            try:
                for index, (i, kind, dtype, code_bits) in enumerate(call.outputs):
                    records.append(_output_record(backend, results[i], dtype, code_bits, kind,
                                                  on_gpu, allocator, index, lend=not staging))
                del results
                if on_gpu and staging:
                    backend.synchronize()  # the outputs complete before TensorFlow gets them
                elif on_gpu:
                    framework_after(stream)
            except BaseException:  # TensorFlow never gets these records, nor releases them
                for record in records:
                    lent_memory.release(TENSOR_RECORD.unpack_from(record)[1])
                raise
        if records:
            ctypes.memmove(fields[7], b"".join(records), len(records) * TENSOR_RECORD.size)
        _retain_kept(address, owners)
        return 0
    except BaseException as exc:  # every error goes back to TensorFlow, never through C
        _write_error(address, fields, exc)
        exc.__traceback__ = None
        del exc
        _retain_kept(address, owners)
        return 1
    finally:
        lent_memory.calling(None)


_seam = {"fallback": False, "asked": None, "said": False}


def _host_copy(backend, value):
    """A host NumPy copy of an argument or a result (a device array downloaded: one wait)."""
    if isinstance(value, (np.ndarray, np.generic)) or np.isscalar(value):
        return np.array(value)
    return np.array(backend.to_host(value))


def _staged(backend, value, kind):
    """An argument as host staging hands it over: engine memory of its own (a copy)."""
    if kind == "unread" or value is None:
        return value
    if kind == "host" or isinstance(value, np.ndarray):
        return np.array(value)
    return backend.asarray(np.array(backend.to_host(value)))


def compare_first_step(number, values):
    """The first-step check of KernelCall `number`: `values` are TensorFlow's host copies of
    the function's read arguments, then of its results (the check flag left out), in their
    order. On any difference this rank falls back to host staging and asks every rank to.
    Returns the difference found, or None."""
    call = call_of(number)
    seen = None if call is None else call.first_seen
    if seen is None:
        return None
    call.first_seen = None
    names = (["input %d" % i for i, kind in enumerate(call.kinds) if kind != "unread"]
             + ["output %d" % i for i in range(len(call.output_dtypes) - 1)])
    for name, mine, theirs in zip(names, seen, values):
        difference = _differ(mine, np.asarray(theirs))
        if difference:
            reason = "%s: %s %s" % (call.name, name, difference)
            _fall_back_here(reason)
            return reason
    return None


def _differ(mine, theirs):
    """Why two host arrays differ (shape, dtype or bytes), or None when bit for bit equal."""
    if mine.shape != theirs.shape:
        return "has shape %s in the engine, %s in TensorFlow" % (list(mine.shape),
                                                                 list(theirs.shape))
    if mine.dtype != theirs.dtype:
        return "is %s in the engine, %s in TensorFlow" % (mine.dtype, theirs.dtype)
    if mine.tobytes() != theirs.tobytes():
        return "holds other bytes in the engine than in TensorFlow"
    return None


def _fall_back_here(reason):
    """This rank crosses by host staging from now on and asks the others to (next header)."""
    _seam.update(fallback=True, asked=reason)
    _say_fallback("this rank found %s" % reason)


def fallback_asked():
    """True while this rank has a fallback to host staging to tell the other ranks of."""
    return _seam["asked"] is not None


def fall_back_with(ranks):
    """An op header told this rank that `ranks` fell back to host staging: so does this one."""
    if _seam["asked"] is not None:
        _seam["asked"] = None  # every rank heard it in this header
    if not _seam["fallback"]:
        _seam["fallback"] = True
        _say_fallback("rank(s) %s found a difference" % ", ".join(map(str, ranks)))


def _say_fallback(why):
    if _seam["said"]:
        return
    _seam["said"] = True
    import warnings
    warnings.warn(
        "sok1x: the first-step check of its TensorFlow GPU kernels failed (%s): what the kernel "
        "handed the engine, or back, is not what TensorFlow holds. From now on this job's graph "
        "ops cross by host staging, on every rank (slower, and correct). Please report it with "
        "your TensorFlow and CUDA versions; SOK1X_SEAM=host keeps it so from the start."
        % why, RuntimeWarning, stacklevel=2)


def fallen_back():
    """True once this process's calls cross by host staging (the first-step check failed)."""
    return _seam["fallback"]


def _allocate(address, index, shape):
    """Output `index` of the call at `address`, of `shape`, allocated by TensorFlow (the C
    library's sok1x_allocate_output); returns its address (0 for no elements)."""
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    failed = ctypes.c_int64(0)
    data = _library["allocate"](address, index, len(shape), dims, ctypes.byref(failed))
    if failed.value:
        raise MemoryError("TensorFlow could not allocate an output of shape %s" % list(shape))
    return data or 0


Output = collections.namedtuple("Output", "address keep dtype shape host")
Output.__doc__ = """One output as the kernel gets it: the engine's memory lent as `keep` (release
it with release(keep)), or, keep 0, `host` a NumPy copy of host bytes."""


def invoke(number, inputs, on_gpu, stream=0):
    """What graph_ops/engine_call_op.cc's kernel does, for callers without TensorFlow (the GPU
    tests and benchmarks, with PyTorch as the framework): calls on_call() for KernelCall
    `number` on inputs, each (address, NumPy dtype, shape) of device inputs then host inputs
    (the call's input_order). Returns its outputs as Output tuples in the call's output_order;
    raises RuntimeError carrying the error TensorFlow would raise."""
    record, allocated = pack_call(number, inputs, on_gpu, stream)
    if on_call(ctypes.addressof(record), allocated.allocate) != 0:
        raise RuntimeError(allocated.message.value.decode("utf-8", "replace"))
    return unpack_outputs(number, allocated)


class _Allocated:
    """invoke()'s record buffers and the outputs it had allocated (TensorFlow's allocate_output,
    in host memory)."""

    def __init__(self, call, count, inputs):
        self.call, self.count = call, count
        self.inputs = ctypes.create_string_buffer(max(inputs, 1) * TENSOR_RECORD.size)
        self.outputs = ctypes.create_string_buffer(max(count, 1) * TENSOR_RECORD.size)
        self.message = ctypes.create_string_buffer(4096)
        self.record = ctypes.create_string_buffer(CALL_RECORD.size)
        self.arrays = {}

    def allocate(self, index, shape):
        array = np.empty(shape, self.call.output_dtypes[self.call.output_order[index]])
        self.arrays[index] = array
        return array.__array_interface__["data"][0] if array.size else 0


def pack_call(number, inputs, on_gpu, stream=0):
    """invoke()'s first half (the kernel's work before its callback): the CallRecord of a call
    of `number` on `inputs`. Returns (the record, its _Allocated)."""
    call = call_of(number)
    count = len(call.output_order)
    allocated = _invoke_buffers.get((number, len(inputs)))
    if allocated is None:
        allocated = _invoke_buffers[(number, len(inputs))] = _Allocated(call, count, len(inputs))
    allocated.arrays = {}
    for index, (address, dtype, shape) in enumerate(inputs):
        code_bits = _type_codes.get(dtype)
        if code_bits is None:
            code_bits = _type_codes[dtype] = dlpack.type_code(dtype)
        TENSOR_RECORD.pack_into(allocated.inputs, index * TENSOR_RECORD.size, int(address), 0,
                                *code_bits, len(shape), *(tuple(shape) + _NO_DIMS[len(shape):]))
    CALL_RECORD.pack_into(allocated.record, 0, number, int(on_gpu), int(stream), 0,
                          len(inputs), ctypes.addressof(allocated.inputs), count,
                          ctypes.addressof(allocated.outputs), 0,
                          ctypes.addressof(allocated.message), len(allocated.message))
    return allocated.record, allocated


def unpack_outputs(number, allocated):
    """invoke()'s second half (the kernel's work after its callback): the Output tuples."""
    outputs = []
    for index in range(allocated.count):
        address, keep, code, bits, ndim, *dims = TENSOR_RECORD.unpack_from(
            allocated.outputs, index * TENSOR_RECORD.size)
        outputs.append(Output(address, keep, dlpack.numpy_dtype(code, bits),
                              tuple(dims[:ndim]), allocated.arrays.get(index)))
    return outputs


_invoke_buffers = {}  # (number, inputs) -> invoke()'s records, reused
_type_codes = {}  # NumPy dtype -> its DLPack (code, bits), for pack_call


def release(keep):
    """TensorFlow dropped the output lent as `keep`: the engine gets its memory back."""
    lent_memory.release(keep)


def lent_count():
    """How many engine arrays TensorFlow holds as outputs now (for leak tests)."""
    return lent_memory.count()


_callbacks = {}


def attach(library):
    """Connects the compiled op library (a ctypes.CDLL) to on_call() and release(); detached
    again at exit, before Python goes (a tensor TensorFlow frees after that keeps its memory)."""
    if _callbacks.get("library") is library:
        return
    library.sok1x_set_callbacks.argtypes = [CALL_FUNCTION, RELEASE_FUNCTION]
    library.sok1x_retain_input.restype = ctypes.c_void_p
    library.sok1x_retain_input.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    library.sok1x_release_input.argtypes = [ctypes.c_void_p]
    library.sok1x_allocate_output.restype = ctypes.c_void_p
    library.sok1x_allocate_output.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                              ctypes.c_void_p, ctypes.c_void_p]
    call, release_function = CALL_FUNCTION(on_call), RELEASE_FUNCTION(release)
    _callbacks.update(library=library, call=call, release=release_function)
    _library.update(retain=library.sok1x_retain_input, release=library.sok1x_release_input,
                    allocate=library.sok1x_allocate_output)
    library.sok1x_set_callbacks(call, release_function)
    import atexit
    atexit.register(_detach, library)


def _detach(library):
    try:
        library.sok1x_set_callbacks(CALL_FUNCTION(), RELEASE_FUNCTION())
    except Exception:  # the library or ctypes already torn down
        pass
    _library.clear()


