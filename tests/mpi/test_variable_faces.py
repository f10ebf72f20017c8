"""A sok1x.Variable's shape, read_value and assign as SOK's (its rank's shard of the table) in
tf.compat.v1 graph mode, at any number of ranks, against a stock tf.Variable holding what SOK's
shard holds (global row i on rank i % size, or every row on rank r for "localized:r"); a
DynamicVariable's assign refused as SOK's; a value of the wrong shape an error that changes
nothing. tests/cpu/jobs/variable_face_job.py checks the same executing eagerly."""
import numpy as np
import pytest
import tf_support
from mpi4py import MPI

import sok1x as sok
from sok1x.errors import InvalidInputError

tf1 = tf_support.tf1
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, DIM = 11, 3


def shard(table, mode):
    """What SOK's variable of `table` holds on this rank."""
    if mode == "distributed":
        return table[RANK::SIZE]
    return table if RANK == SIZE - 1 else table[:0]


@pytest.mark.parametrize("mode", ["distributed", "localized"])
def test_shape_read_and_assign_are_the_shards(mode, shared_dir):
    table = np.random.default_rng(7).uniform(size=(ROWS, DIM)).astype(np.float32)
    ones = np.ones_like(shard(table, mode))
    graph = tf1.Graph()
    with graph.as_default():
        variable = sok.Variable(table, mode=mode if mode == "distributed" else
                                "localized:%d" % (SIZE - 1))
        reference = tf1.Variable(shard(table, mode), use_resource=True)
        assert variable.shape == reference.shape == variable.get_shape(), variable.shape
        read = [variable.read_value(), reference.read_value()]
        zero = [v.assign(np.zeros(v.shape), read_value=False) for v in (variable, reference)]
        add = [v.assign_add(ones, read_value=False) for v in (variable, reference)]
        sub = [v.assign_sub(0.5 * ones, read_value=False) for v in (variable, reference)]
        dump = sok.dump(shared_dir, [variable])
        load = sok.load(shared_dir, [variable])
        wrong = tf1.placeholder(tf1.float32, [None, DIM])
        assigned = variable.assign(wrong, read_value=False)
        # SOK's reads: a lookup of every row sees the shard's rows after the writes.
        lookup = tf1.nn.embedding_lookup(variable, np.arange(ROWS)) if mode == "distributed" \
            else None
    with tf_support.initialized_session(graph) as sess:
        mine, want = sess.run(read)
        np.testing.assert_array_equal(mine, want)
        np.testing.assert_array_equal(sess.run(variable), want)  # the fetch of the variable
        sess.run(zero)
        mine, want = sess.run(read)
        np.testing.assert_array_equal(mine, np.zeros_like(want))
        np.testing.assert_array_equal(mine, want)
        sess.run(add)
        sess.run(sub)
        mine, want = sess.run(read)
        np.testing.assert_array_equal(mine, want)
        sess.run(dump)
        sess.run(zero[0])
        sess.run(load)
        np.testing.assert_array_equal(sess.run(read[0]), want)
        # A value of another shape, known only when the step runs, fails this rank's write and
        # changes nothing.
        with pytest.raises(tf1.errors.InvalidArgumentError, match="assign"):
            sess.run(assigned, {wrong: np.zeros([len(want) + 1, DIM])})
        np.testing.assert_array_equal(sess.run(read[0]), want)
        if lookup is not None:
            np.testing.assert_array_equal(sess.run(lookup), np.full_like(table, 0.5))


def test_static_wrong_shape_and_dynamic_writes_are_refused():
    graph = tf1.Graph()
    with graph.as_default():
        variable = sok.Variable(np.ones([ROWS, DIM], np.float32))
        dynamic = sok.DynamicVariable(dimension=DIM, var_type="hbm", initializer="0.5")
        before = variable.read_value()
        # A value of the handle's own [1] (Horovod's broadcast, a restore) writes the handle.
        to_handle = variable.assign(np.zeros([1], np.float32))
        with pytest.raises(InvalidInputError, match=r"assign.*\[%d, %d\]" % (
                len(range(RANK, ROWS, SIZE)), DIM)):
            variable.assign(np.zeros([2]))
        with pytest.raises(InvalidInputError, match="assign_add"):
            variable.assign_add(1.0)
        assert dynamic.shape.as_list() == [None, DIM]
        for write in (dynamic.assign, dynamic.assign_add, dynamic.assign_sub):
            with pytest.raises(NotImplementedError, match="sok1x.assign"):
                write(np.zeros([1, DIM]))
        with pytest.raises(NotImplementedError, match="sok1x.export"):
            dynamic.read_value()
    with tf_support.initialized_session(graph) as sess:
        sess.run(to_handle)
        np.testing.assert_array_equal(sess.run(before), np.ones([len(range(RANK, ROWS, SIZE)),
                                                                 DIM]))


def test_horovods_broadcast_hook_writes_the_handles_not_the_shards():
    """hvd.BroadcastGlobalVariablesHook assigns every global variable rank 0's value: a sok1x
    variable's handle, so each rank keeps its own rows and trains them as stock TensorFlow
    trains its shard."""
    hvd = pytest.importorskip("horovod.tensorflow")
    hvd.init()
    table = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
    ids = [RANK % ROWS, (RANK + 5) % ROWS]
    graph = tf1.Graph()
    with graph.as_default():
        variable = sok.Variable(table)
        loss = tf1.reduce_sum(tf1.nn.embedding_lookup(variable, tf1.constant(ids, tf1.int64)))
        train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss)
        read = variable.read_value()
        hooks = [sok.InitHook(backend="cpu"), hvd.BroadcastGlobalVariablesHook(0)]
        with tf1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            np.testing.assert_array_equal(sess.run(read), shard(table, "distributed"))
            sess.run(train)
            got = sess.run(read)
    every = sorted(i for r in range(SIZE) for i in [r % ROWS, (r + 5) % ROWS])
    want = table.copy()
    for i in every:
        want[i] -= 0.5
    np.testing.assert_array_equal(got, shard(want, "distributed"))
