"""A pooled lookup for a seam that crosses the host (TensorFlow 1.15's host staging, DESIGN D1):
per table, the form of its result that takes the fewer bytes over PCIe:

    pooled    rows = the pooled vectors [num_segments, dim], as pooled_lookup returns them
    distinct  rows = the batch's distinct rows [u, dim] and indices = int32 [nnz], each key's row
              among them; the framework gathers and pools on its own device, as
              tf.nn.embedding_lookup_sparse does:
                  out[s] = sum_i w_i * rows[indices[i]]  (/ sum_i w_i for a mean)
              and the gradient of rows it hands back is, per distinct row, the sum of its keys'
              gradients (an unsorted segment sum by indices: tf.gather's gradient, made dense).

distinct is chosen where u * dim * itemsize + 4 * nnz < num_segments * dim * itemsize (itemsize:
of the floats that cross, 2 for a float16 layer), never for a table with a low-frequency filter
(its admission counts each key's occurrences) or for bad input (the step then fails as
pooled_lookup's does, on every rank). Either way the forward state is pooled_forward_many's, so
pooled_backward_many takes per table gradients shaped like its rows: for distinct rows each key
is its own output row, and their gradients go to the owners unchanged.
"""
import collections

import numpy as np

from sok1x.engine.lookup.checks import KEY_DTYPES
from sok1x.engine.lookup.pooled import PooledInput, check_input, pooled_forward_many

CompactRows = collections.namedtuple("CompactRows", "rows indices")
CompactRows.__doc__ = """One table's result of compact_forward_many: rows (backend float32:
pooled [num_segments, dim], or distinct [u, dim]) and indices (None for pooled rows; backend
int32 [nnz], each key's row among the distinct rows)."""

_INT32_LIMIT = 2 ** 31


def distinct_pays(distinct, keys, segments, dim, itemsize):
    """True where u distinct rows plus int32 indices of `keys` take fewer bytes than `segments`
    pooled rows of `dim` floats of `itemsize` bytes."""
    return distinct * dim * itemsize + 4 * keys < segments * dim * itemsize


def _candidates(inputs, error):
    """Positions of the inputs that may cross as distinct rows."""
    if error is not None:
        return []
    return [p for p, item in enumerate(inputs)
            if item.admit_ratio is None and item.keys.dtype in KEY_DTYPES
            and 0 < item.keys.shape[0] < _INT32_LIMIT]


def compact_forward_many(runtime, tables, op, inputs, training, key_limits=None, itemsize=4):
    """Collective. pooled_forward_many's lookup (inputs: one PooledInput per table) returning
    per table the CompactRows of fewer bytes, and the state pooled_backward_many takes (its
    gradients shaped like each table's rows). Raises the step's input errors on every rank
    before any table changes, as pooled_forward_many."""
    backend = runtime.backend
    inputs = [item._replace(keys=backend.asarray(item.keys),
                            segment_ids=None if item.segment_ids is None else backend.asarray(
                                item.segment_ids),
                            weights=None if item.weights is None else backend.asarray(
                                item.weights))
              for item in inputs]
    error, checks = None, []
    for table, item in zip(tables, inputs):
        if error is None:
            error, more = check_input(table, item)
            checks += more
    candidates = _candidates(inputs, error)
    found = backend.unique_many([inputs[p].keys for p in candidates], ordered=False) \
        if candidates else []
    items, indices = list(inputs), [None] * len(inputs)
    for p, (distinct, inverse) in zip(candidates, found):
        item, dim = inputs[p], tables[p].dim
        count = int(distinct.shape[0])
        if distinct_pays(count, int(item.keys.shape[0]), int(item.num_segments), dim, itemsize):
            items[p] = PooledInput(distinct, None, count, None, "sum")
            indices[p] = inverse
    outputs, state = pooled_forward_many(
        runtime, tables, op, items, training, local_error=error, extra_checks=checks,
        key_limits=key_limits, checked_keys=[item.keys for item in inputs])
    return [CompactRows(rows, None if index is None else backend.narrow_indices(index))
            for rows, index in zip(outputs, indices)], state
