"""TensorFlow set-up shared by the MPI tests: graph mode, sessions, a fresh graph per test."""
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()


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
