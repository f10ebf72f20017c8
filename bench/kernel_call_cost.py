"""What one call of sok1x's TensorFlow kernels costs the host beside the engine's own work
(engine/kernel_calls.py's on_call: the record read, the inputs taken in place, the streams
ordered, the outputs lent, and TensorFlow's release of each lent output), on calls whose engine
function does nothing:

    python bench/kernel_call_cost.py --backend cuda    # a GPU op: device inputs and outputs
    python bench/kernel_call_cost.py --backend cpu     # TensorFlow's CPU kernel

Three ops shaped as a training step's (forward: keys in, vectors and a token out; backward: the
token and the top gradient in, values and rows out; update: values and rows in, a count out),
each called --calls times a repeat on one CallRecord packed once (TensorFlow's kernel packs its
own in C++, which is not timed here), every lent output released after its call as TensorFlow
releases it when it drops the tensor. Per op: microseconds a call, median of --repeats repeats
(min-max), and the Python function calls a call makes (cProfile's count, C functions included).
"""
import cProfile
import ctypes
import pstats
import sys
import time

import numpy as np

from sok1x.engine import kernel_calls, runtime

import harness

BATCH, DIM = 16384, 128


def parse_args(argv):
    parser = harness.parser(__doc__, out={"required": False, "default": None},
                            backend={"default": "cpu"}, repeats=7)
    parser.add_argument("--calls", type=int, default=2000, help="calls of each op a repeat")
    return parser.parse_args(argv)


class Ops:
    """The three ops, their engine arrays and their packed records."""

    def __init__(self, backend, on_gpu):
        with runtime.entered():  # (aligned, as the engine's outputs are: lent, not copied)
            self.keys = backend.asarray(np.arange(BATCH, dtype=np.int64))
            self.vectors = backend.exportable(backend.zeros((BATCH, DIM), np.float32))
            self.rows = backend.exportable(backend.asarray(np.arange(BATCH, dtype=np.int64)))
        token = np.array([7], dtype=np.int64)
        self.calls = [
            kernel_calls.KernelCall(lambda keys: [self.vectors, np.int64(7)], ["device"],
                                    ["device", "host"], [np.float32, np.int64], "forward"),
            kernel_calls.KernelCall(lambda token, grads: [self.vectors, self.rows],
                                    ["host", "device"], ["device", "device"],
                                    [np.float32, np.int64], "backward"),
            kernel_calls.KernelCall(lambda values, rows: np.int64(0), ["device", "device"],
                                    ["host"], np.int64, "update")]
        numbers = [kernel_calls.register(call) for call in self.calls]

        def described(array):
            if isinstance(array, np.ndarray):
                return array.__array_interface__["data"][0], array.dtype, array.shape
            return backend.address_of(array), array.dtype, tuple(array.shape)
        # the op's device inputs first, then its host inputs (engine_call_op.cc's order)
        inputs = [[described(self.keys)], [described(self.vectors), described(token)],
                  [described(self.vectors), described(self.rows)]]
        self.token = token  # (its memory is the backward's host input)
        self.packed = [kernel_calls.pack_call(number, op_inputs, on_gpu)
                       for number, op_inputs in zip(numbers, inputs)]
        self.names = [call.name for call in self.calls]

    def call(self, op, count):
        """`count` calls of op `op`, each output lent released after the call."""
        record, allocated = self.packed[op]
        address, allocate, outputs = ctypes.addressof(record), allocated.allocate, \
            allocated.outputs
        unpack, size, release = kernel_calls.TENSOR_RECORD.unpack_from, \
            kernel_calls.TENSOR_RECORD.size, kernel_calls.release
        places = range(allocated.count)
        for _ in range(count):
            if kernel_calls.on_call(address, allocate) != 0:
                raise RuntimeError(allocated.message.value.decode())
            for place in places:
                keep = unpack(outputs, place * size)[1]
                if keep:
                    release(keep)


def main(argv):
    args = parse_args(argv)
    rt = harness.start_engine(args.backend)
    on_gpu = rt.backend.NAME == "cuda"
    ops = Ops(rt.backend, on_gpu)
    payload = {"backend": args.backend, "on_gpu": on_gpu, "calls": args.calls,
               "repeats": args.repeats, "environment": harness.environment({}), "ops": []}
    for op, name in enumerate(ops.names):
        ops.call(op, 50)  # warm: the first call's checks, the shapes' fields
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            ops.call(op, args.calls)
            times.append((time.perf_counter() - started) * 1e6 / args.calls)
        profiler = cProfile.Profile()
        profiler.enable()
        ops.call(op, 100)
        profiler.disable()
        python_calls = pstats.Stats(profiler).total_calls / 100
        entry = {"op": name, "us_per_call": float(np.median(times)), "us_min": min(times),
                 "us_max": max(times), "python_calls": python_calls}
        payload["ops"].append(entry)
        harness.say("%-8s %s: %.2f us a call (%.2f-%.2f), %.0f Python calls" % (
            name, "GPU op" if on_gpu else "CPU op", entry["us_per_call"], entry["us_min"],
            entry["us_max"], python_calls))
    if kernel_calls.lent_count():
        raise RuntimeError("%d outputs still lent" % kernel_calls.lent_count())
    rt.backend.synchronize()
    if args.out:
        harness.write_json(args.out, payload)
    harness.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
