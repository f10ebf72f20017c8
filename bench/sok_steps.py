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
"""
import time

from sok1x.engine import api
from sok1x.engine import runtime as engine_runtime
from sok1x.engine.key_exchange import exchange_gradients, lookup_forward

BETA1, BETA2, EPSILON, LEARNING_RATE = 0.9, 0.999, 1e-8, 1e-3
ADAGRAD_INITIAL = 0.1  # the accumulator's initial value (the engine's default)
SLOT_PREFIX = "Adam"


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
    from sok1x.backend import cuda_optimizers
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
