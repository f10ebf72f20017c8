"""The whole engine on the cuda backend (NCCL exchanges, GPU hash tables) against what the cpu
engine computes, at any number of GPUs. No TensorFlow: this drives sok1x.engine.api directly.

    mpiexec --allow-run-as-root -n 2 python3 -m pytest -q tests/gpu/test_engine_cuda.py

The expected values come from NumPy: a key's vector is the initializer recipe's (D10), and a row's
gradient is the sum of its keys' top gradients over the whole job; the cpu engine is checked
against TensorFlow in tests/mpi on the same algorithms.
"""
import numpy as np
import pytest

pytest.importorskip("pycuda")

from mpi4py import MPI  # noqa: E402

from sok1x.backend import random_init  # noqa: E402
from sok1x.backend.cpu import random_rows as cpu_random  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.op_keys import name_key  # noqa: E402
from sok1x.errors import InvalidInputError, OrderError, TableFullError  # noqa: E402

pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.usefixtures("engine")]
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=3)


def host(array):
    """The engine returns device arrays (DESIGN D1): bring one to NumPy for comparing."""
    return runtime.get().backend.to_host(array)


def expected_vectors(table, keys, dim):
    return cpu_random.initial_values(SPEC, name_key("table:" + table), keys, dim)


def job_gradient_by_key(keys_per_rank, grads_per_rank):
    merged = {}
    for keys, grads in zip(keys_per_rank, grads_per_rank):
        for key, grad in zip(keys.reshape(-1).tolist(), grads.reshape(-1, grads.shape[-1])):
            merged[key] = merged.get(key, 0.0) + grad.astype(np.float64)
    return merged


def owner_gradient_by_key(table, values, rows):
    rt = runtime.get()
    shard = rt.tables[table]
    if shard.use_hashtable:
        keys_held, rows_held = (rt.backend.to_host(a) for a in shard.index.export())
        lookup = dict(zip(rows_held.tolist(), keys_held.tolist()))
        keys = [lookup[r] for r in rows.tolist()]
    else:
        keys = (rows * SIZE + RANK).tolist()
    merged = {}
    for part in COMM.allgather((keys, values)):
        merged.update(zip(part[0], part[1]))
    return merged


@pytest.mark.parametrize("use_hashtable", [True, False])
@pytest.mark.parametrize("dim", [8, 128])
def test_dense_lookup_and_gradient(use_hashtable, dim):
    table = "dense_%s_%d" % (use_hashtable, dim)
    api.create_table(table, dim, 50000, use_hashtable, SPEC)
    rng = np.random.default_rng(100 + RANK)
    limit = 2 ** 62 if use_hashtable else 50000 * SIZE
    keys = rng.integers(0, limit, size=(512, 10, 5))
    keys[:, 0] = keys[:, 0] % 97  # repeats inside and across ranks
    out, token = api.dense_lookup(table, "fwd", keys, True, (10, 5))
    out = host(out)
    np.testing.assert_array_equal(out, expected_vectors(table, keys.reshape(-1), dim)
                                  .reshape(out.shape))
    top = rng.standard_normal(out.shape).astype(np.float32)
    values, rows = (host(a) for a in api.dense_lookup_grad(table, "bwd", token, top))
    got = owner_gradient_by_key(table, values, rows)
    want = job_gradient_by_key(COMM.allgather(keys), COMM.allgather(top))
    assert sorted(got) == sorted(want)
    for key, grad in want.items():
        np.testing.assert_allclose(got[key], grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_sparse_lookup(combiner):
    table = "sparse_" + combiner
    dim, slots, nnz, batch = 16, 4, 3, 256
    api.create_table(table, dim, 50000, True, SPEC)
    rng = np.random.default_rng(7 + RANK)
    mask = rng.random((batch * slots, nnz)) < 0.6
    rows, columns = np.nonzero(mask)
    indices = np.stack([rows, columns], 1).astype(np.int64)
    keys = rng.integers(0, 5000, size=len(rows))
    pooled, token = api.sparse_lookup(table, "sfwd", indices, keys, [batch * slots, nnz], slots,
                                      nnz, combiner, True)
    pooled = host(pooled)
    vectors = expected_vectors(table, keys, dim).astype(np.float64)
    want = np.zeros((batch * slots, dim))
    np.add.at(want, rows, vectors)
    if combiner == "mean":
        want /= np.maximum(np.bincount(rows, minlength=batch * slots), 1)[:, None]
    np.testing.assert_allclose(pooled.reshape(-1, dim), want, rtol=1e-5, atol=1e-6)
    values, local_rows = (host(a) for a in api.sparse_lookup_grad(table, "sbwd", token,
                                                                  np.ones_like(pooled)))
    total = COMM.allreduce(float(values.sum()))
    if combiner == "sum":
        assert total == pytest.approx(COMM.allreduce(len(keys)) * dim, rel=1e-5)


@pytest.mark.parametrize("placement", ["mod", "hash", ("rank", 0)])
def test_fused_pooled_lookup_of_three_tables(placement):
    from sok1x.engine.lookup.pooled import PooledInput
    dims, names = (8, 32, 4), []
    for t, dim in enumerate(dims):
        names.append("fused_%s_%d" % (placement if isinstance(placement, str) else "rank", t))
        api.create_table(names[-1], dim, 20000, t != 1 or placement == "hash", SPEC,
                         placement=placement)
    rng = np.random.default_rng([21, RANK])
    inputs, wants = [], []
    for t, (name, dim) in enumerate(zip(names, dims)):
        batch, nnz = 64, 300 + 50 * t
        keys = rng.integers(0, 20000 if placement != "hash" else 2 ** 50, size=nnz)
        segments = np.sort(rng.integers(0, batch, size=nnz))
        weights = rng.random(nnz).astype(np.float32) if t != 0 else None
        combiner = "mean" if t == 2 else "sum"
        inputs.append(PooledInput(keys, segments, batch, weights, combiner))
        vectors = expected_vectors(name, keys, dim).astype(np.float64)
        w = np.ones(nnz) if weights is None else weights.astype(np.float64)
        want = np.zeros((batch, dim))
        np.add.at(want, segments, vectors * w[:, None])
        if combiner == "mean":
            total = np.bincount(segments, weights=w, minlength=batch)
            want = np.where(total[:, None] > 0, want / np.where(total == 0, 1, total)[:, None], 0)
        wants.append(want)
    outputs, token = api.pooled_lookup(names, "fused_fwd", inputs, True)
    for got, want in zip(outputs, wants):
        np.testing.assert_allclose(host(got), want, rtol=1e-5, atol=1e-5)
    grads = api.pooled_lookup_grad(names, "fused_bwd", token,
                                   [np.ones_like(host(o)) for o in outputs])
    for (values, _rows), item in zip(grads, inputs):
        total = COMM.allreduce(float(host(values).sum()))
        if item.combiner == "sum":
            w = 1.0 if item.weights is None else item.weights
            want = COMM.allreduce(float(np.sum(np.ones(len(item.keys)) * w))) * host(
                values).shape[1]
            assert total == pytest.approx(want, rel=1e-4)


def test_bad_key_on_one_rank_fails_everywhere_and_changes_nothing():
    table = "guarded"
    api.create_table(table, 4, 16, True, SPEC)
    good = np.array([[[RANK, RANK + SIZE]]])
    api.dense_lookup(table, "g1", good, True, (1, 2))
    held = runtime.get().tables[table].index.size
    bad = good.copy()
    if RANK == SIZE - 1:
        bad[0, 0, 1] = -1
    with pytest.raises(InvalidInputError, match="rank %d: guarded: key -1" % (SIZE - 1)):
        api.dense_lookup(table, "g2", bad, True, (1, 2))
    assert runtime.get().tables[table].index.size == held
    many = (np.arange(40) * SIZE + RANK).reshape(1, 5, 8)
    with pytest.raises(TableFullError, match="is full"):
        api.dense_lookup(table, "g3", many, True, (5, 8))
    assert runtime.get().tables[table].index.size == held


def test_ranks_in_different_ops_raise_instead_of_hanging():
    if SIZE == 1:
        pytest.skip("needs two ranks")
    api.create_table("order", 4, 16, True, SPEC)
    keys = np.array([[[RANK]]])
    with pytest.raises(OrderError, match="different sok1x collectives"):
        api.dense_lookup("order", "op_a" if RANK == 0 else "op_b", keys, True, (1, 1))


def test_allreduce_over_nccl():
    got = api.allreduce("ar", [np.full(1000, RANK + 1.0, np.float32), np.ones((3, 3))], True)
    np.testing.assert_allclose(got[0], (SIZE + 1) / 2.0)
    np.testing.assert_allclose(got[1], 1.0)


def test_full_gpu_fails_the_step_on_every_rank_and_says_what_to_do():
    from sok1x.errors import DeviceMemoryError
    # The last rank asks for 2**34 rows of 128 floats (8 TiB); the others for a few rows.
    capacity = 2 ** 34 if RANK == SIZE - 1 else 16
    api.create_table("too_big_for_the_gpu", 128, capacity, False, SPEC, replace=True)
    with pytest.raises(DeviceMemoryError, match="rank %d: .*allow_growth" % (SIZE - 1)):
        api.dense_lookup("too_big_for_the_gpu", "huge", np.array([[[RANK]]]), True, (1, 1))
    # The engine still works afterwards.
    test_allreduce_over_nccl()


def test_a_rank_that_skipped_a_call_raises_order_error_not_a_silent_pairing():
    """A rank whose step failed before sok1x ran (TensorFlow rejected its input) has counted the
    tower's call anyway (graph_ops/ordering.py's ticker): its next lookup meets the others'
    current one, which fails with OrderError naming both calls, and waits for their next one:
    every rank goes on from the same next step."""
    if SIZE == 1:
        pytest.skip("needs two ranks")
    from sok1x.engine.op_order import CLOCK, OpId
    api.create_table("skew", 4, 64, False, SPEC)
    op = OpId("skew-tower/lookup", "skew-tower", 0, True)
    keys = np.array([[[RANK]]])
    CLOCK.tick("skew-tower")
    if RANK == SIZE - 1:
        CLOCK.tick("skew-tower")  # the call whose step failed on this rank alone
    else:
        with pytest.raises(OrderError, match="different steps"):
            api.dense_lookup("skew", op, keys, True, (1, 1))
        CLOCK.tick("skew-tower")  # the next step
    out, _ = api.dense_lookup("skew", op, keys, True, (1, 1))
    np.testing.assert_array_equal(host(out).reshape(-1), expected_vectors("skew", [RANK], 4)[0])


def _waits_of_a_step(tables, update):
    """Host waits and MPI calls of one step (lookup, gradient and, if `update`, SGD) of a fused
    lookup of `tables` tables, after a warm-up step."""
    rt = runtime.get()
    names = ["waits_%d_%d" % (tables, t) for t in range(tables)]
    for name in names:
        api.create_table(name, 16, 4096, False, SPEC)
    rng = np.random.default_rng(7 + RANK)
    inputs = [api.PooledInput(rt.backend.asarray(rng.integers(0, 4096 * SIZE, size=300)),
                              rt.backend.asarray(np.sort(rng.integers(0, 64, size=300))), 64,
                              None, "sum") for _ in names]
    grads = [rt.backend.asarray(np.ones((64, 16), np.float32)) for _ in names]

    def step():
        _, token = api.pooled_lookup(names, "waits_fwd", inputs, True)
        for name, (values, rows) in zip(names, api.pooled_lookup_grad(names, "waits_bwd",
                                                                      token, grads)):
            if update:
                api.apply_optimizer_update(name, "sgd", "SGD", {}, {"lr": 0.1}, values, rows)
    step()
    rt.backend.synchronize()
    before = rt.stats()
    step()
    after = rt.stats()
    return {key: after[key] - before[key] for key in after}


def test_a_training_step_waits_on_the_host_twice():
    """Forward, backward and update wait on the host twice at any number of GPUs (the two op
    headers), and make no MPI call: the sizes travel over NCCL."""
    counts = _waits_of_a_step(1, update=True)
    assert counts["host_waits"] <= 2 and counts["host_collectives"] == 0, counts


def test_a_lookup_of_26_tables_waits_as_often_as_one():
    one, many = _waits_of_a_step(1, update=False), _waits_of_a_step(26, update=False)
    assert many["host_waits"] == one["host_waits"] <= 2, (one, many)
    assert many["host_collectives"] == 0, many
