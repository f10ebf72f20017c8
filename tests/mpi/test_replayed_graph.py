"""A session's training loop replays (engine/lookup/replayed_step.py through
graph_ops/embedding_ops.py, DESIGN D14): an All2AllDenseEmbedding trained by a sok1x optimizer
in a tf.Session, with the bounded step asked for (SOK1X_BOUNDED_STEP=1; on several ranks sized
by per-peer capacities, SOK1X_PEER_CAPACITY=1), records its lookup's shape class and from then
on replays its forward and backward, and its update where the seam hands the engine's own
gradient back (TensorFlow's kernels lend it, DLPack shares it; host staging copies it). Over
many steps with changing keys, the losses, every table row and optimizer slot and the dense
weights equal the same program run with the replay off (SOK1X_CAPTURE=0) bit for bit; a bad key
in a replayed step fails that step on every rank and changes no row. SOK v2's lookup_sparse of
several Variables of one dim (one keyed op, pooled by segment ids) replays the same way, its
pooling done after the replay; through host staging (the compact form) it runs uncaptured,
and agrees."""
import sys

import numpy as np
import pytest
from mpi4py import MPI
from optimizer_reference import Trained, batches, gather_table, train_sok1x
from tf_support import session, tf1

import sok1x
from sok1x.engine import runtime
from sok1x.engine.lookup import bounded_step, peer_capacity, replayed_step
from sok1x.graph_ops import boundary

STEPS = 8


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok1x.init(backend="cpu")


@pytest.fixture(autouse=True)
def bounded(monkeypatch):
    monkeypatch.setenv(bounded_step.ENV, "1")
    monkeypatch.setenv(peer_capacity.ENV, "1")


def fresh_plans():
    """Every run starts without per-peer capacities: an op reads SOK1X_PEER_CAPACITY once, when
    its plan is made, and sets its caps at its first lookup. The layers here name their ops as
    other graphs do (other files', the run before), whose plans would carry over."""
    with runtime.entered() as rt:
        rt.capacities.clear()


def adam(global_step, fed):
    del global_step, fed
    return sok1x.optimizers.Adam(0.02), tf1.train.AdamOptimizer(0.02)


class Replays:
    """Counts what the engine's replayed paths did (each call that did not fall back), the
    replays that found an array of their class still held by TensorFlow (held: the step ran
    uncaptured) and the copies handed out."""

    def __init__(self, monkeypatch):
        self.counts = dict.fromkeys(("_replay", "backward", "update", "keyed_update"), 0)
        for name in self.counts:
            monkeypatch.setattr(replayed_step, name, self._counted(name,
                                                                   getattr(replayed_step, name)))
        self.held = self.copies = 0
        monkeypatch.setattr(replayed_step, "_found_held", self._held(replayed_step._found_held))
        copies = replayed_step._fixed_copies

        def counted_copies(backend, arrays):
            self.copies += bool(len(arrays))  # (a class records its riders' copies: none here)
            return copies(backend, arrays)
        monkeypatch.setattr(replayed_step, "_fixed_copies", counted_copies)

    def _held(self, function):
        def counted(*args):
            held = function(*args)
            self.held += held
            return held
        return counted

    def _counted(self, name, function):
        def counted(*args, **kwargs):
            result = None
            try:
                result = function(*args, **kwargs)
            finally:  # a replay that raised (a bad key) counts too
                self.counts[name] += result is not None or sys.exc_info()[0] is not None
            return result
        return counted


def trained(world, monkeypatch, capture, data):
    """The optimizer tests' model trained on `data` with SOK1X_CAPTURE=`capture`: (Trained,
    its table's Adam slots {key: row} each)."""
    fresh_plans()
    monkeypatch.setenv(replayed_step.ENV, capture)
    slots = {}

    def at_the_end(layer, _keys):
        for name in sorted(runtime.get().tables[layer.var._sok1x_table.name].slots):
            slots[name] = gather_table(layer, name)
    got, _layer = train_sok1x(world, adam, data, layer_hook=at_the_end)
    with runtime.entered() as rt:
        replayed_step.free(rt)
    return got, slots


def assert_equal_training(got, want):
    np.testing.assert_array_equal(got[0].losses, want[0].losses)
    assert sorted(got[0].table) == sorted(want[0].table)
    for key in want[0].table:
        np.testing.assert_array_equal(got[0].table[key], want[0].table[key])
    for a, b in zip(got[0].dense, want[0].dense):
        np.testing.assert_array_equal(a, b)
    assert sorted(got[1]) == sorted(want[1])
    for name in want[1]:
        for key in want[1][name]:
            np.testing.assert_array_equal(got[1][name][key], want[1][name][key])


def test_a_session_loop_replays_and_equals_the_uncaptured_loop(world, monkeypatch):
    data = batches(STEPS, world[1], seed=5)
    want = trained(world, monkeypatch, "0", data)
    replays = Replays(monkeypatch)
    got = trained(world, monkeypatch, "1", data)
    assert isinstance(got[0], Trained)
    assert_equal_training(got, want)
    # first sight; recorded (on several ranks once the caps are agreed); replayed after
    assert replays.counts["_replay"] >= STEPS - 3
    assert replays.counts["backward"] == replays.counts["_replay"]
    if boundary.seam_path() != boundary.HOST_STAGING:  # the gradient comes back in place
        assert replays.counts["update"] >= replays.counts["backward"] - 1
    elif tf1.__version__.startswith("1."):  # TensorFlow 1.15's py_func copies it (2.x's may
        assert replays.counts["update"] == 0  # hand NumPy's memory back: the copy, found)
    # TensorFlow's kernels say what a session holds: nothing past its step, so no copy;
    # through a py_func every replayed output and gradient is copied (api's detach)
    assert replays.held == 0
    if boundary.seam_path() == boundary.KERNELS:
        assert replays.copies == 0
    else:
        assert replays.copies >= replays.counts["_replay"]  # each output, most gradients


def test_a_bad_key_in_a_replayed_step_fails_every_rank_and_changes_nothing(world, monkeypatch):
    data = batches(STEPS, world[1], seed=9)
    keys, labels = data[5]
    bad = keys.copy()
    bad[-1, 0, 0] = -3  # in the last rank's share of the global batch: every rank fails
    data[5] = (bad, labels)
    monkeypatch.setenv(replayed_step.ENV, "1")
    replays = Replays(monkeypatch)
    seen = []
    fresh_plans()

    def after_each_step(layer, _keys):
        seen[:] = [layer, gather_table(layer), replays.counts["_replay"]]
    with pytest.raises(tf1.errors.OpError, match="key -3 .* negative"):
        train_sok1x(world, adam, data, layer_hook=after_each_step)
    layer, table, replayed = seen
    assert replayed >= 1 and replays.counts["_replay"] == replayed + 1  # it failed replayed
    now = gather_table(layer)
    for key in table:
        np.testing.assert_array_equal(now[key], table[key])
    with runtime.entered() as rt:
        replayed_step.free(rt)


def v2_trained(world, monkeypatch, capture, combiner, queued=None):
    """Three sok1x.Variables of one dim looked up by one sok.lookup_sparse (ragged ids, 1 to 3
    a row, their rows shuffled from step to step: a lookup of as many ids each step, as a
    fixed hotness gives) and trained by Adam through OptimizerWrapper for STEPS steps with
    SOK1X_CAPTURE=`capture`: (losses, each variable's exported (keys, rows) gathered, what
    a queue gave back each step). queued: None; "kept", a queue holds the second variable's
    gradient (values and indices: pieces of the backward's arrays) a step; "applied", and
    that queued gradient, a step late, is what the optimizer applies to it."""
    fresh_plans()
    rank, size = world
    monkeypatch.setenv(replayed_step.ENV, capture)
    rng = np.random.default_rng(31)
    rows, dim, count = 40, 4, 3
    starts = [rng.uniform(-1, 1, size=(rows, dim)).astype(np.float32) for _ in range(count)]
    data = []
    for _ in range(STEPS):  # rows of 1 to 3 ids, shuffled each step: the same ids a rank
        lengths = np.stack([rng.permutation([1, 2, 3, 1, 3]) for _ in range(size)])
        data.append([(lengths[rank], rng.integers(0, rows, size=int(lengths.sum()))[
            int(lengths[:rank].sum()):int(lengths[:rank + 1].sum())]) for _ in range(count)])
    with tf1.Graph().as_default() as graph:
        feeds = [(tf1.placeholder(tf1.int64, [None]), tf1.placeholder(tf1.int64, [None]))
                 for _ in range(count)]
        ids = [tf1.RaggedTensor.from_row_lengths(values, lengths) for values, lengths in feeds]
        variables = [sok1x.Variable(start) for start in starts]
        pooled = sok1x.lookup_sparse(variables, ids, combiners=[combiner] * count)
        loss = tf1.add_n([tf1.reduce_sum(p * p) * (t + 1.0) for t, p in enumerate(pooled)])
        grads = tf1.gradients(loss, variables)
        fetches = []
        if queued:
            queue = tf1.FIFOQueue(2, [tf1.float32, tf1.int64])
            with tf1.control_dependencies([queue.enqueue([grads[1].values, grads[1].indices])]):
                fetches = list(queue.dequeue())
            if queued == "applied":
                grads[1] = tf1.IndexedSlices(fetches[0], fetches[1], grads[1].dense_shape)
        train = sok1x.OptimizerWrapper(tf1.train.AdamOptimizer(0.01)).apply_gradients(
            zip(grads, variables))
        exported = [sok1x.export(v) for v in variables]
        losses, given = [], []
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            if queued:  # the first step's dequeue gets an empty gradient
                sess.run(queue.enqueue([tf1.zeros([0, dim]), tf1.zeros([0], tf1.int64)]))
            for step in data:
                feed = {}
                for (values, lengths), (lengths_now, keys_now) in zip(feeds, step):
                    feed[values], feed[lengths] = keys_now, lengths_now
                result = sess.run([loss, train] + fetches, feed)
                losses.append(result[0])
                given.append([np.array(a, copy=True) for a in result[2:]])
            tables = sess.run(exported)
    with runtime.entered() as rt:
        replayed_step.free(rt)
    return np.array(losses), [MPI.COMM_WORLD.allgather(t) for t in tables], given


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_v2_lookup_sparse_of_several_variables_replays_and_equals(world, monkeypatch, combiner):
    want = v2_trained(world, monkeypatch, "0", combiner)
    replays = Replays(monkeypatch)
    got = v2_trained(world, monkeypatch, "1", combiner)
    np.testing.assert_array_equal(got[0], want[0])
    for got_ranks, want_ranks in zip(got[1], want[1]):
        for (a_keys, a_rows), (b_keys, b_rows) in zip(got_ranks, want_ranks):
            np.testing.assert_array_equal(a_keys, b_keys)
            np.testing.assert_array_equal(a_rows, b_rows)
    if boundary.seam_path() != boundary.HOST_STAGING:  # host staging: the compact form
        assert replays.counts["_replay"] >= STEPS - 3
        assert replays.counts["backward"] == replays.counts["_replay"]
        assert replays.counts["keyed_update"] >= replays.counts["backward"] - 1
    else:
        assert replays.counts["_replay"] == replays.counts["keyed_update"] == 0


@pytest.mark.parametrize("queued", ["kept", "applied"])
def test_v2_gradient_pieces_a_queue_holds_are_never_written(world, monkeypatch, queued):
    """A queue holds one Variable's gradient of a replayed keyed lookup a step (through the
    kernels: pieces of the backward's own arrays), and may hand it to the optimizer a step
    late: what the queue gives back, the losses and every table equal the uncaptured
    program's, bit for bit; through the kernels a replay found the pieces held."""
    want = v2_trained(world, monkeypatch, "0", "sum", queued)
    replays = Replays(monkeypatch)
    got = v2_trained(world, monkeypatch, "1", "sum", queued)
    np.testing.assert_array_equal(got[0], want[0])
    for got_step, want_step in zip(got[2], want[2]):
        for a, b in zip(got_step, want_step):
            np.testing.assert_array_equal(a, b)
    for got_ranks, want_ranks in zip(got[1], want[1]):
        for (a_keys, a_rows), (b_keys, b_rows) in zip(got_ranks, want_ranks):
            np.testing.assert_array_equal(a_keys, b_keys)
            np.testing.assert_array_equal(a_rows, b_rows)
    if boundary.seam_path() == boundary.KERNELS:
        assert replays.held >= 1


def kept_past_the_step(world, monkeypatch, capture, kind):
    """A session program that keeps a replayed lookup's output or gradient past its step: a
    queue holding the output (or the gradient's values and rows) one step, or a while loop
    writing each micro-batch's output to a TensorArray. Returns what it read, per step."""
    fresh_plans()
    rank, size = world
    monkeypatch.setenv(replayed_step.ENV, capture)
    slots, nnz, dim, micro = 2, 2, 4, 3
    rng = np.random.default_rng(41)
    data = [rng.integers(0, 32 * size, size=(micro, 3 * size, slots, nnz))[:, rank::size]
            for _ in range(STEPS)]
    with tf1.Graph().as_default() as graph:
        layer = sok1x.All2AllDenseEmbedding(
            32, dim, slots, nnz, use_hashtable=False,
            embedding_initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=11))
        if kind == "loop":
            keys = tf1.placeholder(tf1.int64, [micro, 3, slots, nnz])
            outputs = tf1.TensorArray(tf1.float32, size=micro)
            _, outputs = tf1.while_loop(
                lambda i, held: i < micro,
                lambda i, held: (i + 1, held.write(i, layer(keys[i]))),
                [tf1.constant(0), outputs], parallel_iterations=1)
            fetch, feed_of = outputs.stack(), lambda step: step
        else:
            keys = tf1.placeholder(tf1.int64, [3, slots, nnz])
            out = layer(keys)
            kept = [out]
            if kind == "gradient_queue":
                gradient = tf1.gradients(tf1.reduce_sum(out * out), [layer.var])[0]
                kept = [gradient.values, gradient.indices]
            queue = tf1.FIFOQueue(2, [t.dtype for t in kept])
            fetch, feed_of = [queue.dequeue(), queue.enqueue(kept)], lambda step: step[0]
        got = []
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            if kind != "loop":
                sess.run(fetch[1], {keys: feed_of(data[0])})
            for step in data[1:]:
                result = sess.run(fetch, {keys: feed_of(step)})
                got.append(result if kind == "loop" else result[0])
    with runtime.entered() as rt:
        replayed_step.free(rt)
    return got


@pytest.mark.parametrize("kind", ["output_queue", "gradient_queue", "loop"])
def test_outputs_a_graph_keeps_past_the_step_are_its_own(world, monkeypatch, kind):
    """A queue that holds a replayed lookup's output or gradient a step, or a while loop whose
    TensorArray holds each iteration's, reads what the uncaptured program reads, bit for bit:
    through a py_func the replays hand out copies (api's detach=True); through TensorFlow's
    kernels a replay that finds an output of its class still held runs uncaptured, and the
    class hands out copies from then on (detach=HELD)."""
    want = kept_past_the_step(world, monkeypatch, "0", kind)
    replays = Replays(monkeypatch)
    got = kept_past_the_step(world, monkeypatch, "1", kind)
    for a, b in zip(got, want):
        for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            np.testing.assert_array_equal(x, y)
    assert replays.counts["_replay"] >= 2
    if boundary.seam_path() == boundary.KERNELS:
        assert replays.held >= 1
        assert replays.copies >= 1  # the class turned to copies, and replayed again


def own_gradient_trained(world, monkeypatch, capture):
    """A session whose top gradient is the lookup's own output (grad_ys=out, as d(0.5 |out|^2)
    gives), trained by sok1x's Adam with SOK1X_CAPTURE=`capture`: each step's output."""
    fresh_plans()
    rank, size = world
    monkeypatch.setenv(replayed_step.ENV, capture)
    rng = np.random.default_rng(43)
    data = [rng.integers(0, 32 * size, size=(3 * size, 2, 2))[rank::size] for _ in range(STEPS)]
    with tf1.Graph().as_default() as graph:
        layer = sok1x.All2AllDenseEmbedding(
            32, 4, 2, 2, use_hashtable=False,
            embedding_initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=11))
        keys = tf1.placeholder(tf1.int64, [3, 2, 2])
        out = layer(keys)
        gradient = tf1.gradients(out, [layer.var], grad_ys=[out])[0]
        train = sok1x.optimizers.Adam(0.02).apply_gradients([(gradient, layer.var)])
        got = []
        with session(graph) as sess:
            sess.run(tf1.global_variables_initializer())
            for step in data:
                got.append(np.array(sess.run([out, train], {keys: step})[0], copy=True))
    with runtime.entered() as rt:
        replayed_step.free(rt)
    return got


def test_a_top_gradient_that_is_the_output_itself_keeps_replaying(world, monkeypatch):
    """The backward's first sight keeps the class's own output as its gradient, not
    TensorFlow's input over it: a kernel's input the engine keeps keeps TensorFlow's tensor, and
    the output lent would then be held for good (each later step uncaptured)."""
    want = own_gradient_trained(world, monkeypatch, "0")
    replays = Replays(monkeypatch)
    got = own_gradient_trained(world, monkeypatch, "1")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert replays.held == 0
    assert replays.counts["_replay"] >= STEPS - 3
    assert replays.counts["backward"] == replays.counts["_replay"]
