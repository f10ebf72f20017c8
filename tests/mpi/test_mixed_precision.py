"""Mixed precision: a layer asked for float16 (dtype="mixed_float16", or Keras' mixed_float16
policy) gives float16 outputs and takes float16 gradients, while its table and optimizer state
stay float32; K steps of training equal one process training the float32 model with plain
TensorFlow to SOK's AMP tolerance (1e-2)."""
import numpy as np
import pytest
from embedding_reference import full_table
from mpi4py import MPI
from optimizer_reference import local_shard
from tf_support import global_batch, local_part, session, tf1

import sok1x
from sok1x.graph_ops import tf_compat

SLOTS, NNZ, DIM, PER_RANK, VOCAB, CAPACITY, STEPS = 3, 2, 8, 4, 40, 48, 4
TOLERANCE = 1e-2


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.init(backend="cpu")


def make_layer(kind, dtype):
    options = {} if dtype is None else {"dtype": dtype}
    initializer = tf1.random_uniform_initializer(-0.5, 0.5, seed=4)
    if kind == "dense":
        return sok1x.All2AllDenseEmbedding(CAPACITY, DIM, SLOTS, NNZ, use_hashtable=False,
                                           embedding_initializer=initializer, **options)
    return sok1x.DistributedEmbedding("mean", CAPACITY, DIM, SLOTS, NNZ, use_hashtable=False,
                                      embedding_initializer=initializer, **options)


def model_loss(vectors, global_size):
    """A little float16 work on the embedding output (as a mixed-precision model does), then the
    loss in float32."""
    scaled = vectors * tf1.constant(1.5, vectors.dtype) + tf1.constant(0.25, vectors.dtype)
    return tf1.reduce_sum(tf1.sin(tf1.cast(scaled, tf1.float32))) / float(global_size)


def train_sok1x(world, kind, dtype, data):
    rank, size = world
    global_size = PER_RANK * size
    with tf1.Graph().as_default() as graph:
        keys = tf1.placeholder(tf1.int64, [PER_RANK, SLOTS, NNZ])
        layer = make_layer(kind, dtype)
        if kind == "dense":
            vectors = layer(keys)
        else:
            vectors = layer(tf1.SparseTensor(*sparse_parts(keys, PER_RANK)))
        loss = model_loss(vectors, global_size)
        vector_grad = tf1.gradients(loss, vectors)[0]
        grads = tf1.gradients(loss, [layer.var])
        with sok1x.OptimizerScope([layer.var]):
            train = tf1.train.AdamOptimizer(0.05).apply_gradients(zip(grads, [layer.var]))
        losses = []
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for step_keys in data:
                value, _ = sess.run([loss, train], {keys: local_part(step_keys, rank, size)})
                losses.append(MPI.COMM_WORLD.allreduce(float(value)))
    shard = local_shard(layer)
    held = {"values": shard.values.dtype, **{n: s.dtype for n, s in shard.slots.items()}}
    local_keys = np.arange(CAPACITY) * size + rank
    table = {}
    for part_keys, part_rows in MPI.COMM_WORLD.allgather((local_keys, np.array(shard.values))):
        table.update((k, r) for k, r in zip(part_keys.tolist(), part_rows) if k < VOCAB)
    return losses, table, layer, (vectors.dtype, vector_grad.dtype, held)


def train_reference(kind, layer, data):
    """The float32 model in one process: a tf.Variable holding each key's initial vector."""
    global_size = data[0].shape[0]
    _, initial = full_table(layer, np.arange(VOCAB))
    with tf1.Graph().as_default() as graph:
        keys = tf1.placeholder(tf1.int64, [global_size, SLOTS, NNZ])
        table = tf1.Variable(initial, use_resource=True)
        if kind == "dense":
            vectors = tf1.nn.embedding_lookup(table, keys)
        else:
            ids = tf1.SparseTensor(*sparse_parts(keys, global_size))
            vectors = tf1.reshape(tf1.nn.embedding_lookup_sparse(table, ids, None, "mean"),
                                  [global_size, SLOTS, DIM])
        loss = model_loss(vectors, global_size)
        train = tf1.train.AdamOptimizer(0.05).minimize(loss, var_list=[table])
        losses = []
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for step_keys in data:
                value, _ = sess.run([loss, train], {keys: step_keys})
                losses.append(float(value))
            return losses, dict(enumerate(sess.run(table)))


def sparse_parts(keys, batch):
    """(indices, values, dense shape) of keys [batch, SLOTS, NNZ] as the SparseTensor
    [batch * SLOTS, NNZ] DistributedEmbedding takes."""
    rows = batch * SLOTS
    indices = np.stack(np.meshgrid(np.arange(rows), np.arange(NNZ), indexing="ij"), -1)
    return indices.reshape(-1, 2), tf1.reshape(keys, [-1]), [rows, NNZ]


def check_against_float32(world, kind, dtype):
    data = [global_batch(50 + step, PER_RANK * world[1], SLOTS, NNZ, VOCAB)
            for step in range(STEPS)]
    losses, table, layer, dtypes = train_sok1x(world, kind, dtype, data)
    output_dtype, gradient_dtype, held = dtypes
    assert output_dtype == tf1.float16 and gradient_dtype == tf1.float16
    assert held and all(d == np.float32 for d in held.values()), held
    want_losses, want_table = train_reference(kind, layer, data)
    np.testing.assert_allclose(losses, want_losses, rtol=TOLERANCE, atol=TOLERANCE)
    keys = sorted(want_table)
    assert sorted(table) == keys
    np.testing.assert_allclose(np.stack([table[k] for k in keys]),
                               np.stack([want_table[k] for k in keys]),
                               rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_dtype_mixed_float16_matches_float32_tensorflow(world, kind):
    check_against_float32(world, kind, "mixed_float16")


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_keras_mixed_float16_policy_matches_float32_tensorflow(world, kind):
    if not tf_compat.tf2_behavior() and tf_compat.VERSION < (2, 0):
        pytest.skip("TensorFlow %s sets a global mixed_float16 policy only with TensorFlow 2 "
                    "behaviour on (a layer's dtype='mixed_float16' is tested)"
                    % tf_compat.tf.__version__)
    tf_compat.set_keras_global_policy("mixed_float16")
    try:
        check_against_float32(world, kind, None)
    finally:
        tf_compat.set_keras_global_policy("float32")


def test_float32_stays_float32_and_other_dtypes_are_refused(world):
    with tf1.Graph().as_default():
        assert make_layer("dense", None)(
            tf1.zeros([1, SLOTS, NNZ], tf1.int64)).dtype == tf1.float32
        with pytest.raises(ValueError, match="float32, float16 or bfloat16, not float64"):
            make_layer("dense", "float64")
