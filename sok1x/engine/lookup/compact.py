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
compact_lookup_grad takes per table gradients shaped like its rows: for distinct rows each key
is its own output row, and their gradients go to the owners unchanged.
"""
import collections

import numpy as np

from sok1x.backend.cuts import cut_points, part_starts
from sok1x.engine.lookup.checks import KEY_DTYPES
from sok1x.engine.lookup.keyed import keyed_backward, keyed_distinct_forward
from sok1x.engine.lookup.pooled import (
    PooledInput,
    checked_inputs,
    pooled_backward_many,
    pooled_forward_many,
)

JoinedRows = collections.namedtuple("JoinedRows", "rows indices row_counts")
JoinedRows.__doc__ = """All tables' results joined (tables of one dim, joined=True): rows
(backend float32 [sum r_t, dim], table after table), indices (None where every table crossed
pooled, else backend int32 [sum nnz_t], each key's row in `rows`), row_counts (host int64 [T]:
r_t, each table's pooled or distinct rows; None for a keyed lookup's distinct rows, which are
the unit's, not per table). One form for all: distinct where their bytes summed are fewer."""

CompactState = collections.namedtuple("CompactState", "pooling row_counts keyed",
                                      defaults=(False,))
CompactState.__doc__ = """What compact_backward_many needs: pooled_forward_many's state (keyed:
keyed.py's KeyedState), and row_counts (host int64 [T]) where the gradient comes joined in
per-table pieces, else None."""

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


def compact_forward_many(runtime, tables, op, inputs, training, key_limits=None, itemsize=4,
                         joined=False):
    """Collective. pooled_forward_many's lookup (inputs: one PooledInput per table) returning
    per table the CompactRows of fewer bytes (joined=True, tables of one dim: one JoinedRows for
    all), and the state compact_backward_many takes. Raises the step's input errors on every
    rank before any table changes, as pooled_forward_many."""
    backend = runtime.backend
    inputs, error, checks = checked_inputs(backend, tables, inputs)
    candidates = _candidates(inputs, error)
    found = backend.unique_many([inputs[p].keys for p in candidates], ordered=False) \
        if candidates else []
    joined = joined and len({table.dim for table in tables}) == 1
    items, indices = list(inputs), [None] * len(inputs)
    chosen = _distinct_choice(tables, inputs, candidates, found, itemsize, joined)
    for p, (distinct, inverse) in zip(candidates, found):
        if p in chosen:
            items[p] = PooledInput(distinct, None, int(distinct.shape[0]), None, "sum")
            indices[p] = inverse
    outputs, state = pooled_forward_many(
        runtime, tables, op, items, training, local_error=error, extra_checks=checks,
        key_limits=key_limits, checked_keys=[item.keys for item in inputs], inputs_checked=True)
    if not joined:
        return [CompactRows(rows, None if index is None else backend.narrow_indices(index))
                for rows, index in zip(outputs, indices)], CompactState(state, None)
    row_counts = np.array([int(rows.shape[0]) for rows in outputs], np.int64)
    rows = outputs[0] if len(outputs) == 1 else backend.join_rows(outputs)
    index = None
    if chosen:
        starts = part_starts(row_counts)
        index = backend.narrow_indices(backend.join_keys(indices, starts))
    return JoinedRows(rows, index, row_counts), CompactState(state, row_counts)


def _distinct_choice(tables, inputs, candidates, found, itemsize, joined):
    """The positions that cross as distinct rows: each where that pays, or (joined) all of them
    where every table may and the sum pays."""
    sizes = [(int(distinct.shape[0]), int(inputs[p].keys.shape[0]),
              int(inputs[p].num_segments), tables[p].dim)
             for p, (distinct, _) in zip(candidates, found)]
    if not joined:
        return {p for p, size in zip(candidates, sizes) if distinct_pays(*size, itemsize)}
    if len(candidates) < len(inputs):
        return set()
    total = [sum(size[i] for size in sizes) for i in range(3)]
    return set(candidates) if distinct_pays(*total, tables[0].dim, itemsize) else set()


def compact_keyed_forward(runtime, tables, op, item, training, key_limits=None, itemsize=4):
    """Collective. The joined form of a KeyedInput's lookup (tables of one dim): where the
    tables pass as one unit of dense tables, the keys are de-duplicated once for all of them
    (keyed.keyed_distinct_forward). Returns (JoinedRows: distinct rows and int32 indices with
    row_counts None, or the pooled rows with row_counts the tables' num_segments; the state
    compact_backward_many takes)."""
    dim = tables[0].dim

    def pays(distinct, keys, segments):
        return distinct_pays(distinct, keys, segments, dim, itemsize)

    rows, inverse, state = keyed_distinct_forward(runtime, tables, op, item, training,
                                                  key_limits, pays)
    if inverse is None:
        counts = np.asarray(item.num_segments, np.int64).reshape(-1)
        return JoinedRows(rows, None, counts), CompactState(state, None, True)
    return (JoinedRows(rows, runtime.backend.narrow_indices(inverse), None),
            CompactState(state, None, True))


def compact_backward_many(runtime, tables, op, state, grads_list):
    """Collective. state: compact_forward_many's; grads_list: per table float32 gradients
    shaped like its rows, or (joined) one [sum r_t, dim]. Returns pooled_backward_many's per
    table (values, rows)."""
    if state.keyed:
        values, rows, counts = keyed_backward(runtime, tables, op, state.pooling, grads_list[0],
                                              rows_per_table=True, bounded=False)
        starts = cut_points(counts)
        return list(zip(runtime.backend.row_views(values, starts), rows))
    if state.row_counts is not None:
        grads = runtime.backend.asarray(grads_list[0])
        if len(grads.shape) == 2 and int(grads.shape[0]) == int(state.row_counts.sum()):
            starts = cut_points(state.row_counts)
            grads_list = runtime.backend.row_views(grads, starts)
        else:  # pooled_backward_many reports the mismatch on every rank
            grads_list = [grads] * len(tables)
    return pooled_backward_many(runtime, tables, op, state.pooling, grads_list, bounded=False)
