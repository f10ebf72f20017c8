"""The training step a framework sees, at the job's size (one process per GPU, under mpiexec):

    mpiexec -n 2 python3 bench/framework_step.py --out results/fw2.json

Per workload (workloads.py: seed, dlrm; dlrm26 = dlrm's 26 features as 26 tables in one fused
lookup; dlrm_dynamic = dlrm on a DynamicVariable, "hbm" beside "hybrid", run_dynamic), from one
initial table, the same LazyAdam step (forward lookup, top gradient = output,
backward exchange, update) five ways:

    sok1x_dlpack   the zero-copy seam with PyTorch as the framework: keys, outputs, gradients and
                   the update's slices cross as DLPack capsules, ordered by wait_for_framework /
                   release_to_framework, as graph_ops/boundary.py does for TensorFlow (three ops:
                   forward, backward, update)
    sok1x_host     host staging, as TensorFlow 1.15's py_func: every op's inputs come from and its
                   outputs go to host NumPy arrays through page-locked buffers
    sok1x_device   the engine on device arrays, no framework at all
    torch_dedup    the strongest plain-PyTorch step we could write: torch.unique before the
                   exchange, all_to_all_single, index_select, a LazyAdam on the unique rows
    torch_plain    the earlier bench/ reference (torch_reference.py: no de-duplication)

Each variant is timed as the median of --repeats repeats of --steps steps (wall clock, the GPU
waited for at the end), the variants interleaved inside each repeat so that the host's load
drifts over all of them alike. The first steps' outputs are compared across variants. Also
measured in the same run: page-locked host-to-device and device-to-host bandwidth, and per step
of sok1x_device the kernel launches, fills, copies, host waits, NCCL collectives and MPI
exchanges.
"""
import functools
import gc
import sys
import time

import numpy as np
import torch
from torch.utils import dlpack as torch_dlpack

from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.pooled_lookup import PooledInput

import harness
import sok_steps
import torch_reference
import workloads

SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=5)
CHECK_STEPS = 2
SUMMARY_NAMES = ("ms_per_step", "ms_min", "ms_max", "ms_repeats")
VARIANTS = ("sok1x_dlpack", "sok1x_host", "sok1x_device", "torch_dedup", "torch_plain")


def parse_args(argv):
    parser = harness.parser(__doc__, out=True, steps=True, repeats=True, port=29541,
                            backend=True, scale=True)
    parser.add_argument("--workloads", default="seed,dlrm,dlrm26")
    return parser.parse_args(argv)


say, job_max = harness.say, harness.job_max


class TorchSeam:
    """PyTorch at the engine's seam: the backend calls graph_ops/boundary.py makes."""

    def __init__(self, backend):
        self.backend = backend

    def to_engine(self, tensor):
        return self.backend.from_dlpack(torch_dlpack.to_dlpack(tensor))

    def to_torch(self, array):
        return torch_dlpack.from_dlpack(self.backend.to_dlpack(array))

    def op(self, function, *tensors):
        """One framework op into the engine: tensors in, tensors out, ordered both ways."""
        arrays = [self.to_engine(t) for t in tensors]
        self.backend.wait_for_framework()
        results = function(*arrays)
        self.backend.release_to_framework()
        return [r if isinstance(r, (int, np.integer)) or np.ndim(r) == 0 else self.to_torch(r)
                for r in results]


class SokVariants:
    """The three sok1x ways of one step over tables `names` (one, or one per dlrm feature)."""

    def __init__(self, rt, w, names):
        self.rt, self.w, self.names = rt, w, names
        self.backend = rt.backend
        self.seam = TorchSeam(rt.backend)
        self.step_count = 0
        self.crossed_bytes = 0

    def _hyper(self):
        self.step_count += 1
        return sok_steps.lazy_adam_hyper(self.step_count)

    # one step on engine arrays, the framework's conversions passed in --------------------------
    def _forward(self, keys):
        w = self.w
        if len(self.names) == 1:
            out, token = api.dense_lookup(self.names[0], "fwd", keys, True, (w.slots, w.nnz))
            return [out, token]
        per_table = self._split(keys.reshape(-1))
        outs, token = api.pooled_lookup(self.names, "fwd", per_table, True)
        return outs + [token]

    def _split(self, keys):
        """dlrm26: feature t's keys [batch] (one per sample) as table t's PooledInput."""
        batch = self.w.batch_per_rank
        segments = self._segments
        return [PooledInput(self.backend.take_rows(keys, index), segments, batch, None, "sum")
                for index in self._feature_index]

    def prepare(self, keys_host):
        """Per-table gather indices (dlrm26) for keys [batch, 26, 1] flattened."""
        batch, slots = keys_host.shape[0], keys_host.shape[1]
        self._segments = self.backend.asarray(np.arange(batch, dtype=np.int64))
        self._feature_index = [self.backend.asarray(np.arange(batch, dtype=np.int64) * slots + t)
                               for t in range(slots)] if len(self.names) > 1 else []

    def _backward(self, token, grads):
        if len(self.names) == 1:
            values, rows = api.dense_lookup_grad(self.names[0], "bwd", token, grads[0])
            return [(values, rows)]
        return api.pooled_lookup_grad(self.names, "bwd", token, grads)

    def _update(self, pairs, hyper):
        for name, (values, rows) in zip(self.names, pairs):
            api.apply_optimizer_update(name, "lazy_adam", "Adam", {}, hyper, values, rows)

    def device(self, keys_device):
        with runtime.entered():  # PyCUDA reshapes device arrays only with its context current
            return self._device(keys_device)

    def _device(self, keys_device):
        results = self._forward(keys_device)
        outs, token = results[:-1], int(results[-1])
        self._update(self._backward(token, outs), self._hyper())
        return outs

    def dlpack(self, keys_torch):
        with runtime.entered():
            return self._dlpack(keys_torch)

    def _dlpack(self, keys_torch):
        seam = self.seam
        results = seam.op(self._forward, keys_torch)
        outs, token = results[:-1], int(results[-1])
        tops = [o * 1.0 for o in outs]  # the framework's own op: the loss gradient
        grads = seam.op(lambda *g: [a for pair in self._backward(token, list(g)) for a in pair],
                        *tops)
        hyper = self._hyper()
        seam.op(lambda *parts: self._update(list(zip(parts[0::2], parts[1::2])), hyper) or [],
                *grads)
        return outs

    def host(self, keys_host):
        with runtime.entered():
            return self._host(keys_host)

    def _host(self, keys_host):
        backend = self.backend
        crossed = keys_host.nbytes
        results = self._forward(backend.upload_staged(keys_host))
        outs = [backend.download_staged(o) for o in results[:-1]]
        token = int(results[-1])
        tops = outs  # d(0.5 ||out||^2) / d out: the framework hands the same arrays back
        crossed += 2 * sum(o.nbytes for o in outs)
        pairs = self._backward(token, [backend.upload_staged(t) for t in tops])
        host_pairs = [(backend.download_staged(v), backend.download_staged(r)) for v, r in pairs]
        crossed += 2 * sum(v.nbytes + r.nbytes for v, r in host_pairs)
        self._update([(backend.upload_staged(v), backend.upload_staged(r))
                      for v, r in host_pairs], self._hyper())
        self.crossed_bytes = crossed
        return outs


def shard_weight(rt, names, device):
    """A torch copy of this rank's rows (the tables' shards stacked, for dlrm26)."""
    parts = [torch.from_numpy(rt.backend.to_host(api.shard(n).values)) for n in names]
    return torch.cat(parts).to(device)


def pinned_bandwidth(device, nbytes=256 << 20, repeats=7):
    """Median GB/s of page-locked host-to-device and device-to-host copies of `nbytes`."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    timer = harness.TorchTimer(device)
    result = {}
    for name, dst, src in (("h2d", gpu, host), ("d2h", host, gpu)):
        times = timer.time_ms(functools.partial(dst.copy_, src, non_blocking=True), repeats,
                              warmup=0)
        result[name + "_gbps"] = nbytes / (harness.median(times) * 1e6)
    return result


def make_tables(rt, w, fused):
    names = ["fw_%s_%d" % (w.name, t) for t in range(w.slots if fused else 1)]
    per_table = w.vocab if fused else workloads.total_vocabulary(w)
    for name in names:
        api.create_table(name, w.dim, per_table // rt.size, False, SPEC, replace=True)
        api.shard(name)
    return names


def launch_counts():
    """The cuda backend's counters (kernel launches, fills, copies, host waits), or {} on cpu."""
    if runtime.get().backend.NAME != "cuda":
        return {}
    from sok1x.backend.cuda_launch import COUNTS
    return dict(COUNTS)


def run_workload(rt, name, device, steps, repeats, scale):
    fused = name == "dlrm26"
    w = workloads.workload("dlrm" if fused else name, rt.size, scale)
    batches = workloads.Batches(w, rt.rank, rt.size)
    if fused:  # 26 tables of w.vocab keys each: feature t's keys relative to its own table
        batches.keys = [k - np.arange(w.slots).reshape(1, -1, 1) * w.vocab for k in batches.keys]
    backend = rt.backend
    keys_device = [backend.asarray(k) for k in batches.keys]
    keys_torch = [torch.from_numpy(k).to(device) for k in batches.keys]
    names = make_tables(rt, w, fused)
    weight = shard_weight(rt, names, device)
    sok = SokVariants(rt, w, names)
    sok.prepare(batches.keys[0])
    torch_dedup = None if fused else torch_reference.TorchDedupStep(weight.clone(), rt.rank,
                                                                    rt.size)
    torch_plain = None if fused else torch_reference.TorchShardedEmbedding(
        weight.clone(), rt.rank, rt.size, False, w.nnz)
    del weight
    runs = {
        "sok1x_device": lambda s: sok.device(keys_device[s % 3]),
        "sok1x_dlpack": lambda s: sok.dlpack(keys_torch[s % 3]),
        "sok1x_host": lambda s: sok.host(batches.keys[s % 3]),
    }
    if torch_dedup is not None:
        runs["torch_dedup"] = lambda s: [torch_dedup.step(keys_torch[s % 3].reshape(-1))]
        runs["torch_plain"] = lambda s: [torch_plain.step(batches.keys[s % 3])]

    def host_out(outs):
        return np.concatenate([(o.cpu().numpy() if torch.is_tensor(o) else np.asarray(
            backend.to_host(o))).reshape(-1) for o in outs])

    # Same outputs on the first steps: every variant from the same initial table.
    first = {}
    for variant, run in runs.items():
        if variant.startswith("sok1x"):
            make_tables(rt, w, fused)
            sok.step_count = 0
        first[variant] = [host_out(run(s)) for s in range(CHECK_STEPS)]
    reference = first["sok1x_device"]
    diffs = {v: job_max(max(float(np.max(np.abs(a - b))) for a, b in zip(outs, reference)))
             for v, outs in first.items()}

    def synchronize():
        backend.synchronize()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    timed = {variant: harness.Steps(run, CHECK_STEPS) for variant, run in runs.items()}
    for run in timed.values():  # warm-up
        harness.wall_ms(run, 2, synchronize)
    times = {v: [] for v in runs}
    for _ in range(repeats):
        for variant, run in timed.items():
            harness.barrier()
            times[variant].append(job_max(harness.wall_ms(run, steps, synchronize)))

    # Per-step counts of the engine on device arrays.
    harness.barrier()
    data_calls = (lambda: getattr(rt.data, "collectives_enqueued", 0)) if rt.data is not rt.host \
        else (lambda: 0)
    before = (launch_counts(), data_calls(), rt.host.calls)
    timed["sok1x_device"]()
    synchronize()
    after = launch_counts()
    counts = {k: after[k] - before[0].get(k, 0) for k in after}
    if "host_waits" in counts:
        counts["host_waits"] -= 1  # the synchronize() above
    counts["data_collectives"] = data_calls() - before[1]
    counts["mpi_exchanges"] = rt.host.calls - before[2]

    entries = []
    for variant in runs:
        entry = {"workload": name, "variant": variant, "ranks": rt.size,
                 "tables": len(names), "global_batch": w.global_batch,
                 "max_abs_diff_vs_sok1x_device": diffs[variant]}
        entry.update(harness.summary(times[variant], SUMMARY_NAMES))
        if variant == "sok1x_host":
            entry["bytes_crossing_per_step"] = int(job_max(sok.crossed_bytes))
        if variant == "sok1x_device":
            entry["per_step_counts"] = counts
        entries.append(entry)
        say("%-7s %-13s %d ranks: %8.3f ms/step (min %.3f, max %.3f)  diff %.1e" % (
            name, variant, rt.size, entry["ms_per_step"], entry["ms_min"], entry["ms_max"],
            diffs[variant]))
    say("%-7s per step of sok1x_device: %s" % (name, counts))
    for table in names:
        rt.tables.pop(table, None)
    return entries


# Issue 21: dlrm's step on a DynamicVariable, var_type "hbm" beside "hybrid" -------------------
def run_dynamic(rt, steps, repeats, scale):
    """dlrm's step (sok1x_device) on one hash-placed DynamicVariable per var_type: "hbm", and
    "hybrid" whose GPU part holds half of the rows the batches' distinct keys take (later rows,
    the keys first seen later, in page-locked host memory). Returns entries like run_workload's
    plus the hybrid / hbm ratio."""
    from sok1x.engine.dynamic_table import make_dynamic
    w = workloads.workload("dlrm", rt.size, scale)
    batches = workloads.Batches(w, rt.rank, rt.size)
    keys_device = [rt.backend.asarray(k) for k in batches.keys]
    distinct = len(np.unique(np.concatenate([k.reshape(-1) for k in batches.keys])))
    per_rank = int(job_max(distinct))  # an upper bound for any owner
    capacity = 1 << int(np.ceil(np.log2(2 * per_rank)))
    hbm_gib = per_rank // (2 * rt.size) * w.dim * 4 / 2 ** 30
    runs, names = {}, {}
    for var_type, gib in (("hbm", 0.0), ("hybrid", hbm_gib)):
        name = names[var_type] = "fw_dyn_" + var_type
        api.create_table(name, w.dim, capacity, True, SPEC, replace=True, placement="hash",
                         dynamic=make_dynamic(var_type, capacity, capacity, "lru", gib))
        runs[var_type] = functools.partial(
            lambda sok, s: sok.device(keys_device[s % 3]), SokVariants(rt, w, [name]))

    def synchronize():
        rt.backend.synchronize()

    timed = {variant: harness.Steps(run) for variant, run in runs.items()}
    for run in timed.values():  # warm-up: every batch's keys inserted
        harness.wall_ms(run, 3, synchronize)
    times = {v: [] for v in runs}
    for _ in range(repeats):
        for variant, run in timed.items():
            harness.barrier()
            times[variant].append(job_max(harness.wall_ms(run, steps, synchronize)))
    table = rt.tables[names["hybrid"]]
    held = table.index.size
    host_share = job_max(max(0, held - table.hbm_rows) / max(held, 1))
    host_rows, held_rows = [], []
    with runtime.entered():  # a step's distinct host rows: PCIe bytes = rows * row bytes * 7
        for keys in keys_device:
            unique_keys, _ = rt.backend.unique(keys.reshape(-1))
            rows = rt.backend.to_host(table.index.find(unique_keys))
            host_rows.append(np.count_nonzero(rows >= table.hbm_rows))
            held_rows.append(np.count_nonzero(rows >= 0))
    host_rows = int(job_max(np.mean(host_rows)))
    say("dlrm_dynamic hybrid: %d distinct rows per step in host memory of %d (mean of the "
        "batches; forward read and LazyAdam's var, m, v read and written: %.1f MB over PCIe)"
        % (host_rows, int(np.mean(held_rows)), host_rows * w.dim * 4 * 7 / 1e6))
    entries = []
    for variant, ms in times.items():
        entries.append({"workload": "dlrm_dynamic", "variant": "sok1x_device_" + variant,
                        "ranks": rt.size, "global_batch": w.global_batch,
                        "capacity_per_rank": capacity,
                        "hbm_rows": table.hbm_rows if variant == "hybrid" else None,
                        "host_share_of_held_rows_max": host_share if variant == "hybrid" else 0,
                        "distinct_keys_per_rank_max": per_rank,
                        "host_rows_per_step_max": host_rows if variant == "hybrid" else 0})
        entries[-1].update(harness.summary(ms, SUMMARY_NAMES))
        say("dlrm_dynamic %-7s %d ranks: %8.3f ms/step (min %.3f, max %.3f)" % (
            variant, rt.size, entries[-1]["ms_per_step"], min(ms), max(ms)))
    entries[-1]["hybrid_over_hbm"] = entries[1]["ms_per_step"] / entries[0]["ms_per_step"]
    say("dlrm_dynamic hybrid / hbm: %.2f (held rows in host memory: %.2f)" % (
        entries[-1]["hybrid_over_hbm"], host_share))
    for name in names.values():
        rt.tables.pop(name, None)
    return entries


def main(argv):
    args = parse_args(argv)
    rt = harness.start_engine(args.backend)
    device = harness.start_torch(rt, args.port)
    payload = {"ranks": rt.size, "environment": harness.environment(
        {"torch": torch.__version__, "nccl": getattr(getattr(rt.data, "library", None),
                                                     "version_text", None)}),
        "steps_per_repeat": args.steps, "repeats": args.repeats, "backend": args.backend}
    payload["pcie"] = {k: harness.job_min(v)
                       for k, v in pinned_bandwidth(device).items()} if device.type == "cuda" \
        else {"h2d_gbps": float("inf"), "d2h_gbps": float("inf")}
    say("page-locked copies: %s GB/s" % payload["pcie"])
    payload["steps"] = []
    for name in args.workloads.split(","):
        started = time.time()
        try:
            if name == "dlrm_dynamic":
                payload["steps"] += run_dynamic(rt, args.steps, args.repeats, args.scale)
            else:
                payload["steps"] += run_workload(rt, name, device, args.steps, args.repeats,
                                                 args.scale)
        except Exception as exc:  # keep the other workloads' figures; the log has the trace
            import traceback
            traceback.print_exc()
            payload["steps"].append({"workload": name, "ranks": rt.size, "error": repr(exc)})
        gc.collect()
        say("%s took %.1f s" % (name, time.time() - started))
        harness.write_json(args.out, payload)
    harness.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
