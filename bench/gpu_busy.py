"""Ad-hoc: GPU kernel and copy time per step of step_calls' Case, from PyTorch's profiler (CUPTI
sees PyCUDA's kernels too, and those of replayed graphs). python bench/gpu_busy.py WORKLOAD
[STEPS] [replayed]; under mpiexec each rank prints its own (replayed on several ranks: with
SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1)."""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import harness
import step_calls


def main(argv):
    name, steps = argv[0], int(argv[1]) if len(argv) > 1 else 20
    replayed = len(argv) > 2 and argv[2] == "replayed"
    rt = harness.start_engine("cuda")
    torch.cuda.set_device(rt.device_ordinal)  # (this rank's GPU, as the engine's)
    torch.zeros(1, device="cuda")
    case = step_calls.Case(rt, name, 1, replayed=replayed)
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
    lines = ["rank %d of %d, %s%s: wall %.0f us/step, kernels %.0f us/step, copies+sets %.0f "
             "us/step" % (rt.rank, rt.size, name, " replayed" if replayed else "", wall,
                          kernels, copies)]
    for key, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:30]:
        lines.append("  %8.1f us/step  %s" % (us, key[:90]))
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
