"""The first-step check of sok1x's TensorFlow kernels (DESIGN D1; on where TensorFlow sees a GPU,
forced here on the CPU kernel with SOK1X_SEAM_CHECK=1): each kernel op's first step hands
kernel_calls.compare_first_step TensorFlow's own host copies of its inputs and outputs, once;
where they equal what the kernel handed over, training goes on in place, bit for bit as without
the check; where a rank finds a difference, it falls back to host staging at once, every other
rank follows at the next op header, each says so once, and the numbers stay the same."""
import os
import warnings

import numpy as np
import pytest
import tf_support
from mpi4py import MPI

import sok1x as sok
from sok1x.engine import kernel_calls
from sok1x.graph_ops import boundary, op_library

tf1 = tf_support.tf1
RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
STEPS = 4

pytestmark = pytest.mark.skipif(not op_library.available(),
                                reason="sok1x's op library cannot be built here")


@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.setenv(boundary.SEAM_ENV, "kernels")
    for key, value in (("fallback", False), ("asked", None), ("said", False)):
        monkeypatch.setitem(kernel_calls._seam, key, value)
    return monkeypatch


def train(checked):
    """STEPS training steps of a v1 layer and a fused v2 lookup (a forward, a backward and
    updates each); returns every step's outputs and the shards after."""
    with tf1.Graph().as_default() as graph:
        os.environ[boundary.CHECK_ENV] = "1" if checked else "0"
        try:
            layer = sok.All2AllDenseEmbedding(64, 4, 2, 1, name="check_v1")
            variables = [sok.Variable(np.full((13, 4), t + 1.0, np.float32)) for t in range(2)]
            keys = tf1.placeholder(tf1.int64, [None, 2, 1])
            ids = [tf1.ragged.placeholder(tf1.int64, 1, []) for _ in range(2)]
            out = layer(keys)
            pooled = sok.lookup_sparse(variables, ids, combiners=["sum", "mean"])
            loss = tf1.reduce_sum(out * out) + tf1.add_n([tf1.reduce_sum(p * p) for p in pooled])
            emb_vars, _ = sok.split_embedding_variable_from_others(tf1.trainable_variables())
            with sok.OptimizerScope(emb_vars):
                train_op = tf1.train.AdagradOptimizer(0.1).minimize(loss)
            exports = [sok.export(v) for v in variables]
        finally:
            os.environ.pop(boundary.CHECK_ENV, None)
        seen = []
        with tf_support.session(graph) as sess:
            sess.run(sok.Init(backend="cpu"))
            sess.run(tf1.global_variables_initializer())
            for step in range(STEPS):
                rng = np.random.default_rng([step, RANK])
                feed = {keys: rng.integers(0, 64 * SIZE, (4, 2, 1))}
                for placeholder in ids:
                    feed[placeholder] = tf1.ragged.constant_value(
                        [list(rng.integers(0, 13, 2)), [], list(rng.integers(0, 13, 3))],
                        dtype=np.int64)
                seen.append(sess.run([out] + pooled + [train_op], feed)[:-1])
            seen.append(sess.run(exports))
    return seen


def assert_same(got, want):
    for step_got, step_want in zip(got, want):
        for a, b in zip(step_got, step_want):
            if isinstance(a, tuple):  # an export: keys and vectors
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y)
            else:
                np.testing.assert_array_equal(a, b)


def test_a_first_step_that_matches_changes_nothing(kernels):
    compared = []
    original = kernel_calls.compare_first_step

    def counting(number, values):
        compared.append(number)
        return original(number, values)

    kernels.setattr(kernel_calls, "compare_first_step", counting)
    want = train(False)
    assert not compared
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train(True)
    assert not [w for w in caught if "first-step check" in str(w.message)]
    assert_same(got, want)
    # each checked op compared once: the layer's and the fused lookup's forward, backward and
    # update (the fused lookup's tables updated by one op or one each)
    assert len(compared) == len(set(compared)) >= 6, compared
    assert not kernel_calls.fallen_back()


def test_a_difference_on_one_rank_makes_every_rank_cross_by_host_staging(kernels):
    want = train(False)
    if RANK == SIZE - 1:  # what the engine keeps of its first step is not what TF holds
        original = kernel_calls._host_copy

        def altered(backend, value):
            copy = original(backend, value)
            if copy.size:
                copy.reshape(-1).view(np.uint8)[0] ^= 1
            return copy
        kernels.setattr(kernel_calls, "_host_copy", altered)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train(True)
    assert_same(got, want)  # host staging from the first step on gives the same numbers
    assert kernel_calls.fallen_back(), "rank %d did not fall back" % RANK
    said = [str(w.message) for w in caught if "first-step check" in str(w.message)]
    assert len(said) == 1, said
    if RANK == SIZE - 1:
        assert "this rank found" in said[0] and "holds other bytes" in said[0]
    else:
        assert "rank(s) %d found a difference" % (SIZE - 1) in said[0]
    assert "host staging, on every rank" in said[0]
