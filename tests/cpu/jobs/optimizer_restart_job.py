"""An MPI job for test_optimizer_restarts_eagerly: Adam on a decaying learning-rate schedule
trains a sok1x.Variable executing eagerly (TF2, tf.GradientTape); a job stopped after STOP
steps and restarted in a new process trains on as the job that never stopped. The step count
of the optimizer that updates the table (a TF 2.11+ Keras optimizer's twin, the wrapper's own)
comes back through tf.train.Checkpoint of the optimizer the program holds (restored before
the first step, so into state made after the restore) or sok.dump / sok.load with it.

    optimizer_restart_job.py first <folder>   uninterrupted runs (the reference, saved in
                                              <folder>), then every case's first STOP steps
    optimizer_restart_job.py rest <folder>    restores every case, trains on, compares
Prints "OPTIMIZER RESTARTS OK" after the second.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
import eager_job  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, DIM, STEPS, STOP = 16, 4, 6, 3


def _schedule(schedules):
    return schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.6)


# name -> (the optimizer the program holds, whether it applies it through OptimizerWrapper)
OPTIMIZERS = {
    "new_keras_adam_wrapped": (lambda: tf.keras.optimizers.Adam(
        _schedule(tf.keras.optimizers.schedules), beta_1=0.5, beta_2=0.8), True),
    "new_keras_adam_applied_directly": (lambda: tf.keras.optimizers.Adam(
        _schedule(tf.keras.optimizers.schedules), beta_1=0.5, beta_2=0.8), False),
    "legacy_keras_adam_wrapped": (lambda: tf.keras.optimizers.legacy.Adam(
        _schedule(tf.keras.optimizers.schedules), beta_1=0.5, beta_2=0.8), True),
    "v1_adam_wrapped": (lambda: tf.compat.v1.train.AdamOptimizer(0.1, beta1=0.5, beta2=0.8),
                        True),
}
WAYS = ["checkpoint", "dump", "dump_sok_files"]


def _batches():
    rng = np.random.default_rng(44)
    return [rng.integers(0, ROWS, size=(2 * SIZE, 3)) for _ in range(STEPS)]


class _Job:
    """One table and the optimizer the program holds."""

    def __init__(self, optimizer_name, table_name):
        make, wrapped = OPTIMIZERS[optimizer_name]
        initial = np.random.default_rng(3).uniform(-1, 1, (ROWS, DIM)).astype(np.float32)
        self.table = sok.Variable(initial, name=table_name)
        self.optimizer = make()
        if wrapped:
            self.optimizer = sok.OptimizerWrapper(self.optimizer)

    def run(self, batches):
        for batch in batches:
            ids = tf.RaggedTensor.from_tensor(tf.constant(batch.reshape(SIZE, -1, 3)[RANK]))
            with tf.GradientTape() as tape:
                pooled = sok.lookup_sparse(self.table, ids, combiners="sum")
                loss = tf.reduce_sum(tf.square(pooled - 0.5))
            grads = tape.gradient(loss, [self.table])
            self.optimizer.apply_gradients(zip(grads, [self.table]))

    def rows(self):
        keys, values = sok.export(self.table)
        table = np.zeros([ROWS, DIM], np.float32)
        for shard_keys, shard_values in COMM.allgather((keys.numpy(), values.numpy())):
            table[shard_keys] = shard_values
        return table


def _cases():
    return [(name, way) for name in sorted(OPTIMIZERS) for way in WAYS]


def _places(folder, name, way):
    """(dump folder, this rank's tf.train.Checkpoint folder) of a case."""
    case = os.path.join(folder, "%s-%s" % (name, way))
    return os.path.join(case, "dump"), os.path.join(case, "objects-rank%d" % RANK)


def first(folder):
    """Every case's first STOP steps, saved; then the uninterrupted runs, after them: slot
    prefixes follow the order optimizers are made in ("Adam", "Adam_1", ...), and the restarted
    process makes the cases' optimizers in the same order, as a restarted program does."""
    sok.init(backend="cpu", use_legacy_optimizer=False)  # TF 2.11+'s Keras optimizers
    for name, way in _cases():
        dump_folder, objects = _places(folder, name, way)
        job = _Job(name, "%s_%s" % (name, way))
        job.run(_batches()[:STOP])
        if way == "checkpoint":
            # the rows and every slot: sok1x's sharded format (SOK's files, the default, hold
            # the slots of the optimizer given, none without one)
            sok.dump(dump_folder, [job.table], file_format="sharded")
            tf.train.Checkpoint(optimizer=job.optimizer).save(os.path.join(objects, "ckpt"))
        else:
            file_format = "sok" if way == "dump_sok_files" else "sharded"
            sok.dump(dump_folder, [job.table], job.optimizer, file_format=file_format)
    for name in sorted(OPTIMIZERS):
        job = _Job(name, "whole_" + name)
        job.run(_batches())
        rows = job.rows()
        if RANK == 0:
            np.save(os.path.join(folder, "whole-%s.npy" % name), rows)
    COMM.Barrier()


def rest(folder):
    sok.init(backend="cpu", use_legacy_optimizer=False)
    for name, way in _cases():
        dump_folder, objects = _places(folder, name, way)
        job = _Job(name, "%s_%s" % (name, way))
        if way == "checkpoint":
            sok.load(dump_folder, [job.table])
            tf.train.Checkpoint(optimizer=job.optimizer).restore(
                tf.train.latest_checkpoint(objects))
        else:
            file_format = "sok" if way == "dump_sok_files" else "sharded"
            sok.load(dump_folder, [job.table], job.optimizer, file_format=file_format)
        job.run(_batches()[STOP:])
        whole = np.load(os.path.join(folder, "whole-%s.npy" % name))
        got = job.rows()
        assert np.allclose(got, whole, rtol=1e-6, atol=1e-7), (
            "%s restored by %s trains on differently:\n%s\nagainst\n%s" % (name, way, got, whole))
    COMM.Barrier()
    if RANK == 0:
        print("OPTIMIZER RESTARTS OK")


if __name__ == "__main__":
    eager_job.run({"first": first, "rest": rest}[sys.argv[1]], sys.argv[2])
