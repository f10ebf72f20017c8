"""PyTorch as TensorFlow at sok1x's kernel seam (DESIGN D1; sok1x/engine/kernel_calls.py), for the
benchmarks: an op is a registered KernelCall, called with its tensors' addresses and the
framework's CUDA stream, as graph_ops/engine_call_op.cc's kernel calls it; device outputs come
back lent, held as LentOutputs (the record TensorFlow's tensor keeps: address, dtype, shape) and
read as torch tensors over the engine's memory where the framework computes with them, host
outputs (a token) come back as host values. What TensorFlow's kernel does in C++ (the records
in and out, the tensors) is done here in Python: TorchKernels.stand_in_s adds up its time, so
that a report can say what the seam costs without it.
"""
import ctypes
import time

import numpy as np
import torch
from torch.utils import dlpack as torch_dlpack

from sok1x.backend import dlpack
from sok1x.engine import kernel_calls

_TORCH_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


class LentOutput:
    """A device output the engine lent, as TensorFlow's kernel holds it: the memory's record
    (address, dtype, shape) in a tensor that TensorFlow hands to the next op as it is. Its
    memory goes back to the engine when the framework drops it. A framework op that computes
    with it reads it through tensor() (PyTorch over the same memory, no copy); the ops of a step
    that only pass it to the next kernel (the lookup's output as the backward's top gradient)
    make none, as TensorFlow makes no Python object for a tensor between two kernels."""
    __slots__ = ("address", "dtype", "shape", "keep", "device")

    def __init__(self, output, device):
        self.address, self.dtype, self.shape = output.address, output.dtype, output.shape
        self.keep, self.device = output.keep, device

    def tensor(self):
        """The output as a torch tensor over its memory (the tensor keeps this alive)."""
        return torch.as_tensor(_CudaMemory(self), device=self.device)

    def __del__(self):
        kernel_calls.release(self.keep)


class _CudaMemory:
    """A LentOutput as PyTorch reads it in place (its CUDA array interface, which
    torch.as_tensor takes without a copy, holding this as the tensor's owner)."""
    __slots__ = ("lent", "__cuda_array_interface__")

    def __init__(self, lent):
        self.lent = lent
        self.__cuda_array_interface__ = {"data": (lent.address, False), "shape": lent.shape,
                                         "typestr": lent.dtype.str, "version": 2}


class Lent:
    """What keeps an output the engine lent on the CPU: its memory goes back to the engine when
    PyTorch drops the tensor."""
    __slots__ = ("keep",)

    def __init__(self, keep):
        self.keep = keep

    def __del__(self):
        kernel_calls.release(self.keep)


def described(value):
    """(address, NumPy dtype, shape) of a torch tensor, a LentOutput or a NumPy array (a host
    output)."""
    if type(value) is LentOutput:
        return value.address, value.dtype, value.shape
    if torch.is_tensor(value):
        return value.data_ptr(), _TORCH_DTYPES[value.dtype], tuple(value.shape)
    return value.__array_interface__["data"][0], value.dtype, value.shape


def as_torch(value):
    """An op's output as the framework computes with it: a torch tensor (a LentOutput read in
    place) or the host value."""
    return value.tensor() if type(value) is LentOutput else value


class TorchKernels:
    """The kernel seam with PyTorch as the framework on `device` (a torch.device)."""

    def __init__(self, device):
        self.on_gpu = device.type == "cuda"
        self.device = device
        self.where = ((dlpack.DEVICE_CUDA, torch.cuda.current_device()) if self.on_gpu
                      else (dlpack.DEVICE_CPU, 0))
        self.calls = []
        self.stand_in_s = 0.0

    def register(self, function, inputs, outputs, dtypes):
        """Registers KernelCall(function, inputs, outputs, dtypes); returns its number."""
        call = kernel_calls.KernelCall(function, inputs, outputs, dtypes, "bench")
        self.calls.append(call)
        return kernel_calls.register(call)

    def stream(self):
        """The framework's CUDA stream as a CUstream (0 on CPU): what TensorFlow's op context
        hands each kernel of its device. A step asks once and passes it to its ops."""
        started = time.perf_counter()
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.on_gpu else 0
        self.stand_in_s += time.perf_counter() - started
        return stream

    def op(self, number, tensors, hosts=(), stream=0):
        """Calls KernelCall `number` on torch tensors or LentOutputs `tensors` (device inputs)
        and host values `hosts`, ordered after `stream`; returns its outputs (LentOutputs on a
        GPU, torch tensors on the CPU, host values)."""
        started = time.perf_counter()
        inputs = [described(t) for t in tensors]
        inputs.extend(described(h) for h in hosts)
        record, allocated = kernel_calls.pack_call(number, inputs, self.on_gpu, stream)
        entered = time.perf_counter()
        if kernel_calls.on_call(ctypes.addressof(record), allocated.allocate) != 0:
            raise RuntimeError(allocated.message.value.decode())
        left = time.perf_counter()
        outputs = [self._tensor(o) for o in kernel_calls.unpack_outputs(number, allocated)]
        self.stand_in_s += entered - started + time.perf_counter() - left
        return outputs

    def _tensor(self, output):
        """A lent output as the framework holds it (TensorFlow's kernel makes its tensor in
        C++): on a GPU a LentOutput (as_torch() reads it), on the CPU a torch tensor through a
        DLPack capsule; host bytes as they are."""
        if not output.keep:
            return output.host
        if self.on_gpu:
            return LentOutput(output, self.device)
        return torch_dlpack.from_dlpack(dlpack.export_capsule(
            output.address, output.shape, output.dtype, *self.where, Lent(output.keep)))
