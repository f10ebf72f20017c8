"""The training step a framework sees, at the job's size (one process per GPU, under mpiexec):

    mpiexec -n 2 python3 bench/framework_step.py --out results/fw2.json

Per workload (workloads.py: seed, dlrm: one table; dlrm26 = dlrm's 26 features as 26 tables in
one lookup; dlrm_hash and dlrm26_hash = dlrm and dlrm26 on hash tables (their PyTorch peer a
dense table holding each key's initial value where sok1x's rows lie in arrival order:
hashed_shard_weight); mlperf26 = MLPerf
DLRM-DCNv2's 26 tables, skipped with a message where the job's GPUs cannot hold them;
dlrm26_dynamic = dlrm26 on hbm DynamicVariables (one hash group; the same peer as
dlrm26_hash); dlrm26_hybrid = the same on hybrid ones; dlrm26_full = on hybrid ones that are
full, every step evicting (workloads.full_rows); dlrm_dynamic = dlrm on a DynamicVariable,
"hbm" beside "hybrid", run_dynamic),
from the same initial tables, the same step (forward lookup, top gradient = output, backward
exchange, update: LazyAdam, Adagrad for mlperf26) five ways:

    sok1x_dlpack   the zero-copy seam with PyTorch as the framework: keys, outputs, gradients and
                   the update's slices cross as DLPack capsules, ordered by wait_for_framework /
                   release_to_framework, as graph_ops/boundary.py does for TensorFlow (three ops:
                   forward, backward, update)
    sok1x_kernels  sok1x's TensorFlow kernels with PyTorch as the framework: each op hands the
                   engine its tensors' device pointers and its current CUDA stream, as
                   graph_ops/engine_call_op.cc does with TensorFlow's (the kernel's own few
                   lines done by kernel_calls.invoke, in Python), and takes the engine's lent
                   outputs as its tensors without a copy (__cuda_array_interface__); three ops:
                   forward, backward, update
    sok1x_kernels_replayed  sok1x_kernels over sok1x_replayed's step as a session's graph
                   runs it: replay=True and detach=DETACH_HELD (the class's own output and
                   gradient lent, as nothing holds them past the step; engine/lent_memory.py);
                   the update op, handed the backward's gradient, finds it by address and
                   replays too
    sok1x_host     host staging, as TensorFlow 1.15's py_func, with the fewest bytes
                   (api.compact_keyed_lookup: the distinct rows of all tables' keys, found
                   in one pass for a table group, in one array and int32 indices into it in
                   another, or the pooled vectors where those are fewer bytes) come to the
                   host; the framework copies
                   them to its GPU, gathers there (the lookup's outputs, what its dense layers
                   read), and hands back the gather's gradient (the distinct rows' sums) through
                   the host; the backward's slices cross down and up to the update op, as they
                   do between two py_funcs. Every copy is counted, the framework's too
                   (bytes_h2d / bytes_d2h), and pcie_bound_ms is what they take at the measured
                   page-locked rates
    sok1x_host_kept  sok1x_host with the update taking the backward's slices where they are (the
                   graph handing the update op the backward's own values, not a copy): what
                   a step of this seam costs without that round trip
    sok1x_host_pooled  host staging as before: every op's inputs come from and its outputs go to
                   host NumPy arrays through page-locked buffers, the pooled vectors crossing
                   (the framework's own copies to and from its GPU not made, nor counted)
    sok1x_device   the engine on device arrays, no framework at all
    sok1x_bounded  sok1x_device as a bounded step (SOK1X_BOUNDED_STEP=1,
                   engine/lookup/bounded_step.py): on one rank the forward leaves its key
                   checks to the backward and the backward's rows are padded to the keys, so
                   the host waits once a step, not twice (the same on several ranks)
    sok1x_replayed sok1x_bounded with the dense or keyed lookup passing replay=True (a keyed
                   lookup replays where its tables are one table, one group of dense tables
                   or one hash group whose rows stay in GPU memory: dlrm26, dlrm26_hash,
                   dlrm26_dynamic, dlrm26_hybrid, and dlrm26_full, whose full group's
                   evicting steps are a class of their own; a replayed hybrid step counts its
                   lookup in one launch beside its graphs, left out of its floor): on one
                   rank its forward, backward and update are recorded once as CUDA graphs
                   and replayed (engine/lookup/replayed_step.py); its GPU floor
                   (those graphs replayed back to back, no host work: not the key copy, the
                   hyper-parameters' write or the update's time stamp) is reported beside it,
                   whole and per graph. Its lookup and backward are a tower's first two ops,
                   as a graph chains them, and the lookup leaves its key checks (and a hash
                   group's insert its counts) to the backward
    sok1x_replayed_end  sok1x_replayed with the lookup reading its key checks at its own end,
                   as TensorFlow's graph ops do (they cannot know that a backward runs), and as
                   a hash group's lookup did whatever its caller promised until 2026-11-28
    torch_dedup    the strongest plain-PyTorch step we could write: torch.unique before the
                   exchange, all_to_all_single, index_select, the same optimizer on the unique
                   rows; for several tables, the tables concatenated with key offsets into one
                   weight (TorchRec's fused table-batched embedding), one pass for all
    torch_graph    torch_dedup's step at one rank over fixed-size buffers (distinct keys by a sort,
                   padded to the keys' number), captured once with torch.cuda.CUDAGraph and
                   replayed (torch_reference.TorchGraphStep): the peer a captured sok1x step is
                   held against (issue 45); its GPU floor (the graph replayed back to back, no
                   host work) is reported beside it. torch_dedup steps over torch_graph's
                   copy of the shard (one H200 holds no third copy beside sok1x's); made at one
                   rank where the GPU has room for that copy (hash and hybrid tables too), else
                   left out with a message (before torch_plain, which then gives way)
    torch_plain    the earlier bench/ reference (torch_reference.py: no de-duplication; one table)

Each variant is timed as the median of --repeats repeats of --steps steps (wall clock, the GPU
waited for at the end), the variants interleaved inside each repeat so that the host's load
drifts over all of them alike. The first steps' outputs are compared across variants. Also
measured in the same run: page-locked host-to-device and device-to-host bandwidth, and per step
of sok1x_device the kernel launches, fills, copies, host waits (and the microseconds spent in
them), the host's Python microseconds not spent waiting, NCCL collectives and MPI exchanges.
SOK1X_BENCH_VARIANTS=a,b,... times those variants alone (sok1x_device and sok1x_bounded always).
SOK1X_BENCH_GC_FREEZE=1 freezes the process's objects out of garbage collection before timing
(gc.freeze): a step whose time then falls was paying for collections over the whole process.
With SOK1X_BENCH_PROFILE=FILE, rank 0 appends a cProfile of 20 sok1x_device steps per workload,
then of 20 sok1x_dlpack steps (what the seam adds on the host)
($SOK1X_BENCH_PROFILE_LINES functions by own and by cumulative time, default 30).
"""
import functools
import gc
import os
import sys
import time

import numpy as np
import torch
from torch.utils import dlpack as torch_dlpack

from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup import bounded_step, peer_capacity, replayed_step

import harness
import sok_steps
import torch_kernels
import torch_reference
import workloads

SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=5)
CHECK_STEPS = 2
SUMMARY_NAMES = ("ms_per_step", "ms_min", "ms_max", "ms_repeats")
VARIANTS = ("sok1x_kernels", "sok1x_kernels_replayed", "sok1x_dlpack", "sok1x_host",
            "sok1x_host_kept", "sok1x_host_pooled", "sok1x_device", "sok1x_bounded",
            "sok1x_replayed", "sok1x_replayed_end", "torch_dedup", "torch_graph", "torch_plain")
HOST_VARIANTS = ("sok1x_host", "sok1x_host_kept", "sok1x_host_pooled")


def parse_args(argv):
    parser = harness.parser(__doc__, out=True, steps=True, repeats=True, port=29541,
                            backend=True, scale=True)
    parser.add_argument("--workloads", default="seed,dlrm,dlrm26,mlperf26")
    parser.add_argument("--segment-ids", action="store_true",
                        help="the keyed workloads' keys pooled by segment ids (dlrm26: one key "
                             "a sample, summed), as TensorFlow's keyed op hands them")
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


def _no_order(stream=0):
    return None


def _no_orders():
    return _no_order, _no_order


class SokVariants(sok_steps.EngineStep):
    """The three sok1x ways of one step (sok_steps.EngineStep): on engine arrays (device), through
    the zero-copy seam with PyTorch as the framework (dlpack), and through host staging (host)."""

    def __init__(self, rt, w, names, device=None, segment_ids=False):
        super().__init__(rt, w, names, segment_ids)
        self._sized_plans = {}  # the replayed variant's per-peer capacities (replayed())
        self.seam = TorchSeam(rt.backend)
        self.torch_device = device
        self.crossed = {}  # variant -> (bytes host-to-device, device-to-host) of its last step
        self.kernels = torch_kernels.TorchKernels(device)
        self._mode = None  # (bounded, peer capacity) the environment is set to (_environment)
        self._kernel_ops = (  # the keys come as one array (dlrm26's: all tables' keys, keyed)
            self.kernels.register(lambda keys: self._forward(keys), ["device"],
                                  ["device", "host"], [np.float32, np.int64]),
            self.kernels.register(
                lambda token, grads: list(self._backward(int(token), [grads])[0]),
                ["host", "device"], ["device", "device"], [np.float32, np.int64]),
            self.kernels.register(
                lambda values, rows: self._update([(values, rows)], self._hyper()) or np.int64(0),
                ["device", "device"], ["host"], np.int64))

    def _environment(self, bounded, peer):
        """Sets the environment a variant steps under (SOK1X_BOUNDED_STEP, SOK1X_PEER_CAPACITY):
        written only where the last step ran under another, since a variant's steps run in a
        row and a user sets these once, not around every step (four writes a step, about 5 us,
        were counted in python_us until 2026-11-29)."""
        if self._mode == (bounded, peer):
            return
        for name, on in ((bounded_step.ENV, bounded), (peer_capacity.ENV, peer)):
            if on:
                os.environ[name] = "1"
            else:
                os.environ.pop(name, None)
        self._mode = (bounded, peer)

    def device(self, keys_device):
        """EngineStep.device() under the engine's defaults (no bounded step, counted sizes)."""
        self._environment(False, False)
        return super().device(keys_device)

    def bounded(self, keys_device):
        """device() as a bounded step (engine/lookup/bounded_step.py, SOK1X_BOUNDED_STEP=1):
        on one rank no host wait but the backward's read of the forward's checks."""
        return self._bounded(super().device, keys_device)

    def replayed(self, keys_device):
        """bounded() with the lookup passing replay=True: its forward, backward and update are
        replayed from recorded shape classes (engine/lookup/replayed_step.py); on several ranks
        its lookups are sized by per-peer capacities (SOK1X_PEER_CAPACITY=1), with plans of
        their own, so the other variants keep sizing theirs by counts."""
        return self._replayed(super().device, keys_device)

    def replayed_end(self, keys_device):
        """replayed() with the lookup reading its key checks at its end (checks="end"), as
        TensorFlow's graph ops do (an op cannot know whether its step runs the backward): what
        that read's wait costs a step. A hash group's forward read them there, whatever its
        caller promised, until 2026-11-28."""
        self.checks = "end"
        try:
            return self._replayed(super().device, keys_device)
        finally:
            self.checks = "backward"

    def kernels_replayed(self, keys_torch):
        """kernels_step over replayed()'s step: what a session's lookup, backward and update
        cost through sok1x's TensorFlow kernels once they replay (graph_ops' ops pass
        replay=True and detach=DETACH_HELD in a session's graph: the class's own arrays are
        lent while PyTorch, as TensorFlow, holds none past its step; the update finds its
        gradient by address)."""
        self.detach = api.DETACH_HELD
        try:
            return self._replayed(self._kernels_entered, keys_torch)
        finally:
            self.detach = False

    def _bounded(self, run, keys):
        self._environment(True, False)
        return run(keys)

    def _replayed(self, run, keys):
        self._environment(True, True)
        self.rt.capacities, self._sized_plans = self._sized_plans, self.rt.capacities
        self.replay = True
        try:
            return run(keys)
        finally:
            self.replay = False
            self.rt.capacities, self._sized_plans = self._sized_plans, self.rt.capacities

    def kernels_step(self, keys_torch):
        self._environment(False, False)
        return self._kernels_entered(keys_torch)

    def _kernels_entered(self, keys_torch):
        with runtime.entered():
            return self._kernels_step(keys_torch)

    def kernels_unordered(self, keys_torch):
        """kernels_step with the stream ordering left out (SOK1X_BENCH_UNORDERED=1: what the
        events cost; at one GPU the framework here queues no GPU work, so nothing races)."""
        backend = self.backend
        orders = backend.framework_orders
        backend.framework_orders = _no_orders
        try:
            return self.kernels_step(keys_torch)
        finally:
            backend.framework_orders = orders

    def _kernels_step(self, keys_torch):
        forward, backward, update = self._kernel_ops
        kernels = self.kernels
        stream = kernels.stream()
        out, token = kernels.op(forward, keys_torch, stream=stream)
        values, rows = kernels.op(backward, [out], [token], stream)  # top gradient = output
        kernels.op(update, [values, rows], stream=stream)
        return [out]

    def dlpack(self, keys_torch):
        self._environment(False, False)
        with runtime.entered():
            return self._dlpack(keys_torch)

    def _dlpack(self, keys_torch):
        seam = self.seam
        results = seam.op(self._forward, *keys_torch)
        outs, token = results[:-1], int(results[-1])
        # d(0.5 ||out||^2) / d out is out itself: the framework hands the outputs back, as the
        # device and host variants do, so the three differ by the crossing alone (a PyTorch op
        # here, o * 1.0 until 90ffa22 (2026-11-23), timed the framework's own pass over the
        # outputs in this variant only: bench/NOTES.md).
        tops = outs
        grads = seam.op(lambda *g: [a for pair in self._backward(token, list(g)) for a in pair],
                        *tops)
        hyper = self._hyper()
        seam.op(lambda *parts: self._update(list(zip(parts[0::2], parts[1::2])), hyper) or [],
                *grads)
        return outs

    def host_pooled(self, keys_host):
        self._environment(False, False)
        with runtime.entered():
            return self._host_pooled(keys_host)

    def _host_pooled(self, keys_host):
        backend = self.backend
        up = sum(k.nbytes for k in keys_host)
        results = self._forward(*[backend.upload_staged(k) for k in keys_host])
        outs = [backend.download_staged(o) for o in results[:-1]]
        token = int(results[-1])
        tops = outs  # d(0.5 ||out||^2) / d out: the framework hands the same arrays back
        up += sum(o.nbytes for o in outs)
        pairs = self._backward(token, [backend.upload_staged(t) for t in tops])
        host_pairs = [(backend.download_staged(v), backend.download_staged(r)) for v, r in pairs]
        slices = sum(v.nbytes + r.nbytes for v, r in host_pairs)
        self._update([(backend.upload_staged(v), backend.upload_staged(r))
                      for v, r in host_pairs], self._hyper())
        self.crossed["sok1x_host_pooled"] = (up + slices, up - sum(k.nbytes for k in keys_host)
                                             + slices)
        return outs

    def host(self, keys_host, kept=False):
        self._environment(False, False)
        with runtime.entered():
            return self._host(keys_host, kept)

    def _keyed_input(self, keys):
        """The step's keys as one KeyedInput (dlrm: one table, each key its own row)."""
        w = self.w
        if w.tables is None:
            flat = self.backend.reshape(keys, -1)
            count = int(flat.shape[0])
            return api.KeyedInput(flat, [count], None, [count], None, "sum")
        return api.KeyedInput(keys, self._lengths, self._segments,
                              [w.batch_per_rank] * len(self.names), None, "sum")

    def _host(self, keys_host, kept):
        """One step through the host seam with the fewest bytes (sok1x_host); kept: the update
        takes the backward's slices where they are (sok1x_host_kept)."""
        backend, device = self.backend, self.torch_device
        up, down = sum(k.nbytes for k in keys_host), 0
        keys = backend.upload_staged(keys_host[0])
        joined, token = api.compact_keyed_lookup(self.names, "fwd", self._keyed_input(keys),
                                                 True)
        staged = backend.download_staged_many(
            [a for a in (joined.rows, joined.indices) if a is not None])
        down += sum(a.nbytes for a in staged)
        # The framework: its own copies to its GPU, its gather (the lookup's outputs, the dense
        # layers' input), top gradient = output, the gather's gradient (per distinct row the
        # sum of its keys'), its copy to the host into page-locked memory.
        rows = torch.from_numpy(staged[0]).to(device, non_blocking=True)
        up += rows.numel() * 4
        if joined.indices is None:
            out = grad = rows
        else:
            index = torch.from_numpy(staged[1]).to(device, non_blocking=True)
            up += index.numel() * 4
            index = index.long()
            out = rows.index_select(0, index)
            grad = torch.zeros_like(rows).index_add_(0, index, out)
        host = backend.host_buffer(grad.numel() * 4).view(np.float32).reshape(tuple(grad.shape))
        torch.from_numpy(host).copy_(grad, non_blocking=True)
        down += host.nbytes
        if device.type == "cuda":  # the framework's copies done before the engine reads them
            torch.cuda.current_stream(device).synchronize()
        grads = [backend.upload_staged(host)]
        up += host.nbytes
        pairs = api.compact_lookup_grad(self.names, "bwd", token, grads)
        if not kept:  # the slices cross to the host and back, as between two py_funcs
            host_pairs = backend.download_staged_many([a for pair in pairs for a in pair])
            slices = sum(a.nbytes for a in host_pairs)
            up, down = up + slices, down + slices
            pairs = list(zip(*[iter([backend.upload_staged(a) for a in host_pairs])] * 2))
        api.apply_optimizer_updates(self.names, self.rule, self.slot_prefix, {}, self._hyper(),
                                    [v for v, _ in pairs], [r for _, r in pairs])
        self.crossed["sok1x_host_kept" if kept else "sok1x_host"] = (up, down)
        return [out]


def shard_weight(rt, names, device):
    """A torch copy of this rank's rows (the tables' shards stacked, for dlrm26)."""
    parts = [torch.from_numpy(rt.backend.to_host(api.shard(n).values)) for n in names]
    return torch.cat(parts).to(device)


def hashed_shard_weight(rt, names, vocabs, dim, device):
    """For hash tables (dlrm26_hash): the dense rows PyTorch's peer holds, each owned key k of
    table t (k % size == rank) at its table's offset + k // size, with the initial value the
    table gives k when k first arrives (the backend's init_rows for k and t's table_id). So the
    peer starts equal to sok1x, though sok1x's rows lie in arrival order."""
    backend, parts = rt.backend, []
    for name, vocab in zip(names, vocabs):
        table = api.shard(name)
        rows = np.arange(-(-vocab // rt.size), dtype=np.int64)
        values = backend.zeros((len(rows), dim), np.float32)
        backend.init_rows(values, backend.asarray(rows),
                          backend.asarray(rows * rt.size + rt.rank), table.spec, table.table_id)
        parts.append(torch.from_numpy(backend.to_host(values)))
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


def device_bandwidth(device, size, nbytes=256 << 20, repeats=5):
    """Median GB/s of a device copy (bytes read + written) and, with several ranks, of NCCL's
    all_to_all_single (bytes each rank sends to the others), both measured here."""
    timer = harness.TorchTimer(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = harness.median(timer.time_ms(functools.partial(dst.copy_, src), repeats))
    result = {"hbm_gbps": 2 * nbytes / (copy_ms * 1e6)}
    if size > 1:
        import torch.distributed as dist
        a2a_ms = harness.job_max(harness.median(timer.time_ms(
            functools.partial(dist.all_to_all_single, dst, src), repeats)))
        result["all_to_all_gbps"] = nbytes * (size - 1) / size / (a2a_ms * 1e6)
    return result


def step_floor(w, batches, size, bandwidth):
    """The least time a step's bytes take at the measured rates (a lower bound, mlperf26): the
    distinct keys' vectors cross to their owners and back and their gradients out (3 all-to-alls
    of (size-1)/size of them), and in memory each distinct row is read at the gather and read and
    written with its Adagrad accumulator at the update, each key's vector read at the pooling and
    its gradient written at the spread. Returns (ms, the bytes it counts)."""
    row = w.dim * 4
    distinct = harness.job_max(max(sum(len(np.unique(k)) for k in batch) for batch in batches))
    keys = sum(len(k) for k in batches[0])
    exchanged = 3 * distinct * row * (size - 1) / size
    memory = distinct * row * (1 + 4) + keys * row * 2
    ms = memory / (bandwidth["hbm_gbps"] * 1e6)
    if size > 1:
        ms += exchanged / (bandwidth["all_to_all_gbps"] * 1e6)
    return ms, {"exchanged_bytes": exchanged, "memory_bytes": memory}


def launch_counts():
    """The cuda backend's counters (kernel launches, fills, copies, host waits), or {} on cpu."""
    if runtime.get().backend.NAME != "cuda":
        return {}
    from sok1x.backend.cuda.kernel_launch import COUNTS
    return dict(COUNTS)


def too_big(w, rt, device):
    """Why mlperf26 cannot run in this job (a sentence), or None."""
    if w.name != "mlperf26" or device.type != "cuda":
        return None
    need = sum(w.tables) * w.dim * 4 * 2 * 2  # rows and accumulators, sok1x's and PyTorch's
    have = harness.job_min(torch.cuda.get_device_properties(device).total_memory) * rt.size
    if need <= 0.8 * have:
        return None
    return ("mlperf26 skipped: its rows and Adagrad accumulators take %.0f GB for sok1x and as "
            "much again for the PyTorch peer (%.0f GB in all), and this job's %d GPU(s) hold "
            "%.0f GB: it needs 4 H200s (nvidia-h200-x4) or more"
            % (need / 2e9, need / 1e9, rt.size, have / 1e9))


def _single_table_runs(rt, w, device, sok, names):
    batches = workloads.Batches(w, rt.rank, rt.size)
    backend = rt.backend
    keys_device = [backend.asarray(k) for k in batches.keys]
    keys_torch = [torch.from_numpy(k).to(device) for k in batches.keys]
    if w.hashed:
        weight = hashed_shard_weight(rt, names, [workloads.total_vocabulary(w)], w.dim, device)
    else:
        weight = shard_weight(rt, names, device)
    graph = _graph_step(rt, w, weight, device, keys_torch[0].numel())
    if graph is None:
        dedup = torch_reference.TorchDedupStep(weight.clone(), rt.rank, rt.size)
    else:  # over torch_graph's shard, its check starting from the rows torch_graph's does
        shared, slots = graph.shard()
        dedup = torch_reference.TorchDedupStep(shared, rt.rank, rt.size, slots)
        graph.restore = graph.snapshot([k.reshape(-1) for k in keys_torch[:CHECK_STEPS]])
    plain = None
    if _room_for(device, _peer_bytes(w, weight), "torch_plain"):
        plain = torch_reference.TorchShardedEmbedding(weight.clone(), rt.rank, rt.size, False,
                                                      w.nnz)
    del weight
    runs = {
        "sok1x_device": lambda s: sok.device([keys_device[s % 3]]),
        "sok1x_bounded": lambda s: sok.bounded([keys_device[s % 3]]),
        "sok1x_replayed": lambda s: sok.replayed([keys_device[s % 3]]),
        "sok1x_replayed_end": lambda s: sok.replayed_end([keys_device[s % 3]]),
        "sok1x_kernels": lambda s: sok.kernels_step([keys_torch[s % 3]]),
        "sok1x_kernels_replayed": lambda s: sok.kernels_replayed([keys_torch[s % 3]]),
        "sok1x_kernels_unordered": lambda s: sok.kernels_unordered([keys_torch[s % 3]]),
        "sok1x_dlpack": lambda s: sok.dlpack([keys_torch[s % 3]]),
        "sok1x_host": lambda s: sok.host([batches.keys[s % 3]]),
        "sok1x_host_kept": lambda s: sok.host([batches.keys[s % 3]], kept=True),
        "sok1x_host_pooled": lambda s: sok.host_pooled([batches.keys[s % 3]]),
        "torch_dedup": lambda s: [dedup.step(keys_torch[s % 3].reshape(-1))],
    }
    if graph is not None:
        runs["torch_graph"] = lambda s: graph.step(keys_torch[s % 3].reshape(-1))
    if plain is not None:
        runs["torch_plain"] = lambda s: [plain.step(batches.keys[s % 3])]
    return runs, graph


def _room_for(device, nbytes, variant):
    """True when the GPU has `nbytes` free and 2 GiB to spare (every rank of the job alike);
    else says that `variant` is left out. Anything fits on the cpu (nothing is measured)."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    if harness.job_min(free) >= nbytes + (2 << 30):
        return True
    say("%s left out: it needs %.1f GB more than the %.1f GB free" % (
        variant, (nbytes + (2 << 30) - free) / 1e9, free / 1e9))
    return False


def _peer_bytes(w, weight):
    """What one more PyTorch peer needs on the GPU while sok1x's optimizer slots are still to be
    made (at its first update): the peer's copy of the shard and its slots, and sok1x's slots
    (torch_graph's copy is torch_dedup's too: it shares it)."""
    slots = 2 if w.optimizer == "lazy_adam" else 1
    return (2 + 2 * slots) * weight.numel() * weight.element_size()


def _graph_step(rt, w, weight, device, key_count, **tables):
    """torch_graph's TorchGraphStep over a copy of `weight`, or None (and why, said) on several
    ranks, on the cpu, without room, or when PyTorch cannot capture the step. (Beside hash and
    hybrid tables it ran out of memory until sok_steps.make_tables dropped the old shards
    before a remake, 2026-11-26.)"""
    if device.type != "cuda":
        return None  # CUDA graphs need a GPU
    if rt.size != 1:
        say("torch_graph left out: on several ranks its exchange needs fixed per-peer buffers, "
            "which it does not have yet (one rank only)")
        return None
    if not _room_for(device, _peer_bytes(w, weight), "torch_graph"):
        return None
    try:
        return torch_reference.TorchGraphStep(weight.clone(), key_count, w.optimizer, **tables)
    except RuntimeError as exc:  # a capture PyTorch refuses: the other variants still run
        say("torch_graph left out: %s" % exc)
        torch.cuda.synchronize(device)
        return None


def _table_runs(rt, w, device, sok, names):
    batches = workloads.table_batches(w, rt.rank, rt.size)
    backend = rt.backend
    joined = [np.concatenate(batch) for batch in batches]  # the batch as one keyed array
    keys_device = [[backend.asarray(k)] for k in joined]
    keys_torch = [[torch.from_numpy(k).to(device) for k in batch] for batch in batches]
    joined_torch = [[torch.from_numpy(k).to(device)] for k in joined]
    runs = {
        "sok1x_device": lambda s: sok.device(keys_device[s % 3]),
        "sok1x_bounded": lambda s: sok.bounded(keys_device[s % 3]),
        "sok1x_replayed": lambda s: sok.replayed(keys_device[s % 3]),
        "sok1x_replayed_end": lambda s: sok.replayed_end(keys_device[s % 3]),
        "sok1x_kernels": lambda s: sok.kernels_step(joined_torch[s % 3]),
        "sok1x_kernels_replayed": lambda s: sok.kernels_replayed(joined_torch[s % 3]),
        "sok1x_kernels_unordered": lambda s: sok.kernels_unordered(joined_torch[s % 3]),
        "sok1x_dlpack": lambda s: sok.dlpack(joined_torch[s % 3]),
        "sok1x_host": lambda s: sok.host([joined[s % 3]]),
        "sok1x_host_kept": lambda s: sok.host([joined[s % 3]], kept=True),
        "sok1x_host_pooled": lambda s: sok.host_pooled([joined[s % 3]]),
    }
    if w.hashed:
        weight = hashed_shard_weight(rt, names, w.tables, w.dim, device)
    else:
        weight = shard_weight(rt, names, device)
    offsets = np.concatenate([[0], np.cumsum([-(-v // rt.size) * rt.size
                                              for v in w.tables])[:-1]])
    graph = _graph_step(rt, w, weight, device, len(joined[0]), key_offsets=offsets.tolist(),
                        hotness=w.hotness, batch=w.batch_per_rank)
    slots = None
    if graph is not None:  # torch_dedup over torch_graph's shard, as above
        weight, slots = graph.shard()
        graph.restore = graph.snapshot([k[0] for k in joined_torch[:CHECK_STEPS]])
    group = torch_reference.TorchGroupStep(weight, rt.rank, rt.size, offsets.tolist(),
                                           w.hotness, w.batch_per_rank, w.optimizer, slots)
    del weight
    runs["torch_dedup"] = lambda s: group.step(keys_torch[s % 3])
    if graph is not None:
        runs["torch_graph"] = lambda s: graph.step(joined_torch[s % 3][0])
    return runs, graph


def host_outputs(backend, outs):
    """One host float array of a step's outputs (torch tensors or backend arrays), flattened."""
    outs = [torch_kernels.as_torch(o) for o in outs]
    return np.concatenate([(o.cpu().numpy() if torch.is_tensor(o) else np.asarray(
        backend.to_host(o))).reshape(-1) for o in outs])


def run_workload(rt, name, device, steps, repeats, scale, pcie, segment_ids=False):
    w = workloads.workload(name, rt.size, scale)
    reason = too_big(w, rt, device)
    if reason is not None:
        say(reason)
        return [{"workload": name, "ranks": rt.size, "skipped": reason}]
    backend = rt.backend
    names = sok_steps.make_tables(rt, w, SPEC)
    sok = SokVariants(rt, w, names, device, segment_ids)
    runs, graph = (_single_table_runs if w.tables is None else _table_runs)(rt, w, device, sok,
                                                                            names)
    if os.environ.get("SOK1X_BENCH_UNORDERED") != "1":
        runs.pop("sok1x_kernels_unordered")
    chosen = os.environ.get("SOK1X_BENCH_VARIANTS")
    if chosen:  # these alone, beside the two every figure below is read from
        kept = set(chosen.split(",")) | {"sok1x_device", "sok1x_bounded"}
        runs = {variant: run for variant, run in runs.items() if variant in kept}

    # Same outputs on the first steps: every variant from the same initial table.
    first = {}
    for variant, run in runs.items():
        if variant.startswith("sok1x"):
            sok_steps.make_tables(rt, w, SPEC)
            sok.step_count = 0
        if variant == "torch_graph":  # torch_dedup stepped its shard: back to the first rows
            graph.restore()
        first[variant] = [host_outputs(backend, run(s)) for s in range(CHECK_STEPS)]
    reference = first["sok1x_device"]
    diffs = {v: job_max(max(float(np.max(np.abs(a - b))) for a, b in zip(outs, reference)))
             for v, outs in first.items()}

    def synchronize():
        backend.synchronize()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    timed = {variant: harness.Steps(run, CHECK_STEPS) for variant, run in runs.items()}
    if harness.gc_frozen_if_asked():  # (unfrozen by the caller once the workload is done)
        say("%-8s the process's objects frozen out of garbage collection (gc.freeze)" % name)
    times = harness.interleaved_ms(timed, repeats, steps, synchronize)
    counts = per_step_counts(rt, timed["sok1x_device"], synchronize)
    bounded_counts = per_step_counts(rt, timed["sok1x_bounded"], synchronize)
    replayed_counts, kernels_replayed_counts = (
        per_step_counts(rt, timed[v], synchronize) if v in timed else None
        for v in ("sok1x_replayed", "sok1x_kernels_replayed"))
    stand_in_us = None
    if "sok1x_kernels" in timed:  # what TensorFlow's C++ would do, here done in Python
        synchronize()
        sok.kernels.stand_in_s = 0.0
        for _ in range(CHECK_STEPS * 10):
            timed["sok1x_kernels"]()
        synchronize()
        stand_in_us = job_max(sok.kernels.stand_in_s / (CHECK_STEPS * 10) * 1e6)
    for variant in ("sok1x_device", "sok1x_bounded", "sok1x_replayed", "sok1x_kernels",
                    "sok1x_kernels_replayed", "sok1x_dlpack"):
        if variant not in timed:
            continue
        harness.profile_steps(rt, timed[variant], synchronize, "%s %s, %d GPU(s)" % (
            name, variant, rt.size))
    graph_floor_ms = None if graph is None else job_max(graph.floor_ms())  # changes its shard
    # (changes the tables: after every figure too) dlrm26_full's recorded forward evicts:
    # replayed back to back with none of the host's work between (the counts, the rebuild of
    # worn indexes), its indexes fill with tombstones, so the figure would be no floor
    replayed_floor = (replayed_floor_ms(rt, synchronize)
                      if "sok1x_replayed" in timed and name != "dlrm26_full" else None)
    # the shape classes the replayed variants left, and the device memory they hold (issue 45:
    # what each class holds; the most of any rank), on the first replayed variant's entry
    replay_memory = None
    holder = next((v for v in ("sok1x_replayed", "sok1x_kernels_replayed") if v in timed), None)
    if holder is not None:
        replay_memory = {"replay_classes": int(job_max(replayed_step.classes_held(rt))),
                         "replay_held_mib": job_max(replayed_step.held_bytes(rt)) / 2.0 ** 20}

    entries = []
    for variant in runs:
        entry = {"workload": name, "variant": variant, "ranks": rt.size,
                 "tables": len(names), "global_batch": w.global_batch,
                 "max_abs_diff_vs_sok1x_device": diffs[variant]}
        entry.update(harness.summary(times[variant], SUMMARY_NAMES))
        if variant in HOST_VARIANTS:
            up, down = (int(job_max(b)) for b in sok.crossed[variant])
            entry.update(bytes_crossing_per_step=up + down, bytes_h2d=up, bytes_d2h=down,
                         pcie_bound_ms=up / (pcie["h2d_gbps"] * 1e6)
                         + down / (pcie["d2h_gbps"] * 1e6))
            if entry["pcie_bound_ms"] > 0:  # on the cpu backend nothing crosses a bus
                entry["over_pcie_bound"] = entry["ms_per_step"] / entry["pcie_bound_ms"]
        if variant == "sok1x_device":
            entry["per_step_counts"] = counts
        if variant == "sok1x_bounded":
            entry["per_step_counts"] = bounded_counts
        if variant == holder:
            entry.update(replay_memory)
        if variant == "sok1x_replayed":
            entry["per_step_counts"] = replayed_counts
            if replayed_floor is not None:
                entry["replayed_floor_ms"], entry["replayed_floor_parts_ms"] = replayed_floor
        if variant == "sok1x_kernels":
            entry["stand_in_us"] = stand_in_us
        if variant == "sok1x_kernels_replayed":
            entry["per_step_counts"] = kernels_replayed_counts
        if variant in ("torch_graph", "sok1x_device") and graph_floor_ms is not None:
            entry["torch_graph_floor_ms"] = graph_floor_ms
        entries.append(entry)
        say("%-8s %-13s %d ranks: %8.3f ms/step (min %.3f, max %.3f)  diff %.1e" % (
            name, variant, rt.size, entry["ms_per_step"], entry["ms_min"], entry["ms_max"],
            diffs[variant]))
    say("%-8s per step of sok1x_device: %s" % (name, counts))
    say("%-8s per step of sok1x_bounded: %s" % (name, bounded_counts))
    if replayed_counts is not None:
        say("%-8s per step of sok1x_replayed: %s" % (name, replayed_counts))
        if replayed_step.last_refusal() is not None:  # a class its step could not record
            say("%-8s a class refused its capture: %s" % (name, replayed_step.last_refusal()))
    if kernels_replayed_counts is not None:
        say("%-8s per step of sok1x_kernels_replayed: %s" % (name, kernels_replayed_counts))
    if replay_memory:
        say("%-8s replayed shape classes: %d, holding %.1f MiB of device memory (the most of a "
            "rank)" % (name, replay_memory["replay_classes"], replay_memory["replay_held_mib"]))
    if graph_floor_ms is not None:
        say("%-8s torch_graph's GPU floor (its graph replayed back to back): %.3f ms"
            % (name, graph_floor_ms))
    if replayed_floor is not None:
        say("%-8s sok1x_replayed's GPU floor (its graphs replayed back to back): %.3f ms "
            "(forward, backward, update alone: %s)" % (name, replayed_floor[0], ", ".join(
                "%.3f" % part for part in replayed_floor[1])))
    if name == "mlperf26" and device.type == "cuda":
        bandwidth = device_bandwidth(device, rt.size)
        floor_ms, floor_bytes = step_floor(w, workloads.table_batches(w, rt.rank, rt.size),
                                           rt.size, bandwidth)
        for entry in entries:
            entry.update(bandwidth, floor_ms=floor_ms, over_floor=entry["ms_per_step"] / floor_ms,
                         **floor_bytes)
        say("mlperf26 floor %.3f ms at %s (%s)" % (floor_ms, bandwidth, floor_bytes))
    for table in names:
        rt.tables.pop(table, None)
    return entries


# Issue 21: dlrm's step on a DynamicVariable, var_type "hbm" beside "hybrid" -------------------
def _walk_as_given(run, *args):
    """run(*args) with the row kernels walking hybrid batches as given (SOK1X_HOST_ORDER=0)."""
    from sok1x.backend.cuda import host_row_order as cuda_host_order
    with cuda_host_order.walked_as_given():
        return run(*args)



def run_dynamic(rt, device, steps, repeats, scale):
    """dlrm's step (sok1x_device) on one hash-placed DynamicVariable per var_type: "hbm", and
    "hybrid" whose GPU part holds half of the rows the batches' distinct keys take (later rows,
    the keys first seen later, in page-locked host memory), beside torch_dedup on the same keys
    (its dense rows hold each key's initial value: hashed_shard_weight). Returns entries like
    run_workload's plus the hybrid / hbm ratio."""
    from sok1x.engine.tables.dynamic_table import make_dynamic
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
            lambda sok, s: sok.device([keys_device[s % 3]]), SokVariants(rt, w, [name]))

    if rt.backend.NAME == "cuda":  # the hybrid step with its batches walked as given
        runs["hybrid_walk_as_given"] = functools.partial(_walk_as_given, runs["hybrid"])
    keys_torch = [torch.from_numpy(k).to(device) for k in batches.keys]
    weight = hashed_shard_weight(rt, [names["hbm"]], [workloads.total_vocabulary(w)], w.dim,
                                 device)
    dedup = torch_reference.TorchDedupStep(weight, rt.rank, rt.size)
    del weight
    runs["torch_dedup"] = lambda s: [dedup.step(keys_torch[s % 3].reshape(-1))]

    # The first steps from the initial rows: hbm's outputs against the peer's.
    first = {v: [host_outputs(rt.backend, runs[v](s)) for s in range(CHECK_STEPS)]
             for v in ("hbm", "torch_dedup")}
    peer_diff = job_max(max(float(np.max(np.abs(a - b)))
                            for a, b in zip(first["torch_dedup"], first["hbm"])))

    def synchronize():
        rt.backend.synchronize()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    timed = {variant: harness.Steps(run) for variant, run in runs.items()}
    # Three warm-up steps: every batch's keys inserted before the timing.
    times = harness.interleaved_ms(timed, repeats, steps, synchronize, warmup=3)
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
        if variant == "torch_dedup":
            entries.append({"workload": "dlrm_dynamic", "variant": variant, "ranks": rt.size,
                            "global_batch": w.global_batch,
                            "max_abs_diff_vs_sok1x_device": peer_diff})
            entries[-1].update(harness.summary(ms, SUMMARY_NAMES))
            say("dlrm_dynamic torch_dedup %d ranks: %8.3f ms/step (min %.3f, max %.3f)  diff "
                "%.1e vs hbm" % (rt.size, entries[-1]["ms_per_step"], min(ms), max(ms),
                                 peer_diff))
            continue
        entries.append({"workload": "dlrm_dynamic", "variant": "sok1x_device_" + variant,
                        "ranks": rt.size, "global_batch": w.global_batch,
                        "capacity_per_rank": capacity,
                        "hbm_rows": table.hbm_rows if variant != "hbm" else None,
                        "host_share_of_held_rows_max": host_share if variant != "hbm" else 0,
                        "distinct_keys_per_rank_max": per_rank,
                        "host_rows_per_step_max": host_rows if variant != "hbm" else 0})
        entries[-1].update(harness.summary(ms, SUMMARY_NAMES))
        say("dlrm_dynamic %-7s %d ranks: %8.3f ms/step (min %.3f, max %.3f)" % (
            variant, rt.size, entries[-1]["ms_per_step"], min(ms), max(ms)))
    entries[1]["hybrid_over_hbm"] = entries[1]["ms_per_step"] / entries[0]["ms_per_step"]
    say("dlrm_dynamic hybrid / hbm: %.2f (held rows in host memory: %.2f)" % (
        entries[1]["hybrid_over_hbm"], host_share))
    for name in names.values():
        rt.tables.pop(name, None)
    return entries


def replayed_floor_ms(rt, synchronize, replays=20):
    """The replayed step's GPU floor: (ms a step of its recorded graphs replayed back to back with
    no host work between them, [ms of each graph replayed alone]: forward, backward, update), or
    None unless the run recorded exactly one step's graphs on every rank (on several ranks the
    forward is two graphs, around its op header, and the graphs exchange with every rank); the
    first where sok1x_replayed_end recorded the same step's graphs again (its lookup reads its
    checks elsewhere: a class of its own, the same GPU work). Changes the tables (the update
    replays)."""
    with runtime.entered():
        steps = replayed_step.recorded_works(rt)
        count = len(steps[0]) if 1 <= len(steps) <= 2 else 0
        if harness.job_min(count) != job_max(count) or count not in (3, 4):
            return None
        works = steps[0]

        def timed(run):
            synchronize()
            started = time.perf_counter()
            for _ in range(replays):
                run()
            synchronize()
            return job_max((time.perf_counter() - started) * 1e3 / replays)
        parts = [timed(work.replay) for work in works]
        whole = timed(lambda: [work.replay() for work in works])
    return whole, parts


def per_step_counts(rt, run, synchronize, steps=20):
    """Per step of `run` (sok1x_device), averaged over `steps`: kernel launches, fills, copies,
    host waits, NCCL collectives, MPI exchanges, Python's garbage collections (gc_gen0..2, gc_us:
    harness.GcClock), the host's pace after them (host_pace_us: harness.host_pace_us, which
    tells a process whose host runs slow), and python_us: the host's time in the step not
    spent waiting for the GPU (wall clock less the waits); on cuda also python_us_alone, from
    `steps` more steps (which change the tables too), each begun on an idle GPU."""
    harness.barrier()
    synchronize()
    before = (launch_counts(), rt.stats())
    collected = harness.GcClock()
    try:
        started = time.perf_counter()
        for _ in range(steps):
            run()
        wall_us = (time.perf_counter() - started) * 1e6
    finally:
        collected.remove()
    stats = rt.stats()  # the engine's own count of its host waits (before synchronize below)
    waited_us = launch_counts().get("wait_us", 0) - before[0].get("wait_us", 0)
    synchronize()
    after = launch_counts()
    counts = {k: (after[k] - before[0].get(k, 0)) / steps for k in after}
    if "wait_us" in counts:
        counts["wait_us"] = waited_us / steps
        counts["python_us"] = (wall_us - waited_us) / steps
    counts["host_waits"] = (stats["host_waits"] - before[1]["host_waits"]) / steps
    counts["data_collectives"] = (stats["data_collectives"]
                                  - before[1]["data_collectives"]) / steps
    counts["mpi_exchanges"] = (stats["host_collectives"] - before[1]["host_collectives"]) / steps
    counts.update({k: v / steps for k, v in collected.counts().items()})
    if "wait_us" in counts:
        counts["python_us_alone"] = python_us_alone(run, synchronize, steps)
    counts["host_pace_us"] = harness.host_pace_us()  # this process's pace, to read the above by
    return counts


def python_us_alone(run, synchronize, steps=20):
    """The host's microseconds a step of `run` not spent waiting, each step started on an idle
    GPU (the step and its GPU work waited for before the next begins; the wait at its end, like
    the engine's own, not counted): the host's own work, without what a launch or copy into a
    queue still busy with earlier steps may block for, which python_us counts (median of the
    steps)."""
    from sok1x.backend.cuda.kernel_launch import COUNTS
    alone = []
    synchronize()
    for _ in range(steps):
        waited = COUNTS.get("wait_us", 0)
        started = time.perf_counter()
        run()
        ran = time.perf_counter()
        alone.append((ran - started) * 1e6 - (COUNTS.get("wait_us", 0) - waited))
        synchronize()
    return float(np.median(alone))


def main(argv):
    args = parse_args(argv)
    # The tables never grow in the timed steps, and growth in place (table_group.GROW_ENV) maps
    # a member's next doubling ahead from 3/4 of its capacity on: beside the PyTorch peers'
    # copies of every table, dlrm26_dynamic and dlrm26_hybrid then do not fit one H200
    # (2026-11-27, 3a96d24). Their arrays are laid out plainly unless the caller says otherwise.
    os.environ.setdefault("SOK1X_GROW_IN_PLACE", "0")
    rt = harness.start_engine(args.backend)
    device = harness.start_torch(rt, args.port)
    payload = {"ranks": rt.size, "environment": harness.environment(
        {"torch": torch.__version__, "nccl": getattr(getattr(rt.data, "library", None),
                                                     "version_text", None)}),
        "steps_per_repeat": args.steps, "repeats": args.repeats, "backend": args.backend,
        "segment_ids": args.segment_ids}
    payload["pcie"] = {k: harness.job_min(v)
                       for k, v in pinned_bandwidth(device).items()} if device.type == "cuda" \
        else {"h2d_gbps": float("inf"), "d2h_gbps": float("inf")}
    say("page-locked copies: %s GB/s" % payload["pcie"])
    payload["steps"] = []
    for name in args.workloads.split(","):
        started = time.time()
        try:
            if name == "dlrm_dynamic":
                payload["steps"] += run_dynamic(rt, device, args.steps, args.repeats,
                                                args.scale)
            else:
                payload["steps"] += run_workload(rt, name, device, args.steps, args.repeats,
                                                 args.scale, payload["pcie"], args.segment_ids)
        except Exception as exc:  # keep the other workloads' figures; the log has the trace
            import traceback
            traceback.print_exc()
            payload["steps"].append({"workload": name, "ranks": rt.size, "error": repr(exc)})
        gc.unfreeze()  # (SOK1X_BENCH_GC_FREEZE: this workload's objects may be collected now)
        harness.release_memory(rt.backend, device)
        say("%s took %.1f s" % (name, time.time() - started))
        harness.write_json(args.out, payload)
    harness.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
