"""sok1x.group_embedding_column_scope (DeepRec's, DESIGN D12): a wide-and-deep program built
from feature columns trains in a MonitoredTrainingSession with its embedding columns in two
scopes, and its losses equal the same program on stock TensorFlow (no scope) in one process on
the whole batch. Columns outside a scope stay TensorFlow's."""
import numpy as np
import pytest
from mpi4py import MPI
from tf_support import ENGINE_OP_TYPES, session, tf1

import sok1x
from sok1x.backend import cpu
from sok1x.engine.op_keys import name_key
from sok1x.common.initializers import spec_from_initializer

GLOBAL_BATCH = 16
STEPS = 6  # two batches, alternating
CITIES = ["paris", "rome", "oslo", "lima", "kiev"]
fc = tf1.feature_column


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.enable_distributed_strategy("collective", backend="cpu")


def step_batch(step):
    """One global batch: user ids, items (strings, 0-3 per sample), cities (some unknown, so
    dropped), tags (ids, 0-3 per sample) with weights, prices, labels."""
    rng = np.random.default_rng(100 + step)
    items = [["item%d" % rng.integers(0, 50) for _ in range(rng.integers(0, 4))]
             for _ in range(GLOBAL_BATCH)]
    tags = [list(rng.integers(0, 25, size=rng.integers(0, 4))) for _ in range(GLOBAL_BATCH)]
    # weights <= 0 are dropped, as safe_embedding_lookup_sparse drops them
    tag_weights = [list(rng.uniform(-0.5, 2.0, size=len(row))) for row in tags]
    return {"user": rng.integers(0, 30, size=(GLOBAL_BATCH, 1)).astype(np.int64),
            "city": rng.choice(CITIES + ["nowhere"], size=(GLOBAL_BATCH, 1)).astype(object),
            "price": rng.uniform(0, 1, size=(GLOBAL_BATCH, 1)).astype(np.float32),
            "item": items, "tag": tags, "tag_weight": tag_weights,
            "label": rng.integers(0, 2, size=(GLOBAL_BATCH, 1)).astype(np.float32)}


def sparse_value(rows, dtype):
    indices = [[r, c] for r, row in enumerate(rows) for c in range(len(row))]
    values = [v for row in rows for v in row]
    width = max([len(row) for row in rows] + [1])
    return tf1.SparseTensorValue(np.array(indices, np.int64).reshape(-1, 2),
                                 np.array(values, dtype), [len(rows), width])


def local_feed(placeholders, batch, rank, size):
    per = GLOBAL_BATCH // size
    part = slice(rank * per, (rank + 1) * per)
    feed = {}
    for key, placeholder in placeholders.items():
        if key == "item":
            feed[placeholder] = sparse_value(batch[key][part], object)
        elif key == "tag":
            feed[placeholder] = sparse_value(batch[key][part], np.int64)
        elif key == "tag_weight":
            feed[placeholder] = sparse_value(batch[key][part], np.float32)
        else:
            feed[placeholder] = batch[key][part]
    return feed


# (scope, column, vocabulary, dim, combiner): the tables of the program
EMBEDDINGS = [("deep", "user", 30, 8, "mean"), ("deep", "item", 20, 4, "sum"),
              ("deep", "city", 5, 6, "mean"), ("deep", "tag", 25, 3, "mean"),
              ("wide", "tag", 25, 1, "sum")]


def initial_rows(scope, column, vocabulary, dim):
    """The rows sok1x draws for the table of the embedding of categorical column `column` (a
    name) with TF's default embedding initializer."""
    spec = spec_from_initializer(tf1.truncated_normal_initializer(stddev=1 / np.sqrt(dim)), "")
    values = np.zeros((vocabulary, dim), np.float32)
    keys = np.arange(vocabulary, dtype=np.int64)
    table_name = "%s/%s_embedding/embedding_weights" % (scope, column)
    cpu.init_rows(values, keys, keys, spec, name_key("table:" + table_name))
    return values


def build_program(grouped, size):
    """The wide-and-deep model. grouped: embedding columns built in sok1x's scopes, else stock
    TensorFlow columns initialised with the rows sok1x draws. Returns (placeholders, loss of
    this process's rows / GLOBAL_BATCH, train op)."""
    placeholders = {
        "user": tf1.placeholder(tf1.int64, [None, 1]),
        "city": tf1.placeholder(tf1.string, [None, 1]),
        "price": tf1.placeholder(tf1.float32, [None, 1]),
        "item": tf1.sparse_placeholder(tf1.string),
        "tag": tf1.sparse_placeholder(tf1.int64),
        "tag_weight": tf1.sparse_placeholder(tf1.float32),
        "label": tf1.placeholder(tf1.float32, [None, 1])}
    categorical = {
        "user": fc.categorical_column_with_identity("user", 30),
        "item": fc.categorical_column_with_hash_bucket("item", 20),
        "city": fc.categorical_column_with_vocabulary_list("city", CITIES),
        "tag": fc.weighted_categorical_column(fc.categorical_column_with_identity("tag", 25),
                                              "tag_weight")}
    columns = {"deep": [], "wide": []}
    for scope, key, vocabulary, dim, combiner in EMBEDDINGS:
        if grouped:
            with sok1x.group_embedding_column_scope(scope):
                column = tf1.feature_column.embedding_column(categorical[key], dim, combiner)
        else:
            initializer = tf1.constant_initializer(
                initial_rows(scope, categorical[key].name, vocabulary, dim))
            column = fc.embedding_column(categorical[key], dim, combiner, initializer)
        columns[scope].append(column)
    features = {k: v for k, v in placeholders.items() if k != "label"}
    deep_in = fc.input_layer(features, columns["deep"] + [fc.numeric_column("price")])
    wide = fc.input_layer(features, columns["wide"])
    rng = np.random.default_rng(5)
    hidden = tf1.layers.dense(deep_in, 8, tf1.nn.relu, kernel_initializer=tf1.constant_initializer(
        rng.normal(0, 0.3, (22, 8))))
    logits = tf1.layers.dense(hidden, 1, kernel_initializer=tf1.constant_initializer(
        rng.normal(0, 0.3, (8, 1)))) + wide
    loss = tf1.reduce_sum(tf1.nn.sigmoid_cross_entropy_with_logits(
        labels=placeholders["label"], logits=logits)) / GLOBAL_BATCH
    global_step = tf1.train.get_or_create_global_step()
    optimizer = tf1.train.AdagradOptimizer(0.5)
    pairs = optimizer.compute_gradients(loss)
    if grouped:
        embedding, _ = sok1x.split_embedding_variable_from_others([v for _, v in pairs])
        assert len(embedding) == len(EMBEDDINGS)
        is_embedding = {id(v) for v in embedding}
        dense = [(g, v) for g, v in pairs if g is not None and id(v) not in is_embedding]
        summed = sok1x.allreduce([g for g, _ in dense], average=False)
        pairs = [(g, v) for g, v in pairs if id(v) in is_embedding] + list(
            zip(summed, [v for _, v in dense]))
    train = optimizer.apply_gradients(pairs, global_step=global_step)
    return placeholders, loss, train


def test_wide_and_deep_from_grouped_columns_trains_as_stock_tensorflow(world):
    rank, size = world
    batches = [step_batch(s % 2) for s in range(STEPS)]
    with tf1.Graph().as_default() as graph:
        placeholders, loss, train = build_program(True, size)
        lookups = [op for op in graph.get_operations() if op.type in ENGINE_OP_TYPES
                   and "lookup" in op.name and "grad" not in op.name]
        assert len(lookups) == 2, [op.name for op in lookups]  # one per scope
        losses = []
        with tf1.train.MonitoredTrainingSession() as sess:
            for batch in batches:
                local_loss, _ = sess.run([loss, train], local_feed(placeholders, batch, rank,
                                                                   size))
                losses.append(MPI.COMM_WORLD.allreduce(float(local_loss)))
    with tf1.Graph().as_default() as graph:
        placeholders, loss, train = build_program(False, 1)
        want = []
        with session(graph) as sess:
            sess.run([tf1.global_variables_initializer(), tf1.tables_initializer()])
            for batch in batches:
                want.append(sess.run([loss, train], local_feed(placeholders, batch, 0, 1))[0])
    assert want[-2] < want[0] and want[-1] < want[1]  # it learns
    np.testing.assert_allclose(losses, want, rtol=1e-4)


def test_columns_outside_a_scope_stay_tensorflow_and_bad_combiners_fail():
    from tensorflow.python.feature_column import feature_column_v2
    original = tf1.feature_column.embedding_column
    ids = fc.categorical_column_with_identity("x", 10)
    with sok1x.group_embedding_column_scope("g"):
        inside = tf1.feature_column.embedding_column(ids, 3)
        shared = tf1.feature_column.shared_embedding_columns(
            [ids, fc.categorical_column_with_identity("y", 10)], 2, combiner="sum")
        with pytest.raises(ValueError, match="combiner 'sqrtn' is not supported; DeepRec"):
            tf1.feature_column.embedding_column(ids, 3, combiner="sqrtn")
    outside = tf1.feature_column.embedding_column(ids, 3)
    assert tf1.feature_column.embedding_column is original
    assert sok1x.deeprec.group_embedding_columns.is_group_column(inside)
    assert [c.name for c in shared] == ["x_shared_embedding", "y_shared_embedding"]
    assert type(outside) is feature_column_v2.EmbeddingColumn


def test_shared_columns_share_one_table_in_one_lookup(world):
    rank, size = world
    a = fc.categorical_column_with_identity("a", 12)
    b = fc.categorical_column_with_identity("b", 12)
    with sok1x.group_embedding_column_scope("shared"):
        columns = tf1.feature_column.shared_embedding_columns(
            [a, b], 3, combiner="sum", initializer=tf1.ones_initializer())
    with tf1.Graph().as_default() as graph:
        features = {"a": tf1.constant([[rank % 12]], tf1.int64),
                    "b": tf1.constant([[rank % 12], [(rank + 1) % 12]], tf1.int64)[:1]}
        out = fc.input_layer(features, columns)
        handles, _ = sok1x.split_embedding_variable_from_others(tf1.trainable_variables())
        assert len(handles) == 1
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            np.testing.assert_allclose(sess.run(out), np.ones((1, 6)))


def test_dense_features_is_refused_and_two_input_layers_share_the_tables():
    ids = fc.categorical_column_with_identity("z", 10)
    with sok1x.group_embedding_column_scope("twice"):
        column = tf1.feature_column.embedding_column(ids, 2)
    with tf1.Graph().as_default():
        features = {"z": tf1.constant([[1], [2]], tf1.int64)}
        fc.input_layer(features, [column])
        fc.input_layer(features, [column])
        handles, _ = sok1x.split_embedding_variable_from_others(tf1.trainable_variables())
        assert len(handles) == 1
        with pytest.raises(NotImplementedError, match="pass it to input_layer"):
            tf1.keras.layers.DenseFeatures([column])(features)
