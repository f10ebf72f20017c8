"""What one crossing of the zero-copy seam costs the host, part by part (one process, one GPU):

    python3 bench/seam_crossing.py --out results/seam_crossing.json

The seam (framework_step's sok1x_dlpack, graph_ops/boundary.py for TensorFlow) crosses each op's
tensors as DLPack capsules and orders the two streams with an event each way. Per call, in host
microseconds (median of --repeats repeats of --calls calls, min-max), with PyTorch as the
framework:

    torch_to_dlpack        PyTorch alone: a tensor to a capsule
    import                 sok1x's from_dlpack of such a capsule (the engine's array over it)
    export                 sok1x's to_dlpack of an engine array
    torch_from_dlpack      PyTorch alone: a capsule (sok1x's) to a tensor
    order_both_ways        wait_for_framework + release_to_framework (two events, no host wait)
    engine_array           one pooled engine array made and dropped (the unit of an engine op)
    launch                 one row written through the backend (an array made, filled, and a
                           kernel launched: put_rows)
    kernel_call            one op through sok1x's TensorFlow kernels (framework_step's
                           sok1x_kernels, torch_kernels.py): a device input and a host input
                           read in place, a lent device output and a host output handed back,
                           the two streams ordered; the engine function does nothing
    kernel_call_engine     kernel_call's own part in sok1x (kernel_calls.on_call), less what
                           TensorFlow's C++ does and PyTorch's stand-in does in Python

Together these say what a step's seam adds per op beside the engine's own per-op cost.
"""

import numpy as np

import harness
import torch_kernels


def main():
    args = harness.parser(__doc__, out=True, repeats=15).parse_args()
    import torch
    import torch.utils.dlpack as torch_dlpack
    from sok1x.engine import runtime
    rt = harness.start_engine("cuda")
    harness.start_torch(rt, 29500)
    backend = rt.backend
    calls = 200
    keys = torch.arange(26 * 2048, device="cuda", dtype=torch.int64)
    table = backend.zeros((26 * 2048, 128), np.float32)
    rows = backend.asarray(np.arange(1, dtype=np.int64))
    capsules = []

    def torch_to_dlpack():
        capsules.append(torch_dlpack.to_dlpack(keys))

    def import_one():
        backend.from_dlpack(torch_dlpack.to_dlpack(keys))

    exported = []

    def export_one():
        exported.append(backend.to_dlpack(table))

    def torch_from_dlpack():
        torch_dlpack.from_dlpack(backend.to_dlpack(table))

    def order_both_ways():
        backend.wait_for_framework()
        backend.release_to_framework()

    def engine_array():
        backend.empty((4096,), np.float32)

    def launch():
        backend.put_rows(table, rows, backend.zeros((1, 128), np.float32))

    kernels = torch_kernels.TorchKernels(keys.device)
    lent = backend.zeros((2048, 128), np.float32)
    token = np.zeros((), np.int64)
    number = kernels.register(lambda k, t: [lent, np.int64(1)], ["device", "host"],
                              ["device", "host"], [np.float32, np.int64])
    stream = kernels.stream()

    def kernel_call():
        kernels.op(number, [keys], [token], stream)

    results = {}
    with runtime.entered():
        for name, run in (("torch_to_dlpack", torch_to_dlpack), ("import", import_one),
                          ("export", export_one), ("order_both_ways", order_both_ways),
                          ("engine_array", engine_array), ("launch", launch),
                          ("kernel_call", kernel_call)):
            kernels.stand_in_s = 0.0
            results[name] = harness.per_call_us(run, calls, args.repeats, backend.synchronize)
            capsules.clear()
            exported.clear()
        stand_in_us = kernels.stand_in_s * 1e6 / (calls * args.repeats + 1)
        results["kernel_call_engine"] = {
            key: value - stand_in_us for key, value in results["kernel_call"].items()}
        # from_dlpack's own part: a capsule made outside the timed calls
        made = [backend.to_dlpack(table) for _ in range(calls * (args.repeats + 1))]

        def torch_only():
            torch_dlpack.from_dlpack(made.pop())
        results["torch_from_dlpack"] = harness.per_call_us(torch_only, calls, args.repeats,
                                                   backend.synchronize)
        results["export_and_torch_from_dlpack"] = harness.per_call_us(
            torch_from_dlpack, calls, args.repeats, backend.synchronize)
        backend.synchronize()
    for name, figure in results.items():
        harness.say("%-28s %7.2f us (%.2f-%.2f)" % (name, figure["median_us"], figure["min_us"],
                                                   figure["max_us"]))
    harness.write_json(args.out, {"environment": harness.environment(
        {"torch": torch.__version__}), "calls": calls, "repeats": args.repeats,
        "per_call": results})
    harness.finish()


if __name__ == "__main__":
    main()
