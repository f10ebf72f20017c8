"""Training step and exchange benchmarks at the job's size (one process per GPU, under mpiexec).

    mpiexec -n 4 python3 bench/step_and_exchange.py --out results/w4.json

Exchange (2+ ranks): the engine's all-to-all (NcclCommunicator.all_to_all_v, grouped send/recv)
against torch.distributed.all_to_all_single over NCCL, the same bytes per rank, equal splits.
Step: for each workload (workloads.py) and layer (dense = All2AllDenseEmbedding, sparse =
DistributedEmbedding with sum), from one initial table: sok1x through the api (host arrays, as the
graph ops call it), sok1x with device arrays (sok_steps.py), and PyTorch (torch_reference.py).
The three must give the same outputs on the first steps (checked and recorded) before each is
timed. With --backend cpu (and gloo for PyTorch) the script runs on CPU-only hosts, to check it.
"""
import sys

import numpy as np
import torch
import torch.distributed as dist

from sok1x.backend import random_init
from sok1x.engine import api
from sok1x.engine.lookup.exchange_header import exchange_header

import harness
import sok_steps
import torch_reference
import workloads

SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=5)
CHECK_STEPS = 3


def parse_args(argv):
    parser = harness.parser(__doc__, backend=True, out=True, scale=True, port=29533)
    parser.add_argument("--workloads", default="seed,dlrm")
    parser.add_argument("--exchange-mib", default="16,64,256", help="MiB per rank")
    parser.add_argument("--api-steps", type=int, default=8)
    parser.add_argument("--fast-steps", type=int, default=20)
    return parser.parse_args(argv)


say, job_max = harness.say, harness.job_max


# -- exchange -----------------------------------------------------------------------------------

def exchange_bench(rt, device, sizes_mib):
    """Per size: median ms of the engine's all-to-all, of the engine's exchange with its host
    header (as a lookup runs it), and of torch's all_to_all_single, the slowest rank's."""
    return [exchange_one(rt, device, mib) for mib in sizes_mib]


def exchange_one(rt, device, mib):
    backend, size = rt.backend, rt.size
    width = 32  # floats per row: 128-byte rows
    rows_per_peer = max(1, int(mib * (1 << 20)) // (4 * width * size))
    counts = np.full(size, rows_per_peer, dtype=np.int64)
    host = np.full((rows_per_peer * size, width), 0.5 + rt.rank, np.float32)
    send = backend.asarray(host)
    harness.barrier()
    engine_ms = harness.median(harness.StreamTimer(backend).time_ms(
        lambda: rt.data.all_to_all_v(send, counts, counts), repeats=10, warmup=3))

    def with_header():
        exchange_header(rt, "bench_exchange", counts)
        rt.data.all_to_all_v(send, counts, counts)

    harness.barrier()
    header_ms = harness.median([harness.wall_ms(with_header, 1, backend.synchronize)
                               for _ in range(10)])
    torch_send = torch.from_numpy(host).to(device)
    torch_recv = torch.empty_like(torch_send)
    harness.barrier()
    raw_ms = harness.median(harness.TorchTimer(device).time_ms(
        lambda: dist.all_to_all_single(torch_recv, torch_send), repeats=10, warmup=3))
    nbytes = host.nbytes
    entry = {"mib_per_rank": mib, "bytes_per_rank": nbytes,
             "engine_ms": job_max(engine_ms), "engine_with_header_ms": job_max(header_ms),
             "torch_nccl_ms": job_max(raw_ms)}
    for key in ("engine", "engine_with_header", "torch_nccl"):
        entry[key + "_gbps"] = nbytes / entry[key + "_ms"] / 1e6
    entry["engine_vs_raw"] = entry["torch_nccl_ms"] / entry["engine_ms"]
    entry["engine_with_header_vs_raw"] = entry["torch_nccl_ms"] / entry["engine_with_header_ms"]
    say("exchange %6.1f MiB/rank: engine %.3f ms, +header %.3f ms, torch %.3f ms "
        "(engine %.0f%% of raw)" % (mib, entry["engine_ms"], entry["engine_with_header_ms"],
                                    entry["torch_nccl_ms"], 100 * entry["engine_vs_raw"]))
    return entry


# -- training step --------------------------------------------------------------------------------

def shard_to_torch(backend, values, device):
    """A torch copy of a shard's values (device-to-device on cuda)."""
    if backend.NAME != "cuda":
        return torch.from_numpy(backend.to_host(values).copy()).to(device)
    import pycuda.driver as driver
    from sok1x.backend.cuda import context as cuda_context
    weight = torch.empty(tuple(values.shape), dtype=torch.float32, device=device)
    torch.cuda.synchronize(device)
    with cuda_context.entered():
        cuda_context.stream().synchronize()
        driver.memcpy_dtod(weight.data_ptr(), int(values.gpudata), values.nbytes)
    return weight


class StepCase:
    """One (workload, layer, hash table or not) case on this rank."""

    def __init__(self, rt, w, layer, use_hashtable):
        self.rt, self.w, self.layer = rt, w, layer
        self.use_hashtable = use_hashtable
        self.pooled = layer == "sparse"
        self.table = "bench_%s_%s%s" % (w.name, layer, "_hash" if use_hashtable else "")
        self.capacity = workloads.total_vocabulary(w) // rt.size
        self.batches = workloads.Batches(w, rt.rank, rt.size)
        self.sparse = [workloads.sparse_parts(k) for k in self.batches.keys]
        self.keys_per_step = w.global_batch * w.slots * w.nnz

    def new_table(self):
        """Creates this case's table anew (fresh initial values, no optimizer state)."""
        self.rt.tables.pop(self.table, None)
        harness.release_memory(self.rt.backend)
        api.create_table(self.table, self.w.dim, self.capacity, self.use_hashtable, SPEC,
                         replace=True)
        return api.shard(self.table)

    def entry(self, variant, ms, diffs, extra=None):
        """diffs: per check step, the largest |output - torch output| on this rank (or None)."""
        ms = job_max(ms)
        diffs = None if diffs is None else [job_max(d) for d in diffs]
        entry = {"workload": self.w.name, "layer": self.layer, "variant": variant,
                 "hashtable": self.use_hashtable, "ranks": self.rt.size,
                 "global_batch": self.w.global_batch, "keys_per_step": self.keys_per_step,
                 "ms_per_step": ms, "samples_per_s": self.w.global_batch / ms * 1e3,
                 "keys_per_s": self.keys_per_step / ms * 1e3,
                 "diff_vs_torch_per_step": diffs}
        entry.update(extra or {})
        say("%-5s %-6s %-12s %d ranks: %9.3f ms/step  %.3g samples/s  diffs %s" % (
            self.w.name, self.layer, variant, self.rt.size, ms, entry["samples_per_s"],
            "-" if diffs is None else " ".join("%.1e" % d for d in diffs)))
        return entry


def run_api(case, steps, reference_outs):
    """Checks the first outputs against reference_outs (None: only records them), then times.
    Returns (outputs of the first steps, differences per step, ms per step, ms per phase)."""
    backend = case.rt.backend
    stepper = sok_steps.SokStep(case.table, case.w, case.pooled)
    outs, diffs = [], []
    for s in range(CHECK_STEPS):
        out = stepper.api_step(case.batches(s), case.sparse[s % len(case.sparse)])
        outs.append(out)
        if reference_outs is not None:
            diffs.append(float(np.max(np.abs(out - reference_outs[s]))))
    timed_step = harness.Steps(
        lambda s: stepper.api_step(case.batches(s), case.sparse[s % len(case.sparse)]),
        CHECK_STEPS)
    ms = harness.step_ms(timed_step, steps, backend.synchronize,
                         after_warmup=stepper.start_phases)
    phases = {name: job_max(total / steps) for name, total in stepper.phases.items()}
    return outs, diffs, ms, phases


def run_device(case, steps, reference_outs):
    backend = case.rt.backend
    stepper = sok_steps.SokStep(case.table, case.w, case.pooled)
    segment_ids = [backend.asarray(p.segment_ids) for p in case.sparse] if case.pooled else None

    def one(s):
        seg = segment_ids[s % len(segment_ids)] if case.pooled else None
        return stepper.device_step(case.batches(s), seg)

    diffs = []
    for s in range(CHECK_STEPS):
        out = backend.to_host(one(s)).reshape(reference_outs[s].shape)
        diffs.append(float(np.max(np.abs(out - reference_outs[s]))))
    return diffs, harness.step_ms(harness.Steps(one, CHECK_STEPS), steps, backend.synchronize)


def run_torch(case, weight, steps, device):
    model = torch_reference.TorchShardedEmbedding(weight, case.rt.rank, case.rt.size,
                                                  case.pooled, case.w.nnz)
    w = case.w
    shape = (w.batch_per_rank, w.slots) + (() if case.pooled else (w.nnz,)) + (w.dim,)
    outs = [model.step(case.batches(s)).cpu().numpy().reshape(shape) for s in range(CHECK_STEPS)]

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ms = harness.step_ms(harness.Steps(lambda s: model.step(case.batches(s)), CHECK_STEPS), steps,
                         synchronize)
    return outs, ms


def step_bench(rt, device, names, scale, api_steps, fast_steps):
    results = []
    backend = rt.backend
    for name in names:
        w = workloads.workload(name, rt.size, scale)
        cases = [StepCase(rt, w, "dense", False), StepCase(rt, w, "sparse", False)]
        if name == "seed":
            cases.append(StepCase(rt, w, "dense", True))
        for case in cases:
            try:
                results += run_case(rt, case, device, api_steps, fast_steps)
            except Exception as exc:  # keep the other cases' figures; the log has the trace
                import traceback
                traceback.print_exc()
                results.append({"workload": w.name, "layer": case.layer, "ranks": rt.size,
                                "hashtable": case.use_hashtable, "error": repr(exc)})
            rt.tables.pop(case.table, None)
            harness.release_memory(backend, device)
    return results


def run_case(rt, case, device, api_steps, fast_steps):
    """torch, sok1x_api and sok1x_device entries of one case (no torch for hash tables)."""
    backend = rt.backend
    results = []
    table = case.new_table()
    weight = None if case.use_hashtable else shard_to_torch(backend, table.values, device)
    del table
    torch_outs = None
    if weight is not None:
        torch_outs, torch_ms = run_torch(case, weight, fast_steps, device)
        del weight
        harness.release_memory(backend, device)
        results.append(case.entry("torch", torch_ms, None))
    case.new_table()
    api_outs, diffs, api_ms, phases = run_api(case, api_steps, torch_outs)
    results.append(case.entry("sok1x_api", api_ms, diffs if torch_outs else None,
                              {"phase_ms": phases}))
    case.new_table()
    diffs, device_ms = run_device(case, fast_steps, torch_outs or api_outs)
    results.append(case.entry("sok1x_device", device_ms, diffs,
                              {"diffs_against": "torch" if torch_outs else "sok1x_api"}))
    return results


def main(argv):
    args = parse_args(argv)
    rt = harness.start_engine(args.backend)
    device = harness.start_torch(rt, args.port)
    lazy_adam_source = sok_steps.ensure_lazy_adam(rt.backend) if args.backend == "cuda" \
        else "backend"
    say("%d ranks on %s, LazyAdam from %s" % (rt.size, device, lazy_adam_source))
    payload = {"ranks": rt.size, "backend": args.backend, "scale": args.scale,
               "lazy_adam": lazy_adam_source,
               "environment": harness.environment({"torch": torch.__version__,
                                                  "nccl": getattr(rt.data, "library", None)
                                                  and rt.data.library.version_text})}
    if rt.size > 1:
        sizes = [float(m) / args.scale for m in args.exchange_mib.split(",")]
        payload["exchange"] = exchange_bench(rt, device, sizes)
        harness.write_json(args.out, payload)
    payload["steps"] = step_bench(rt, device, args.workloads.split(","), args.scale,
                                  args.api_steps, args.fast_steps)
    harness.write_json(args.out, payload)
    harness.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
