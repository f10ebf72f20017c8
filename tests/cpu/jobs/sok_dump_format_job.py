"""An MPI job for test_sok_dump_format: sok.dump(path, vars, optimizer), unchanged SOK code,
writes SOK v2's own files byte for byte as a faithful writer built from SOK's code
(sok_dump_writer.py) would from the same shards, and sok.load reads files that writer made as
if SOK had dumped them on another number of ranks. Executing eagerly, as SOK's v2 programs do.
argv[1]: the round size in bytes ("sok": SOK's 64 MiB; a small one makes every table take
several of SOK's save rounds).
Prints "SOK DUMP FORMAT OK" on success.

1. A distributed and a localized sok.Variable and a DynamicVariable, trained by
   sok.OptimizerWrapper(Adagrad): each file equals the faithful writer's bytes, SOK's reader
   reads keys and rows back; file_format="sharded" writes sok1x's sharded format instead.
2. Files the writer made from tables spread over 3 SOK ranks (other values, other slots) load
   into every table at this rank count: each rank's rows and slot rows are the files' by key.
3. A weight file cut short fails on every rank naming the file, and no table changes.
"""
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
from sok1x.engine.checkpoint import sok_format  # noqa: E402
from sok1x.errors import CheckpointError  # noqa: E402
import eager_job  # noqa: E402
import sok_dump_writer as writer  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, DIM, PER_RANK, STEPS, SOK_RANKS = 21, 3, 4, 3, 3
SLOT = "accumulator"


def make_tables():
    initial = np.random.default_rng(5).uniform(size=(ROWS, DIM)).astype(np.float32)
    return {"dist": sok.Variable(initial, name="dist"),
            "loc": sok.Variable(initial + 1, mode="localized:%d" % (SIZE - 1), name="loc"),
            "dyn": sok.DynamicVariable(dimension=DIM, var_type="hbm", initializer="0.5",
                                       name="dyn")}


def shard(variable, optimizer):
    keys, values = (t.numpy() for t in sok.export(variable))
    slot = sok.export(optimizer.get_slot(variable, SLOT))[1].numpy()
    return keys, values, {SLOT: slot}


def expected_files(name, variable, optimizer, round_bytes):
    shards = COMM.allgather(shard(variable, optimizer))
    localized = name == "loc"
    if localized:
        shards = [shards[SIZE - 1]]
    return writer.table_files(variable.name, shards, DIM, localized, name == "dyn", "Adagrad",
                              [SLOT], round_bytes)


def check_dump(tables, optimizer, folder, round_bytes):
    sok.dump(folder, list(tables.values()), optimizer)  # SOK's call: SOK's files
    COMM.Barrier()
    for name, variable in tables.items():
        for file_name, want in expected_files(name, variable, optimizer, round_bytes).items():
            with open(os.path.join(folder, file_name), "rb") as f:
                got = f.read()
            assert got == want, (file_name, len(got), len(want))
            file_type, _, array = writer.read(got)
            if file_type == 0 and name != "loc":
                held = np.concatenate(COMM.allgather(sok.export(variable)[0].numpy()))
                np.testing.assert_array_equal(np.sort(array), np.sort(held))
    assert not os.path.exists(os.path.join(folder, "sok1x-checkpoint.json"))
    sharded = folder + "-sharded"
    sok.dump(sharded, list(tables.values()), optimizer, file_format="sharded")
    assert os.path.exists(os.path.join(sharded, "sok1x-checkpoint.json"))
    assert not any(n.endswith("-key") for n in os.listdir(sharded))


def sok_rank_shards(keys, weights, states, owner_of):
    return [(keys[owner_of(keys) == r], weights[owner_of(keys) == r],
             {s: v[owner_of(keys) == r] for s, v in states.items()}) for r in range(SOK_RANKS)]


def write_sok_folder(folder, tables, round_bytes):
    """Rank 0 writes what SOK on SOK_RANKS ranks would have dumped; returns per table the
    global (keys, weights, slot rows)."""
    rng = np.random.default_rng(9)
    truth = {}
    for name, variable in tables.items():
        keys = (np.arange(ROWS, dtype=np.int64) if name != "dyn" else
                np.sort(rng.choice(1000, size=ROWS + 4, replace=False)).astype(np.int64))
        weights = rng.normal(size=(len(keys), DIM)).astype(np.float32)
        states = {SLOT: rng.uniform(size=(len(keys), DIM)).astype(np.float32)}
        truth[name] = (keys, weights, states[SLOT])
        if name == "loc":
            shards = [(keys, weights, states)]
        else:
            shards = sok_rank_shards(keys, weights, states, lambda k: k % SOK_RANKS)
            if name == "dyn":  # SOK's hash-table export order is not sorted
                shards = [(k[::-1], w[::-1], {s: v[::-1] for s, v in st.items()})
                          for k, w, st in shards]
        files = writer.table_files(variable.name, shards, DIM, name == "loc", name == "dyn",
                                   "Adagrad", [SLOT], round_bytes)
        if RANK == 0:
            for file_name, data in files.items():
                with open(os.path.join(folder, file_name), "wb") as f:
                    f.write(data)
    COMM.Barrier()
    return truth


def check_load(tables, optimizer, folder, round_bytes):
    os.makedirs(folder, exist_ok=True)
    truth = write_sok_folder(folder, tables, round_bytes)
    sok.load(folder, list(tables.values()), optimizer)  # a SOK folder: found by its files
    for name, variable in tables.items():
        keys, weights, slot_rows = truth[name]
        held, values, states = shard(variable, optimizer)
        if name == "dyn":  # every key of the file is now held on exactly one rank
            every = np.sort(np.concatenate(COMM.allgather(held)))
            assert set(keys) <= set(every), name
        at = np.searchsorted(keys, held)
        mine = (at < len(keys)) & (keys[np.minimum(at, len(keys) - 1)] == held)
        assert mine.sum() == (len(held) if name != "dyn" else mine.sum()), name
        np.testing.assert_array_equal(values[mine], weights[at[mine]], err_msg=name)
        np.testing.assert_array_equal(states[SLOT][mine], slot_rows[at[mine]], err_msg=name)


def check_bad_file(tables, optimizer, folder):
    before = {n: shard(v, optimizer) for n, v in tables.items()}
    if RANK == 0:
        path = os.path.join(folder, writer.stem(tables["dyn"].name) + "-weight")
        with open(path, "rb+") as f:
            f.truncate(os.path.getsize(path) - 4)
    COMM.Barrier()
    try:
        sok.load(folder, list(tables.values()), optimizer)
    except CheckpointError as error:
        assert "dyn_0-weight" in str(error), error
    else:
        raise AssertionError("a cut weight file loaded")
    for name, variable in tables.items():
        after = shard(variable, optimizer)
        np.testing.assert_array_equal(after[1], before[name][1], err_msg=name)
        np.testing.assert_array_equal(after[2][SLOT], before[name][2][SLOT], err_msg=name)


def main(rounds_arg):
    round_bytes = writer.ROUND_BYTES if rounds_arg == "sok" else int(rounds_arg)
    sok_format.ROUND_BYTES = round_bytes
    sok.init(backend="cpu")
    tables = make_tables()
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.3))  # legacy after init
    mine = slice(RANK * PER_RANK, (RANK + 1) * PER_RANK)
    for ids, weights in eager_job.batches(3, ROWS, SIZE * PER_RANK, DIM, STEPS):
        for variable in tables.values():
            eager_job.step(variable, optimizer, ids[mine], weights[mine], eager_job.sok_lookup)
    root = COMM.bcast(tempfile.mkdtemp(prefix="sok1x-sok-format-") if RANK == 0 else None)
    try:
        check_dump(tables, optimizer, os.path.join(root, "dumped"), round_bytes)
        check_load(tables, optimizer, os.path.join(root, "from_sok"), round_bytes)
        check_bad_file(tables, optimizer, os.path.join(root, "from_sok"))
    finally:
        COMM.Barrier()
        if RANK == 0:
            shutil.rmtree(root, ignore_errors=True)
    if RANK == 0:
        print("SOK DUMP FORMAT OK")


if __name__ == "__main__":
    eager_job.run(main, sys.argv[1])
