"""Bad input on any one rank fails the step on every rank, names what was wrong, and changes no
table (DESIGN D7)."""
import numpy as np
import pytest
from tf_support import session, tf1

import sok1x
from sok1x.engine import runtime


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.init(backend="cpu")


def shard_size(layer):
    table = runtime.get().tables[layer.var._sok1x_table.name]
    return table.index.size if table.use_hashtable else None


def last_rank_gets(world, good, bad):
    rank, size = world
    return bad if rank == size - 1 else good


def check_step_fails_everywhere(world, layer, fetch, feed, match, good_feed):
    """Runs `fetch` with `feed` (bad on the last rank only): every rank must raise `match`, and
    the shard and a following good step must be as if the bad step never ran."""
    with session(tf1.get_default_graph()) as sess:
        sess.run(tf1.global_variables_initializer())
        before = sess.run(fetch, good_feed)
        size_before = shard_size(layer)
        with pytest.raises(tf1.errors.OpError, match=match) as info:
            sess.run(fetch, feed)
        assert "rank %d" % (world[1] - 1) in str(info.value)
        assert shard_size(layer) == size_before
        np.testing.assert_array_equal(sess.run(fetch, good_feed), before)


def test_negative_key(world):
    rank, size = world
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(16, 4, 1, 2, name="negative_keys")
        keys = tf1.placeholder(tf1.int64, [None, 1, 2])
        out = layer(keys)
        good = np.array([[[rank, 7]]])
        bad = last_rank_gets(world, good, np.array([[[rank, -3]]]))
        check_step_fails_everywhere(world, layer, out, {keys: bad},
                                    "negative_keys/EmbeddingVariable: key -3 .* negative",
                                    {keys: good})


def test_key_beyond_vocabulary_without_hash_table(world):
    rank, size = world
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(8, 4, 1, 1, use_hashtable=False, name="small_vocab")
        keys = tf1.placeholder(tf1.int64, [None, 1, 1])
        out = layer(keys)
        good = np.array([[[rank]]])
        bad = last_rank_gets(world, good, np.array([[[8 * size]]]))
        check_step_fails_everywhere(world, layer, out, {keys: bad},
                                    "small_vocab/EmbeddingVariable: key %d .* beyond "
                                    "max_vocabulary_size_per_gpu" % (8 * size), {keys: good})


def test_full_shard_names_layer_rank_and_capacity(world):
    rank, size = world
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(3, 4, 1, 4, name="tiny_table")
        keys = tf1.placeholder(tf1.int64, [None, 1, 4])
        out = layer(keys)
        good = np.array([[[0, 0, 0, 0]]])  # key 0 lives on rank 0
        # Five new keys owned by the last rank: more than its 3 rows.
        owned_by_last = [(size - 1) + size * i for i in range(1, 6)]
        bad = last_rank_gets(world, good, np.array([[owned_by_last[:4]]]))
        if rank == size - 1:
            bad = np.concatenate([bad, np.array([[owned_by_last[1:5]]])])
        else:
            bad = np.concatenate([bad, bad])
        check_step_fails_everywhere(
            world, layer, out, {keys: bad},
            r"tiny_table/EmbeddingVariable: the shard on rank %d is full: \d rows used of "
            "max_vocabulary_size_per_gpu=3" % (size - 1), {keys: good})


def test_runtime_shape_that_disagrees_with_slot_num(world):
    rank, size = world
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(16, 4, 2, 1, name="two_slots")
        keys = tf1.placeholder(tf1.int64, [None, None, None])
        out = layer(keys)
        good = np.array([[[1], [2]]])
        bad = last_rank_gets(world, good, np.array([[[1], [2], [3]]]))
        check_step_fails_everywhere(world, layer, out, {keys: bad},
                                    r"two_slots/EmbeddingVariable: keys must have shape "
                                    r"\[batch, slot_num=2", {keys: good})


def test_sparse_dense_shape_that_disagrees_with_slot_num(world):
    rank, size = world
    with tf1.Graph().as_default():
        layer = sok1x.DistributedEmbedding("sum", 16, 4, slot_num=2, max_nnz=3, name="sparse_two")
        indices = tf1.placeholder(tf1.int64, [None, 2])
        values = tf1.placeholder(tf1.int64, [None])
        shape = tf1.placeholder(tf1.int64, [2])
        out = layer(tf1.SparseTensor(indices, values, shape))
        good = {indices: [[0, 0], [1, 2]], values: [rank, 5], shape: [2, 3]}
        bad = dict(good)
        bad[shape] = last_rank_gets(world, [2, 3], [3, 3])
        check_step_fails_everywhere(world, layer, out, bad,
                                    "sparse_two/EmbeddingVariable: dense_shape.0.=3 is not a "
                                    "multiple of slot_num=2", good)


def test_graph_time_errors_name_the_layer(world):
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(16, 4, 2, 1, name="typed")
        with pytest.raises(ValueError, match="typed: keys must be int64, int32 or uint32"):
            layer(tf1.constant([[[1.0], [2.0]]]))
        with pytest.raises(ValueError, match=r"typed: keys must have shape \[batch, 2, 1\]"):
            layer(tf1.constant([[1, 2]], dtype=tf1.int64))
        with pytest.raises(ValueError, match="combiner must be 'sum' or 'mean'"):
            sok1x.DistributedEmbedding("max", 16, 4, 2, 3)
        with pytest.raises(ValueError, match="embedding_vec_size must be a positive integer"):
            sok1x.All2AllDenseEmbedding(16, 0, 2, 1)
        with pytest.raises(ValueError, match="not supported"):
            sok1x.All2AllDenseEmbedding(16, 4, 2, 1, embedding_initializer="glorot_uniform")


def test_a_shard_that_cannot_be_made_fails_the_step_on_every_rank(world):
    from sok1x.backend.random_init import DEFAULT_SPEC
    from sok1x.engine import api
    rank, size = world
    # The last rank asks for far more rows than memory holds (512 TiB); the others for few.
    capacity = 2 ** 45 if rank == size - 1 else 16
    api.create_table("too_big_somewhere", 4, capacity, True, DEFAULT_SPEC, replace=True)
    for _ in range(2):  # and again: the ranks stay in step
        with pytest.raises(sok1x.errors.DeviceMemoryError,
                           match="rank %d: too_big_somewhere: no memory for a shard" % (size - 1)):
            api.dense_lookup("too_big_somewhere", "lookup", np.array([[[rank]]]), True, (1, 1))
    assert "too_big_somewhere" not in runtime.get().tables or rank != size - 1
