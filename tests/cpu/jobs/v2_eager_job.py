"""An MPI job for test_v2_eager: SOK's v2 API executing eagerly under tf.GradientTape (TF2),
in a process of its own (the MPI tests run in graph mode). Prints "V2 EAGER OK" on success.

1. Seed 003's program ("Get Started" of SOK 2.x, its sizes), with only the import changed, its
   lookups and SGD update checked against tf.nn.embedding_lookup_sparse and the TF optimizer on
   the same values.
2. SOK's own v2 SGD check (tests/mpi/v2_check.py) against a single-process model.
3. OptimizerWrapper around TF 2.11+ Keras optimizers against them on a dense table.
4. A table looked up twice in a step; a bad key on one rank fails every rank, changing nothing.
5. The training step inside a tf.function, and one whose tables cross the seam in keyed form.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "mpi"))
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import v2_check  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
import eager_job  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def seed_003():
    """The seed's program, checked step by step."""
    import horovod.tensorflow as hvd
    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")  # nopep8
    sok.init(backend="cpu", use_legacy_optimizer=False)  # the twins of the new Keras ones
    # sok.Variable: the seed's sizes and partitions.
    v1 = sok.Variable(np.arange(15 * 16).reshape(15, 16), dtype=tf.float32)
    v2 = sok.Variable(np.arange(15 * 16).reshape(15, 16), dtype=tf.float32, mode="localized:0")
    print("v1:\n", v1)
    print("v2:\n", v2)
    keys, _ = sok.export(v1)
    assert keys.shape[0] == len(range(RANK, 15, SIZE)), keys  # [9, 3] and [8, 3] on 2 GPUs, ...
    assert sok.export(v2)[0].shape[0] == (15 if RANK == 0 else 0)

    v1 = sok.DynamicVariable(dimension=16, var_type="hbm", initializer="normal")
    v2 = sok.DynamicVariable(dimension=16, var_type="hybrid", initializer="uniform",
                             init_capacity=1024 * 1024, max_capacity=1024 * 1024,
                             max_hbm_for_vectors=2)
    indices1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]],
                               values=[1, 1, 3, 4, 5], dense_shape=[2, 3])
    indices2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]], values=[1, 2, 3],
                               dense_shape=[2, 2])
    with tf.GradientTape() as tape:
        embeddings = sok.lookup_sparse([v1, v2], [indices1, indices2], combiners=["sum", "mean"])
        loss = 0.0
        for embedding in embeddings:
            loss += tf.reduce_sum(embedding)
    before = [eager_job.gathered(v1), eager_job.gathered(v2)]
    optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)
    sok_optimizer = sok.OptimizerWrapper(optimizer)
    grads = tape.gradient(loss, [v1, v2])
    sok_optimizer.apply_gradients(zip(grads, [v1, v2]))
    after = [eager_job.gathered(v1), eager_job.gathered(v2)]

    # The reference: dense TF tables holding the same values, every rank's batch (the same on
    # every rank, as in the seed) in one process.
    for t, (ids, combiner) in enumerate([(indices1, "sum"), (indices2, "mean")]):
        keys = sorted(before[t])
        assert keys == sorted(set(ids.values.numpy().tolist())), keys
        dense = tf.Variable(_dense(before[t], keys))
        with tf.GradientTape() as reference_tape:
            want = tf.nn.embedding_lookup_sparse(dense, ids, None, combiner=combiner)
            reference_loss = tf.reduce_sum(want) * SIZE
        np.testing.assert_allclose(embeddings[t].numpy(), want.numpy(), rtol=1e-6)
        gradient = reference_tape.gradient(reference_loss, [dense])
        tf.keras.optimizers.SGD(learning_rate=1.0).apply_gradients(zip(gradient, [dense]))
        for k in keys:
            np.testing.assert_allclose(after[t][k], dense.numpy()[k], rtol=1e-6)

    # sok.export / sok.assign, as the seed calls them.
    with tf.device("CPU"):
        indices = tf.convert_to_tensor([i for i in range(24)], dtype=tf.int64)
        values = tf.convert_to_tensor(np.random.default_rng(5).random((24, 16)),
                                      dtype=tf.float32)
    sok.assign(v1, indices, values)
    ex_v1_indices, ex_v1_values = sok.export(v1)
    print("ex_v1_indices:\n", ex_v1_indices)
    everything = eager_job.gathered(v1)
    for k in range(24):
        np.testing.assert_array_equal(everything[k], values.numpy()[k])


def _dense(rows, keys):
    table = np.zeros([max(keys) + 1, 16], np.float32)
    for k in keys:
        table[k] = rows[k]
    return table


def sgd_check(steps):
    variables = v2_check.make_variables(sok, tf)
    v2_check.assign_dynamic(sok, variables)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))
    handles = list(variables.values())
    losses = []
    for step in range(steps):
        inputs = v2_check.eager_inputs(tf, v2_check.step_batch(step))
        with tf.GradientTape() as tape:
            loss = v2_check.lookups(sok, tf, variables, inputs)
        grads = tape.gradient(loss, handles)
        assert all(isinstance(g, tf.IndexedSlices) for g in grads)
        optimizer.apply_gradients(zip(grads, handles))
        losses.append(float(loss))
    shards = {name: tuple(t.numpy() for t in sok.export(v)) for name, v in variables.items()}
    v2_check.check_results(losses, shards, steps)


def keras_optimizers():
    """OptimizerWrapper(tf.keras.optimizers.X) on a sok1x.Variable equals X on a dense table."""
    rows, dim = 16, 3
    rng = np.random.default_rng(9)
    initial = rng.uniform(-1, 1, size=(rows, dim)).astype(np.float32)
    batches = [rng.integers(0, rows, size=(8, 3)) for _ in range(4)]
    makers = {"SGD": lambda: tf.keras.optimizers.SGD(0.5),
              "Adam": lambda: tf.keras.optimizers.Adam(0.01),
              "Adagrad": lambda: tf.keras.optimizers.Adagrad(0.1),
              "legacy Adamax": lambda: tf.keras.optimizers.legacy.Adamax(0.05),
              "legacy Adadelta": lambda: tf.keras.optimizers.legacy.Adadelta(1.0, rho=0.9)}
    for name, make in makers.items():
        table = sok.Variable(initial, name="keras_" + name.replace(" ", "_"))
        dense = tf.Variable(initial)
        wrapped, native = sok.OptimizerWrapper(make()), make()
        for batch in batches:
            mine = tf.RaggedTensor.from_tensor(batch.reshape(SIZE, -1, 3)[RANK])
            with tf.GradientTape() as tape:
                pooled = sok.lookup_sparse(table, mine)
                loss = tf.reduce_sum(pooled * pooled)
            wrapped.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
            with tf.GradientTape() as tape:
                pooled = tf.nn.embedding_lookup_sparse(
                    dense, tf.RaggedTensor.from_tensor(batch).to_sparse(), None, combiner="sum")
                loss = tf.reduce_sum(pooled * pooled)
            native.apply_gradients(zip(tape.gradient(loss, [dense]), [dense]))
        got = eager_job.gathered(table)
        for k in range(rows):
            np.testing.assert_allclose(got[k], dense.numpy()[k], rtol=1e-5, atol=1e-6,
                                       err_msg=name)


def twice_in_a_step_and_bad_input():
    """One variable looked up twice in a step; then bad keys on the last rank only: every rank
    raises in that lookup and the table is unchanged (D7)."""
    from sok1x.errors import InvalidInputError
    initial = np.arange(10 * 2, dtype=np.float32).reshape(10, 2)
    table, dense = sok.Variable(initial, name="twice"), tf.Variable(initial)
    first = tf.RaggedTensor.from_row_lengths(np.array([1, 2, 2], np.int64), [2, 1])
    second = tf.RaggedTensor.from_row_lengths(np.array([2, 9], np.int64), [1, 1])
    optimizer = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse(table, first)) + 2 * tf.reduce_sum(
            sok.lookup_sparse(table, second, combiners="mean"))
    optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    with tf.GradientTape() as tape:
        want = tf.reduce_sum(tf.nn.embedding_lookup_sparse(dense, first.to_sparse(), None,
                                                           combiner="sum"))
        want += 2 * tf.reduce_sum(tf.nn.embedding_lookup_sparse(dense, second.to_sparse(), None,
                                                                combiner="mean"))
    tf.compat.v1.train.GradientDescentOptimizer(float(SIZE)).apply_gradients(
        zip(tape.gradient(want, [dense]), [dense]))
    np.testing.assert_allclose(float(loss), float(want))
    before = eager_job.gathered(table)
    for k in range(10):
        np.testing.assert_allclose(before[k], dense.numpy()[k])
    bad = np.array([1, 10 if RANK == SIZE - 1 else 3], np.int64)
    try:
        with tf.GradientTape():
            sok.lookup_sparse(table, tf.RaggedTensor.from_row_lengths(bad, [1, 1]))
    except InvalidInputError as error:
        assert "beyond the number of rows" in str(error), error
    else:
        raise AssertionError("rank %d: a key beyond the rows did not raise" % RANK)
    after = eager_job.gathered(table)
    for k in range(10):
        np.testing.assert_array_equal(before[k], after[k])


def in_a_tf_function():
    """The training step traced once by tf.function (graph ops, tape gradients) on a Variable
    and a DynamicVariable, against TF on dense tables (every rank looks up the same ids)."""
    initial = np.random.default_rng(4).uniform(-1, 1, size=(12, 3)).astype(np.float32)
    table = sok.Variable(initial, name="in_function")
    dynamic = sok.DynamicVariable(dimension=3, initializer="zeros", name="in_function_dynamic")
    sok.assign(dynamic, np.arange(12), initial)
    dense = [tf.Variable(initial), tf.Variable(initial)]
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))
    reference = tf.keras.optimizers.SGD(0.1 * SIZE)

    @tf.function
    def step(ids, weights):
        with tf.GradientTape() as tape:
            pooled = sok.lookup_sparse([table, dynamic], [ids, ids], [weights, None],
                                       ["mean", "sum"])
            loss = tf.reduce_sum(pooled[0] * pooled[0]) + tf.reduce_sum(pooled[1])
        grads = tape.gradient(loss, [table, dynamic])
        optimizer.apply_gradients(zip(grads, [table, dynamic]))
        return loss

    rng = np.random.default_rng(6)
    for _ in range(4):
        keys = rng.integers(0, 12, size=(4, 3))
        ids = tf.RaggedTensor.from_tensor(keys).to_sparse()
        weights = tf.SparseTensor(ids.indices, rng.uniform(0.5, 2, size=12).astype(np.float32),
                                  ids.dense_shape)
        loss = step(ids, weights)
        with tf.GradientTape() as tape:
            first = tf.nn.embedding_lookup_sparse(dense[0], ids, weights, combiner="mean")
            second = tf.nn.embedding_lookup_sparse(dense[1], ids, None, combiner="sum")
            want = tf.reduce_sum(first * first) + tf.reduce_sum(second)
        reference.apply_gradients(zip(tape.gradient(want, dense), dense))
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    for variable, expected in zip((table, dynamic), dense):
        got = eager_job.gathered(variable)
        for k in got:
            np.testing.assert_allclose(got[k], expected.numpy()[k], rtol=1e-5, atol=1e-6)


def keyed_in_a_tf_function():
    """Tables of one dim and pooling inside a tf.function cross the seam in keyed form (one
    pooled output split in the graph); one table's output unused: a zero gradient."""
    rng = np.random.default_rng(8)
    initial = [rng.uniform(-1, 1, size=(12, 3)).astype(np.float32) for _ in range(2)]
    tables = [sok.Variable(values, name="keyed_function_%d" % t)
              for t, values in enumerate(initial)]
    dense = [tf.Variable(values) for values in initial]
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))
    reference = tf.keras.optimizers.SGD(0.1 * SIZE)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            pooled = sok.lookup_sparse(tables, [ids, ids], None, ["sum", "sum"])
            loss = tf.reduce_sum(pooled[0] * pooled[0])
        grads = tape.gradient(loss, tables)
        optimizer.apply_gradients(zip(grads, tables))
        return loss

    for _ in range(3):
        ids = tf.RaggedTensor.from_tensor(rng.integers(0, 12, size=(4, 3))).to_sparse()
        loss = step(ids)
        with tf.GradientTape() as tape:
            first = tf.nn.embedding_lookup_sparse(dense[0], ids, None, combiner="sum")
            want = tf.reduce_sum(first * first)
        reference.apply_gradients(zip(tape.gradient(want, dense[:1]), dense[:1]))
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    for variable, expected in zip(tables, dense):
        got = eager_job.gathered(variable)
        for k in got:
            np.testing.assert_allclose(got[k], expected.numpy()[k], rtol=1e-5, atol=1e-6)


def main(steps):
    seed_003()
    sgd_check(steps)
    keras_optimizers()
    twice_in_a_step_and_bad_input()
    in_a_tf_function()
    keyed_in_a_tf_function()
    COMM.Barrier()
    if RANK == 0:
        print("V2 EAGER OK")


if __name__ == "__main__":
    eager_job.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 10)
