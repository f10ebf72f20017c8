"""The checkpoint tests' reference, in one place (tests/mpi and tests/cpu/jobs use it): a
training step whose keys do not depend on the number of ranks, and every row of a table over
all ranks, gathered with mpi4py from each rank's own shard (the engine's own view), so a test
compares what a load restored with what was there before the save.
"""
import numpy as np
from mpi4py import MPI

from sok1x.engine import api

COMM = MPI.COMM_WORLD
ADAM = dict(lr_t=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7)
ADAM_SLOTS = ("Adam/m", "Adam/v")


def train_step(name, keys, op, gradient):
    """Looks up `keys` (the same on every rank; rank r takes keys[r::size]) of table `name` in
    op `op` and applies one Adam update with every gradient element equal to `gradient`."""
    mine = np.asarray(keys, np.int64)[COMM.rank::COMM.size]
    vectors, token = api.dense_lookup(name, op, mine, True)
    # Made on the table's backend (device arrays on cuda: SOK1X_TEST_BACKEND=cuda).
    top = api.shard(name).backend.asarray(np.full(vectors.shape, gradient, vectors.dtype))
    values, rows = api.dense_lookup_grad(name, op, token, top)
    api.apply_optimizer_update(name, "adam", "Adam", {}, ADAM, values, rows)


def _host(table, array):
    """A host copy of a table's array (rows split into host memory: on cpu, the one array
    holding both parts)."""
    if array is None:
        return None
    whole = getattr(array, "whole", None)
    return np.asarray(table.backend.to_host(array if whole is None else whole))


def every_row(name, slots=ADAM_SLOTS, times=False, trained_only=False):
    """{key: [value, one array per slot name in `slots` (None where the table lacks it),
    update time if `times`]} of every key held on any rank; slots=None: every slot the table
    has, sorted by name. trained_only: only keys whose update time is set (> 0)."""
    table = api.shard(name)
    if table.use_hashtable:
        keys, rows = (_host(table, a) for a in table.index.export())
    else:
        rows = np.arange(table.values.shape[0])
        keys = rows * table.size + table.rank
    stamps = _host(table, table.times)
    if trained_only:
        keys, rows = keys[stamps[rows] > 0], rows[stamps[rows] > 0]
    names = sorted(table.slots) if slots is None else list(slots)
    arrays = [_host(table, table.values)] + [_host(table, table.slots.get(s)) for s in names]
    local = [(int(key), [None if a is None else a[row].copy() for a in arrays]
              + ([stamps[row]] if times else [])) for key, row in zip(keys, rows)]
    merged = {}
    for part in COMM.allgather(local):
        merged.update(dict(part))
    return merged


def as_arrays(rows_by_key):
    """[keys sorted, then each part of every_row's lists stacked in that order]."""
    keys = sorted(rows_by_key)
    parts = len(rows_by_key[keys[0]]) if keys else 0
    return [np.array(keys, np.int64)] + [np.stack([rows_by_key[k][i] for k in keys])
                                         for i in range(parts)]


def assert_same(got, want):
    """Asserts two every_row results hold the same keys with equal arrays."""
    assert sorted(got) == sorted(want)
    for key in want:
        for a, b in zip(got[key], want[key]):
            np.testing.assert_array_equal(a, b)
