"""Checkpoints of tables (D8), rank-agnostic: dump / load round trips with optimizer slots, a
corrupt file, a dim mismatch and incremental_model_dump, checked against every rank's rows
gathered independently (allgather of each shard), at any number of ranks."""
import json
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

import sok1x
from sok1x.backend.random_init import make_spec
from sok1x.engine import api, checkpoint
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.errors import CheckpointError

from checkpoint_reference import assert_same, every_row, train_step

COMM = MPI.COMM_WORLD
DIM = 4


@pytest.fixture(scope="module", autouse=True)
def up():
    # SOK1X_TEST_BACKEND=cuda runs the same specification on GPUs (tests/gpu/run_all.sh does)
    sok1x.init(backend=os.environ.get("SOK1X_TEST_BACKEND", "cpu"))


def _train(name, keys, step):
    train_step(name, keys, "ckpt_%s_%d" % (name, step), (step + 1) * 0.1)


def _manifest(path):
    with open(os.path.join(path, checkpoint.MANIFEST_NAME)) as handle:
        return json.load(handle)


@pytest.mark.parametrize("use_hashtable", [True, False])
def test_dump_load_round_trip_with_slots(shared_dir, use_hashtable):
    name = "ckpt/round_%d" % use_hashtable
    api.create_table(name, DIM, 16, use_hashtable, make_spec("uniform", -1, 1, 5), replace=True)
    keys = np.array([3, 7, 1, 12, 5, 9, 2, 8, 11, 4, 6, 0][:4 * COMM.size], np.int64)
    _train(name, keys, 0)
    _train(name, keys[::2], 1)
    saved = every_row(name)
    checkpoint.dump_tables(shared_dir, [name])
    manifest = _manifest(shared_dir)
    assert [s["rank"] for s in manifest["tables"][name]["shards"]] == list(range(COMM.size))
    for shard in manifest["tables"][name]["shards"]:
        assert os.path.exists(os.path.join(shared_dir, shard["file"]))
    _train(name, keys, 2)  # changes rows and slots after the dump
    assert sorted(every_row(name)) == sorted(saved)
    checkpoint.load_tables(shared_dir, [name])
    assert_same(every_row(name), saved)
    if use_hashtable:
        # A fresh table (its initializer run again) loads the same rows.
        api.create_table(name, DIM, 16, use_hashtable, make_spec("uniform", -1, 1, 5),
                         replace=True)
        checkpoint.load_tables(shared_dir, [name], slot_prefixes=["Adam"])
        assert_same(every_row(name), saved)


def test_changed_byte_raises_naming_the_file(shared_dir):
    name = "ckpt/corrupt"
    api.create_table(name, DIM, 16, True, make_spec("uniform", -1, 1, 5), replace=True)
    _train(name, np.arange(2 * COMM.size, dtype=np.int64), 0)
    checkpoint.dump_tables(shared_dir, [name])
    last = _manifest(shared_dir)["tables"][name]["shards"][-1]
    path = os.path.join(shared_dir, last["file"])
    if COMM.rank == 0:
        data = bytearray(open(path, "rb").read())
        data[-20] ^= 0x01
        open(path, "wb").write(bytes(data))
    COMM.barrier()
    before = every_row(name)
    with pytest.raises(CheckpointError, match="checksum") as info:
        checkpoint.load_tables(shared_dir, [name])
    assert path in str(info.value)
    assert_same(every_row(name), before)  # nothing changed
    if COMM.rank == 0:
        open(path, "wb").write(bytes(data[:100]))
    COMM.barrier()
    with pytest.raises(CheckpointError, match="truncated") as info:
        checkpoint.load_tables(shared_dir, [name])
    assert path in str(info.value)
    if COMM.rank == 0:
        os.remove(path)
    COMM.barrier()
    with pytest.raises(CheckpointError, match="missing") as info:
        checkpoint.load_tables(shared_dir, [name])
    assert path in str(info.value)
    assert_same(every_row(name), before)


def test_other_dim_names_both(shared_dir):
    name = "ckpt/dims"
    api.create_table(name, DIM, 16, True, make_spec("uniform", -1, 1, 5), replace=True)
    _train(name, np.arange(COMM.size, dtype=np.int64), 0)
    checkpoint.dump_tables(shared_dir, [name])
    api.create_table(name, DIM + 2, 16, True, make_spec("uniform", -1, 1, 5), replace=True)
    with pytest.raises(CheckpointError, match="dim %d.*dim %d" % (DIM, DIM + 2)):
        checkpoint.load_tables(shared_dir, [name])
    with pytest.raises(CheckpointError, match="no sok1x checkpoint manifest"):
        checkpoint.load_tables(shared_dir + "-missing", [name])


def test_incremental_dump_returns_exactly_the_updated_keys():
    name = "ckpt/incremental"
    api.create_table(name, DIM, 32, True, make_spec("uniform", -1, 1, 5), replace=True)
    everything = np.arange(8 * COMM.size, dtype=np.int64)
    _train(name, everything, 0)
    time.sleep(0.01)
    since = COMM.bcast(time.time())
    time.sleep(0.01)
    touched = np.array([5, 2, 8 * COMM.size - 1], np.int64)
    _train(name, np.repeat(touched, COMM.size), 1)
    # The engine's call under sok.incremental_model_dump (which needs TensorFlow, and the GPU
    # machines running this specification on cuda have none).
    [(keys, values)] = checkpoint.incremental_tables([name], since)
    assert sorted(keys.tolist()) == sorted(touched.tolist())
    whole = every_row(name)
    for key, row in zip(keys.tolist(), values):
        np.testing.assert_array_equal(row, whole[key][0])
    [(none, _)] = checkpoint.incremental_tables([name], time.time() + 60)
    assert none.size == 0


def test_dynamic_table_grows_and_round_trips_with_hash_placement(shared_dir):
    """A DynamicVariable-style table (hash placement) that grew past its initial capacity."""
    name = "ckpt/dynamic"
    settings = dict(placement="hash", dynamic=make_dynamic("hbm", 2, 64))
    api.create_table(name, DIM, 64, True, make_spec("normal", 0, 1, 9), replace=True, **settings)
    keys = np.arange(100, 100 + 6 * COMM.size, dtype=np.int64) * 7919
    _train(name, keys, 0)
    saved = every_row(name)
    assert api.shard(name).capacity > 2
    checkpoint.dump_tables(shared_dir, [name])
    api.create_table(name, DIM, 64, True, make_spec("normal", 0, 1, 9), replace=True, **settings)
    checkpoint.load_tables(shared_dir, [name])
    assert_same(every_row(name), saved)
    since = COMM.bcast(time.time())
    _train(name, keys[:COMM.size], 1)  # keeps working after the load
    [(got, _)] = checkpoint.incremental_tables([name], since)
    assert sorted(got.tolist()) == sorted(keys[:COMM.size].tolist())
