"""An MPI job for test_v2_eager: how SOK's own TF2 test scripts use v2 variables eagerly, each
checked against stock TensorFlow on a tf.Variable of the same rows fed the global batch. Prints
"SOK EAGER IDIOMS OK" on success.

1. A DynamicVariable made before any sok.init() (SOK's sok_sgd_test never calls it) brings
   sok1x up with its defaults; its `size` counts the keys this rank holds at each read.
2. sok.init() makes tf.keras.optimizers / tf.optimizers the legacy OptimizerV2 modules, as
   SOK's init(use_legacy_optimizer=True) does; use_legacy_optimizer=False puts them back.
3. tf.nn.embedding_lookup(sok_var, ids) under tf.GradientTape, the (legacy) Keras optimizer
   applied to the sok1x variable directly; then a sok1x.Variable's eager value is this rank's
   rows (`sok_var - tf_rows`, as SOK's scripts check it) and a lookup of every key is the
   stock table.
4. A TF 2.11+ Keras optimizer (not the legacy one) applied directly to a sok1x.Variable.
5. A "localized:r" variable read eagerly on rank r alone.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
import eager_job  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, DIM, PER_RANK, STEPS = 24, 4, 6, 4


def never_initialized():
    variable = sok.DynamicVariable(dimension=DIM, var_type="hbm", initializer="13")
    rows = tf.nn.embedding_lookup(variable, tf.constant([0, 7], tf.int64))
    np.testing.assert_array_equal(rows.numpy(), np.full([2, DIM], 13.0))
    # size: the keys this rank holds, read anew (SOK's assign_and_export_test)
    sok.assign(variable, tf.range(100, 140, dtype=tf.int64), tf.ones([40, DIM]))
    held = int(variable.size[0])
    assert held == sok.export(variable)[0].shape[0]
    assert COMM.allreduce(held) == 2 + 40


def legacy_keras_optimizers():
    own = tf.keras.optimizers.SGD
    sok.init(backend="cpu")
    assert tf.keras.optimizers.Optimizer.__name__ == "OptimizerV2"
    assert issubclass(tf.optimizers.Adagrad, tf.keras.optimizers.Optimizer)
    assert hasattr(tf.keras.optimizers.SGD(1.0), "_slots")
    sok.init(backend="cpu", use_legacy_optimizer=False)
    assert tf.keras.optimizers.SGD is own
    sok.init(backend="cpu")




def trained(make_variable, make_optimizer, seed, initial=None):
    """(sok1x variable, stock tf.Variable) after STEPS steps of SOK's scripts' model."""
    if initial is None:
        initial = np.random.default_rng(seed).uniform(size=(ROWS, DIM)).astype(np.float32)
    variable, dense = make_variable(initial), tf.Variable(initial)
    optimizer, reference = make_optimizer(), make_optimizer()
    for ids, weights in eager_job.batches(seed, ROWS, SIZE * PER_RANK, DIM, STEPS):
        mine = slice(RANK * PER_RANK, (RANK + 1) * PER_RANK)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(variable, ids[mine]) * weights[mine])
        optimizer.apply_gradients(zip(tape.gradient(loss, [variable]), [variable]))
        with tf.GradientTape() as tape:
            want = tf.reduce_sum(tf.nn.embedding_lookup(dense, ids) * weights)
        reference.apply_gradients(zip(tape.gradient(want, [dense]), [dense]))
    every_key = tf.range(ROWS, dtype=tf.int64)
    np.testing.assert_allclose(tf.nn.embedding_lookup(variable, every_key).numpy(),
                               dense.numpy(), rtol=1e-5, atol=1e-5)
    return variable, dense


def directly_applied_optimizers():
    for make in (lambda: tf.keras.optimizers.SGD(0.5), lambda: tf.keras.optimizers.Adagrad(0.1)):
        variable, dense = trained(sok.Variable, make, seed=1)
        local = tf.nn.embedding_lookup(dense, np.arange(RANK, ROWS, SIZE))
        # SOK's scripts compare the variable itself (this rank's rows) with the stock rows.
        assert float(tf.reduce_sum((variable - local) ** 2)) < 1e-8
        np.testing.assert_allclose(variable.numpy(), local.numpy(), rtol=1e-5, atol=1e-6)
        trained(lambda _: sok.DynamicVariable(dimension=DIM, var_type="hbm", initializer="0.25"),
                make, seed=2, initial=np.full([ROWS, DIM], 0.25, np.float32))
    sok.init(backend="cpu", use_legacy_optimizer=False)
    trained(sok.Variable, lambda: tf.keras.optimizers.Adam(0.05), seed=3)
    sok.init(backend="cpu")


def localized_read_on_its_rank_alone():
    """A "localized:r" variable is read eagerly on rank r alone (no collective), as SOK's."""
    initial = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
    variable = sok.Variable(initial, mode="localized:%d" % (SIZE - 1))
    if RANK == SIZE - 1:
        ids = tf.constant([3, 0, 3, ROWS - 1], tf.int64)
        np.testing.assert_array_equal(tf.nn.embedding_lookup(variable, ids).numpy(),
                                      initial[ids.numpy()])


def main():
    never_initialized()
    localized_read_on_its_rank_alone()
    legacy_keras_optimizers()
    directly_applied_optimizers()
    COMM.Barrier()
    if RANK == 0:
        print("SOK EAGER IDIOMS OK")


if __name__ == "__main__":
    eager_job.run(main)
