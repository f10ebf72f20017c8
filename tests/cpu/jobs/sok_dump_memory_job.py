"""An MPI job for test_sok_dump_memory: the peak resident memory that sok.dump and sok.load add
to a rank in SOK's file format (their default for SOK v2's tables), eagerly, as SOK's programs
call them, with SOK1X_CHECKPOINT_CHUNK_MB set small by the test.

    sok_dump_memory_job.py <folder> <rows>   a sok.Variable of <rows> x 128 float32 and a
        DynamicVariable of <rows> / 2 keys: each dumped, some rows changed, loaded back (those
        rows must come back); prints per rank the shard's size, the chunk's, and the peak
        resident memory each dump and load added.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
from sok1x.engine import checkpoint  # noqa: E402
import eager_job  # noqa: E402
from job_memory import resident_kib  # noqa: E402

COMM = MPI.COMM_WORLD
DIM = 128


def peak_reset():
    """Resets this process's peak resident memory (VmHWM) to its current size."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def peak_kib():
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise KeyError("VmHWM")


def added_kib(run):
    """Peak resident memory (KiB) that run() adds to this process."""
    COMM.barrier()
    peak_reset()
    before = resident_kib()
    run()
    return peak_kib() - before


def label_file(variable):
    """SOK's weight file of `variable` (sok.dump's default format for it)."""
    return "%s-weight" % variable.name.replace(":", "_")


def round_trip(folder, variable, keys, label):
    """Dumps `variable`, spoils the rows of `keys`, loads; prints what each added."""
    want = sok.export(variable)[1].numpy()[::997].copy()
    dump = added_kib(lambda: sok.dump(folder, [variable]))
    assert os.path.exists(os.path.join(folder, label_file(variable))), os.listdir(folder)
    sok.assign(variable, keys, np.zeros([len(keys), DIM], np.float32))
    load = added_kib(lambda: sok.load(folder, [variable]))
    np.testing.assert_array_equal(sok.export(variable)[1].numpy()[::997], want, err_msg=label)
    rows = int(sok.export(variable)[0].shape[0])
    print("rank %d: %s shard %d KiB, chunk %d KiB, dump added %d KiB, load added %d KiB"
          % (COMM.rank, label, rows * DIM * 4 >> 10, checkpoint.chunk_bytes() >> 10, dump,
             load), flush=True)


def main(folder, rows):
    rows = int(rows)
    sok.init(backend="cpu")
    small = sok.Variable(np.ones([8, DIM], np.float32), name="warm")
    sok.dump(os.path.join(folder, "warm"), [small])  # the code and its pools, once
    sok.load(os.path.join(folder, "warm"), [small])
    table = sok.Variable(tf.keras.initializers.RandomUniform(-1, 1, seed=3),
                         shape=[rows, DIM], name="big")
    round_trip(os.path.join(folder, "dense"), table, np.arange(0, rows, 3), "dense")
    dynamic = sok.DynamicVariable(dimension=DIM, var_type="hbm", initializer="0.5",
                                  init_capacity=rows // 2, max_capacity=rows // 2,
                                  name="bighash")
    keys = np.arange(rows // 2, dtype=np.int64) * 7 + 1
    for start in range(0, len(keys), 4096):  # every key (each rank keeps its own), in pieces
        part = keys[start:start + 4096]
        sok.assign(dynamic, part, np.random.default_rng(start).uniform(
            size=(len(part), DIM)).astype(np.float32))
    round_trip(os.path.join(folder, "hash"), dynamic, keys[::3], "hash")


if __name__ == "__main__":
    eager_job.run(main, *sys.argv[1:3])
