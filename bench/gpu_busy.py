"""Ad-hoc: GPU kernel and copy time per step of step_calls' Case, from PyTorch's profiler (CUPTI
sees PyCUDA's kernels too). python bench/gpu_busy.py WORKLOAD [STEPS]"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import harness
import step_calls


def main(argv):
    name, steps = argv[0], int(argv[1]) if len(argv) > 1 else 20
    torch.zeros(1, device="cuda")
    rt = harness.start_engine("cuda")
    case = step_calls.Case(rt, name, 1)
    for _ in range(5):
        case.run()
    rt.backend.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            case.run()
        rt.backend.synchronize()
        wall = (time.perf_counter() - started) / steps * 1e6
    kernels, copies, by_name = harness.profiler_gpu_us(prof, steps)
    print("%s: wall %.0f us/step, kernels %.0f us/step, copies+sets %.0f us/step" % (
        name, wall, kernels, copies))
    for key, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:25]:
        print("  %8.1f us/step  %s" % (us, key[:90]))


if __name__ == "__main__":
    main(sys.argv[1:])
