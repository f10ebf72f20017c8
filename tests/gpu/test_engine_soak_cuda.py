"""20,000 engine steps on the cuda backend (lookup, gradient, Adam update: NCCL exchanges,
page-locked staging, pooled device memory) keep the host's resident memory, the page-locked
staging and the memory pool flat after a warm-up of a quarter of the steps. Rank-agnostic:

    mpiexec --allow-run-as-root -n 2 python3 -m pytest -q tests/gpu/test_engine_soak_cuda.py
"""
import numpy as np
import pytest

pytest.importorskip("pycuda")

from mpi4py import MPI  # noqa: E402

from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api  # noqa: E402

pytestmark = pytest.mark.timeout(600, method="thread")
STEPS = 20000
KIB_PER_STEP = 0.05
BATCH, DIM, KEYS = 64, 8, 5000


def resident_kib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4  # pages of 4 KiB


def test_twenty_thousand_steps_keep_memory_flat(engine):
    from sok1x.backend.cuda import context as cuda_context
    from sok1x.backend.cuda import staging as cuda_staging
    api.create_table("soak_table", DIM, 20000, True,
                     random_init.make_spec("uniform", -1.0, 1.0, seed=3))
    rng = np.random.default_rng(engine.rank)
    batches = [rng.integers(0, KEYS, size=(BATCH, 2)) for _ in range(32)]
    warm = STEPS // 4
    for number in range(STEPS):
        if number == warm:
            start = (resident_kib(), cuda_staging.pinned_bytes(),
                     cuda_context.memory_pool().held_blocks
                     + cuda_context.memory_pool().active_blocks)
        vectors, token = api.dense_lookup("soak_table", "soak", batches[number % 32], True)
        grads = np.ones(vectors.shape, np.float32)
        values, rows = api.dense_lookup_grad("soak_table", "soak_grad", token, grads)
        api.apply_optimizer_update("soak_table", "adam", "Adam", {},
                                   {"lr_t": 0.001, "beta1": 0.9, "beta2": 0.999,
                                    "epsilon": 1e-7}, values, rows)
    engine.backend.synchronize()
    end = (resident_kib(), cuda_staging.pinned_bytes(),
           cuda_context.memory_pool().held_blocks + cuda_context.memory_pool().active_blocks)
    per_step = (end[0] - start[0]) / float(STEPS - warm)
    print("rank %d: RSS %+d KiB over %d steps (%.4f KiB/step), pinned %d -> %d bytes, pool "
          "blocks %d -> %d" % (engine.rank, end[0] - start[0], STEPS - warm, per_step, start[1],
                               end[1], start[2], end[2]))
    worst = MPI.COMM_WORLD.allreduce(per_step, op=MPI.MAX)
    assert worst < KIB_PER_STEP, "RSS grew %.4f KiB per step on some rank" % worst
    # How many blocks are in flight at once may vary a little with timing; a leak would not.
    assert end[1] - start[1] <= 1 << 20, "page-locked staging grew from %d to %d bytes" % (
        start[1], end[1])
    assert end[2] <= start[2] + 8, "the memory pool grew from %d to %d blocks" % (start[2],
                                                                                 end[2])
