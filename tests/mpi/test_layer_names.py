"""Layers and variables built with the same name in one graph get tables of their own, named as
TensorFlow names ops (emb, emb_1): training one never moves another, and a layer's table never
depends on another layer's settings. Rank-agnostic: each rank checks the rows its own lookups
return against what the initializer gives the keys (one rank's run is the reference)."""
import numpy as np
import pytest
from tf_support import session, tf1

import sok1x

SLOTS, NNZ, BATCH = 2, 1, 8


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.init(backend="cpu")


def _layer(dim, name, seed):
    return sok1x.All2AllDenseEmbedding(
        64, dim, SLOTS, NNZ, name=name,
        embedding_initializer=tf1.random_uniform_initializer(-1.0, 1.0, seed=seed))


def _keys(world):
    rank, _ = world
    return (np.arange(BATCH * SLOTS * NNZ, dtype=np.int64).reshape(BATCH, SLOTS, NNZ)
            + 16 * rank) % 40


def test_two_layers_with_one_name_get_tables_of_their_own(world):
    with tf1.Graph().as_default() as graph:
        first, second = _layer(4, "emb", 1), _layer(4, "emb", 1)
        assert (first.table_name, second.table_name) == ("emb/EmbeddingVariable",
                                                         "emb_1/EmbeddingVariable")
        keys = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
        out_first, out_second = first(keys), second(keys)
        loss = tf1.reduce_sum(out_first)
        train = sok1x.optimizers.Adam(0.5).apply_gradients(
            zip(tf1.gradients(loss, [first.var]), [first.var]))
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            feed = {keys: _keys(world)}
            before_first, before_second = sess.run([out_first, out_second], feed)
            sess.run(train, feed)
            after_first, after_second = sess.run([out_first, out_second], feed)
    assert np.abs(after_first - before_first).max() > 0.1  # trained
    np.testing.assert_array_equal(after_second, before_second)  # untouched


def test_a_taken_name_with_other_settings_builds_and_runs(world):
    """The second `emb` has another dim and initializer: its table is its own from the start,
    on every rank (with one shared table this failed at run time, on one rank)."""
    with tf1.Graph().as_default() as graph:
        narrow, wide = _layer(4, "emb", 1), _layer(8, "emb", 2)
        keys = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
        outs = [narrow(keys), wide(keys)]
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got_narrow, got_wide = sess.run(outs, {keys: _keys(world)})
    assert got_narrow.shape[-1] == 4 and got_wide.shape[-1] == 8
    alone = _rows_of_a_lone_layer(world, 8, 2, "emb_1")
    np.testing.assert_array_equal(got_wide, alone)  # as if the first layer were not there


def _rows_of_a_lone_layer(world, dim, seed, name):
    """The reference: a layer with the same table name and settings, alone in its graph."""
    with tf1.Graph().as_default() as graph:
        layer = _layer(dim, name, seed)
        keys = tf1.placeholder(tf1.int64, [None, SLOTS, NNZ])
        out = layer(keys)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            return sess.run(out, {keys: _keys(world)})


def test_a_model_built_again_in_another_graph_finds_the_same_names(world):
    names = []
    for _ in range(2):
        with tf1.Graph().as_default():
            names.append([_layer(4, "rebuilt", 1).table_name, _layer(4, "rebuilt", 1).table_name])
    assert names[0] == names[1] == ["rebuilt/EmbeddingVariable", "rebuilt_1/EmbeddingVariable"]


def test_v2_variables_with_one_name_get_tables_of_their_own(world):
    with tf1.Graph().as_default():
        first = sok1x.Variable(np.zeros([16, 4], np.float32), name="table")
        second = sok1x.Variable(np.ones([16, 8], np.float32), name="table")
        assert first.table_name != second.table_name
        assert {first.table_name, second.table_name} == {"table", "table_1"}
