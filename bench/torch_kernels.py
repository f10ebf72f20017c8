"""PyTorch as TensorFlow at sok1x's kernel seam (DESIGN D1; sok1x/engine/kernel_calls.py), for the
benchmarks: an op is a registered KernelCall, called with its tensors' addresses and the
framework's CUDA stream, as graph_ops/engine_call_op.cc's kernel calls it; device outputs come
back lent and become torch tensors over the engine's memory, host outputs (a token) come back as
host values. What TensorFlow's kernel does in C++ (the records in and out, the tensors) is done
here in Python: TorchKernels.stand_in_s adds up its time, so that a report can say what the seam
costs without it.
"""
import ctypes
import time

import numpy as np
import torch
from torch.utils import dlpack as torch_dlpack

from sok1x.backend import dlpack
from sok1x.engine import kernel_calls

_TORCH_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


class Lent:
    """What keeps an output the engine lent: its memory goes back to the engine when PyTorch
    drops the tensor, as TensorFlow's tensor gives it back through the kernel."""
    __slots__ = ("keep",)

    def __init__(self, keep):
        self.keep = keep

    def __del__(self):
        kernel_calls.release(self.keep)


class LentDevice(Lent):
    """A lent device output as PyTorch reads it in place (its CUDA array interface, which
    torch.as_tensor takes without a copy and holds as the tensor's owner)."""
    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, output):
        super().__init__(output.keep)
        self.__cuda_array_interface__ = {"data": (output.address, False), "shape": output.shape,
                                         "typestr": output.dtype.str, "version": 2}


def described(value):
    """(address, NumPy dtype, shape) of a torch tensor or a NumPy array (a host output)."""
    if torch.is_tensor(value):
        return value.data_ptr(), _TORCH_DTYPES[value.dtype], tuple(value.shape)
    return value.__array_interface__["data"][0], value.dtype, value.shape


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
        """Calls KernelCall `number` on torch tensors `tensors` (device inputs) and host values
        `hosts`, ordered after `stream`; returns its outputs (torch tensors, host values)."""
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
        """A lent output as a torch tensor over its memory (TensorFlow's kernel makes its tensor
        in C++; here PyTorch's cheapest way in: the CUDA array interface on a GPU, else a
        DLPack capsule); host bytes as they are."""
        if not output.keep:
            return output.host
        if self.on_gpu:
            return torch.as_tensor(LentDevice(output), device=self.device)
        return torch_dlpack.from_dlpack(dlpack.export_capsule(
            output.address, output.shape, output.dtype, *self.where, Lent(output.keep)))
