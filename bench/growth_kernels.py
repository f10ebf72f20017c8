"""Ad-hoc: where growth_step's warm steps spend their time, way by way: the wall ms a step
(--steps steps back to back, after --warm warm ones), the host ms a step (each step after a
synchronize, its Python until its last launch returns), and the GPU's kernel and copy
microseconds a step with the kernels that take most, from PyTorch's profiler (CUPTI sees
PyCUDA's kernels too), over --steps more steps. With $SOK1X_BENCH_PROFILE set, each way's first
case adds a cProfile of --steps more steps back to back (harness.profile_steps).

    python bench/growth_kernels.py --ways room,evict_drop,evict_device [--steps 5]
"""
import time

import growth_step
import harness


def profiled(backend, steps, step):
    """harness.profiler_gpu_us of `steps` calls of step(tag) under PyTorch's profiler (cuda;
    zeros on cpu)."""
    if backend.NAME != "cuda":
        for s in range(steps):
            step("profiled%d" % s)
        return 0.0, 0.0, {}
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for s in range(steps):
            step("profiled%d" % s)
        backend.synchronize()
    return harness.profiler_gpu_us(prof, steps)


def run_way(rt, args, way, rounds, profile=True):
    """One way's figures: a dict of medians over `rounds` fresh cases."""
    backend = rt.backend
    walls, hosts, kernels, copies, names = [], [], [], [], {}
    for repeat in range(rounds):
        with growth_step.growth_switch(way):
            case = growth_step.Case(rt, args, way, 100 + repeat,
                                    steps=1 + args.warm + 4 * args.steps)
            case.fill_up()
            keys = iter(case.steps)

            def step(tag, case=case, keys=keys):
                growth_step.read_evicted(case, way, case.step(next(keys), tag))
            for s in range(1 + args.warm):
                step("warm%d" % s)
            backend.synchronize()
            start = time.perf_counter()
            for s in range(args.steps):
                step("timed%d" % s)
            backend.synchronize()
            walls.append((time.perf_counter() - start) * 1e3 / args.steps)
            host = []
            for s in range(args.steps):
                backend.synchronize()
                start = time.perf_counter()
                step("host%d" % s)
                host.append((time.perf_counter() - start) * 1e3)
            hosts.append(harness.median(host))
            backend.synchronize()
            k, c, by_name = profiled(backend, args.steps, step)
            kernels.append(k)
            copies.append(c)
            for name, us in by_name.items():
                names.setdefault(name, []).append(us)
            if repeat == 0 and profile:
                harness.profile_steps(rt, lambda: step("cprofile"), backend.synchronize, way,
                                      args.steps)
        case.drop()
        harness.release_memory(backend)
    top = sorted(((harness.median(v), k) for k, v in names.items()), reverse=True)[:args.top]
    return {"wall_ms": harness.summary(walls), "host_ms": harness.summary(hosts),
            "kernel_us": harness.summary(kernels), "copy_us": harness.summary(copies),
            "top_kernels_us": [(name, us) for us, name in top]}


def main():
    parser = harness.parser(__doc__, out={"required": False, "default": None},
                            backend={"default": "cuda"}, repeats=5)
    for flag, default in (("--tables", 26), ("--dim", 128), ("--rows", 1 << 18),
                          ("--new", 16384), ("--warm", 2), ("--steps", 4), ("--top", 14)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--ways", default="room,evict_drop,evict_device")
    parser.add_argument("--between-ms", type=float, default=0.0)  # growth_step's
    args = parser.parse_args()
    if args.backend == "cuda":
        import torch
        torch.zeros(1, device="cuda")
    rt = harness.start_engine(args.backend)
    ways = [w for w in args.ways.split(",") if w]
    run_way(rt, args, ways[0], 1, profile=False)  # kernels compile
    out = {"environment": harness.environment({"ranks": rt.size}), "args": vars(args),
           "ways": {}}
    for way in ways:
        entry = out["ways"][way] = run_way(rt, args, way, args.repeats)
        harness.say("%s: wall %.3f ms (%.3f-%.3f), host %.3f ms, kernels %.0f us, copies %.0f us"
                    % (way, entry["wall_ms"]["median_ms"], entry["wall_ms"]["min_ms"],
                       entry["wall_ms"]["max_ms"], entry["host_ms"]["median_ms"],
                       entry["kernel_us"]["median_ms"], entry["copy_us"]["median_ms"]))
        for name, us in entry["top_kernels_us"]:
            harness.say("    %8.1f us  %s" % (us, name[:90]))
    room = out["ways"].get("room")
    if room:
        for way, entry in out["ways"].items():
            harness.say("%s / room: wall %.2fx, kernels %.2fx" % (
                way, entry["wall_ms"]["median_ms"] / room["wall_ms"]["median_ms"],
                entry["kernel_us"]["median_ms"] / max(room["kernel_us"]["median_ms"], 1e-9)))
    if args.out:
        harness.write_json(args.out, out)
    harness.finish()


if __name__ == "__main__":
    main()
