"""Single-table references for the embedding tests: what one process computes on the whole batch.

The global batch is built from a seed on every rank; each rank feeds its share to sok1x, while the
reference runs TensorFlow's own lookups over one full table on the whole batch.
"""
import numpy as np
from mpi4py import MPI
from tf_support import tf1

from sok1x.backend.cpu.random_rows import initial_values
from sok1x.engine import runtime
from sok1x.engine.op_keys import name_key


def full_table(layer, keys):
    """Returns {key: initial vector} for `keys`, from the initializer recipe (D10) alone."""
    unique = np.unique(keys)
    values = initial_values(layer.init_spec, name_key("table:" + layer.var._sok1x_table.name),
                            unique, layer.embedding_vec_size)
    return unique, values


def reference_lookup(layer, keys):
    """tf.nn.embedding_lookup of `keys` over a table holding each key's initial vector."""
    unique, values = full_table(layer, keys)
    positions = np.searchsorted(unique, keys)
    return tf1.nn.embedding_lookup(tf1.constant(values), tf1.constant(positions)), unique


def shard_gradient_by_key(layer, values, rows):
    """Turns one rank's IndexedSlices (values, local rows) into {key: gradient} over all ranks.
    Rows -1 are padding (a bounded step's, SOK1X_BOUNDED_STEP=1): their values must be zeros."""
    rt = runtime.get()
    table = rt.tables[layer.var._sok1x_table.name]
    rows, values = np.asarray(rows), np.asarray(values)
    assert not values[rows < 0].any(), "a padded row -1 carries a gradient"
    rows, values = rows[rows >= 0], values[rows >= 0]
    if table.use_hashtable:
        keys_held, rows_held = table.index.export()
        key_of_row = dict(zip(rows_held.tolist(), keys_held.tolist()))
        keys = np.array([key_of_row[r] for r in rows.tolist()], dtype=np.int64)
    else:
        keys = rows * rt.size + rt.rank
    everyone = MPI.COMM_WORLD.allgather((keys, values))
    merged = {}
    for rank_keys, rank_values in everyone:
        for key, value in zip(rank_keys.tolist(), rank_values):
            assert key not in merged, "key %d came back from two owners" % key
            merged[key] = value
    return merged
