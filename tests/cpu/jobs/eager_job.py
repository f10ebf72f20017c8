"""What the eager MPI jobs of tests/cpu share: running a job's main so that a failure on one
rank ends the whole job at once (the others would wait in a collective), the batches they train
on, one training step under a GradientTape, a variable's rows gathered from every rank, and a
one-key-per-sample sok1x lookup."""
import sys
import traceback

import numpy as np


def run(main, *args):
    """Calls main(*args); on any exception prints it and aborts every rank of COMM_WORLD."""
    try:
        main(*args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)


def batches(seed, rows, samples, dim, steps):
    """`steps` (ids int64 [samples] in [0, rows), weights float32 [samples, dim]) from `seed`:
    the global batches, the same on every rank."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, rows, size=samples).astype(np.int64),
             rng.uniform(size=(samples, dim)).astype(np.float32)) for _ in range(steps)]


def step(variable, optimizer, ids, weights, lookup):
    """One step of `optimizer` on the loss sum(lookup(variable, ids) * weights)."""
    import tensorflow as tf
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(lookup(variable, ids) * weights)
    optimizer.apply_gradients(zip(tape.gradient(loss, [variable]), [variable]))


def gathered(variable):
    """Collective: key -> vector of every rank's exported shard of a sok1x variable."""
    from mpi4py import MPI

    import sok1x as sok
    keys, values = sok.export(variable)
    table = {}
    for shard_keys, shard_values in MPI.COMM_WORLD.allgather((keys.numpy(), values.numpy())):
        table.update(zip(shard_keys.tolist(), shard_values))
    return table


def sok_lookup(variable, ids):
    """One key per sample through sok1x.lookup_sparse, as tf.nn.embedding_lookup (which reads a
    localized variable on its own rank alone, as SOK's)."""
    import tensorflow as tf

    import sok1x as sok
    ragged = tf.RaggedTensor.from_row_lengths(ids, np.ones(len(ids), np.int64))
    return sok.lookup_sparse(variable, ragged, combiners="sum")
