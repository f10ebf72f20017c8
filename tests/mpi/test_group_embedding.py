"""sok1x.group_embedding_lookup_sparse (DeepRec's GroupEmbedding, DESIGN D12) against one
tf.nn.embedding_lookup_sparse per table on the whole batch in this process: forward values and
the tables' gradients, with and without weights, over sok1x layers' variables and plain TF
variables sharded by sok1x (their rows are the variables' own); bad input fails with a clear
error on every rank."""
import numpy as np
import pytest
from mpi4py import MPI
from tf_support import embedding_lookup_sparse, session, tf1

import sok1x
from sok1x.backend import cpu
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.engine.op_keys import name_key

GLOBAL_BATCH = 8
# (vocabulary, dim, combiner, max ids per row) of each table
TABLES = [(40, 4, "sum", 3), (23, 8, "mean", 2), (9, 2, "mean", 4)]


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.enable_distributed_strategy("collective", backend="cpu")


def initial_rows(table, vocabulary):
    """The initial [vocabulary, dim] rows sok1x draws for `table` (a TableSpec), in NumPy."""
    values = np.zeros((vocabulary, table.dim), np.float32)
    keys = np.arange(vocabulary, dtype=np.int64)
    cpu.init_rows(values, keys, keys, table.init_spec, name_key("table:" + table.name))
    return values


def sparse_batch(seed, vocabulary, max_ids, weighted):
    """(indices, ids, weights) of a [GLOBAL_BATCH, max_ids] batch whose last row is not empty
    (tf.nn.embedding_lookup_sparse drops trailing empty rows) and with some empty rows."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, max_ids + 1, size=GLOBAL_BATCH)
    counts[GLOBAL_BATCH // 2 - 1] = 0
    counts[-1] = max(counts[-1], 1)
    counts[0] = max_ids
    indices = np.array([[r, c] for r in range(GLOBAL_BATCH) for c in range(counts[r])], np.int64)
    ids = rng.integers(0, vocabulary, size=len(indices)).astype(np.int64)
    ids[:2] = ids[0]  # a repeated id in one row
    weights = rng.uniform(0.5, 2.0, size=len(indices)).astype(np.float32) if weighted else None
    return indices, ids, weights


def local_rows(batch, rank, size, max_ids):
    """This rank's rows of a global sparse batch, as a tf.SparseTensor value (and weights)."""
    indices, ids, weights = batch
    per = GLOBAL_BATCH // size
    mine = (indices[:, 0] >= rank * per) & (indices[:, 0] < (rank + 1) * per)
    local = indices[mine] - [rank * per, 0]
    shape = [per, max_ids]
    sp_ids = tf1.SparseTensor(local, ids[mine], shape)
    sp_weights = None if weights is None else tf1.SparseTensor(local, weights[mine], shape)
    return sp_ids, sp_weights


def reference(initial, batches, coefficients, shapes=TABLES):
    """Per table the whole batch's lookup and the gradient of sum(out * coefficient) with
    respect to the table, by tf.nn.embedding_lookup_sparse in one process. shapes: per table
    (vocabulary, dim, combiner, max ids per row)."""
    with tf1.Graph().as_default() as graph:
        tables = [tf1.Variable(rows) for rows in initial]
        outs = []
        for table, (indices, ids, weights), (_, _, combiner, max_ids) in zip(
                tables, batches, shapes):
            shape = [GLOBAL_BATCH, max_ids]
            sp_weights = None if weights is None else tf1.SparseTensor(indices, weights, shape)
            outs.append(embedding_lookup_sparse(
                table, tf1.SparseTensor(indices, ids, shape), sp_weights, combiner))
        loss = tf1.add_n([tf1.reduce_sum(o * c) for o, c in zip(outs, coefficients)])
        grads = [tf1.convert_to_tensor(g) for g in tf1.gradients(loss, tables)]
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            return sess.run(outs), sess.run(grads)


def dense_gradient(handle, slices_value, vocabulary, size, rank):
    """This job's gradient of one table as a dense [vocabulary, dim] array: the rows of every
    rank's IndexedSlices put at their global ids (row r of rank k holds id r * size + k)."""
    dense = np.zeros((vocabulary, table_of(handle).dim), np.float64)
    ids = np.asarray(slices_value.indices) * size + rank
    np.add.at(dense, ids, slices_value.values)
    return MPI.COMM_WORLD.allreduce(dense)


def run_group_lookup(world, weighted, kinds):
    rank, size = world
    per = GLOBAL_BATCH // size
    batches = [sparse_batch(7 + t, vocab, max_ids, weighted)
               for t, (vocab, _, _, max_ids) in enumerate(TABLES)]
    coefficients = [np.random.default_rng(20 + t).normal(size=(GLOBAL_BATCH, dim))
                    .astype(np.float32) for t, (_, dim, _, _) in enumerate(TABLES)]
    with tf1.Graph().as_default() as graph:
        params = []
        for t, ((vocab, dim, _, _), kind) in enumerate(zip(TABLES, kinds)):
            if kind == "tf":
                params.append(tf1.get_variable(
                    "plain%d" % t, [vocab, dim],
                    initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=t)))
            else:
                layer = sok1x.DistributedEmbedding(
                    "sum", -(-vocab // size), dim, 1, 4, use_hashtable=False,
                    embedding_initializer=tf1.random_normal_initializer(stddev=0.3, seed=t),
                    name="layer%d" % t)
                params.append(layer.var)
        parts = [local_rows(b, rank, size, max_ids) for b, (_, _, _, max_ids) in
                 zip(batches, TABLES)]
        outs = sok1x.group_embedding_lookup_sparse(
            params, [p[0] for p in parts], [c for _, _, c, _ in TABLES],
            sp_weights=[p[1] for p in parts] if weighted else None)
        handles = [p if table_of(p) is not None else sok1x.deeprec.group_embedding.handle_of(p)
                   for p in params]
        local_coefficients = [c[rank * per:(rank + 1) * per] for c in coefficients]
        loss = tf1.add_n([tf1.reduce_sum(o * c) for o, c in zip(outs, local_coefficients)])
        grads = tf1.gradients(loss, handles)
        assert all(isinstance(g, tf1.IndexedSlices) for g in grads)
        assert all(tf1.gradients(loss, [p])[0] is None for p in params if table_of(p) is None)
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            # a plain variable's table holds the variable's own rows
            own_rows = {t: sess.run(p) for t, p in enumerate(params) if table_of(p) is None}
            got_outs, got_grads = sess.run([outs, grads])
    initial = [own_rows[t] if t in own_rows else initial_rows(table_of(h), vocab)
               for t, (h, (vocab, _, _, _)) in enumerate(zip(handles, TABLES))]
    want_outs, want_grads = reference(initial, batches, coefficients)
    for got, want in zip(got_outs, want_outs):
        np.testing.assert_allclose(got, want[rank * per:(rank + 1) * per], rtol=1e-5, atol=1e-6)
    for handle, got, want, (vocab, _, _, _) in zip(handles, got_grads, want_grads, TABLES):
        np.testing.assert_allclose(dense_gradient(handle, got, vocab, size, rank), want,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_group_lookup_of_plain_variables_matches_tf(world, weighted):
    run_group_lookup(world, weighted, ["tf", "tf", "tf"])


def test_group_lookup_of_sok1x_and_plain_variables_matches_tf(world):
    run_group_lookup(world, True, ["sok1x", "tf", "sok1x"])


def test_ragged_ids_single_values_and_deeprecs_later_argument_order(world):
    rank, size = world
    with tf1.Graph().as_default() as graph:
        table = tf1.get_variable("ragged_table", [10, 3], initializer=tf1.ones_initializer())
        ragged = tf1.RaggedTensor.from_row_splits(tf1.constant([rank, 2, 3], tf1.int64),
                                                 [0, 2, 2, 3])
        weights = tf1.RaggedTensor.from_row_splits(tf1.constant([1.0, 2.0, 4.0]), [0, 2, 2, 3])
        out, = sok1x.group_embedding_lookup_sparse(table, ragged, "sum")
        weighted, = sok1x.group_embedding_lookup_sparse([table], [ragged], ["sum"], [weights])
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got, got_weighted = sess.run([out, weighted])
    np.testing.assert_allclose(got, [[2.0] * 3, [0.0] * 3, [1.0] * 3])
    np.testing.assert_allclose(got_weighted, [[3.0] * 3, [0.0] * 3, [4.0] * 3])


def test_plain_variable_trains_with_a_native_optimizer_without_optimizer_scope(world):
    rank, size = world
    with tf1.Graph().as_default() as graph:
        table = tf1.get_variable("table", [6, 2], initializer=tf1.zeros_initializer())
        ids = tf1.SparseTensor([[0, 0]], tf1.constant([rank % 6], tf1.int64), [1, 1])
        out, = sok1x.group_embedding_lookup_sparse([table], [ids], ["sum"])
        train = tf1.train.GradientDescentOptimizer(0.5).minimize(-tf1.reduce_sum(out))
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train)
            after = sess.run(out)
    # every rank's id got +0.5 per rank that looked it up
    np.testing.assert_allclose(after, np.full((1, 2), 0.5 * len(range(rank % 6, size, 6))))


def test_bad_arguments_fail_on_every_rank_with_clear_errors():
    with tf1.Graph().as_default():
        table = tf1.get_variable("t", [6, 2], initializer=tf1.ones_initializer())
        ids = tf1.SparseTensor([[0, 0]], tf1.constant([1], tf1.int64), [1, 1])
        with pytest.raises(ValueError, match="partition_strategy='div' is not supported"):
            sok1x.group_embedding_lookup_sparse([table], [ids], ["sum"], "div")
        with pytest.raises(ValueError, match="one entry per table.*'combiners': 2"):
            sok1x.group_embedding_lookup_sparse([table], [ids], ["sum", "mean"])
        with pytest.raises(ValueError, match="combiner 'sqrtn' is not supported; DeepRec"):
            sok1x.group_embedding_lookup_sparse([table], [ids], ["sqrtn"])
        with pytest.raises(TypeError, match=r"sp_ids\[0\]: ids must be a tf.SparseTensor or "):
            sok1x.group_embedding_lookup_sparse([table], [tf1.constant([[1]])], ["sum"])
        with pytest.raises(ValueError, match="'params': 1, 'sp_ids': 2"):
            sok1x.group_embedding_lookup_sparse(table, [ids, ids], "sum")
    with pytest.raises(ValueError, match="sok1x supports 'collective' and 'localized'"):
        sok1x.enable_distributed_strategy(strategy="parameter_server")


def test_an_id_outside_the_table_fails_the_step_on_every_rank(world):
    rank, size = world
    with tf1.Graph().as_default() as graph:
        table = tf1.get_variable("small", [4 * size, 2], initializer=tf1.ones_initializer())
        bad = 4 * size * 10 if rank == size - 1 else 1
        ids = tf1.SparseTensor([[0, 0]], tf1.constant([bad], tf1.int64), [1, 1])
        out, = sok1x.group_embedding_lookup_sparse([table], [ids], ["mean"])
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            with pytest.raises(tf1.errors.OpError, match="rank %d" % (size - 1)):
                sess.run(out)


def test_group_lookup_of_sok1x_v2_variables(world):
    """sok1x.Variable and sok1x.DynamicVariable (branch v2) in one group lookup with a plain
    variable: values as tf.nn.embedding_lookup_sparse, the Variable's gradient as TF's."""
    pytest.importorskip("sok1x.v2.variables")
    rank, size = world
    per = GLOBAL_BATCH // size
    initial = np.random.default_rng(3).normal(size=(40, 4)).astype(np.float32)
    batches = [sparse_batch(30 + t, vocab, max_ids, True)
               for t, (vocab, _, _, max_ids) in enumerate(TABLES[:2])]
    batches.append(sparse_batch(40, 1000, 3, False))
    coefficients = [np.random.default_rng(50 + t).normal(size=(GLOBAL_BATCH, dim))
                    .astype(np.float32) for t, dim in enumerate([4, 8, 8])]
    with tf1.Graph().as_default() as graph:
        dense = sok1x.Variable(initial, name="v2_dense")
        plain = tf1.get_variable("v2_plain", [23, 8], initializer=tf1.ones_initializer())
        dynamic = sok1x.DynamicVariable(8, initializer="ones", name="v2_dynamic")
        parts = [local_rows(b, rank, size, m) for b, m in zip(batches, [3, 2, 3])]
        outs = sok1x.group_embedding_lookup_sparse(
            [dense, plain, dynamic], [p[0] for p in parts], ["sum", "mean", "mean"],
            sp_weights=[parts[0][1], parts[1][1], None])
        loss = tf1.add_n([tf1.reduce_sum(o * c[rank * per:(rank + 1) * per])
                          for o, c in zip(outs, coefficients)])
        grad = tf1.gradients(loss, [dense])[0]
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            got_outs, got_grad = sess.run([outs, grad])
    want_outs, want_grads = reference(
        [initial, np.ones((23, 8), np.float32), np.ones((1000, 8), np.float32)], batches,
        coefficients, [(40, 4, "sum", 3), (23, 8, "mean", 2), (1000, 8, "mean", 3)])
    for got, want in zip(got_outs, want_outs):
        np.testing.assert_allclose(got, want[rank * per:(rank + 1) * per], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dense_gradient(dense, got_grad, 40, size, rank), want_grads[0],
                               rtol=1e-5, atol=1e-5)
