"""DeepRec's tf.get_embedding_variable (sok1x.deeprec.get_embedding_variable, DESIGN D12):
EmbeddingVariables keyed by arbitrary int64 keys, looked up together by
group_embedding_lookup_sparse under the "collective" strategy and trained by a native optimizer
(no OptimizerScope), against tf.nn.embedding_lookup_sparse on a plain tf.Variable holding the
same rows (one row per key) trained by the same optimizer on the whole batch in this process:
per step the lookups, and at the end every key's row. Options sok1x does not honour are refused
on every rank, naming the variable and the option, before anything is made."""
import numpy as np
import pytest
from tf_support import embedding_lookup_sparse, session, tf1

import sok1x
from sok1x.deeprec import (CounterFilter, EmbeddingVariableOption, GlobalStepEvict,
                           InitializerOption, StorageOption, get_embedding_variable)

GLOBAL_BATCH, STEPS = 8, 4
# Keys as DeepRec's programs make them (hashes): far beyond any vocabulary, int64.
KEYS = np.array([7, 12, 4096, 123456789, 2 ** 33 + 1, 98765432109876, 2 ** 62 + 5,
                 2 ** 63 - 2, 31337, 555], np.int64)
OPTIMIZERS = {
    "adagrad": lambda: tf1.train.AdagradOptimizer(0.3),
    "sgd": lambda: tf1.train.GradientDescentOptimizer(0.2),
    "adam": lambda: tf1.train.AdamOptimizer(0.1),
}


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.enable_distributed_strategy("collective", backend="cpu")


def batch(seed, max_ids):
    """(indices, positions into KEYS) of a [GLOBAL_BATCH, max_ids] sparse batch: with max_ids
    above 1 a repeated key in a row and an empty row, the last row not empty; with max_ids 1 a
    key in every row. KEYS[-2:] never appear."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, max_ids + 1, size=GLOBAL_BATCH)
    if max_ids > 1:
        counts[GLOBAL_BATCH // 2 - 1] = 0
    indices = np.array([[r, c] for r in range(GLOBAL_BATCH) for c in range(counts[r])], np.int64)
    positions = rng.integers(0, len(KEYS) - 2, size=len(indices))
    positions[1] = positions[0]
    return indices, positions


def local_sparse(indices, positions, rank, size, max_ids):
    """This rank's rows of the batch as a SparseTensor of keys."""
    per = GLOBAL_BATCH // size
    mine = (indices[:, 0] >= rank * per) & (indices[:, 0] < (rank + 1) * per)
    return tf1.SparseTensor(indices[mine] - [rank * per, 0], KEYS[positions[mine]],
                            [per, max_ids])


def reference(optimizer, initial, batches, combiners, coefficients):
    """Per step the whole batch's lookups (before that step's update) and the rows after the
    last, by tf.nn.embedding_lookup_sparse over tf.Variables [len(KEYS), dim] in one process."""
    with tf1.Graph().as_default() as graph:
        tables = [tf1.Variable(rows) for rows in initial]
        outs = [embedding_lookup_sparse(table, tf1.SparseTensor(
                    indices, positions.astype(np.int64), [GLOBAL_BATCH, max_ids]), None, combiner)
                for table, (indices, positions, max_ids), combiner in
                zip(tables, batches, combiners)]
        loss = tf1.add_n([tf1.reduce_sum(o * c) for o, c in zip(outs, coefficients)])
        train = OPTIMIZERS[optimizer]().minimize(loss)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            steps = []
            for _ in range(STEPS):
                steps.append(sess.run(outs))
                sess.run(train)
            return steps, sess.run(tables)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_embedding_variables_train_as_tf_on_a_plain_variable(world, optimizer):
    rank, size = world
    per = GLOBAL_BATCH // size
    dims, combiners = (4, 8), ("sum", "mean")
    batches = [batch(3, 3) + (3,), batch(4, 1) + (1,)]
    coefficients = [np.random.default_rng(9 + t).normal(size=(GLOBAL_BATCH, d)).astype(np.float32)
                    for t, d in enumerate(dims)]
    with tf1.Graph().as_default() as graph:
        first = get_embedding_variable("ev_first", embedding_dim=4,
                                       initializer=tf1.ones_initializer())
        # DeepRec: the InitializerOption's initializer wins over the argument
        second = get_embedding_variable(
            "ev_second", 8, key_dtype=tf1.int64, initializer=tf1.ones_initializer(),
            ev_option=EmbeddingVariableOption(
                init_option=InitializerOption(initializer=tf1.constant_initializer(0.5))))
        assert first.target_gpu == -1 and second.target_gpu == -1
        ids_first = local_sparse(batches[0][0], batches[0][1], rank, size, 3)
        one_per_row = KEYS[batches[1][1]][rank * per:(rank + 1) * per]  # the port's ragged ids
        ids_second = tf1.RaggedTensor.from_row_lengths(
            values=tf1.constant(one_per_row), row_lengths=tf1.ones_like(one_per_row))
        outs = sok1x.group_embedding_lookup_sparse([first, second], [ids_first, ids_second],
                                                   list(combiners))
        local = [c[rank * per:(rank + 1) * per] for c in coefficients]
        loss = tf1.add_n([tf1.reduce_sum(o * c) for o, c in zip(outs, local)])
        train = OPTIMIZERS[optimizer]().minimize(loss)
        every_key = tf1.SparseTensor(np.stack([np.arange(len(KEYS)), np.zeros(len(KEYS))], 1)
                                     .astype(np.int64), KEYS, [len(KEYS), 1])
        probe = sok1x.group_embedding_lookup_sparse([first, second], [every_key, every_key],
                                                    ["sum", "sum"])
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got_steps = []
            for _ in range(STEPS):
                got_steps.append(sess.run(outs))
                sess.run(train)
            got_rows = sess.run(probe)
    initial = [np.ones((len(KEYS), 4), np.float32), np.full((len(KEYS), 8), 0.5, np.float32)]
    want_steps, want_rows = reference(optimizer, initial, batches, combiners, coefficients)
    for step, (got, want) in enumerate(zip(got_steps, want_steps)):
        for table, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g, w[rank * per:(rank + 1) * per], rtol=1e-5, atol=1e-6,
                                       err_msg="%s, step %d, table %d" % (optimizer, step, table))
    for table, (g, w) in enumerate(zip(got_rows, want_rows)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6,
                                   err_msg="%s, trained rows of table %d" % (optimizer, table))


REFUSED = [
    (dict(partitioner=lambda shape, dtype: [1, 1]), "partitioner"),
    (dict(regularizer=lambda x: x), "regularizer"),
    (dict(steps_to_live=100), "steps_to_live"),
    (dict(ev_option=EmbeddingVariableOption(filter_option=CounterFilter(filter_freq=3))),
     r"ev_option.filter_option \(CounterFilter\)"),
    (dict(ev_option=EmbeddingVariableOption(evict_option=GlobalStepEvict(steps_to_live=9))),
     r"ev_option.evict_option \(GlobalStepEvict\)"),
    (dict(ev_option=EmbeddingVariableOption(storage_option=StorageOption(storage_type=3))),
     "ev_option.storage_option.storage_type"),
    (dict(ev_option="dram"), "expected a tf.EmbeddingVariableOption"),
    (dict(key_dtype=tf1.string), "key_dtype must be tf.int64 or tf.int32"),
    (dict(value_dtype=tf1.float64), "value_dtype must be float32"),
    (dict(embedding_dim=0), "embedding_dim must be a positive int"),
]


@pytest.mark.parametrize("kwargs,what", REFUSED, ids=[w.split()[0].strip("\\(")
                                                      for _, w in REFUSED])
def test_unsupported_options_are_refused_naming_the_variable(kwargs, what):
    arguments = dict(dict(embedding_dim=4), **kwargs)
    with tf1.Graph().as_default() as graph:
        with pytest.raises(ValueError, match=r"get_embedding_variable\('ev_refused'\).*" + what):
            get_embedding_variable("ev_refused", **arguments)
        assert not tf1.global_variables() and not graph.get_operations()  # nothing made
        get_embedding_variable("ev_refused", 4)  # the name is still free
        with pytest.raises(ValueError, match="'ev_refused'.*already exists"):
            get_embedding_variable("ev_refused", 4)


def test_variable_scopes_name_embedding_variables_and_reuse_gives_them_back():
    """As tf.get_variable in DeepRec: one name under two scopes makes two variables; a scope
    with reuse=True or AUTO_REUSE gives the one made back; reuse=True of a name never made,
    and the same name again without reuse, are refused naming it."""
    with tf1.Graph().as_default():
        with tf1.variable_scope("tower_a"):
            a = get_embedding_variable("ev_scoped", 4)
        with tf1.variable_scope("tower_b"):
            b = get_embedding_variable("ev_scoped", 4)
        assert a is not b
        with tf1.variable_scope("tower_a", reuse=True):
            assert get_embedding_variable("ev_scoped", 4) is a
            with pytest.raises(ValueError, match="tower_a/ev_never_made.*reuse=True"):
                get_embedding_variable("ev_never_made", 4)
        with tf1.variable_scope("tower_b", reuse=tf1.AUTO_REUSE):
            assert get_embedding_variable("ev_scoped", 4) is b
        with tf1.variable_scope("tower_a"):
            with pytest.raises(ValueError, match="tower_a/ev_scoped already exists"):
                get_embedding_variable("ev_scoped", 4)
        with pytest.raises(ValueError, match="'ev_dtype'.*value_dtype must be float32"):
            get_embedding_variable("ev_dtype", 4, value_dtype="not a dtype")


def test_a_table_placed_on_one_gpu_is_refused_by_the_group_lookup():
    with tf1.Graph().as_default():
        variable = get_embedding_variable("ev_placed", 4)
        variable.target_gpu = 0  # DeepRec's programs may set it; sok1x spreads every table
        ids = tf1.SparseTensor([[0, 0]], tf1.constant([5], tf1.int64), [1, 1])
        with pytest.raises(ValueError, match=r"params\[0\]: the EmbeddingVariable 'ev_placed' "
                                             r"has target_gpu=0.*localized"):
            sok1x.group_embedding_lookup_sparse([variable], [ids], ["sum"])
