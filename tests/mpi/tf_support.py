"""TensorFlow set-up shared by the MPI tests: graph mode, sessions, a fresh graph per test."""
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()

# The op types of sok1x's per-step ops on each seam (graph_ops/boundary.py).
ENGINE_OP_TYPES = ("Sok1xEngineCall", "PyFunc", "EagerPyFunc")


def embedding_lookup_sparse(params, sp_ids, sp_weights, combiner):
    """tf.nn.embedding_lookup_sparse as TensorFlow 2.x (and sok1x, and SOK) pool it: a row
    without ids is zeros under every combiner. TensorFlow 1.15 divides a weighted mean's (or
    sqrtn's) empty row, 0, by its weight sum, 0: NaN there, made 0 here."""
    out = tf1.nn.embedding_lookup_sparse(params, sp_ids, sp_weights, combiner=combiner)
    if sp_weights is None or combiner == "sum" or not tf.__version__.startswith("1."):
        return out
    return tf1.where(tf1.is_nan(out), tf1.zeros_like(out), out)


def session(graph, inter_op_threads=2):
    """Returns a tf.compat.v1.Session on `graph` with the given inter-op thread count."""
    config = tf1.ConfigProto(inter_op_parallelism_threads=inter_op_threads,
                             intra_op_parallelism_threads=1)
    return tf1.Session(graph=graph, config=config)


def initialized_session(graph):
    """session(graph) with sok1x brought up on the cpu backend (sok1x.Init) and the graph's
    variables initialized."""
    import sok1x
    sess = session(graph)
    with graph.as_default():
        sess.run(sok1x.Init(backend="cpu"))
        sess.run(tf1.global_variables_initializer())
    return sess


def global_batch(seed, global_size, slot_num, nnz, vocabulary):
    """Returns int64 keys [global_size, slot_num, nnz], the same on every rank for one seed."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocabulary, size=(global_size, slot_num, nnz), dtype=np.int64)


def local_part(array, rank, size):
    """Returns this rank's contiguous share of `array` along axis 0."""
    per = array.shape[0] // size
    return array[rank * per:(rank + 1) * per]
