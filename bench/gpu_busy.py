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
    kernels = copies = 0.0
    by_name = {}
    for event in prof.events():
        if event.device_type.name != "CUDA":
            continue
        us = getattr(event, "device_time_total", None)
        us = event.cuda_time_total if us is None else us
        if "emcpy" in event.name or "emset" in event.name:
            copies += us
        else:
            kernels += us
        by_name[event.name] = by_name.get(event.name, 0.0) + us
    print("%s: wall %.0f us/step, kernels %.0f us/step, copies+sets %.0f us/step" % (
        name, wall, kernels / steps, copies / steps))
    for key, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:25]:
        print("  %8.1f us/step  %s" % (us / steps, key[:90]))


if __name__ == "__main__":
    main(sys.argv[1:])
