"""An MPI job for test_variable_faces: a sok1x.Variable as SOK's TF2 programs see it executing
eagerly (its rank's shard of the table), against a stock tf.Variable holding what SOK's shard
holds (global row i on rank i % size; every row on rank r for "localized:r", none elsewhere),
trained alongside on the same rows. Prints "VARIABLE FACES OK" on success.

1. shape, numpy(), read_value(), value() and tf.convert_to_tensor are the shard's; assign of
   np.zeros(var.shape), assign_add and assign_sub write it, as on the stock variable.
2. SOK's dump_load scripts' idiom: train with a Keras optimizer (its slots, keyed by the
   variable's _unique_id, exist), sok.dump with the optimizer, zero the variable and its slots
   through their shapes, sok.load: the rows are back, and had been zeroed.
3. A value of another shape is an InvalidInputError changing nothing (one of the handle's [1]
   writes the handle, as a Horovod broadcast or a restore does, not the table); a
   DynamicVariable's shape is [None, dim] and its assign / numpy raise NotImplementedError.
4. TensorFlow's own machinery on the handle still works: tf.train.Checkpoint saves and restores
   it, inside tf.function too the reads and writes are the shard's.
"""
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
from sok1x.errors import InvalidInputError  # noqa: E402
import eager_job  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, DIM, PER_RANK, STEPS = 13, 3, 4, 3


def held(mode):
    """The global rows SOK's variable holds on this rank."""
    if mode == "distributed":
        return np.arange(RANK, ROWS, SIZE)
    return np.arange(ROWS) if RANK == SIZE - 1 else np.zeros([0], np.int64)


def make(mode, table):
    if mode == "distributed":
        return sok.Variable(table)
    return sok.Variable(table, mode="localized:%d" % (SIZE - 1))


def check_reads_and_writes(mode, folder):
    table = np.random.default_rng(3).uniform(size=(ROWS, DIM)).astype(np.float32)
    variable, reference = make(mode, table), tf.Variable(table[held(mode)])
    assert variable.shape == reference.shape == variable.get_shape(), variable.shape
    for read in (lambda v: v.numpy(), lambda v: v.read_value().numpy(),
                 lambda v: v.value().numpy(), lambda v: tf.convert_to_tensor(v).numpy()):
        np.testing.assert_array_equal(read(variable), read(reference))
    for v in (variable, reference):
        v.assign(np.zeros(v.shape))
    np.testing.assert_array_equal(variable.numpy(), np.zeros(reference.shape))
    for v in (variable, reference):
        v.assign_add(np.full(v.shape, 2.0, np.float32))
        v.assign_sub(tf.ones(v.shape))
    np.testing.assert_array_equal(variable.numpy(), reference.numpy())
    assert variable.assign(table[held(mode)]) is variable
    np.testing.assert_array_equal(variable.numpy(), table[held(mode)])

    @tf.function
    def halve():
        variable.assign(variable.read_value() * 0.5)
        return variable.read_value()
    np.testing.assert_array_equal(halve().numpy(), table[held(mode)] * 0.5)
    np.testing.assert_array_equal(variable.numpy(), table[held(mode)] * 0.5)

    before = variable.numpy()
    variable.assign(np.zeros([1], np.float32))  # the handle's shape: the handle, not the rows
    np.testing.assert_array_equal(variable.numpy(), before)
    for wrong in (np.zeros([2]), np.zeros([len(held(mode)) + 1, DIM])):
        try:
            variable.assign(wrong)
        except InvalidInputError as error:
            assert "assign" in str(error) and str(list(reference.shape)) in str(error), error
        else:
            raise AssertionError("a value of shape %s was written" % (wrong.shape,))
    np.testing.assert_array_equal(variable.numpy(), before)

    checkpoint = tf.train.Checkpoint(v=variable)
    path = checkpoint.save(os.path.join(folder, "r%d" % RANK, "ckpt"))
    checkpoint.restore(path).assert_consumed()
    np.testing.assert_array_equal(variable.numpy(), before)








def check_dump_load_idiom(mode, folder):
    """SOK's tf2/dump_load/*_static scripts, checked against a stock table trained alongside."""
    table = np.random.default_rng(5).uniform(size=(ROWS, DIM)).astype(np.float32)
    variable, reference = make(mode, table), tf.Variable(table)
    optimizer, stock = tf.optimizers.Adagrad(0.3), tf.optimizers.Adagrad(0.3)
    mine = slice(RANK * PER_RANK, (RANK + 1) * PER_RANK)
    for ids, weights in eager_job.batches(11, ROWS, SIZE * PER_RANK, DIM, STEPS):
        eager_job.step(variable, optimizer, ids[mine], weights[mine], eager_job.sok_lookup)
        eager_job.step(reference, stock, ids, weights, tf.nn.embedding_lookup)
    assert optimizer._slots.get(variable._unique_id) is not None
    rows = held(mode)
    np.testing.assert_allclose(variable.numpy(), reference.numpy()[rows], rtol=1e-5, atol=1e-6)
    slot = optimizer.get_slot(variable, "accumulator")
    stock_slot = stock.get_slot(reference, "accumulator").numpy()[rows]
    np.testing.assert_allclose(slot.numpy(), stock_slot, rtol=1e-5, atol=1e-6)
    trained_rows, trained_slot = variable.numpy(), slot.numpy()
    sok.dump(folder, [variable], optimizer)
    variable.assign(np.zeros(list(variable.shape)))
    slot.assign(np.zeros(list(slot.shape)))
    np.testing.assert_array_equal(variable.numpy(), np.zeros_like(trained_rows))
    np.testing.assert_array_equal(slot.numpy(), np.zeros_like(trained_slot))
    sok.load(folder, [variable], optimizer)
    np.testing.assert_array_equal(variable.numpy(), trained_rows)
    np.testing.assert_array_equal(optimizer.get_slot(variable, "accumulator").numpy(),
                                  trained_slot)


def check_dynamic_refusals():
    dynamic = sok.DynamicVariable(dimension=DIM, var_type="hbm", initializer="0.5")
    assert dynamic.shape.as_list() == [None, DIM], dynamic.shape
    for refused in (lambda: dynamic.assign(np.zeros([1, DIM])), dynamic.numpy,
                    dynamic.read_value, lambda: dynamic.assign_add(np.zeros([1, DIM]))):
        try:
            refused()
        except NotImplementedError as error:
            assert "sok1x.export" in str(error), error
        else:
            raise AssertionError("a DynamicVariable's fixed value was read or written")


def main():
    sok.init(backend="cpu")
    folder = COMM.bcast(tempfile.mkdtemp(prefix="sok1x_faces_") if RANK == 0 else None)
    for number, mode in enumerate(["distributed", "localized"]):
        check_reads_and_writes(mode, os.path.join(folder, "ckpt%d" % number))
        check_dump_load_idiom(mode, os.path.join(folder, "dump%d" % number))
    check_dynamic_refusals()
    COMM.Barrier()
    if RANK == 0:
        shutil.rmtree(folder, ignore_errors=True)
        print("VARIABLE FACES OK")


if __name__ == "__main__":
    eager_job.run(main)
