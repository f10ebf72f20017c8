"""Rows moved outside a step's path in MPI calls of bounded size (engine/bounded_collectives.py),
rank-agnostic: with a limit of a few elements per call, the helpers and what uses them
(incremental_model_dump, export's gather_rows, load_embedding_values' assign_values) give
exactly what one unbounded call gives, in more calls. The references are mpi4py's own pickled
allgather and the same functions under the default limit."""
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

import sok1x
from sok1x.backend.random_init import make_spec
from sok1x.engine import api, bounded_collectives, checkpoint, runtime
from sok1x.engine.tables import assign_values
from sok1x.engine.tables import shard_rows

from checkpoint_reference import train_step

COMM = MPI.COMM_WORLD
TINY = "7"  # elements per call: a round moves one or two rows of dim 3


@pytest.fixture(scope="module", autouse=True)
def up():
    sok1x.init(backend=os.environ.get("SOK1X_TEST_BACKEND", "cpu"))


def _host():
    return runtime.get().host


def _calls(run):
    """(run()'s result, MPI calls it made on this rank)."""
    before = _host().calls
    out = run()
    return out, _host().calls - before


def _bounded_and_not(monkeypatch, run):
    """run() under the default limit, then under TINY: (unbounded, bounded) results; the
    bounded one made more calls."""
    monkeypatch.delenv(bounded_collectives.CHUNK_ENV, raising=False)
    unbounded, few = _calls(run)
    monkeypatch.setenv(bounded_collectives.CHUNK_ENV, TINY)
    bounded, many = _calls(run)
    assert many > few
    return unbounded, bounded


def _rows_of_rank(rank, shape=(3,), dtype=np.float32):
    count = 2 * rank + 5
    return (np.arange(count * int(np.prod(shape)), dtype=dtype).reshape((count,) + shape)
            + 1000 * rank)


@pytest.mark.parametrize("shape, dtype", [((3,), np.float32), ((), np.int64)])
def test_all_gather_rows_equals_an_allgather(monkeypatch, shape, dtype):
    monkeypatch.setenv(bounded_collectives.CHUNK_ENV, TINY)
    mine = _rows_of_rank(COMM.rank, shape, dtype)
    got, counts = bounded_collectives.all_gather_rows(_host(), mine)
    every = COMM.allgather(mine)
    np.testing.assert_array_equal(got, np.concatenate(every))
    assert counts.tolist() == [part.shape[0] for part in every]
    assert got.dtype == dtype


def test_all_to_all_rows_equals_an_exchange_of_everything(monkeypatch):
    monkeypatch.setenv(bounded_collectives.CHUNK_ENV, TINY)
    size, rank = COMM.size, COMM.rank
    send_counts = np.array([(rank + 2 * peer) % 5 for peer in range(size)], np.int64)
    rows = np.arange(int(send_counts.sum()) * 3, dtype=np.float32).reshape(-1, 3) + 100 * rank
    recv_counts = np.array([(source + 2 * rank) % 5 for source in range(size)], np.int64)
    got = bounded_collectives.all_to_all_rows(_host(), rows, send_counts, recv_counts)
    starts = [np.concatenate([[0], np.cumsum(c)]) for c in COMM.allgather(send_counts)]
    every = COMM.allgather(rows)
    want = np.concatenate([every[source][starts[source][rank]:starts[source][rank + 1]]
                           for source in range(size)])
    np.testing.assert_array_equal(got, want)


def _train_table(name, use_hashtable):
    """Returns a time after the table was made and before one Adam step on its even keys."""
    api.create_table(name, 3, 32, use_hashtable, make_spec("uniform", -1, 1, 4), replace=True)
    time.sleep(0.01)
    since = COMM.bcast(time.time())
    time.sleep(0.01)
    train_step(name, np.arange(0, 6 * COMM.size, 2), "bounded_%s" % name, 0.5)
    return since


@pytest.mark.parametrize("use_hashtable", [True, False])
def test_incremental_dump_and_export_in_bounded_calls(monkeypatch, use_hashtable):
    name = "bounded/table_%d" % use_hashtable
    since = _train_table(name, use_hashtable)
    (keys, values), (keys_b, values_b) = _bounded_and_not(
        monkeypatch, lambda: checkpoint.incremental_tables([name], since)[0])
    assert sorted(keys.tolist()) == list(range(0, 6 * COMM.size, 2))
    np.testing.assert_array_equal(keys_b, keys)
    np.testing.assert_array_equal(values_b, values)
    (keys, values), (keys_b, values_b) = _bounded_and_not(
        monkeypatch, lambda: shard_rows.gather_rows(name))
    np.testing.assert_array_equal(keys_b, keys)
    np.testing.assert_array_equal(values_b, values)


@pytest.mark.parametrize("use_hashtable", [True, False])
def test_load_embedding_values_in_bounded_calls(monkeypatch, use_hashtable):
    name = "bounded/assigned_%d" % use_hashtable
    count = 5 * COMM.size + 3
    keys = np.arange(count, dtype=np.int64)[::-1].copy()
    values = np.arange(count * 3, dtype=np.float32).reshape(count, 3) / 7.0

    def assigned():
        api.create_table(name, 3, 32, use_hashtable, make_spec("uniform", -1, 1, 4),
                         replace=True)
        assign_values.assign_values(name, keys, values)
        return shard_rows.gather_rows(name)
    (got_keys, got_values), (keys_b, values_b) = _bounded_and_not(monkeypatch, assigned)
    np.testing.assert_array_equal(keys_b, got_keys)
    np.testing.assert_array_equal(values_b, got_values)
    by_key = dict(zip(got_keys.tolist(), got_values))
    for key, row in zip(keys.tolist(), values):
        np.testing.assert_array_equal(by_key[key], row)
