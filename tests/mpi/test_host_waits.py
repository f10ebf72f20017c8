"""How often a training step waits on the host (issue 17 item 2, DESIGN D9, D13): the engine counts
its host waits (on cpu, the calls at which the cuda backend would block) and its collectives in
the runtime's stats. A training step (forward, backward, update) on the zero-copy seam waits at
most twice, at any number of ranks (more on the host seam and on TensorFlow 1.15: see
MAX_HOST_WAITS): once for the forward's header, which carries the per-owner counts and the input
checks' flags, once for the backward's, which brings the owners' distinct-row counts; the
lookup's two passes wait as often for many tables as for one, and no step makes an MPI call
outside the data channel."""
import numpy as np
import pytest
import tf_support
from mpi4py import MPI

import sok1x as sok
from sok1x.engine import runtime
from sok1x.graph_ops import boundary, tf_compat

tf1 = tf_support.tf1
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
# sok1x's kernels and the zero-copy seam lend TensorFlow the engine's own arrays, so the update
# gets the backward pass's distinct rows as the engine made them. TensorFlow 1.15's PyFunc
# copies every NumPy output into a new tensor (2.x's adopts an aligned one's memory), so on the
# host seam there the update gets a copy of them, which the engine does not know, and checks
# and de-duplicates them again: one wait each, two more a step. On the host seam the forward
# crosses in its compact form (engine/lookup/compact.py), which reads the batch's distinct-row
# count to choose between the rows and the pooled vectors: one wait more.
HOST_SEAM = boundary.seam_path() == boundary.HOST_STAGING
MAX_HOST_WAITS = ((4 if HOST_SEAM and tf_compat.VERSION < (2, 0) else 2)
                  + (1 if HOST_SEAM else 0))


def _per_step_stats(tables, fetch_update=True):
    """Runs SGD steps of a fused lookup of `tables` sok1x.Variables; returns the runtime's stats
    of one step (the update, or only the gradients) after two warm-up steps, and whether it
    changed the shards."""
    graph = tf1.Graph()
    rng = np.random.default_rng(5 + RANK)
    with graph.as_default():
        variables = [sok.Variable(np.full((13, 4), float(t), np.float32)) for t in range(tables)]
        ids = [tf1.RaggedTensor.from_tensor(tf1.constant(rng.integers(0, 13, (6, 3))))
               for _ in range(tables)]
        pooled = sok.lookup_sparse(variables, ids, combiners=["sum"] * tables)
        loss = tf1.add_n([tf1.reduce_sum(p) for p in pooled])
        grads = tf1.gradients(loss, variables)
        train = sok.OptimizerWrapper(tf1.train.GradientDescentOptimizer(0.1)).apply_gradients(
            zip(grads, variables))
        step = train if fetch_update else [g.values for g in grads]
        exports = [sok.export(v) for v in variables]
    with tf_support.session(graph) as sess:
        sess.run(sok.Init(backend="cpu"))
        sess.run(tf1.global_variables_initializer())
        for _ in range(2):
            sess.run(step)
        before_rows = sess.run(exports)
        before = runtime.get().stats()
        sess.run(step)
        after = runtime.get().stats()
        after_rows = sess.run(exports)
    changed = any(not np.array_equal(b[1], a[1]) for b, a in zip(before_rows, after_rows))
    return {key: after[key] - before[key] for key in after}, changed


def test_a_training_step_waits_on_the_host_at_most_twice():
    stats, changed = _per_step_stats(1)
    assert changed or RANK >= 13, "the step must train the rows this rank holds"
    assert stats["host_waits"] <= MAX_HOST_WAITS, stats
    assert stats["host_collectives"] == 0, stats  # no MPI call beside the data channel
    # forward: header, keys, vectors; backward: header, gradients (alone: nothing to exchange)
    assert stats["data_collectives"] == (5 if SIZE > 1 else 0), stats


@pytest.mark.parametrize("tables", [5, 26])
def test_a_lookup_of_many_tables_waits_as_often_as_one(tables):
    one, _ = _per_step_stats(1, fetch_update=False)
    many, _ = _per_step_stats(tables, fetch_update=False)
    assert many == one, (one, many)
    assert many["host_waits"] <= MAX_HOST_WAITS and many["host_collectives"] == 0, many
