"""A plain tf.Variable passed to a group lookup is its own values (DESIGN D12), against stock
TensorFlow on the same variables: the rows looked up are the variable's own (array, constant,
seeded random, tf.train.init_from_checkpoint), training then sok1x.sync_to_variables() or a
Saver save leave the trained rows in the variable and the checkpoint (what stock TensorFlow's
Adagrad gives on the whole batch), a Saver restore is what the table then holds; DeepRec's
localized strategy looks the variables up with TensorFlow on each rank."""
import os

import numpy as np
import pytest
from tf_support import embedding_lookup_sparse, session, tf1

import sok1x

GLOBAL_BATCH = 8
VOCAB, DIM = 13, 3
STEPS = 3


@pytest.fixture(autouse=True)
def collective():
    sok1x.enable_distributed_strategy("collective", backend="cpu")
    yield
    sok1x.enable_distributed_strategy("collective")


def global_ids(seed):
    """(indices, ids) of a [GLOBAL_BATCH, 3] batch, equal on every rank, the last row not
    empty (tf.nn.embedding_lookup_sparse drops trailing empty rows)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, size=GLOBAL_BATCH)
    counts[-1] = max(counts[-1], 1)
    indices = np.array([[r, c] for r in range(GLOBAL_BATCH) for c in range(counts[r])],
                       np.int64)
    return indices, rng.integers(0, VOCAB, size=len(indices)).astype(np.int64)


def local_ids(batch, rank, size):
    indices, ids = batch
    per = GLOBAL_BATCH // size
    mine = (indices[:, 0] >= rank * per) & (indices[:, 0] < (rank + 1) * per)
    return tf1.SparseTensor(indices[mine] - [rank * per, 0], ids[mine], [per, 3])


def table_variable(kind, name="table", partitions=0):
    """A [VOCAB, DIM] tf.Variable, or a PartitionedVariable of `partitions` partitions."""
    rows = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) / 10.0 - 1.0
    if partitions:
        def sliced_rows(shape, dtype=None, partition_info=None):
            offset = partition_info.single_offset(shape) if partition_info else 0
            return tf1.constant(rows[offset:offset + shape[0]])
        initializer = {"array": sliced_rows,
                       "seeded_normal": tf1.random_normal_initializer(seed=5)}[kind]
        return tf1.get_variable(name, [VOCAB, DIM], initializer=initializer,
                                partitioner=tf1.fixed_size_partitioner(partitions))
    if kind == "array":
        return tf1.get_variable(name, initializer=rows)
    if kind == "constant":
        return tf1.get_variable(name, [VOCAB, DIM], initializer=tf1.constant_initializer(0.5))
    if kind == "seeded_normal":
        return tf1.get_variable(name, [VOCAB, DIM],
                                initializer=tf1.random_normal_initializer(seed=5))
    return tf1.get_variable(name, [VOCAB, DIM])  # glorot_uniform, seeded by the graph below


@pytest.mark.parametrize("kind", ["array", "constant", "seeded_normal", "glorot_graph_seed",
                                  "array/2_partitions", "seeded_normal/3_partitions"])
def test_rows_looked_up_are_the_variables_own(world, kind):
    """Against tf.nn.embedding_lookup_sparse over the same variable (a partitioned one read in
    its default "mod" order: row k in partition k % n)."""
    rank, size = world
    batch = global_ids(1)
    kind, _, partitions = kind.partition("/")
    with tf1.Graph().as_default() as graph:
        tf1.set_random_seed(11)
        table = table_variable(kind, partitions=int(partitions[:1] or 0))
        ids = local_ids(batch, rank, size)
        out, = sok1x.group_embedding_lookup_sparse([table], [ids], ["sum"])
        stock = tf1.nn.embedding_lookup_sparse(table, ids, None, combiner="sum")
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got, want = sess.run([out, stock])
    np.testing.assert_allclose(got[:want.shape[0]], want, rtol=1e-6, atol=1e-6)


def training_graph(rank, size, batches, use_resource=True, partitions=0):
    """A model on one plain variable (of `partitions` partitions) trained by Adagrad through a
    group lookup; returns (table, train op, feeds of each step)."""
    with tf1.variable_scope("model", use_resource=use_resource):
        table = table_variable("array", "table", partitions)
    coefficient = np.linspace(-1.0, 1.0, GLOBAL_BATCH * DIM, dtype=np.float32).reshape(
        GLOBAL_BATCH, DIM)
    per = GLOBAL_BATCH // size
    ids = tf1.sparse_placeholder(tf1.int64)  # no shape: the usual TF1 feed
    out, = sok1x.group_embedding_lookup_sparse([table], [ids], ["mean"])
    loss = tf1.reduce_sum(out * coefficient[rank * per:(rank + 1) * per])
    train = tf1.train.AdagradOptimizer(0.3).minimize(loss)
    feeds = []
    for indices, values in batches:
        mine = (indices[:, 0] >= rank * per) & (indices[:, 0] < (rank + 1) * per)
        feeds.append({ids: tf1.SparseTensorValue(indices[mine] - [rank * per, 0], values[mine],
                                                 [per, 3])})
    return table, train, feeds


def stock_trained_rows(batches, partitions=0):
    """The rows stock TensorFlow's Adagrad gives the same model on the whole batch (as
    a partitioned table's partitions one after the other, as its as_tensor() gives them)."""
    coefficient = np.linspace(-1.0, 1.0, GLOBAL_BATCH * DIM, dtype=np.float32).reshape(
        GLOBAL_BATCH, DIM)
    with tf1.Graph().as_default() as graph:
        table = table_variable("array", "model/table", partitions)
        ids = tf1.sparse_placeholder(tf1.int64)
        out = tf1.nn.embedding_lookup_sparse(table, ids, None, combiner="mean")
        loss = tf1.reduce_sum(out * tf1.constant(coefficient)[:tf1.shape(out)[0]])
        train = tf1.train.AdagradOptimizer(0.3).minimize(loss)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for indices, values in batches:
                sess.run(train, {ids: tf1.SparseTensorValue(indices, values, [GLOBAL_BATCH, 3])})
            return sess.run(whole(table))


def whole(table):
    """The value of `table` as one tensor (a PartitionedVariable's partitions concatenated)."""
    return tf1.convert_to_tensor(table)


def two_table_model(lookup, partitions):
    """Two plain variables ("array" of `partitions` partitions, "constant") looked up by
    lookup(tables, ids) -> [pooled], sum and mean, trained by Adagrad on their squares.
    Returns (tables, ids placeholder, train op, plain TF lookups over the tables)."""
    tables = [table_variable("array", "first", partitions), table_variable("constant", "second")]
    ids = tf1.sparse_placeholder(tf1.int64)
    pooled = lookup(tables, ids)
    loss = tf1.add_n([tf1.reduce_sum(out * out) for out in pooled])
    train = tf1.train.AdagradOptimizer(0.3).minimize(loss)
    plain = [tf1.nn.embedding_lookup_sparse(table, ids, None, combiner="sum")
             for table in tables]
    return tables, ids, train, plain


def _trained(lookup, partitions, batches):
    """(each table's rows, its plain lookups of the last batch) after training on `batches`."""
    with tf1.Graph().as_default() as graph:
        tables, ids, train, plain = two_table_model(lookup, partitions)
        feeds = [{ids: tf1.SparseTensorValue(indices, values, [GLOBAL_BATCH, 3])}
                 for indices, values in batches]
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for feed in feeds:
                sess.run(train, feed)
            return sess.run([whole(t) for t in tables]), sess.run(plain, feeds[-1])


@pytest.mark.parametrize("partitions", [0, 3], ids=["whole", "3_partitions"])
def test_one_process_sees_the_trained_rows_in_the_variables_and_their_plain_lookups(
        world, partitions):
    """Where one process holds every row (a 1-rank job), sess.run(variable) and a plain
    tf.nn.embedding_lookup_sparse over it see the trained rows after every step, with no sync,
    for tables updated together (one update op of a fused lookup): against stock TensorFlow
    training the same variables."""
    _, size = world
    if size > 1:
        pytest.skip("on several ranks the variables hold the last write-back (a sync or save)")
    batches = [global_ids(30 + step) for step in range(STEPS)]
    want_rows, want_plain = _trained(
        lambda tables, ids: [tf1.nn.embedding_lookup_sparse(table, ids, None, combiner=c)
                             for table, c in zip(tables, ["sum", "mean"])], partitions, batches)
    got_rows, got_plain = _trained(
        lambda tables, ids: sok1x.group_embedding_lookup_sparse(tables, [ids, ids],
                                                                ["sum", "mean"]),
        partitions, batches)
    for got, want in zip(got_rows + got_plain, want_rows + want_plain):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got_rows[1], 0.5)  # trained away from the initial rows


@pytest.mark.parametrize("partitions", [0, 3], ids=["whole", "3_partitions"])
@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
def test_trained_rows_reach_the_variable_and_the_checkpoint_as_stock_tf(world, rank_dir,
                                                                        use_resource, partitions):
    """Every partition of a partitioned variable gets its trained rows back."""
    rank, size = world
    batches = [global_ids(10 + step) for step in range(STEPS)]
    want = stock_trained_rows(batches, partitions)
    prefix = os.path.join(rank_dir, "model.ckpt")
    with tf1.Graph().as_default() as graph:
        table, train, feeds = training_graph(rank, size, batches, use_resource, partitions)
        sync = sok1x.sync_to_variables()
        saver = tf1.train.Saver()
        value = whole(table)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            initial = sess.run(value)
            for feed in feeds:
                sess.run(train, feed)
            if size > 1:  # until a sync or a save: the rows of the last write-back
                np.testing.assert_allclose(sess.run(value), initial)
            else:  # one process holds every row: each update wrote its rows back
                np.testing.assert_allclose(sess.run(value), want, rtol=1e-5, atol=1e-6)
            saver.save(sess, prefix)  # writes the table back first
            np.testing.assert_allclose(sess.run(value), want, rtol=1e-5, atol=1e-6)
            sess.run([part.assign(np.zeros(part.shape, np.float32))
                      for part in (list(table) if partitions else [table])])
            sess.run(sync)
            np.testing.assert_allclose(sess.run(value), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf1.train.load_variable(prefix, "model/table"), want,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("partitions", [0, 3], ids=["whole", "3_partitions"])
def test_a_save_on_rank_0_alone_holds_the_trained_rows(world, rank_dir, partitions):
    """The Horovod idiom: only rank 0 runs saver.save; the other ranks take part in it at their
    next step (engine/checkpoint/join.py), write-back included."""
    rank, size = world
    batches = [global_ids(40 + step) for step in range(STEPS + 1)]
    want = stock_trained_rows(batches[:STEPS], partitions)
    prefix = os.path.join(rank_dir, "model.ckpt")
    with tf1.Graph().as_default() as graph:
        table, train, feeds = training_graph(rank, size, batches, partitions=partitions)
        saver = tf1.train.Saver()
        value = whole(table)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for feed in feeds[:STEPS]:
                sess.run(train, feed)
            if rank == 0:
                saver.save(sess, prefix)
                np.testing.assert_allclose(sess.run(value), want, rtol=1e-5, atol=1e-6)
            sess.run(train, feeds[STEPS])  # where the other ranks meet rank 0's save
    if rank == 0:
        np.testing.assert_allclose(tf1.train.load_variable(prefix, "model/table"), want,
                                   rtol=1e-5, atol=1e-6)


def test_monitored_training_session_checkpoints_hold_the_trained_rows(world, rank_dir):
    """Scaffold's sharded Saver, through MonitoredTrainingSession's checkpoint_dir (every rank
    its own directory), saves the trained rows under the variable's name."""
    rank, size = world
    batches = [global_ids(30 + step) for step in range(STEPS)]
    want = stock_trained_rows(batches)
    directory = rank_dir
    with tf1.Graph().as_default():
        _, train, feeds = training_graph(rank, size, batches)
        step = tf1.train.get_or_create_global_step()
        with tf1.control_dependencies([train]):
            train = tf1.assign_add(step, 1)
        with tf1.train.MonitoredTrainingSession(checkpoint_dir=directory,
                                                save_checkpoint_steps=STEPS) as sess:
            for feed in feeds:
                sess.run(train, feed)
    np.testing.assert_allclose(
        tf1.train.load_variable(tf1.train.latest_checkpoint(directory), "model/table"), want,
        rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("partitions", [0, 2], ids=["whole", "2_partitions"])
def test_a_restore_is_what_the_table_then_holds(world, rank_dir, partitions):
    rank, size = world
    batches = [global_ids(20 + step) for step in range(STEPS)]
    want = stock_trained_rows(batches, partitions)
    if partitions:  # partitions one after the other -> lookup order (row k in partition k % n)
        offsets = np.cumsum([0] + [len(range(p, VOCAB, partitions)) for p in range(partitions)])
        want = want[[offsets[k % partitions] + k // partitions for k in range(VOCAB)]]
    prefix = os.path.join(rank_dir, "model.ckpt")
    probe = global_ids(99)
    with tf1.Graph().as_default() as graph:
        table, train, feeds = training_graph(rank, size, batches, partitions=partitions)
        saver = tf1.train.Saver()
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for feed in feeds:
                sess.run(train, feed)
            saver.save(sess, prefix)
    with tf1.Graph().as_default() as graph:
        table, train, feeds = training_graph(rank, size, batches[:1], partitions=partitions)
        ids = local_ids(probe, rank, size)
        out, = sok1x.group_embedding_lookup_sparse([table], [ids], ["sum"])
        saver = tf1.train.Saver()
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, feeds[0])  # rows that the restore must replace
            saver.restore(sess, prefix)
            got = sess.run(out)
    with tf1.Graph().as_default() as graph:
        stock = tf1.nn.embedding_lookup_sparse(tf1.constant(want), local_ids(probe, rank, size),
                                               None, combiner="sum")
        with session(graph) as sess:
            expected = sess.run(stock)
    np.testing.assert_allclose(got[:expected.shape[0]], expected, rtol=1e-5, atol=1e-6)


def test_init_from_checkpoint_gives_the_table_the_checkpoints_rows(world, rank_dir):
    rank, size = world
    rows = np.random.default_rng(4).normal(size=(VOCAB, DIM)).astype(np.float32)
    prefix = os.path.join(rank_dir, "stock.ckpt")
    with tf1.Graph().as_default() as graph:
        stock_table = tf1.get_variable("pretrained/emb", initializer=rows)
        with session(graph) as sess:
            sess.run(stock_table.initializer)
            tf1.train.Saver([stock_table]).save(sess, prefix)
    batch = global_ids(3)
    with tf1.Graph().as_default() as graph:
        table = tf1.get_variable("model/emb", [VOCAB, DIM])
        ids = local_ids(batch, rank, size)
        out, = sok1x.group_embedding_lookup_sparse([table], [ids], ["mean"])
        tf1.train.init_from_checkpoint(prefix, {"pretrained/": "model/"})
        stock = tf1.nn.embedding_lookup_sparse(tf1.constant(rows), ids, None, combiner="mean")
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got, want = sess.run([out, stock])
    np.testing.assert_allclose(got[:want.shape[0]], want, rtol=1e-6, atol=1e-6)


def test_sync_to_variables_names_variables_without_a_table():
    with tf1.Graph().as_default():
        table = tf1.get_variable("lonely", [4, 2])
        with pytest.raises(ValueError, match="lonely.*never passed to a group lookup"):
            sok1x.sync_to_variables([table])


@pytest.mark.parametrize("partitions", [0, 3], ids=["whole", "3_partitions"])
def test_localized_strategy_looks_variables_up_with_tensorflow_on_each_rank(world, partitions):
    rank, size = world
    sok1x.enable_group_embedding(fusion_type="localized")
    batch = global_ids(5)
    with tf1.Graph().as_default() as graph:
        table = table_variable("seeded_normal", partitions=partitions)
        ids = local_ids(batch, rank, size)
        weights = tf1.SparseTensor(ids.indices, tf1.ones_like(ids.values, tf1.float32) * 2.0,
                                   ids.dense_shape)
        out, = sok1x.group_embedding_lookup_sparse([table], [ids], ["mean"], sp_weights=[weights])
        stock = embedding_lookup_sparse(table, ids, weights, "mean")
        grads = tf1.gradients(tf1.reduce_sum(out), list(table) if partitions else [table])
        assert all(isinstance(grad, tf1.IndexedSlices) for grad in grads)
        assert sok1x.deeprec.group_embedding.handle_of(table) is None
        with sok1x.group_embedding_column_scope("local"):
            column = tf1.feature_column.embedding_column(
                tf1.feature_column.categorical_column_with_identity("c", VOCAB), DIM)
        assert type(column).__name__ == "EmbeddingColumn"  # TensorFlow's own
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got, want = sess.run([out, stock])
    np.testing.assert_allclose(got[:want.shape[0]], want, rtol=1e-6, atol=1e-6)
    assert np.all(got[want.shape[0]:] == 0)


def test_a_table_partitioned_along_its_columns_is_refused():
    with tf1.Graph().as_default():
        table = tf1.get_variable("by_columns", [VOCAB, 4],
                                 partitioner=tf1.fixed_size_partitioner(2, axis=1))
        ids = tf1.SparseTensor([[0, 0]], tf1.constant([1], tf1.int64), [1, 1])
        with pytest.raises(ValueError, match="by_columns.*along their rows only"):
            sok1x.group_embedding_lookup_sparse([table], [ids], ["sum"])
