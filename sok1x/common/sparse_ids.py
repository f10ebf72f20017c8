"""Ids as TF1 programs feed them, turned into what a pooled lookup takes (keys, the row of each
key, the number of rows), once for every front door (lookup_sparse, group lookups, the v1
layers' sparse input).

Taken: a tf.SparseTensor [batch, max_ids] of any known or unknown shape and rank (a
sparse_placeholder without shape, tf.io.parse_example's outputs), a tf.RaggedTensor
[batch, (ids)] (tf.ragged.constant, RaggedTensor.from_row_lengths), ids of int64 or int32
(uint32 and uint64 are cast to int64). A rank other than 2 is an error when the graph is built
if the rank is known, else in the step (every rank runs the same program, so every rank fails
in it). Ids of another dtype go on to the engine, which fails the step on every rank (D7): one
rank's odd dtype must not leave the others waiting in the exchange.
"""
from sok1x.graph_ops.tf_compat import tf1

_WIDENED = ("uint32", "uint64")


def _static_rank(sparse):
    """The rank of a SparseTensor when known from its dense_shape's shape, else None."""
    length = tf1.dimension_value(sparse.dense_shape.shape[0]) \
        if sparse.dense_shape.shape.ndims == 1 else None
    return None if length is None else int(length)


def as_engine_keys(values):
    """The ids as the engine takes them: unsigned ids as int64, any other dtype unchanged."""
    if values.dtype.base_dtype.name in _WIDENED:
        return tf1.cast(values, tf1.int64)
    return values


def ids_parts(ids, where):
    """Returns (keys int64 [nnz], segment ids int64 [nnz], rows int64 scalar) of SparseTensor or
    RaggedTensor ids [batch, ids]; raises TypeError / ValueError naming `where` for other kinds,
    dtypes or ranks (an unknown rank is checked in the step)."""
    if isinstance(ids, tf1.SparseTensor):
        rank = _static_rank(ids)
        indices, dense_shape = ids.indices, ids.dense_shape
        if rank is not None and rank != 2:
            raise ValueError("%s: SparseTensor ids must be [batch, max_ids] (rank 2), got rank %d"
                             % (where, rank))
        if rank is None:
            check = tf1.debugging.assert_equal(
                tf1.size(dense_shape), 2,
                message="%s: SparseTensor ids must be [batch, max_ids] (rank 2)" % where)
            with tf1.control_dependencies([check]):
                indices, dense_shape = tf1.identity(indices), tf1.identity(dense_shape)
        return (as_engine_keys(ids.values), tf1.cast(indices[:, 0], tf1.int64),
                tf1.cast(dense_shape[0], tf1.int64))
    if isinstance(ids, tf1.RaggedTensor):
        if ids.ragged_rank != 1:
            raise ValueError("%s: RaggedTensor ids must be [batch, (ids)] (ragged_rank 1), got "
                             "ragged_rank %d" % (where, ids.ragged_rank))
        return (as_engine_keys(ids.values), tf1.cast(ids.value_rowids(), tf1.int64),
                tf1.cast(ids.nrows(), tf1.int64))
    raise TypeError("%s: ids must be a tf.SparseTensor or tf.RaggedTensor, got %r"
                    % (where, type(ids).__name__))


def weight_values(weights, ids, where):
    """The float32 [nnz] values of `weights` (None, or of the ids' kind), or None."""
    if weights is None:
        return None
    if isinstance(ids, tf1.SparseTensor) != isinstance(weights, tf1.SparseTensor) or not \
            isinstance(weights, (tf1.SparseTensor, tf1.RaggedTensor)):
        raise TypeError("%s: the weights must be of the ids' kind (%s), got %r"
                        % (where, type(ids).__name__, type(weights).__name__))
    values = weights.values
    return values if values.dtype == tf1.float32 else tf1.cast(values, tf1.float32)
