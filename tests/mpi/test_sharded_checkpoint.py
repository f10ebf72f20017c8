"""Sharded checkpoints (D8), rank-agnostic: several tables of different dims and kinds in one
dump streamed in many small chunks, all-or-nothing loads, and files that are wrong in every way a
checksum cannot see (negative, duplicated or out-of-range keys, another table's or dtype's
header), each an error naming the file, on every rank, with no table changed. Loads run both
ways (engine/checkpoint/load.py): staged (read once into a fresh shard) and two-pass (checked,
then read again into the table). The reference is every rank's rows gathered before the dump
(the engine's own view, allgathered)."""
import json
import os
import zlib

import numpy as np
import pytest
from mpi4py import MPI

import sok1x
from sok1x.backend.random_init import make_spec
from sok1x.engine import api, checkpoint, runtime
from sok1x.engine.checkpoint import format as checkpoint_format
from sok1x.engine.checkpoint import load as checkpoint_load
from sok1x.engine.checkpoint import checksum as shard_checksum
from sok1x.engine.checkpoint import storage as shard_storage
from sok1x.engine.tables.dynamic_table import make_dynamic
from sok1x.engine.checkpoint.storage import ShardWriter
from sok1x.errors import CheckpointError

from checkpoint_reference import assert_same, every_row, train_step

COMM = MPI.COMM_WORLD
TABLES = {  # name: (dim, use_hashtable, extra settings)
    "shard/dense": (3, False, {}),
    "shard/hash": (5, True, {}),
    "shard/dynamic": (8, True, dict(placement="hash", dynamic=make_dynamic("hbm", 2, 64))),
}


@pytest.fixture(scope="module", autouse=True)
def up():
    # SOK1X_TEST_BACKEND=cuda runs the same specification on GPUs (tests/gpu/run_all.sh does)
    sok1x.init(backend=os.environ.get("SOK1X_TEST_BACKEND", "cpu"))


@pytest.fixture(params=[checkpoint_load.STAGED, checkpoint_load.TWO_PASS])
def load_way(request, monkeypatch):
    """Every load of the test staged, or two-pass."""
    monkeypatch.setenv(checkpoint_load.LOAD_ENV, request.param)
    return request.param


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few rows, so every shard streams through many."""
    monkeypatch.setenv(checkpoint.CHUNK_ENV, str(200.0 / 2 ** 20))


def _make(name):
    dim, use_hashtable, extra = TABLES[name]
    api.create_table(name, dim, 64, use_hashtable, make_spec("uniform", -1, 1, 3), replace=True,
                     **extra)


def _train(name, keys, step):
    train_step(name, keys, "shard_%s_%d" % (name, step), 0.1 * (step + 1))


def _whole(name):
    """{key: [value, m, v, time]} over every rank."""
    return every_row(name, slots=None, times=True)


def _manifest(path):
    with open(os.path.join(path, checkpoint.MANIFEST_NAME)) as handle:
        return json.load(handle)


def _trained_set():
    keys = np.arange(3 * COMM.size + 5, dtype=np.int64)
    for name in TABLES:
        _make(name)
        _train(name, keys * (7 if "dynamic" in name else 1), 0)
        _train(name, keys[::3], 1)
    return {name: _whole(name) for name in TABLES}


def test_three_tables_stream_in_chunks_and_load_whole(shared_dir, small_chunks, load_way):
    saved = _trained_set()
    checkpoint.dump_tables(shared_dir, list(TABLES))
    manifest = _manifest(shared_dir)
    assert manifest["world_size"] == COMM.size
    for name, (dim, _, _) in TABLES.items():
        entry = manifest["tables"][name]
        assert entry["dim"] == dim and len(entry["shards"]) == COMM.size
        assert [s[0] for s in entry["slots"]] == ["Adam/m", "Adam/v"]
    mine = manifest["tables"]["shard/dense"]["shards"][COMM.rank]
    with open(os.path.join(shared_dir, mine["file"]), "rb") as handle:
        header, _ = checkpoint_format.read_header(handle.read, mine["file"])
    assert header["rows"] > header["chunk_rows"]  # many chunks
    for name in TABLES:
        _train(name, np.arange(4, dtype=np.int64), 2)
    checkpoint.load_tables(shared_dir, list(TABLES))
    for name in TABLES:
        assert_same(_whole(name), saved[name])
    # A second dump of one table replaces only its shards; the others stay loadable.
    old_files = {s["file"] for s in manifest["tables"]["shard/hash"]["shards"]}
    _train("shard/hash", np.arange(6, dtype=np.int64), 3)
    again = _whole("shard/hash")
    checkpoint.dump_tables(shared_dir, ["shard/hash"])
    COMM.barrier()
    assert not any(os.path.exists(os.path.join(shared_dir, f)) for f in old_files)
    checkpoint.load_tables(shared_dir, list(TABLES))
    assert_same(_whole("shard/hash"), again)
    assert_same(_whole("shard/dense"), saved["shard/dense"])


def _ways_taken(monkeypatch):
    """{table name: "staged" or "two-pass"} of the loads that follow."""
    taken = {}
    read = checkpoint_load.read_table

    def recording(rt, plan):
        taken[plan.name] = "two-pass" if plan.staged is None else "staged"
        return read(rt, plan)
    monkeypatch.setattr(checkpoint_load, "read_table", recording)
    return taken


def test_a_chunk_corrupt_late_changes_no_table(shared_dir, small_chunks, load_way, monkeypatch):
    """The largest file of the table loaded last fails its checksum in its last bytes, after
    every other chunk of every table streamed: every rank raises naming the file, no table
    changed, and the staged shards are gone (a load after it, of good files, works)."""
    saved = _trained_set()
    checkpoint.dump_tables(shared_dir, list(TABLES))
    for name in TABLES:
        _train(name, np.arange(4, dtype=np.int64), 2)
    before = {name: _whole(name) for name in TABLES}
    last = list(TABLES)[-1]
    shard = max(_manifest(shared_dir)["tables"][last]["shards"], key=lambda s: s["rows"])
    path = os.path.join(shared_dir, shard["file"])
    if COMM.rank == 0:
        data = bytearray(open(path, "rb").read())
        original = bytes(data)
        data[-3] ^= 0x01  # in the last chunk's update times
        open(path, "wb").write(bytes(data))
    COMM.barrier()
    taken = _ways_taken(monkeypatch)
    with pytest.raises(CheckpointError, match="checksum") as info:
        checkpoint.load_tables(shared_dir, list(TABLES))
    assert path in str(info.value) and not taken  # no table was put
    for name in TABLES:
        assert_same(_whole(name), before[name])
    if COMM.rank == 0:
        open(path, "wb").write(original)
    COMM.barrier()
    checkpoint.load_tables(shared_dir, list(TABLES))
    assert set(taken.values()) <= {load_way}
    for name in TABLES:
        assert_same(_whole(name), saved[name])


def test_auto_stages_within_host_room_and_reads_twice_beyond(shared_dir, monkeypatch):
    """On the cpu backend a load stages a shard only if a copy fits in a quarter of a chunk (D8's
    bound on added host memory), else it reads every file twice; the rows come back either
    way."""
    if runtime.get().backend.free_device_memory() is not None:
        pytest.skip("device memory decides on this backend")
    saved = _trained_set()
    checkpoint.dump_tables(shared_dir, list(TABLES))
    for chunk_mb, way in [(64.0, "staged"), (200.0 / 2 ** 20, "two-pass")]:
        monkeypatch.setenv(checkpoint.CHUNK_ENV, str(chunk_mb))
        for name in TABLES:
            _train(name, np.arange(5, dtype=np.int64), 3)
        taken = _ways_taken(monkeypatch)
        checkpoint.load_tables(shared_dir, list(TABLES))
        assert taken == {name: way for name in TABLES}
        for name in TABLES:
            assert_same(_whole(name), saved[name])


@pytest.mark.parametrize("crc_threads", ["0", "2"])
def test_buffers_cut_into_pieces_on_threads_round_trip(shared_dir, monkeypatch, crc_threads):
    """Every buffer written and read in pieces of 64 bytes on 3 threads, in blocks of 16 bytes
    checksummed on each piece's thread or on 2 checksum threads: the same rows come back, and a
    changed byte still fails the checksum."""
    monkeypatch.setattr(shard_checksum, "PIECE_BYTES", 64)
    monkeypatch.setattr(shard_storage, "BLOCK_BYTES", 16)
    monkeypatch.setenv(shard_checksum.THREADS_ENV, "3")
    monkeypatch.setenv(shard_checksum.CRC_THREADS_ENV, crc_threads)
    saved = _trained_set()
    checkpoint.dump_tables(shared_dir, list(TABLES))
    for entry in _manifest(shared_dir)["tables"].values():  # zlib's crc32 of the whole file
        mine = entry["shards"][COMM.rank]
        with open(os.path.join(shared_dir, mine["file"]), "rb") as handle:
            assert zlib.crc32(handle.read()) == mine["crc32"]
    for name in TABLES:
        _train(name, np.arange(5, dtype=np.int64), 2)
    checkpoint.load_tables(shared_dir, list(TABLES))
    for name in TABLES:
        assert_same(_whole(name), saved[name])
    shard = _manifest(shared_dir)["tables"]["shard/dense"]["shards"][-1]
    path = os.path.join(shared_dir, shard["file"])
    if COMM.rank == 0:
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x10
        open(path, "wb").write(bytes(data))
    COMM.barrier()
    with pytest.raises(CheckpointError, match="checksum"):
        checkpoint.load_tables(shared_dir, list(TABLES))


def test_a_file_changed_between_check_and_read_fails_on_every_rank(shared_dir, monkeypatch):
    """A two-pass load of a file cut short after the check: every rank raises, saying the tables
    may be partly restored (the check read it whole; only a change in between gets this far)."""
    monkeypatch.setenv(checkpoint_load.LOAD_ENV, checkpoint_load.TWO_PASS)
    _trained_set()
    checkpoint.dump_tables(shared_dir, list(TABLES))
    last = _manifest(shared_dir)["tables"]["shard/hash"]["shards"][-1]
    path = os.path.join(shared_dir, last["file"])
    checked = checkpoint_load.check_table

    def check_then_cut(rt, table, *args):
        plan = checked(rt, table, *args)
        if table.name == "shard/hash":
            COMM.barrier()  # every rank checked its files
            if COMM.rank == 0:
                os.truncate(path, 100)
            COMM.barrier()
        return plan
    monkeypatch.setattr(checkpoint_load, "check_table", check_then_cut)
    with pytest.raises(CheckpointError, match="after checking it.*may be partly restored"):
        checkpoint.load_tables(shared_dir, list(TABLES))


def _rewrite_shard(path, rank, name, change):
    """Rank 0 rewrites `rank`'s shard of `name` in folder `path`: change(header, keys, values,
    slots, times) alters the arrays or header in place; the manifest gets the new size and
    checksum, so only the content is wrong."""
    if COMM.rank == 0:
        manifest = _manifest(path)
        shard = manifest["tables"][name]["shards"][rank]
        file_path = os.path.join(path, shard["file"])
        with open(file_path, "rb") as handle:
            data = handle.read()
        header, start = checkpoint_format.read_header(memoryview_reader(data), file_path)
        assert header["chunk_rows"] >= header["rows"]  # one chunk
        body = np.frombuffer(data, np.uint8, offset=start).copy()
        keys, values, slots, times = checkpoint_format.split_chunk(
            body, header["rows"], header["dim"], len(header["slots"]))
        keys, values, times = keys.copy(), values.copy(), times.copy()
        slots = [s.copy() for s in slots]
        change(header, keys, values, slots, times)
        writer = ShardWriter(file_path)
        writer.write(checkpoint_format.encode_header(
            header["table"], header["dim"], header["rows"], header["slots"], rank, COMM.size,
            header["chunk_rows"]).replace(b'"float32"', header.get("dtype_bytes", b'"float32"')))
        for array in [keys, values] + slots + [times]:
            writer.write(array)
        shard["size"], shard["crc32"] = writer.commit()
        with open(os.path.join(path, checkpoint.MANIFEST_NAME), "w") as handle:
            json.dump(manifest, handle)
    COMM.barrier()


def memoryview_reader(data):
    position = [0]

    def read(count):
        piece = data[position[0]:position[0] + count]
        position[0] += count
        return piece
    return read


def _set_key(index, value):
    def change(header, keys, values, slots, times):
        keys[index] = keys[0] if value == "repeat" else value
    return change


def _set_header(field, value):
    def change(header, keys, values, slots, times):
        if field == "dtype":
            header["dtype_bytes"] = value
        else:
            header[field] = value
    return change


@pytest.mark.parametrize("name, change, message", [
    ("shard/hash", _set_key(1, -5), "negative key -5"),
    ("shard/dense", _set_key(1, -5), "negative key -5"),
    ("shard/hash", _set_key(1, "repeat"), "a key twice"),
    ("shard/dense", _set_key(1, "repeat"), "twice"),
    ("shard/dense", _set_key(1, 10 ** 9), "trained key 1000000000"),
    ("shard/dense", _set_header("table", "shard/other"), "holds table 'shard/other'"),
    ("shard/dense", _set_header("dtype", b'"float16"'), "holds float16 rows"),
])
def test_wrong_content_is_an_error_naming_the_file(shared_dir, name, change, message,
                                                  load_way):
    saved = _trained_set()
    checkpoint.dump_tables(shared_dir, list(TABLES))
    victim = COMM.size - 1
    _rewrite_shard(shared_dir, victim, name, change)
    path = os.path.join(shared_dir, _manifest(shared_dir)["tables"][name]["shards"][victim][
        "file"])
    for name_ in TABLES:
        _train(name_, np.arange(3, dtype=np.int64), 5)
    before = {n: _whole(n) for n in TABLES}
    with pytest.raises(CheckpointError, match=message) as info:
        checkpoint.load_tables(shared_dir, list(TABLES))
    assert path in str(info.value)
    for name_ in TABLES:  # all or nothing: no table changed
        assert_same(_whole(name_), before[name_])
    assert saved


def test_a_set_that_lacks_a_table_loads_nothing(shared_dir):
    _trained_set()
    checkpoint.dump_tables(shared_dir, ["shard/dense"])
    before = _whole("shard/dense")
    _train("shard/dense", np.arange(3, dtype=np.int64), 6)
    changed = _whole("shard/dense")
    with pytest.raises(CheckpointError, match="holds no table 'shard/hash'"):
        checkpoint.load_tables(shared_dir, ["shard/dense", "shard/hash"])
    assert_same(_whole("shard/dense"), changed)
    checkpoint.load_tables(shared_dir, ["shard/dense"])
    assert_same(_whole("shard/dense"), before)
