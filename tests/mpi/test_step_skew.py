"""Ranks in different steps or different ops never pair (DESIGN D3, D7; issue 19 item 2): every
exchange carries the op's id and its tower's call count, so a rank whose step TensorFlow failed
before sok1x ran, a sok1x.dump against a training step, and two towers run in another order on
each rank raise OrderError at once, naming each rank's op and call (a step skipped on some ranks
fails on every rank, and all go on from the same next step); nothing changes, nothing waits
until a timeout."""
import re

import numpy as np
import pytest
import tf_support
from mpi4py import MPI

import sok1x as sok
from sok1x.errors import OrderError

tf1 = tf_support.tf1
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
LAST = SIZE - 1

needs_peers = pytest.mark.skipif(SIZE == 1, reason="needs two ranks to disagree")


def _training_graph(ids_of):
    """A sok1x.Variable looked up by the RaggedTensor ids_of() builds, trained by SGD. Returns
    (graph, train op, export of this rank's shard, the table)."""
    graph = tf1.Graph()
    with graph.as_default():
        table = sok.Variable(np.arange(11 * 2, dtype=np.float32).reshape(11, 2))
        pooled = sok.lookup_sparse(table, ids_of(), combiners="sum")
        grads = tf1.gradients(tf1.reduce_sum(pooled), [table])
        train = sok.OptimizerWrapper(tf1.train.GradientDescentOptimizer(0.5)).apply_gradients(
            zip(grads, [table]))
        export = sok.export(table)
    return graph, train, export, table


def _assert_order_error(error, *names):
    """The error is sok1x's OrderError naming every rank, each with its op and call."""
    text = str(error)
    assert OrderError.__name__ in text or isinstance(error, OrderError), text
    assert "different sok1x collectives" in text, text
    for rank in range(SIZE):
        assert "rank %d: " % rank in text, text
    for name in names:
        assert name in text, text
    return [int(call) for call in re.findall(r"\(call (\d+) of its tower\)", text)]


def _same_shards(before, after):
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b, a)


@needs_peers
def test_a_step_tensorflow_fails_on_one_rank_fails_on_the_others_and_the_next_steps_pair():
    fed = {}

    def ids_of():
        fed["values"] = tf1.placeholder(tf1.int64, [None])
        fed["splits"] = tf1.placeholder(tf1.int64, [None])
        return tf1.RaggedTensor.from_row_splits(fed["values"], fed["splits"])  # checked at run
    graph, train, export, _ = _training_graph(ids_of)
    keys = np.array([RANK % 11, 1, 2, 3])
    good = {fed["values"]: keys, fed["splits"]: np.array([0, 2, 4])}
    bad = {fed["values"]: keys, fed["splits"]: np.array([0, 2, 5])}
    with tf_support.initialized_session(graph) as sess:
        sess.run(train, good)
        before = sess.run(export)
        if RANK == LAST:
            # TensorFlow rejects the splits here: sok1x never runs in this step on this rank.
            with pytest.raises(tf1.errors.InvalidArgumentError):
                sess.run(train, bad)
        else:
            # The others' step meets the last rank's next one: it fails, changing nothing.
            with pytest.raises(tf1.errors.OpError) as raised:
                sess.run(train, good)
            calls = _assert_order_error(raised.value, "lookup")
            assert "different steps" in str(raised.value)
            assert calls[LAST] == calls[0] + 1 and set(calls) == {calls[0], calls[LAST]}, calls
            _same_shards(before, sess.run(export))
        # The next step pairs with the next step on every rank, and trains.
        sess.run(train, good)
        assert not np.array_equal(before[1], sess.run(export)[1])


ROWS, STEPS, SKIPPED = 11, 6, 2


def _step_keys(step, rank):
    """Keys rank `rank` looks up at `step`: two bags of two, different per step and rank."""
    return np.random.default_rng(1000 * step + rank).integers(0, ROWS, size=4)


def _reference_table(steps):
    """The table after SGD(0.5) on sum(lookup) over `steps`: each row loses 0.5 per key seen
    on any rank at each step (an independent NumPy reference)."""
    table = np.arange(ROWS * 2, dtype=np.float32).reshape(ROWS, 2)
    for step in steps:
        for rank in range(SIZE):
            for key in _step_keys(step, rank):
                table[key] -= 0.5
    return table


@needs_peers
@pytest.mark.parametrize("inter_op", [1, 8])
@pytest.mark.parametrize("skipper", [0, LAST])
def test_a_step_skipped_on_one_rank_fails_everywhere_and_all_go_on_together(skipper, inter_op):
    """A loop of steps where TensorFlow fails step SKIPPED on rank `skipper` before sok1x runs
    (bad RaggedTensor splits): that step fails on every rank, every other step trains on every
    rank, paired with the same step everywhere, and nothing waits for a timeout."""
    fed = {}

    def ids_of():
        fed["values"] = tf1.placeholder(tf1.int64, [None])
        fed["splits"] = tf1.placeholder(tf1.int64, [None])
        return tf1.RaggedTensor.from_row_splits(fed["values"], fed["splits"])
    graph, train, export, _ = _training_graph(ids_of)
    outcomes = []
    with tf_support.session(graph, inter_op) as sess:
        with graph.as_default():
            sess.run(sok.Init(backend="cpu"))
            sess.run(tf1.global_variables_initializer())
        for step in range(STEPS):
            bad = step == SKIPPED and RANK == skipper
            feed = {fed["values"]: _step_keys(step, RANK),
                    fed["splits"]: np.array([0, 2, 5] if bad else [0, 2, 4])}
            try:
                sess.run(train, feed)
                outcomes.append("ok")
            except tf1.errors.OpError as error:
                outcomes.append("failed: %s" % type(error).__name__)
                if not bad:
                    _assert_order_error(error, "lookup")
        keys, values = sess.run(export)
    assert [o == "ok" for o in outcomes] == [step != SKIPPED for step in range(STEPS)], outcomes
    want = _reference_table([step for step in range(STEPS) if step != SKIPPED])
    np.testing.assert_allclose(values, want[keys], rtol=1e-6)


@needs_peers
def test_dump_on_one_rank_against_a_step_on_the_others(shared_dir):
    def ids_of():
        return tf1.RaggedTensor.from_tensor(tf1.constant([[RANK % 11, 1], [2, 3]], tf1.int64))
    graph, train, export, table = _training_graph(ids_of)
    folder = shared_dir
    with graph.as_default():
        dump = sok.dump(folder, [table])
    with tf_support.initialized_session(graph) as sess:
        sess.run(train)
        before = sess.run(export)
        with pytest.raises(tf1.errors.OpError) as raised:
            sess.run(dump if RANK == 0 else train)
        _assert_order_error(raised.value, "sok1x.dump", "lookup")
        _same_shards(before, sess.run(export))
        # In step again at once: a training step, then a dump, together.
        sess.run(train)
        sess.run(dump)
        assert not np.array_equal(before[1], sess.run(export)[1])


@needs_peers
def test_two_towers_run_in_another_order_on_each_rank():
    graph = tf1.Graph()
    with graph.as_default():
        layer = sok.All2AllDenseEmbedding(64, 2, 1, 1, embedding_initializer="ones")
        keys = tf1.constant(np.array([[[RANK]]], dtype=np.int64))
        train_out = layer(keys)
        grad = tf1.gradients(tf1.reduce_sum(train_out), [layer.var])[0]
        train = tf1.group(grad.values)
        eval_out = layer(tf1.identity(keys), training=False)  # after backward ops: own tower
    order = [train, eval_out] if RANK == 0 else [eval_out, train]
    with tf_support.session(graph) as sess:
        sess.run(sok.Init(backend="cpu"))
        sess.run(tf1.global_variables_initializer())
        for fetch in order:
            with pytest.raises(tf1.errors.OpError) as raised:
                sess.run(fetch)
            _assert_order_error(raised.value, "tower")
            assert "different steps" not in str(raised.value)
        # Then together, in one order: no call is left counted on one rank only.
        sess.run(train)
        np.testing.assert_array_equal(sess.run(eval_out), 1.0)


def test_counts_of_more_tables_than_a_record_holds_still_arrive():
    from sok1x.engine import runtime
    from sok1x.engine.lookup import exchange_header
    sok.init(backend="cpu")
    tables = exchange_header.INLINE_TABLES + 3
    # rank r sends rank j (r + 1) * 100 + j * 10 + t rows of table t
    sent = np.array([[(RANK + 1) * 100 + j * 10 + t for t in range(tables)]
                     for j in range(SIZE)], dtype=np.int64)
    got = exchange_header.exchange_header(runtime.get(), "many_tables_header", sent)
    want = np.array([[(i + 1) * 100 + RANK * 10 + t for t in range(tables)]
                     for i in range(SIZE)], dtype=np.int64)
    np.testing.assert_array_equal(got, want)
    few = exchange_header.exchange_header(runtime.get(), "few_tables_header", sent[:, :2])
    np.testing.assert_array_equal(few, want[:, :2])


@pytest.mark.skipif(SIZE != 1, reason="the one-rank header")
def test_one_rank_header_reads_what_it_is_given_in_one_wait():
    """Alone, the header builds no record (exchange_header._alone): the counts (host or device)
    come back as sent and received, the shared values as every rank's, the arrays asked for as
    host copies, a device flag's overflow bit as overflow, and its failure bit as the error
    describe_error gives; the Sizes are the header's own arrays, and counts of another shape are
    refused."""
    from sok1x.engine import runtime
    from sok1x.engine.lookup import exchange_header
    sok.init(backend="cpu")
    rt = runtime.get()
    backend = rt.backend
    counts = np.array([[7], [9], [11]], dtype=np.int64)
    asked = backend.asarray(np.arange(5, dtype=np.int64))
    for i, (given, flag) in enumerate([(counts.copy(), None),
                                       (backend.asarray(counts.copy()), 0),
                                       (counts.copy(), exchange_header.OVERFLOW)]):
        error_flag = None if flag is None else backend.asarray(np.array([flag], np.int64))
        got = exchange_header.exchange_sizes(rt, "alone_header_%d" % i, given,
                                             also_read=[asked], shared=lambda: [3, 4],
                                             error_flag=error_flag)
        np.testing.assert_array_equal(got.sent, [[7, 9, 11]])
        np.testing.assert_array_equal(got.received, [[7, 9, 11]])
        np.testing.assert_array_equal(got.extra[0], np.arange(5))
        np.testing.assert_array_equal(got.shared, [[3, 4]])
        assert got.overflow is (flag == exchange_header.OVERFLOW)
        given[0, 0] = 8  # the header's answer is its own, whatever the caller does next
        np.testing.assert_array_equal(got.sent, [[7, 9, 11]])
    with pytest.raises(ValueError, match="counts are \\[tables, ranks\\], got \\[1, 3\\]"):
        exchange_header.exchange_sizes(rt, "alone_header_shape", counts.T.copy())
    failed = backend.asarray(np.array([1], np.int64))
    with pytest.raises(ValueError, match="alone_header_bad failed on 1 of 1 ranks:\n  rank 0: "
                                         "key 99 is out of range"):
        exchange_header.exchange_sizes(rt, "alone_header_bad", counts, error_flag=failed,
                                       describe_error=lambda: ValueError("key 99 is out of range"))
