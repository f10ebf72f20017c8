"""An MPI job for test_sharded_restarts: sharded dumps (D8) across jobs of different sizes, ranks
killed in the middle of a dump, and the memory a dump adds.

    shard_job.py save <dir> <ref.npz>         trains two tables (dims 4 and 6, hash table off and
                                              on, Adam), dumps them, rank 0 writes every row and
                                              slot (by key) to ref.npz
    shard_job.py load <dir> <ref.npz>         fresh tables load <dir>; every row and slot must
                                              equal ref.npz (exit 0), else the job fails
    shard_job.py kill <dir> <where>           trains a step more and dumps again, and SIGKILLs
                                              itself: where = "between" (rank 0, after its shard
                                              of the first table) or "inside" (the last rank,
                                              half-way through its first shard file)
    shard_job.py rss <dir> <rows> <chunk MB>  dumps a <rows> x 128 float32 table, then dumps
                                              it again in chunks of <chunk MB> and loads that;
                                              prints each rank's peak resident memory added by
                                              the first dump and by the load; then the same load
                                              of a hash table of <rows> / 2 keys
"""
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "mpi"))
import sok1x  # noqa: E402
from checkpoint_reference import as_arrays, every_row, train_step  # noqa: E402
from sok1x.backend.random_init import make_spec  # noqa: E402
from sok1x.engine import api, checkpoint, runtime  # noqa: E402
from sok1x.engine.checkpoint import storage as shard_storage  # noqa: E402

COMM = MPI.COMM_WORLD
TABLES = {"job/a": (4, False), "job/b": (6, True)}
CAPACITY = 32


def make_tables():
    for name, (dim, use_hashtable) in TABLES.items():
        api.create_table(name, dim, CAPACITY, use_hashtable, make_spec("uniform", -1, 1, 7),
                         replace=True)


def train(step):
    """One Adam step on keys that do not depend on the number of ranks."""
    for name in TABLES:
        train_step(name, np.arange(step, step + 24), "job_%s_%d" % (name, step), 0.1)


def whole(name):
    """(keys, values, m, v) of every trained key (time > 0) over all ranks, sorted by key."""
    return as_arrays(every_row(name, trained_only=True))


def reference(name):
    return {"%s/%d" % (name, i): array for i, array in enumerate(whole(name))}


def peak_reset():
    """Resets this process's peak resident memory (VmHWM) to its current size."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def status_kib(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def kill_at(where):
    if where == "between" and COMM.rank == 0:
        real = checkpoint.tables._write_shard

        def dying(*args):
            entry = real(*args)
            os.kill(os.getpid(), signal.SIGKILL)
            return entry
        checkpoint.tables._write_shard = dying
    if where == "inside" and COMM.rank == COMM.size - 1:
        real_write = shard_storage.ShardWriter.write

        def dying_write(self, data):
            real_write(self, data)
            if self.size > 200:
                os.kill(os.getpid(), signal.SIGKILL)
        shard_storage.ShardWriter.write = dying_write


def added_kib(run):
    """Peak resident memory (KiB) that run() adds to this process."""
    COMM.barrier()
    peak_reset()
    before = status_kib("VmRSS")
    run()
    return status_kib("VmHWM") - before


def rss(path, rows, chunk_mb):
    api.create_table("job/big", 128, rows // COMM.size, False,
                     make_spec("uniform", -1, 1, 7), replace=True)
    shard = api.shard("job/big")
    dump = added_kib(lambda: checkpoint.dump_tables(path, ["job/big"]))
    os.environ[checkpoint.CHUNK_ENV] = chunk_mb
    checkpoint.dump_tables(path, ["job/big"])
    want = shard.values[::997].copy()
    shard.values[::2] = 0.0  # the load must bring the rows back
    load = added_kib(lambda: checkpoint.load_tables(path, ["job/big"]))
    np.testing.assert_array_equal(api.shard("job/big").values[::997], want)
    print("rank %d: shard %d KiB, chunk %d KiB, dump added %d KiB, load added %d KiB of peak "
          "resident memory" % (COMM.rank, shard.values.nbytes >> 10,
                               checkpoint.chunk_bytes() >> 10, dump, load), flush=True)
    del shard
    api.create_table("job/big", 128, 1, False, make_spec("uniform", -1, 1, 7), replace=True)
    hash_rss(path, rows // 2)


def _rows_by_key(name, keys):
    with runtime.entered():
        table = api.shard(name)
        return table.gather(table.rows_of(keys, insert=False)).copy()


def hash_rss(path, rows):
    """A hash table of `rows` keys: a load drops its old shard before it fills the new one."""
    name = "job/bighash"
    api.create_table(name, 128, rows // COMM.size + 64, True, make_spec("uniform", -1, 1, 7),
                     replace=True)
    keys = np.arange(COMM.rank, rows, COMM.size, dtype=np.int64)
    with runtime.entered():
        api.shard(name).rows_of(keys, insert=True)
    checkpoint.dump_tables(path, [name])
    want = _rows_by_key(name, keys[::997])
    shard_kib = api.shard(name).values.nbytes >> 10
    load = added_kib(lambda: checkpoint.load_tables(path, [name]))
    np.testing.assert_array_equal(_rows_by_key(name, keys[::997]), want)
    print("rank %d: hash shard %d KiB, chunk %d KiB, load added %d KiB of peak resident memory"
          % (COMM.rank, shard_kib, checkpoint.chunk_bytes() >> 10, load), flush=True)


def main(mode, path, arg, chunk_mb=None):
    sok1x.init(backend="cpu")
    if mode == "rss":
        rss(path, int(arg), chunk_mb)
        return
    make_tables()
    if mode == "save":
        for step in range(3):
            train(step)
        checkpoint.dump_tables(path, list(TABLES))
        saved = {}
        for name in TABLES:
            saved.update(reference(name))
        if COMM.rank == 0:
            np.savez(arg, **saved)
    elif mode == "load":
        checkpoint.load_tables(path, list(TABLES))
        want = np.load(arg)
        for name in TABLES:
            for i, array in enumerate(whole(name)):
                np.testing.assert_array_equal(array, want["%s/%d" % (name, i)],
                                              err_msg="%s part %d" % (name, i))
        print("rank %d: loaded equal" % COMM.rank, flush=True)
    elif mode == "kill":
        for step in range(4):
            train(step)
        kill_at(arg)
        COMM.barrier()
        checkpoint.dump_tables(path, list(TABLES))
        raise SystemExit("the dump was to be killed")


if __name__ == "__main__":
    main(*sys.argv[1:5])
