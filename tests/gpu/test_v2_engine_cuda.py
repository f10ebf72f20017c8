"""The engine side of SOK's v2 API (sok1x.Variable / DynamicVariable tables, the latter hybrid with
rows in host memory, the fused pooled lookup with a Variable's row limit, shard_rows' assign and
export, an optimizer update, the low-frequency filter) on the cuda backend against a NumPy model of
tf.nn.embedding_lookup_sparse + SGD, at any number of GPUs. No TensorFlow: this drives
sok1x.engine directly.

    mpiexec -n 2 python3 -m pytest -q tests/gpu/test_v2_engine_cuda.py

SOK1X_TEST_BACKEND=cpu runs the same checks on the cpu backend (no GPU needed).
"""
import os

import numpy as np
import pytest
from mpi4py import MPI

from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.tables import shard_rows
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.engine.lookup.pooled import PooledInput
from sok1x.errors import InvalidInputError

BACKEND = os.environ.get("SOK1X_TEST_BACKEND", "cuda")
if BACKEND == "cuda":
    pytest.importorskip("pycuda")

pytestmark = [pytest.mark.timeout(300, method="thread"), pytest.mark.usefixtures("engine")]
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ZERO = random_init.make_spec("constant", 0.0)
# name: (keys, dim, placement, hash table, combiner, weighted, hotness)
TABLES = {
    "v2gpu_distributed": (37, 4, "mod", False, "sum", False, 3),
    "v2gpu_localized": (23, 6, ("rank", SIZE - 1), False, "mean", True, 5),
    "v2gpu_dynamic": (50, 5, "hash", True, "mean", True, 4),
}
GLOBAL_BATCH = 8


def initial():
    rng = np.random.default_rng(21)
    return {name: rng.uniform(-1, 1, size=(spec[0], spec[1])).astype(np.float32)
            for name, spec in TABLES.items()}


def make_tables():
    values = initial()
    for name, (keys, dim, placement, hashed, _, _, _) in TABLES.items():
        per_rank = keys if placement != "mod" else -(-keys // SIZE)
        # The DynamicVariable's table: hybrid, growing from 8 rows, vectors beyond 16 rows in
        # page-locked host memory.
        dynamic = make_dynamic("hybrid", 8, 64, "lru", 16 * dim * 4 / 2 ** 30) if hashed else None
        api.create_table(name, dim, 64 if hashed else per_rank, hashed, ZERO, replace=True,
                         placement=placement, dynamic=dynamic)
        # every rank passes every key; each writes those it holds
        shard_rows.assign(name, np.arange(keys), values[name],
                          key_limit=None if hashed else keys)
    return values


def batch(step):
    """Per table (keys per sample, weights per sample or None) of the global batch."""
    rng = np.random.default_rng([step, 8])
    parts = {}
    for name, (keys, _, _, _, _, weighted, hotness) in TABLES.items():
        lengths = rng.integers(0, hotness + 1, size=GLOBAL_BATCH)
        sample_keys = [rng.integers(0, keys, size=n) for n in lengths]
        weights = [rng.uniform(0.5, 2, size=n) for n in lengths] if weighted else None
        parts[name] = (sample_keys, weights)
    return parts


def pooled_inputs(parts):
    per = GLOBAL_BATCH // SIZE
    mine = slice(RANK * per, (RANK + 1) * per)
    inputs = []
    for name, (sample_keys, weights) in parts.items():
        sample_keys = sample_keys[mine]
        lengths = [len(k) for k in sample_keys]
        keys = np.concatenate(sample_keys).astype(np.int64)
        segments = np.repeat(np.arange(per), lengths).astype(np.int64)
        w = None if weights is None else np.concatenate(weights[mine]).astype(np.float32)
        inputs.append(PooledInput(keys, segments, per, w, TABLES[name][4]))
    return inputs


def reference(tables, parts):
    """(pooled [global batch, dim] per table, d sum(pooled) / d table per table), float64."""
    pooled, grads = {}, {}
    for name, (sample_keys, weights) in parts.items():
        table = tables[name].astype(np.float64)
        out, grad = np.zeros((GLOBAL_BATCH, table.shape[1])), np.zeros_like(table)
        for s, keys in enumerate(sample_keys):
            if not len(keys):
                continue
            w = np.ones(len(keys)) if weights is None else weights[s]
            factor = w / w.sum() if TABLES[name][4] == "mean" else w
            out[s] = (table[keys] * factor[:, None]).sum(axis=0)
            np.add.at(grad, keys, np.repeat(factor[:, None], table.shape[1], axis=1))
        pooled[name], grads[name] = out, grad
    return pooled, grads


def exported(name):
    """The job's whole table, gathered from every rank's export."""
    keys, values = shard_rows.export(name, None if TABLES[name][3] else TABLES[name][0])
    table = np.zeros((TABLES[name][0], TABLES[name][1]), np.float32)
    for shard_keys, shard_values in COMM.allgather((keys, values)):
        table[shard_keys] = shard_values
    return table, keys


def test_lookup_and_sgd_match_the_reference():
    tables = {name: value.astype(np.float64) for name, value in make_tables().items()}
    names = list(TABLES)
    limits = [None if TABLES[n][3] else TABLES[n][0] for n in names]
    backend = runtime.get().backend
    for step in range(5):
        parts = batch(step)
        outputs, token = api.pooled_lookup(names, "v2gpu_forward_%d" % step,
                                           pooled_inputs(parts), True, limits)
        want, grads = reference(tables, parts)
        per = GLOBAL_BATCH // SIZE
        for name, output in zip(names, outputs):
            np.testing.assert_allclose(backend.to_host(output),
                                       want[name][RANK * per:(RANK + 1) * per], rtol=1e-5,
                                       atol=1e-6, err_msg=name)
        ones = [np.ones((per, TABLES[n][1]), np.float32) for n in names]
        slices = api.pooled_lookup_grad(names, "v2gpu_backward_%d" % step, token, ones)
        for name, (values, rows) in zip(names, slices):
            api.apply_optimizer_update(name, "sgd", "SGD", {}, {"lr": 1.0}, values, rows)
            tables[name] -= grads[name]
    for name in names:
        got, keys = exported(name)
        np.testing.assert_allclose(got, tables[name], rtol=1e-5, atol=1e-5, err_msg=name)
        if TABLES[name][2] == "mod":
            np.testing.assert_array_equal(keys, np.arange(RANK, TABLES[name][0], SIZE))


def test_a_key_beyond_a_variables_rows_fails_every_rank_and_changes_nothing():
    make_tables()
    before = [exported(name)[0] for name in TABLES]
    inputs = pooled_inputs(batch(0))
    if RANK == SIZE - 1:  # one rank's bad key: every rank raises
        keys = inputs[0].keys.copy()
        keys[-1] = TABLES["v2gpu_distributed"][0]
        inputs[0] = inputs[0]._replace(keys=keys)
    limits = [None if spec[3] else spec[0] for spec in TABLES.values()]
    with pytest.raises(InvalidInputError, match="number of rows"):
        api.pooled_lookup(list(TABLES), "v2gpu_bad", inputs, True, limits)
    for name, table in zip(TABLES, before):
        np.testing.assert_array_equal(exported(name)[0], table)


def _one_key_per_sample(name, op, keys, ratio):
    """A pooled lookup of this rank's share of `keys` (one key per sample, "sum") and its
    backward with ones; returns host (outputs [n, dim], gradient rows)."""
    per = len(keys) // SIZE
    mine = np.asarray(keys[RANK * per:(RANK + 1) * per], np.int64)
    item = PooledInput(mine, np.arange(per, dtype=np.int64), per, None, "sum", ratio)
    backend = runtime.get().backend
    (output,), token = api.pooled_lookup([name], op, [item], True)
    (values, rows), = api.pooled_lookup_grad([name], op + "_grad", token,
                                             [np.ones((per, 3), np.float32)])
    return backend.to_host(output), np.asarray(backend.to_host(rows))


def test_low_frequency_filter_admits_new_keys_by_ratio():
    """SOK's filter (engine/tables/admission.py) on a hybrid hash table: ratio 0 keeps new keys out
    (zeros, no gradient row, not inserted) and lets held ones through; ratio 1 admits all."""
    name = "v2gpu_filter"
    api.create_table(name, 3, 64, True, random_init.make_spec("constant", 0.5), replace=True,
                     placement="hash", dynamic=make_dynamic("hybrid", 8, 64, "lru",
                                                            16 * 3 * 4 / 2 ** 30))
    held = np.arange(24) % 8
    out, _ = _one_key_per_sample(name, "v2gpu_filter_a", held, None)
    np.testing.assert_array_equal(out, np.full_like(out, 0.5))
    every = np.arange(24)
    out, rows = _one_key_per_sample(name, "v2gpu_filter_b", every, 0.0)
    per = 24 // SIZE
    mine = every[RANK * per:(RANK + 1) * per]
    want = np.where((mine < 8)[:, None], 0.5, 0.0) * np.ones((1, 3))
    np.testing.assert_array_equal(out, want)
    keys, _ = shard_rows.export(name)
    assert sorted(np.concatenate(COMM.allgather(keys)).tolist()) == list(range(8))
    assert COMM.allreduce(len(rows)) == 8  # a gradient row for each held key, none else
    out, _ = _one_key_per_sample(name, "v2gpu_filter_c", every, 1.0)
    np.testing.assert_array_equal(out, np.full_like(out, 0.5))
    keys, _ = shard_rows.export(name)
    assert sorted(np.concatenate(COMM.allgather(keys)).tolist()) == list(range(24))
