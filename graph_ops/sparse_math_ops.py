"""sok1x.unique and sok1x.unsorted_segment_sum: tf.unique and tf.math.unsorted_segment_sum on
sok1x's backend (GPU kernels on cuda, NumPy on cpu). Local ops (no communication), so they are
not chained; the engine's lock keeps them from running beside another engine call.
"""
import collections

from sok1x.engine import api
from sok1x.graph_ops import boundary
from sok1x.graph_ops.tf_compat import tf1

Unique = collections.namedtuple("Unique", "y idx")
Unique.__doc__ = "What sok1x.unique returns, as tf.unique: y (distinct values), idx (x == y[idx])."

_UNIQUE_GRAD = "Sok1xUnique"
_SEGMENT_SUM_GRAD = "Sok1xUnsortedSegmentSum"
_INDEX_DTYPES = (tf1.int32, tf1.int64)


def unique(x, out_idx=tf1.int32, name=None):
    """Returns Unique(y, idx) of a 1-D int32/int64 tensor x: y its distinct values in order of
    first occurrence, idx (out_idx: int32 or int64) with x == y[idx]. Equal to tf.unique."""
    x = tf1.convert_to_tensor(x)
    out_idx = tf1.as_dtype(out_idx)
    if x.dtype not in _INDEX_DTYPES or out_idx not in _INDEX_DTYPES:
        raise TypeError("sok1x.unique takes int32 or int64 values and out_idx, got %s and %s"
                        % (x.dtype.name, out_idx.name))
    x.shape.with_rank(1)

    def run(values):
        keys, inverse = api.unique(values)
        return keys, inverse.astype(out_idx.as_numpy_dtype, copy=False)

    y, idx = boundary.host_op(run, [x], [x.dtype, out_idx], name or "sok1x_unique",
                              gradient=_UNIQUE_GRAD)
    y.set_shape([None])
    idx.set_shape(x.shape)
    return Unique(y, idx)


def unsorted_segment_sum(data, segment_ids, num_segments, name=None):
    """Returns [num_segments, *data.shape[segment_ids.rank:]]: per segment id the sum of the data
    entries with that id (zeros for ids without any; negative ids are dropped). data: float32 or
    float64; segment_ids: int32/int64 shaped like a prefix of data's shape. Equal to
    tf.math.unsorted_segment_sum, gradient included."""
    data = tf1.convert_to_tensor(data)
    segment_ids = tf1.convert_to_tensor(segment_ids)
    num_segments = tf1.convert_to_tensor(num_segments)
    if data.dtype not in (tf1.float32, tf1.float64):
        raise TypeError("sok1x.unsorted_segment_sum sums float32 or float64 data, got %s"
                        % data.dtype.name)
    if segment_ids.dtype not in _INDEX_DTYPES or num_segments.dtype not in _INDEX_DTYPES:
        raise TypeError("segment_ids and num_segments must be int32 or int64")
    numpy_dtype = data.dtype.as_numpy_dtype

    def run(values, ids, count):
        return api.unsorted_segment_sum(values, ids, count).astype(numpy_dtype, copy=False)

    sums = boundary.host_op(run, [data, segment_ids, num_segments], data.dtype,
                            name or "sok1x_unsorted_segment_sum", gradient=_SEGMENT_SUM_GRAD)
    if segment_ids.shape.ndims is not None and data.shape.ndims is not None:
        count = tf1.get_static_value(num_segments)
        sums.set_shape(tf1.TensorShape([None if count is None else int(count)]).concatenate(
            data.shape[segment_ids.shape.ndims:]))
    return sums


@boundary.register_gradient(_UNIQUE_GRAD)
def _unique_grad(op, *grads):
    return [None]


@boundary.register_gradient(_SEGMENT_SUM_GRAD)
def _unsorted_segment_sum_grad(op, grad):
    """d data = grad[segment_ids], zero where an id was negative (its entry was dropped)."""
    segment_ids = op.inputs[1]
    gathered = tf1.gather(grad, tf1.maximum(segment_ids, 0))
    kept = tf1.cast(tf1.greater_equal(segment_ids, 0), grad.dtype)
    ones = tf1.ones(tf1.reshape(tf1.rank(grad) - 1, [1]), dtype=tf1.int32)
    kept = tf1.reshape(kept, tf1.concat([tf1.shape(segment_ids), ones], 0))
    return [gathered * kept, None, None]


def deduplicate(values, indices):
    """Sums the rows of IndexedSlices parts (values [n, ...], indices [n]) that share an index.
    Returns (summed values [u, ...], distinct indices [u]), as TensorFlow's optimizers do."""
    distinct, positions = unique(indices)
    summed = unsorted_segment_sum(values, positions, tf1.shape(distinct)[0])
    return summed, distinct

