"""One training step of a sok1x embedding table, two ways.

api:    sok1x.engine.api's entry points fed host NumPy arrays, their outputs brought back to the
        host each time (forward lookup, its gradient, then the LazyAdam update): the plain
        host path without page-locked staging (framework_step.py has the seam's two real paths).
        The top gradient is the output itself (loss = 0.5 * ||out||^2).
device: the same algorithm with the arrays left on the GPU: key_exchange.lookup_forward, then the
        backward exchange and the update from the engine's own backend ops, without the copies
        to and from the host that the api's NumPy boundary costs. It shows what the engine's
        kernels and exchanges take by themselves.

dense = All2AllDenseEmbedding (one vector per key), sparse = DistributedEmbedding with the sum
combiner (one vector per (sample, slot)).

EngineStep is framework_step.py's step of a Workload (workloads.py) on engine arrays: one table
looked up dense, or several in one keyed lookup; step_calls.py profiles it without PyTorch.
"""
import time

import numpy as np

from sok1x.engine import api
from sok1x.engine import runtime as engine_runtime
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.engine.lookup.key_exchange import exchange_gradients, lookup_forward
from sok1x.engine.lookup.keyed import KeyedInput
from sok1x.engine.op_order import OpId

import workloads

BETA1, BETA2, EPSILON, LEARNING_RATE = 0.9, 0.999, 1e-8, 1e-3
ADAGRAD_INITIAL = 0.1  # the accumulator's initial value (the engine's default)
SLOT_PREFIX = "Adam"
# EngineStep's lookup and backward: a tower's first two ops, as a graph chains them
# (graph_ops/ordering.py), so the backward opens no step of its own
FORWARD, BACKWARD = OpId("fwd", "bench", 0), OpId("bwd", "bench", 1)


def lazy_adam_hyper(step):
    """The engine's LazyAdam hyper-parameters for 1-based `step` (TensorFlow's lr_t)."""
    lr_t = LEARNING_RATE * (1.0 - BETA2 ** step) ** 0.5 / (1.0 - BETA1 ** step)
    return {"lr_t": lr_t, "beta1": BETA1, "beta2": BETA2, "epsilon": EPSILON}


def ensure_lazy_adam(backend):
    """Returns where the backend's LazyAdam update comes from. The cuda backend module gains the
    optimizer kernels as part of the optimizer work; until it re-exports them, the bench attaches
    cuda_optimizers.update_lazy_adam so that the engine's own update path runs."""
    if hasattr(backend, "update_lazy_adam"):
        return "backend"
    from sok1x.backend.cuda import optimizers as cuda_optimizers
    backend.update_lazy_adam = cuda_optimizers.update_lazy_adam
    return "attached from cuda_optimizers"


class SokStep:
    """A step of table `table_name` (created by the caller) for one Workload."""

    def __init__(self, table_name, workload, pooled):
        self.table_name = table_name
        self.w = workload
        self.pooled = pooled
        self.step_count = 0
        self.phases = None

    def start_phases(self):
        """From now on api_step adds the host time of its three calls to self.phases (ms); the
        update is waited for so that its kernels count."""
        self.phases = {"forward": 0.0, "backward": 0.0, "update": 0.0}

    def _phase(self, name, since):
        now = time.perf_counter()
        if self.phases is not None:
            self.phases[name] += (now - since) * 1e3
        return now

    # -- api -------------------------------------------------------------------------------

    def api_step(self, keys, sparse):
        """Runs one step through the api; returns the forward output (host)."""
        self.step_count += 1
        w = self.w
        started = time.perf_counter()
        if self.pooled:
            out, token = api.sparse_lookup(self.table_name, "bench_fwd", sparse.indices,
                                           sparse.values, sparse.dense_shape, w.slots, w.nnz,
                                           "sum", True)
            started = self._phase("forward", started)
            values, rows = api.sparse_lookup_grad(self.table_name, "bench_bwd", token, out)
        else:
            out, token = api.dense_lookup(self.table_name, "bench_fwd", keys, True,
                                          (w.slots, w.nnz))
            started = self._phase("forward", started)
            values, rows = api.dense_lookup_grad(self.table_name, "bench_bwd", token, out)
        host = engine_runtime.get().backend.to_host
        out, values, rows = host(out), host(values), host(rows)
        started = self._phase("backward", started)
        api.apply_optimizer_update(self.table_name, "lazy_adam", SLOT_PREFIX, {},
                                   lazy_adam_hyper(self.step_count), values, rows)
        if self.phases is not None:
            engine_runtime.get().backend.synchronize()
            self._phase("update", started)
        return out

    # -- device ----------------------------------------------------------------------------

    def device_step(self, keys, segment_ids):
        """Runs one step with device arrays; returns the forward output (device array).
        segment_ids: a device int64 array (pooled steps) or None."""
        self.step_count += 1
        rt = engine_runtime.get()
        backend = rt.backend
        with engine_runtime.entered():
            table = rt.tables[self.table_name]
            vectors, routing = lookup_forward(rt, table, "bench_fwd", keys.reshape(-1), True)
            if self.pooled:
                count = keys.shape[0] * self.w.slots
                out = backend.segment_sum(vectors, segment_ids, count)
                per_key = backend.take_rows(out, segment_ids)
            else:
                out = per_key = vectors
            rows, summed = exchange_gradients(rt, table, "bench_bwd", routing, per_key)
            hyper = lazy_adam_hyper(self.step_count)
            backend.update_lazy_adam(table.values, table.slot(SLOT_PREFIX + "/m"),
                                     table.slot(SLOT_PREFIX + "/v"), rows, summed, hyper["lr_t"],
                                     hyper["beta1"], hyper["beta2"], hyper["epsilon"])
            return out


def make_tables(rt, w, spec):
    """Makes Workload w's tables anew, initialised by InitializerSpec `spec`: one (seed, dlrm)
    or one per feature (dlrm26, mlperf26); as v1 hash tables (use_hashtable, a shard holding
    every key its rank owns) where w.hashed, as DynamicVariables of that var_type (that many
    rows, growing to twice that) where w.hashed is "hbm" or "hybrid" (dlrm26_split's with half of
    the rows they start with in GPU memory); dlrm26_full's at workloads.full_rows, never
    growing. Returns their names."""
    if w.tables is None:
        names, sizes = ["fw_%s_0" % w.name], [workloads.total_vocabulary(w)]
    else:
        names, sizes = ["fw_%s_%d" % (w.name, t) for t in range(len(w.tables))], w.tables
    full = workloads.full_rows(w, rt.size) if w.name == "dlrm26_full" else None
    # The old shards go first, their memory back to the driver: a remake (the first-steps check
    # makes the tables once per sok1x variant) must not hold two sets at once beside PyTorch's
    # copies (dlrm26_dynamic ran out of memory on one H200 at a remake, 2026-11-26).
    for name in names:
        rt.tables.pop(name, None)
    rt.backend.free_device_memory()
    for name, keys in zip(names, sizes):
        rows = -(-keys // rt.size)
        gib = rows // 2 * 4 * w.dim / 2 ** 30 if w.name == "dlrm26_split" else 0.0
        dynamic = (make_dynamic(w.hashed, rows, 2 * rows, "lru", gib)
                   if w.hashed in ("hbm", "hybrid") else None)
        if full is not None:  # full from the first steps on: every step evicts
            rows, dynamic = full, make_dynamic("hybrid", full, full, "lru")
        # no one reads the keys a full table evicts: dropped, as SOK's DynamicVariable drops
        # them until a sparse_read_and_evict is built (kept, they would pile up on the device)
        if full is not None:
            api.drop_evicted(name)
        api.create_table(name, w.dim, dynamic.max_capacity if dynamic else rows, bool(w.hashed),
                         spec, replace=True, dynamic=dynamic)
        api.shard(name)
    return names


class EngineStep:
    """A training step of Workload w's tables `names` (make_tables) through the engine api, on
    engine arrays: one table looked up dense (seed, dlrm), or several in one keyed lookup
    (dlrm26, mlperf26): the keys of all tables in one array with per-table lengths, one output
    array, one gradient (engine/lookup/keyed.py, as TorchRec's KeyedJaggedTensor), so no
    framework tensor and no engine object per table. The top gradient is the output.
    Where every table has one key per sample (dlrm26), the keys go without segment ids, each
    its own output row (no pooling, as dlrm's dense lookup), unless segment_ids=True."""

    def __init__(self, rt, w, names, segment_ids=False):
        self.rt, self.w, self.names = rt, w, names
        self.backend = rt.backend
        self.step_count = 0
        self.rule = w.optimizer
        self.slot_prefix = SLOT_PREFIX if w.optimizer == "lazy_adam" else "Adagrad"
        hotness = w.hotness or ()
        self._lengths = np.array([w.batch_per_rank * hot for hot in hotness], dtype=np.int64)
        self._segments = None
        if segment_ids or any(hot != 1 for hot in hotness):
            self._segments = self.backend.asarray(np.concatenate(
                [np.arange(w.batch_per_rank * hot, dtype=np.int64) // hot for hot in hotness]
                or [np.zeros(0, np.int64)]))
        self._counts = None  # the keyed backward's rows per table, for the update
        self.replay = False  # replay=True (engine/lookup/replayed_step.py)
        self.checks = "backward"  # where the lookup reads its key checks: "end", its own end
        self.detach = False  # detach=True: a replay's outputs as copies (TensorFlow's graph ops)

    def _hyper(self):
        self.step_count += 1
        if self.rule == "adagrad":
            return {"lr": LEARNING_RATE, "epsilon": EPSILON}
        return lazy_adam_hyper(self.step_count)

    # one step on engine arrays, a framework's conversions passed in by subclasses -------------
    def _forward(self, *keys):
        w = self.w
        if w.tables is None:
            out, token = api.dense_lookup(self.names[0], FORWARD, keys[0], True, (w.slots, w.nnz),
                                          checks=self.checks,  # this step runs the backward
                                          replay=self.replay, detach=self.detach)
            return [out, token]
        keyed = KeyedInput(keys[0], self._lengths, self._segments,
                           [w.batch_per_rank] * len(self.names), None, "sum")
        # pooled keys replay with their checks read at the lookup's end (keyed.py)
        checks = "end" if self.replay and self._segments is not None else self.checks
        out, token = api.keyed_lookup(self.names, FORWARD, keyed, True, checks=checks,
                                      replay=self.replay, detach=self.detach)
        return [out, token]

    def _backward(self, token, grads):
        if self.w.tables is None:
            values, rows = api.dense_lookup_grad(self.names[0], BACKWARD, token, grads[0],
                                                 detach=self.detach)
            return [(values, rows)]
        values, rows, self._counts = api.keyed_lookup_grad(self.names, BACKWARD, token, grads[0],
                                                           detach=self.detach)
        return [(values, rows)]

    def _update(self, pairs, hyper):
        if self.w.tables is None:
            api.apply_optimizer_updates(self.names, self.rule, self.slot_prefix, {}, hyper,
                                        [v for v, _ in pairs], [r for _, r in pairs])
            return
        (values, rows), = pairs
        api.apply_keyed_update(self.names, self.rule, self.slot_prefix, {}, hyper, values, rows,
                               self._counts)

    def device(self, keys_device):
        """One step on engine arrays `keys_device` (a list of one array); returns the outputs."""
        with engine_runtime.entered():  # PyCUDA reshapes device arrays only with its context
            return self._device(keys_device)

    def _device(self, keys_device):
        results = self._forward(*keys_device)
        outs, token = results[:-1], int(results[-1])
        self._update(self._backward(token, outs), self._hyper())
        return outs
