"""Optimizer semantics beyond one constant setting: hyper-parameters as tensors, callables and
decaying schedules (global_step included) read at run time; LazyAdam leaves rows without a
gradient and their moments alone; repeated rows are summed; and the errors for optimizers sok1x
cannot apply (named variable, list of what is supported)."""
import numpy as np
import pytest
from embedding_reference import full_table
from optimizer_reference import (
    NNZ, SLOTS, VOCAB, assert_same_training, batches, gather_table, local_shard, make_layer,
    train_reference, train_sok1x,
)
from tf_support import global_batch, local_part, session, tf1

import sok1x
from sok1x.errors import Sok1xError, UnsupportedOptimizerError

STEPS = 5
FED = [1.0, 0.5, 2.0, 0.0, 1.5]
keras_v2 = tf1.keras.optimizers


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.init(backend="cpu", use_legacy_optimizer=False)  # keep TensorFlow's tf.keras optimizers


def run_both(world, sok1x_optimizers, reference_optimizers=None, data=None):
    data = data or batches(STEPS, world[1])
    got, layer = train_sok1x(world, sok1x_optimizers, data, fed_values=FED)
    want = train_reference(layer, reference_optimizers or sok1x_optimizers, data,
                           fed_values=FED)
    return got, want


def one(make):
    def make_both(global_step, fed):
        optimizer = make(global_step, fed)
        return optimizer, optimizer
    return make_both


SCHEDULED = {
    "v1_sgd_exponential_decay": one(lambda step, fed: tf1.train.GradientDescentOptimizer(
        tf1.train.exponential_decay(0.4, step, decay_steps=1, decay_rate=0.5, staircase=True))),
    "v1_adam_fed_rate_tensor_beta": one(lambda step, fed: tf1.train.AdamOptimizer(
        fed * 0.02, beta1=tf1.constant(0.8), epsilon=tf1.constant(1e-6))),
    "v1_momentum_callable_rate_fed_momentum": one(lambda step, fed: tf1.train.MomentumOptimizer(
        lambda: tf1.constant(0.05), momentum=fed * 0.4)),
    "v1_rmsprop_decayed": one(lambda step, fed: tf1.train.RMSPropOptimizer(
        tf1.train.exponential_decay(0.02, step, 2, 0.3), decay=fed * 0.4 + 0.1, momentum=0.3)),
    "v1_ftrl_fed": one(lambda step, fed: tf1.train.FtrlOptimizer(
        fed * 0.1 + 0.05, l1_regularization_strength=0.001)),
    "keras_sgd_schedule": one(lambda step, fed: keras_v2.SGD(
        keras_v2.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.6), momentum=0.9)),
    "keras_adam_callable": one(lambda step, fed: keras_v2.Adam(lambda: fed * 0.02,
                                                               beta_1=tf1.constant(0.85))),
    "keras_adagrad_fed": one(lambda step, fed: keras_v2.Adagrad(fed * 0.1 + 0.01)),
}


@pytest.mark.parametrize("name", sorted(SCHEDULED))
def test_hyper_parameters_are_read_when_the_update_runs(world, name):
    got, want = run_both(world, SCHEDULED[name])
    assert_same_training(got, want)


def test_sok1x_adam_with_a_schedule_and_global_step(world):
    def sok1x_side(step, fed):
        rate = tf1.train.exponential_decay(0.05, step, 1, 0.7)
        return sok1x.optimizers.Adam(rate, beta_1=0.85), tf1.train.AdamOptimizer(
            rate, beta1=0.85, epsilon=1e-7)

    def reference_side(step, fed):
        optimizer = tf1.train.AdamOptimizer(tf1.train.exponential_decay(0.05, step, 1, 0.7),
                                            beta1=0.85, epsilon=1e-7)
        return optimizer, optimizer

    got, want = run_both(world, sok1x_side, reference_side)
    assert_same_training(got, want)


def _two_phase_data(size):
    """Step 1 uses keys [0, 8), step 2 keys [8, 16); keys [16, VOCAB) are never used."""
    rng = np.random.default_rng(5)
    data = []
    for step, first in enumerate((0, 8)):
        keys = first + global_batch(50 + step, 3 * size, SLOTS, NNZ, 8)
        data.append((keys, rng.standard_normal((keys.shape[0], 1)).astype(np.float32)))
    return data


def _snapshots(world, make):
    snapshots = []

    def snapshot(layer, _keys):
        """{None: rows, slot name: slot rows} after a step, over all ranks."""
        names = [None] + sorted(local_shard(layer).slots)
        snapshots.append({name: gather_table(layer, name) for name in names})

    _, layer = train_sok1x(world, make, _two_phase_data(world[1]), layer_hook=snapshot)
    return snapshots, layer


def _rows(table, keys):
    return np.stack([table[k] for k in keys])


def test_lazy_adam_leaves_rows_without_gradient_and_their_moments_alone(world):
    make = one(lambda step, fed: sok1x.tf.keras.optimizers.LazyAdamOptimizer(0.05))
    (first, second), layer = _snapshots(world, make)
    assert sorted(k for k in first if k is not None) == ["Adam/m", "Adam/v"]
    step1, step2, never = range(0, 8), range(8, 16), range(16, VOCAB)
    _, initial = full_table(layer, np.arange(VOCAB))
    for name in first:
        np.testing.assert_array_equal(_rows(second[name], step1), _rows(first[name], step1))
    np.testing.assert_array_equal(_rows(second[None], never), initial[16:])
    for name in ("Adam/m", "Adam/v"):
        assert not _rows(second[name], never).any()
        assert _rows(second[name], step2).any() and not _rows(first[name], step2).any()
    assert not np.array_equal(_rows(second[None], step2), initial[8:16])


def test_tf_adam_moves_every_row_it_ever_saw(world):
    make = one(lambda step, fed: tf1.train.AdamOptimizer(0.05))
    (first, second), layer = _snapshots(world, make)
    step1, never = range(0, 8), range(16, VOCAB)
    _, initial = full_table(layer, np.arange(VOCAB))
    m_first, m_second = _rows(first["Adam/m"], step1), _rows(second["Adam/m"], step1)
    np.testing.assert_allclose(m_second, 0.9 * m_first, rtol=1e-6)
    assert not np.allclose(_rows(second[None], step1), _rows(first[None], step1))
    np.testing.assert_array_equal(_rows(second[None], never), initial[16:])


def test_rows_looked_up_twice_are_summed(world):
    rank, size = world
    keys = [global_batch(seed, 2 * size, SLOTS, NNZ, VOCAB) for seed in (61, 62)]
    with tf1.Graph().as_default() as graph:
        layer = make_layer()
        outputs = [layer(tf1.constant(local_part(k, rank, size))) for k in keys]
        loss = tf1.add_n([tf1.reduce_sum(out) for out in outputs])
        grads = tf1.gradients(loss, [layer.var])
        with sok1x.OptimizerScope([layer.var]):
            train = tf1.train.GradientDescentOptimizer(0.25).apply_gradients(
                zip(grads, [layer.var]))
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train)
    _, initial = full_table(layer, np.arange(VOCAB))
    counts = np.bincount(np.concatenate([k.ravel() for k in keys]), minlength=VOCAB)
    got = _rows(gather_table(layer), range(VOCAB))
    np.testing.assert_allclose(got, initial - 0.25 * counts[:, None], rtol=1e-6, atol=1e-6)


# ---- errors ----------------------------------------------------------------------------------

def _embedding_graph():
    layer = make_layer()
    out = layer(tf1.constant(np.zeros((1, SLOTS, NNZ), np.int64)))
    grad = tf1.gradients(tf1.reduce_sum(out), [layer.var])[0]
    return layer, grad


def test_unsupported_optimizer_names_the_variable_and_lists_the_supported(world):
    with tf1.Graph().as_default():
        layer, grad = _embedding_graph()
        for optimizer in (tf1.train.ProximalGradientDescentOptimizer(0.1),
                          tf1.train.ProximalAdagradOptimizer(0.1)):
            with sok1x.OptimizerScope([layer.var]), pytest.raises(UnsupportedOptimizerError) as e:
                optimizer.apply_gradients([(grad, layer.var)])
            message = str(e.value)
            assert layer.var.name in message and type(optimizer).__name__ in message
            assert "Supported:" in message and "sok1x.optimizers.Adam" in message
            assert "RMSPropOptimizer" in message and "Ftrl" in message


def test_subclass_of_a_supported_optimizer_is_unsupported(world):
    class MyAdam(keras_v2.Adam):
        pass

    with tf1.Graph().as_default():
        layer, grad = _embedding_graph()
        with sok1x.OptimizerScope([layer.var]), pytest.raises(UnsupportedOptimizerError,
                                                              match="MyAdam"):
            MyAdam(0.1).apply_gradients([(grad, layer.var)])


def _new_keras():
    """TensorFlow's tf.keras.optimizers where they are TF 2.11+'s (else the test skips)."""
    import tensorflow as tf
    if tf.keras.optimizers.Adam is keras_v2.Adam:
        pytest.skip("this TensorFlow's tf.keras.optimizers.Adam is OptimizerV2")
    return tf.keras.optimizers


def test_new_keras_optimizer_without_a_twin_is_unsupported(world):
    new_keras = _new_keras()
    with tf1.Graph().as_default():
        layer, grad = _embedding_graph()
        with sok1x.OptimizerScope([layer.var]), pytest.raises(UnsupportedOptimizerError,
                                                              match="Nadam.*legacy") as raised:
            new_keras.Nadam(0.1).apply_gradients([(grad, layer.var)])
        assert layer.var.name in str(raised.value), str(raised.value)


def test_new_keras_optimizer_in_the_scope_trains_as_its_optimizer_v2_form(world):
    """TF 2.11+ Keras Adam in sok1x.OptimizerScope (SOK's DenseDemo --optimizer adam), against
    the OptimizerV2 Adam of the same math on the reference's plain variable."""
    new_keras = _new_keras()

    def sok1x_side(step, fed):
        return new_keras.Adam(0.05), keras_v2.Adam(0.05)

    def reference_side(step, fed):
        optimizer = keras_v2.Adam(0.05)
        return optimizer, optimizer

    got, want = run_both(world, sok1x_side, reference_side)
    assert_same_training(got, want)


@pytest.mark.parametrize("make", [lambda: tf1.train.AdamOptimizer(0.1),
                                  lambda: keras_v2.SGD(0.1)])
def test_native_optimizer_outside_the_scope_is_an_error(world, make):
    with tf1.Graph().as_default():
        layer, grad = _embedding_graph()
        with pytest.raises(UnsupportedOptimizerError) as e:
            make().apply_gradients([(grad, layer.var)])
        assert layer.var.name in str(e.value) and "OptimizerScope" in str(e.value)


def test_sok1x_adam_refuses_dense_variables(world):
    with tf1.Graph().as_default():
        dense = tf1.Variable([1.0, 2.0], use_resource=True, name="dense_w")
        with pytest.raises(UnsupportedOptimizerError, match="dense_w"):
            sok1x.optimizers.Adam(0.1).apply_gradients([(tf1.constant([1.0, 1.0]), dense)])


def test_dense_gradient_of_an_embedding_variable_is_an_error(world):
    with tf1.Graph().as_default():
        layer, grad = _embedding_graph()
        with sok1x.OptimizerScope([layer.var]), pytest.raises(Sok1xError, match="IndexedSlices"):
            tf1.train.AdamOptimizer(0.1).apply_gradients(
                [(tf1.convert_to_tensor(grad), layer.var)])


@pytest.mark.parametrize("make", [lambda: tf1.train.AdamOptimizer(0.5),
                                  lambda: keras_v2.SGD(0.5)])
def test_dense_only_training_goes_through_tensorflow_untouched(world, make):
    with tf1.Graph().as_default() as graph:
        dense = tf1.Variable([1.0, -2.0], use_resource=True)
        train = make().apply_gradients([(tf1.constant([1.0, -1.0]), dense)])
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train)
            np.testing.assert_allclose(sess.run(dense), [0.5, -1.5], rtol=1e-5)


def test_optimizer_scope_takes_variables_only(world):
    with pytest.raises(TypeError, match="OptimizerScope"):
        sok1x.OptimizerScope(3)
