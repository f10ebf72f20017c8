"""An MPI job for test_sok_dump_files: sok1x's dumps in SOK's file format, sok.dump's default
for SOK v2's tables, through the engine calls sok.dump and sok.load make
(engine/checkpoint/sok_write.py, sok_read.py), so it runs on any TensorFlow (it imports none).
Two tables as SOK v2's: a sok1x.Variable's (rows by key % ranks, keys below KEYS) and a
DynamicVariable's (a hash table), both trained by Adam, dumped with their Adam slots.

    sok_files_job.py save <dir> <ref.npz>   trains both, dumps them; rank 0 writes every key's
                                            row and slots to ref.npz
    sok_files_job.py load <dir> <ref.npz> <sok>   fresh tables load <dir>: every row and slot
                                            must equal ref.npz; sok="sok": SOK's files read at
                                            their names as SOK's reader reads them hold the
                                            same, and no temporary or kept file is left
    sok_files_job.py kill <dir> <where>     trains a step more, dumps again and dies by SIGKILL:
                                            "write" (the last rank, inside its rows), "keep"
                                            (rank 0, at the first previous file kept), "publish"
                                            (rank 0, after two files renamed over SOK's names)
    sok_files_job.py other <dir>            dumps another table into <dir> (a later dump, which
                                            puts back what a dump that died left)
    sok_files_job.py corrupt <dir>          a changed byte, a cut file, a missing slot file, a
                                            slot the dump did not write: each an error naming
                                            the file on every rank, and no table changed
"""
import os
import shutil
import signal
import sys

import numpy as np
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "mpi"))
import sok1x  # noqa: E402
from checkpoint_reference import ADAM_SLOTS, as_arrays, every_row, train_step  # noqa: E402
from sok1x.backend.random_init import make_spec  # noqa: E402
from sok1x.engine import api  # noqa: E402
from sok1x.engine.checkpoint import sok_format, sok_marker, sok_read, sok_write  # noqa: E402
from sok1x.errors import CheckpointError  # noqa: E402
import sok_dump_writer as sok_reader  # noqa: E402

COMM = MPI.COMM_WORLD
KEYS = 40
SLOTS = tuple(("Adam-%s" % s.split("/")[1], s.split("/")[1], (s, 0.0)) for s in ADAM_SLOTS)
TABLES = {"sokjob/dense": sok_format.SokTable("sokjob/dense", "sokjob_dense", 4, False, KEYS,
                                              None, SLOTS),
          "sokjob/hash": sok_format.SokTable("sokjob/hash", "sokjob_hash", 6, True, None, None,
                                             SLOTS)}


def make_tables():
    for name, table in TABLES.items():
        capacity = -(-KEYS // COMM.size) if not table.dynamic else 64
        api.create_table(name, table.dim, capacity, table.dynamic,
                         make_spec("uniform", -1, 1, 7), replace=True)


def train(step):
    """One Adam step on keys that do not depend on the number of ranks."""
    keys = np.arange(step, step + 24)
    train_step("sokjob/dense", keys, "sokjob_dense_%d" % step, 0.1)
    train_step("sokjob/hash", keys * 7 + 1, "sokjob_hash_%d" % step, 0.1)


def reference():
    out = {}
    for name in TABLES:
        for i, array in enumerate(as_arrays(every_row(name))):
            out["%s/%d" % (name, i)] = array
    return out


def check_sok_reader(path, want):
    """SOK's files at their names, read as SOK's reader reads them, hold `want`'s rows."""
    for name, table in TABLES.items():
        files = ["key", "weight"] + [suffix for suffix, _, _ in SLOTS]
        arrays = []
        for suffix in files:
            with open(os.path.join(path, "%s-%s" % (table.stem, suffix)), "rb") as handle:
                arrays.append(sok_reader.read(handle.read())[2])
        keys = arrays[0].astype(np.int64)
        order = np.argsort(keys)
        np.testing.assert_array_equal(keys[order], want["%s/0" % name], err_msg=name)
        for i, array in enumerate(arrays[1:]):
            rows = array.reshape(len(keys), table.dim)[order]
            np.testing.assert_array_equal(rows, want["%s/%d" % (name, i + 1)],
                                          err_msg="%s %s" % (name, files[i + 1]))
    left = [n for n in os.listdir(path) if sok_marker.TEMP_TAG in n or sok_marker.KEPT_TAG in n]
    assert not left, left


def kill_at(where):
    me = COMM.rank
    if where == "write" and me == COMM.size - 1:
        real_write = sok_write._write_at
        calls = []

        def dying_write(descriptor, data, offset):
            real_write(descriptor, data, offset)
            calls.append(1)
            if len(calls) == 2:  # a table's keys written, its weights not
                os.kill(os.getpid(), signal.SIGKILL)
        sok_write._write_at = dying_write
    if where == "keep" and me == 0:
        real_link = os.link

        def dying_link(source, target):
            real_link(source, target)
            os.kill(os.getpid(), signal.SIGKILL)
        os.link = dying_link
    if where == "publish" and me == 0:
        real_replace, renamed = os.replace, []

        def dying_replace(source, target):
            real_replace(source, target)
            if sok_marker.TEMP_TAG in source:
                renamed.append(target)
                if len(renamed) == 2:  # the dense table's key and weight files replaced
                    os.kill(os.getpid(), signal.SIGKILL)
        os.replace = dying_replace


def corrupt(path):
    """Damages one file at a time; each load must fail naming it and change no table."""
    before = {name: every_row(name) for name in TABLES}
    dense, hash_ = TABLES["sokjob/dense"], TABLES["sokjob/hash"]
    weight = os.path.join(path, dense.stem + "-weight")
    slot = os.path.join(path, hash_.stem + "-Adam-v")
    damages = [(weight, "flip"), (weight, "cut"), (slot, "remove")]
    for target, how in damages:
        saved = os.path.join(path, "saved-copy")
        if COMM.rank == 0:
            shutil.copyfile(target, saved)
            if how == "flip":
                with open(target, "rb+") as handle:
                    handle.seek(os.path.getsize(target) // 2)
                    byte = handle.read(1)
                    handle.seek(-1, os.SEEK_CUR)
                    handle.write(bytes([byte[0] ^ 0x10]))
            elif how == "cut":
                with open(target, "rb+") as handle:
                    handle.truncate(os.path.getsize(target) - 4)
            else:
                os.remove(target)
        COMM.barrier()
        try:
            sok_read.load_tables(path, list(TABLES.values()))
        except CheckpointError as error:
            assert os.path.basename(target) in str(error), (how, str(error))
        else:
            raise AssertionError("a load of %s (%s) went through" % (target, how))
        for name in TABLES:
            got = every_row(name)
            assert sorted(got) == sorted(before[name]), (how, name)
            for key, arrays in before[name].items():
                for a, b in zip(got[key], arrays):
                    np.testing.assert_array_equal(a, b, err_msg="%s %s" % (how, name))
        COMM.barrier()
        if COMM.rank == 0:
            shutil.move(saved, target)
        COMM.barrier()
    # a slot the dump did not write (another optimizer's) is refused, not read from elsewhere
    extra = dense._replace(slots=dense.slots + (("Adam-w", "w", ("Adam/w", 0.0)),))
    try:
        sok_read.load_tables(path, [extra])
    except CheckpointError as error:
        assert "sokjob_dense-Adam-w" in str(error), str(error)
    else:
        raise AssertionError("a slot file the dump did not write was loaded")
    print("rank %d: every damage refused" % COMM.rank, flush=True)


def main(mode, path, arg=None, check=None):
    sok1x.init(backend="cpu")
    make_tables()
    if mode == "save":
        for step in range(3):
            train(step)
        sok_write.dump_tables(path, list(TABLES.values()))
        want = reference()
        if COMM.rank == 0:
            np.savez(arg, **want)
    elif mode == "load":
        sok_read.load_tables(path, list(TABLES.values()))
        want, got = np.load(arg), reference()
        for key, array in got.items():
            np.testing.assert_array_equal(array, want[key], err_msg=key)
        if check == "sok" and COMM.rank == 0:
            check_sok_reader(path, want)
        print("rank %d: loaded equal" % COMM.rank, flush=True)
    elif mode == "kill":
        for step in range(4):
            train(step)
        kill_at(arg)
        COMM.barrier()
        sok_write.dump_tables(path, list(TABLES.values()))
        raise SystemExit("the dump was to be killed")
    elif mode == "other":
        api.create_table("sokjob/other", 3, 8, False, make_spec("uniform", -1, 1, 7),
                         replace=True)
        other = sok_format.SokTable("sokjob/other", "sokjob_other", 3, False, 8 * COMM.size,
                                    None, ())
        sok_write.dump_tables(path, [other])
    elif mode == "corrupt":
        corrupt(path)


if __name__ == "__main__":
    main(*sys.argv[1:5])
