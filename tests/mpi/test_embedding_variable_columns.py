"""DeepRec's EmbeddingVariable feature columns (sok1x.deeprec.categorical_column_with_embedding,
DESIGN D12): embedding columns over them (string and integer ids, a weighted one, a shared pair)
built by sok1x.deeprec's functions, by tf.feature_column's after sok1x.deeprec.install(), or in a
group_embedding_column_scope, trained by the program's own optimizer, against the same program
on stock TensorFlow in one process on the whole batch: embedding_column over
categorical_column_with_hash_bucket (buckets enough for no collision on the data) and
categorical_column_with_identity, its tables starting from the rows the EmbeddingVariables drew.
Per step the losses, at the end every key's row. What sok1x does not honour is refused naming
the column, before anything is made."""
import numpy as np
import pytest
from mpi4py import MPI
from tf_support import ENGINE_OP_TYPES, session, tf1

import sok1x
from sok1x import deeprec

GLOBAL_BATCH, STEPS = 8, 4
ITEMS = ["item%d" % i for i in range(40)]
USERS, TAGS = 30, 20
HASH_BUCKETS = 100003
fc = tf1.feature_column
OPTIMIZERS = {"adagrad": lambda: tf1.train.AdagradOptimizer(0.3),
              "adam": lambda: tf1.train.AdamOptimizer(0.1)}
# (column, dim): the embeddings of the program; "a" and "b" share one table
DIMS = {"item": 4, "user": 3, "a": 2, "b": 2}


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.enable_distributed_strategy("collective", backend="cpu")


def step_batch(step):
    """One global batch: items (strings, 0-3 a sample), a user id with a weight, tags a and b
    (ids, 0-2 a sample), labels."""
    rng = np.random.default_rng(200 + step)

    def ragged(values, most, fewest=0):
        return [list(rng.choice(values, size=rng.integers(fewest, most + 1)))
                for _ in range(GLOBAL_BATCH)]
    return {"item": ragged(ITEMS, 3),
            "user": rng.integers(0, USERS, size=(GLOBAL_BATCH, 1)).astype(np.int64),
            "user_weight": rng.uniform(0.5, 2.0, size=(GLOBAL_BATCH, 1)).astype(np.float32),
            "a": ragged(np.arange(TAGS), 2), "b": ragged(np.arange(TAGS), 2, fewest=1),
            "label": rng.integers(0, 2, size=(GLOBAL_BATCH, 1)).astype(np.float32)}


def _sparse(rows, dtype):
    indices = [[r, c] for r, row in enumerate(rows) for c in range(len(row))]
    width = max([len(row) for row in rows] + [1])
    return tf1.SparseTensorValue(np.array(indices, np.int64).reshape(-1, 2),
                                 np.array([v for row in rows for v in row], dtype),
                                 [len(rows), width])


def _feed(placeholders, batch, rank, size):
    per = GLOBAL_BATCH // size
    part = slice(rank * per, (rank + 1) * per)
    feed = {}
    for key, placeholder in placeholders.items():
        if key == "item":
            feed[placeholder] = _sparse(batch[key][part], object)
        elif key in ("a", "b"):
            feed[placeholder] = _sparse(batch[key][part], np.int64)
        else:
            feed[placeholder] = batch[key][part]
    return feed


def _placeholders():
    return {"item": tf1.sparse_placeholder(tf1.string), "a": tf1.sparse_placeholder(tf1.int64),
            "b": tf1.sparse_placeholder(tf1.int64),
            "user": tf1.placeholder(tf1.int64, [None, 1]),
            "user_weight": tf1.placeholder(tf1.float32, [None, 1]),
            "label": tf1.placeholder(tf1.float32, [None, 1])}


def _embedding_columns(categorical, embedding_column, shared_embedding_columns):
    return [embedding_column(categorical["item"], DIMS["item"], "sum"),
            embedding_column(categorical["user"], DIMS["user"], "mean")] + list(
        shared_embedding_columns([categorical["a"], categorical["b"]], DIMS["a"], "sum"))


def _loss(placeholders, columns):
    """The model's loss on this process's rows (sum / GLOBAL_BATCH): a fixed linear layer over
    input_layer, so only the tables train."""
    features = {k: v for k, v in placeholders.items() if k != "label"}
    net = fc.input_layer(features, columns)
    weights = np.random.default_rng(7).normal(0, 1, (1, sum(DIMS.values()))).astype(np.float32)
    logits = tf1.reduce_sum(net * weights, axis=1, keepdims=True)
    return tf1.reduce_sum(tf1.nn.sigmoid_cross_entropy_with_logits(
        labels=placeholders["label"], logits=logits)) / GLOBAL_BATCH


def _every_key():
    """{column: int64 keys of every id the data can bring}: items hashed as DeepRec hashes them."""
    with tf1.Graph().as_default(), session(tf1.get_default_graph()) as sess:
        items = sess.run(tf1.strings.to_hash_bucket_fast(ITEMS, np.iinfo(np.int64).max))
    return {"item": items, "user": np.arange(USERS), "a": np.arange(TAGS)}


def _probe(tables, keys):
    """{column: rows [len(keys), dim]} of the EmbeddingVariables, one key per row."""
    probes = {}
    for name, table in tables.items():
        ids = tf1.SparseTensor(np.stack([np.arange(len(keys[name])), np.zeros(len(keys[name]))],
                                        1).astype(np.int64), keys[name], [len(keys[name]), 1])
        probes[name] = sok1x.group_embedding_lookup_sparse([table], [ids], ["sum"])[0]
    return probes


def train_with_embedding_variables(world, optimizer, how, batches):
    """(initial rows, losses, trained rows) of the program on EmbeddingVariable columns, built
    `how`: "alone" by sok1x.deeprec's functions, "installed" by tf.feature_column's after
    sok1x.deeprec.install() (as a DeepRec program), "grouped" in a group_embedding_column_scope."""
    rank, size = world
    if how == "installed":
        sok1x.deeprec.install()
    make = fc if how == "installed" else deeprec
    categorical = {"item": make.categorical_column_with_embedding("item"),
                   "user": fc.weighted_categorical_column(
                       make.categorical_column_with_embedding("user", tf1.int64),
                       "user_weight"),
                   "a": make.categorical_column_with_embedding("a", tf1.int64),
                   "b": make.categorical_column_with_embedding("b", tf1.int64, partition_num=4)}
    grouped = how == "grouped"
    with tf1.Graph().as_default() as graph:
        placeholders = _placeholders()
        if grouped:
            with sok1x.group_embedding_column_scope("ev_group"):
                columns = _embedding_columns(categorical, fc.embedding_column,
                                             fc.shared_embedding_columns)
        else:
            columns = _embedding_columns(categorical, make.embedding_column,
                                         make.shared_embedding_columns)
        loss = _loss(placeholders, columns)
        train = OPTIMIZERS[optimizer]().minimize(loss)
        handles, others = sok1x.split_embedding_variable_from_others(tf1.trainable_variables())
        assert not others and len(handles) == 3, tf1.trainable_variables()
        lookups = [op for op in graph.get_operations() if op.type in ENGINE_OP_TYPES
                   and "lookup" in op.name and "grad" not in op.name]
        assert len(lookups) == (1 if grouped else 4), [op.name for op in lookups]  # one a column
        by_column = {name: next(h for h in handles if ("%s_" % name) in h.name)
                     for name in ("item", "user", "a")}
        probes = _probe(by_column, _every_key())
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            initial = sess.run(probes)
            losses = []
            for batch in batches:
                local, _ = sess.run([loss, train], _feed(placeholders, batch, rank, size))
                losses.append(MPI.COMM_WORLD.allreduce(float(local)))
            return initial, losses, sess.run(probes)


def train_stock_tensorflow(optimizer, initial, batches):
    """(losses, trained rows) of the same program on stock columns, whole batch, this process."""
    keys = _every_key()
    buckets = {}
    with tf1.Graph().as_default(), session(tf1.get_default_graph()) as sess:
        buckets["item"] = sess.run(tf1.strings.to_hash_bucket_fast(ITEMS, HASH_BUCKETS))
    assert len(set(buckets["item"])) == len(ITEMS), "hash buckets collide on the test data"
    buckets["user"], buckets["a"] = keys["user"], keys["a"]
    sizes = {"item": HASH_BUCKETS, "user": USERS, "a": TAGS}
    start = {}
    for name in sizes:
        rows = np.zeros((sizes[name], DIMS[name]), np.float32)
        rows[buckets[name]] = initial[name]
        start[name] = tf1.constant_initializer(rows)
    categorical = {"item": fc.categorical_column_with_hash_bucket("item", HASH_BUCKETS),
                   "user": fc.weighted_categorical_column(
                       fc.categorical_column_with_identity("user", USERS), "user_weight"),
                   "a": fc.categorical_column_with_identity("a", TAGS),
                   "b": fc.categorical_column_with_identity("b", TAGS)}
    with tf1.Graph().as_default() as graph:
        placeholders = _placeholders()
        columns = [fc.embedding_column(categorical["item"], DIMS["item"], "sum", start["item"]),
                   fc.embedding_column(categorical["user"], DIMS["user"], "mean",
                                       start["user"])] + list(fc.shared_embedding_columns(
                                           [categorical["a"], categorical["b"]], DIMS["a"],
                                           "sum", start["a"]))
        loss = _loss(placeholders, columns)
        train = OPTIMIZERS[optimizer]().minimize(loss)
        tables = {name: next(v for v in tf1.trainable_variables()
                             if v.shape.as_list() == [sizes[name], DIMS[name]])
                  for name in sizes}
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            losses = [sess.run([loss, train], _feed(placeholders, b, 0, 1))[0] for b in batches]
            trained = sess.run(tables)
    return losses, {name: trained[name][buckets[name]] for name in sizes}


@pytest.mark.parametrize("how", ["alone", "installed", "grouped"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_embedding_variable_columns_train_as_stock_columns(world, optimizer, how):
    batches = [step_batch(s % 2) for s in range(STEPS)]
    initial, losses, trained = train_with_embedding_variables(world, optimizer, how, batches)
    for name, rows in initial.items():
        assert np.unique(rows, axis=0).shape[0] == rows.shape[0], name  # rows of their own
    want_losses, want_rows = train_stock_tensorflow(optimizer, initial, batches)
    assert want_losses[-2] < want_losses[0]  # it learns
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for name in trained:
        np.testing.assert_allclose(trained[name], want_rows[name], rtol=1e-5, atol=1e-6,
                                   err_msg="%s: %s's rows" % (optimizer, name))


REFUSED = [
    (dict(ev_option=deeprec.EmbeddingVariableOption(
        filter_option=deeprec.CounterFilter(filter_freq=3))),
     r"ev_option.filter_option \(CounterFilter\)"),
    (dict(ev_option=deeprec.EmbeddingVariableOption(
        evict_option=deeprec.GlobalStepEvict(steps_to_live=9))),
     r"ev_option.evict_option \(GlobalStepEvict\)"),
    (dict(ev_option=deeprec.EmbeddingVariableOption(ckpt="x")), "ev_option.ckpt"),
    (dict(ev_option=deeprec.EmbeddingVariableOption(
        storage_option=deeprec.StorageOption(storage_type=3))),
     "ev_option.storage_option.storage_type"),
    (dict(ev_option="dram"), "expected a tf.EmbeddingVariableOption"),
    (dict(dtype=tf1.float32), "dtype must be tf.string or an integer dtype"),
    (dict(partition_num=0), "partition_num must be None or a positive int"),
]


@pytest.mark.parametrize("kwargs,what", REFUSED,
                         ids=[w.split()[0].strip("\\(") for _, w in REFUSED])
def test_options_sok1x_does_not_honour_are_refused_naming_the_column(kwargs, what):
    with tf1.Graph().as_default() as graph:
        with pytest.raises(ValueError,
                           match=r"categorical_column_with_embedding\('ev_refused'\).*" + what):
            deeprec.categorical_column_with_embedding("ev_refused", **kwargs)
        assert not graph.get_operations()


def test_embedding_columns_over_it_refuse_what_sok1x_does_not_do():
    ids = deeprec.categorical_column_with_embedding("ev_ids", tf1.int64)
    with pytest.raises(ValueError, match="ev_ids_embedding.*combiner 'sqrtn' is not supported"):
        deeprec.embedding_column(ids, 3, combiner="sqrtn")
    with pytest.raises(ValueError, match="ev_ids_embedding: max_norm is not supported"):
        deeprec.embedding_column(ids, 3, max_norm=1.0)
    with pytest.raises(ValueError, match="mix categorical_column_with_embedding columns"):
        deeprec.shared_embedding_columns([ids, fc.categorical_column_with_identity("x", 5)], 2)
    with sok1x.group_embedding_column_scope("mixed"), pytest.raises(
            ValueError, match="mix categorical_column_with_embedding columns"):
        fc.shared_embedding_columns([ids, fc.categorical_column_with_identity("x", 5)], 2)
    with tf1.Graph().as_default():
        features = {"ev_ids": tf1.constant([[1], [2]], tf1.int64)}
        column = deeprec.embedding_column(ids, 2)
        with pytest.raises(NotImplementedError, match="pass it to input_layer"):
            tf1.keras.layers.DenseFeatures([column])(features)
        # TensorFlow's own embedding_column (tf.feature_column's where install() was not called)
        from tensorflow.python.feature_column import feature_column_v2
        with pytest.raises(ValueError, match="has no bucket count.*sok1x.deeprec.install"):
            fc.input_layer(features, [feature_column_v2.embedding_column(ids, 2)])
        with pytest.raises(ValueError, match="the feature is int64, the column's dtype string"):
            fc.input_layer(features, [deeprec.embedding_column(
                deeprec.categorical_column_with_embedding("ev_ids"), 2)])
    # other columns stay TensorFlow's
    plain = deeprec.embedding_column(fc.categorical_column_with_identity("x", 5), 2)
    assert type(plain) is feature_column_v2.EmbeddingColumn
