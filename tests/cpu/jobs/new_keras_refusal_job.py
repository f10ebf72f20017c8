"""An MPI job for test_new_keras_refusal: TF 2.11+ Keras optimizers whose sparse update sok1x
does not reproduce (RMSprop, Nadam: SOK refuses every TF 2.11+ Keras optimizer) are
refused on sok1x variables, through sok.OptimizerWrapper and applied directly, on every rank,
with an error naming the optimizer and the fix, and the table is unchanged (its initial rows,
from NumPy). Those with a twin still train, against stock TensorFlow training a tf.Variable on
the global batch: SGD without momentum, and SGD with momentum (plain and Nesterov), Adamax,
Adadelta and Ftrl, whose state decays (or is recomputed) and moves every row, also those a step
does not touch.
Prints "NEW KERAS REFUSAL OK".
"""
import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
from sok1x.errors import UnsupportedOptimizerError  # noqa: E402
import eager_job  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, DIM = 12, 3
REFUSED = [
    lambda: tf.keras.optimizers.RMSprop(0.5),
    lambda: tf.keras.optimizers.Nadam(0.5),
]
# TF 2.11+ Keras optimizers whose state decays (or is recomputed) on every row on a sparse
# gradient, and moves every row: through twins whose rules run on every row.
EVERY_ROW = [
    ("SGD momentum", lambda: tf.keras.optimizers.SGD(0.25, momentum=0.9)),
    ("SGD nesterov", lambda: tf.keras.optimizers.SGD(0.25, momentum=0.9, nesterov=True)),
    ("Adamax", lambda: tf.keras.optimizers.Adamax(0.5)),
    ("Adadelta", lambda: tf.keras.optimizers.Adadelta(1.0, rho=0.5)),
    ("Ftrl", lambda: tf.keras.optimizers.Ftrl(0.5, l1_regularization_strength=0.01,
                                              l2_shrinkage_regularization_strength=0.1)),
]


def refused(action, name):
    try:
        action()
    except UnsupportedOptimizerError as error:
        text = str(error)
        assert name in text and "sok1x.init()" in text and "legacy" in text, text
    else:
        raise AssertionError("%s was not refused" % name)


def main():
    sok.init(backend="cpu", use_legacy_optimizer=False)  # TensorFlow's own tf.keras.optimizers
    initial = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
    ids = tf.constant(np.arange(RANK, ROWS, SIZE), tf.int64)
    for make in REFUSED:
        optimizer = make()
        name = type(optimizer).__name__
        refused(functools.partial(sok.OptimizerWrapper, optimizer), name)
        variable = sok.Variable(initial)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(variable, ids))
        grads = tape.gradient(loss, [variable])
        refused(functools.partial(optimizer.apply_gradients, list(zip(grads, [variable]))), name)
        keys, values = sok.export(variable)
        np.testing.assert_array_equal(values.numpy(), initial[keys.numpy()])
    # A twin still trains: SGD without momentum, as stock TensorFlow on the global batch.
    variable, dense = sok.Variable(initial), tf.Variable(initial)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.5))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(variable, ids))
    optimizer.apply_gradients(zip(tape.gradient(loss, [variable]), [variable]))
    every = tf.constant(np.arange(ROWS), tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(dense, every))
    tf.keras.optimizers.SGD(0.5).apply_gradients(zip(tape.gradient(loss, [dense]), [dense]))
    keys, values = sok.export(variable)
    np.testing.assert_allclose(values.numpy(), dense.numpy()[keys.numpy()], rtol=1e-6)
    for name, make in EVERY_ROW:
        against_stock(initial * 0.01, name, make)
    COMM.Barrier()
    if RANK == 0:
        print("NEW KERAS REFUSAL OK")


def against_stock(initial, name, make):
    """Optimizer make() through the wrapper and applied directly, three steps (the later ones
    touching a third of the rows), against it on a tf.Variable [ROWS, DIM] fed every rank's
    keys."""
    steps = [np.arange(ROWS), np.arange(0, ROWS, 3), np.arange(1, ROWS, 3)]
    wrapped, direct, dense = sok.Variable(initial), sok.Variable(initial), tf.Variable(initial)
    wrapper, plain, stock = sok.OptimizerWrapper(make()), make(), make()
    for keys in steps:
        mine = tf.constant(keys[keys % SIZE == RANK], tf.int64)
        for variable, optimizer in ((wrapped, wrapper), (direct, plain)):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.embedding_lookup(variable, mine) * 2.0)
            optimizer.apply_gradients(zip(tape.gradient(loss, [variable]), [variable]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(dense, tf.constant(keys)) * 2.0)
        stock.apply_gradients(zip(tape.gradient(loss, [dense]), [dense]))
    moved = dense.numpy() - initial  # what each row moved by (small next to its value)
    for variable in (wrapped, direct):
        keys, values = sok.export(variable)
        keys = keys.numpy()
        np.testing.assert_allclose(values.numpy() - initial[keys], moved[keys], rtol=1e-3,
                                   atol=1e-7, err_msg=name)


if __name__ == "__main__":
    eager_job.run(main)
