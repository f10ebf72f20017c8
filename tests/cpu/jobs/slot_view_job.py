"""An MPI job for test_slot_views: an optimizer's slots of sok1x variables as SOK's TF2 programs
read them (optimizer.get_slot(var, name), then .numpy(), .assign(), sok.export, sok.assign,
sok.dump / sok.load with the optimizer), executing eagerly, checked against stock TensorFlow's
slots of a tf.Variable trained on the global batch with the same optimizer class. Prints
"SLOT VIEWS OK" on success.

1. sok.Variable (distributed, and localized on the last rank) and DynamicVariable, each trained
   by Keras OptimizerV2 SGD with momentum, Adagrad, Adamax, Adadelta, Ftrl and by
   tf.compat.v1.train.FtrlOptimizer (slot "accum"): every slot's rows on this rank, by key,
   are the stock slot's rows (Adagrad's untouched rows at its initial accumulator 0.1).
2. view.assign(zeros) and sok.assign(view, keys, zeros) zero the engine slot, and sok.load of
   a dump made before (with the optimizer) brings it back exactly; a value of the wrong shape
   is refused.
3. var.target_gpu is SOK's: -1 for a distributed variable, r for "localized:r".
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
ROWS, DIM, PER_RANK, STEPS = 20, 3, 5, 3
legacy = tf.keras.optimizers.legacy
OPTIMIZERS = [
    lambda: legacy.SGD(0.5, momentum=0.9),
    lambda: legacy.Adagrad(0.3),
    lambda: legacy.Adamax(0.2, beta_1=0.9, beta_2=0.999),
    lambda: legacy.Adadelta(1.0),
    lambda: legacy.Ftrl(0.3),
    lambda: tf.compat.v1.train.FtrlOptimizer(0.3),
]
VARIABLES = {
    "distributed": lambda initial: sok.Variable(initial),
    "localized": lambda initial: sok.Variable(initial, mode="localized:%d" % (SIZE - 1)),
    "dynamic": lambda initial: sok.DynamicVariable(dimension=DIM, var_type="hbm",
                                                   initializer="0.5"),
}








def train(kind, make_optimizer, seed):
    """(sok1x variable, its optimizer, stock tf.Variable, stock optimizer) after STEPS steps."""
    initial = np.random.default_rng(seed).uniform(size=(ROWS, DIM)).astype(np.float32)
    if kind == "dynamic":
        initial[:] = 0.5
    variable, dense = VARIABLES[kind](initial), tf.Variable(initial)
    optimizer, reference = make_optimizer(), make_optimizer()
    mine = slice(RANK * PER_RANK, (RANK + 1) * PER_RANK)
    for ids, weights in eager_job.batches(seed, ROWS, SIZE * PER_RANK, DIM, STEPS):
        eager_job.step(variable, optimizer, ids[mine], weights[mine], eager_job.sok_lookup)
        eager_job.step(dense, reference, ids, weights, tf.nn.embedding_lookup)
    return variable, optimizer, dense, reference


def check_slots(kind, seed, variable, optimizer, dense, reference):
    names = reference.get_slot_names()
    assert names and sorted(optimizer.get_slot_names()) == sorted(names), names
    for name in names:
        view = optimizer.get_slot(variable, name)
        stock = reference.get_slot(dense, name).numpy()
        keys, values = (t.numpy() for t in sok.export(view))
        if kind == "dynamic":  # every key looked up, each on one rank
            held = np.sort(np.concatenate(COMM.allgather(keys)))
            seen = [ids for ids, _ in eager_job.batches(seed, ROWS, SIZE * PER_RANK, DIM, STEPS)]
            np.testing.assert_array_equal(held, np.unique(seen))
        else:
            want_keys = (np.arange(RANK, ROWS, SIZE) if kind == "distributed" else
                         np.arange(ROWS) if RANK == SIZE - 1 else np.zeros([0], np.int64))
            np.testing.assert_array_equal(keys, want_keys)
            assert tuple(view.shape) == (len(keys), DIM), view.shape
        np.testing.assert_allclose(values, stock[keys], rtol=1e-5, atol=1e-6,
                                   err_msg="%s %s %s" % (kind, type(reference).__name__, name))
        np.testing.assert_array_equal(view.numpy(), values)
    return names


def check_writes(variable, optimizer, names):
    """Zeroing a slot reaches the engine; a load brings the dumped slot back."""
    folder = COMM.bcast(tempfile.mkdtemp(prefix="sok1x_slots_") if RANK == 0 else None)
    sok.dump(folder, [variable], optimizer)
    before = {name: [t.numpy() for t in sok.export(optimizer.get_slot(variable, name))]
              for name in names}
    for number, name in enumerate(names):
        view = optimizer.get_slot(variable, name)
        keys, values = before[name]
        if number % 2:
            sok.assign(view, keys, np.zeros_like(values))
        else:
            view.assign(np.zeros(values.shape))
        np.testing.assert_array_equal(sok.export(view)[1].numpy(), np.zeros_like(values))
    sok.load(folder, [variable], optimizer)
    for name in names:
        keys, values = (t.numpy() for t in sok.export(optimizer.get_slot(variable, name)))
        np.testing.assert_array_equal(keys, before[name][0])
        np.testing.assert_array_equal(values, before[name][1])
    view = optimizer.get_slot(variable, names[0])
    try:
        view.assign(np.zeros([len(before[names[0]][0]) + 1, DIM]))
    except InvalidInputError as error:
        assert "assign" in str(error), error
    else:
        raise AssertionError("a value of the wrong shape was written")
    COMM.barrier()
    if RANK == 0:
        shutil.rmtree(folder)


def main():
    sok.init(backend="cpu")
    for number, make_optimizer in enumerate(OPTIMIZERS):
        for kind in VARIABLES:
            trained = train(kind, make_optimizer, seed=number)
            variable = trained[0]
            want_gpu = SIZE - 1 if kind == "localized" else -1
            assert variable.target_gpu == want_gpu, (kind, variable.target_gpu)
            names = check_slots(kind, number, *trained)
            check_writes(variable, trained[1], names)
    COMM.Barrier()
    if RANK == 0:
        print("SLOT VIEWS OK")


if __name__ == "__main__":
    eager_job.run(main)
