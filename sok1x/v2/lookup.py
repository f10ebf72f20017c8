"""sok1x.lookup_sparse (SOK's v2 lookup): tf.nn.embedding_lookup_sparse over sok1x variables,
several of them in one fused lookup that shares one exchange (DESIGN D11)."""
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.graph_ops import pooled_lookup_ops
from sok1x.graph_ops.tf_compat import tf1

_COMBINERS = ("sum", "mean")


def _as_list(value, count, what):
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError("sok1x.lookup_sparse: %d %s for %d variables" % (len(value), what,
                                                                             count))
        return list(value)
    return [value] * count


def _ids_parts(ids, label):
    """Returns (keys, segment ids, number of rows) of SparseTensor or RaggedTensor ids."""
    if isinstance(ids, tf1.SparseTensor):
        segment_ids = tf1.cast(ids.indices[:, 0], tf1.int64)
        return ids.values, segment_ids, tf1.cast(ids.dense_shape[0], tf1.int64)
    if isinstance(ids, tf1.RaggedTensor):
        if ids.ragged_rank != 1:
            raise ValueError("sok1x.lookup_sparse: %s: RaggedTensor ids must be [batch, (hotness)],"
                             " got ragged_rank %d" % (label, ids.ragged_rank))
        return (ids.values, tf1.cast(ids.value_rowids(), tf1.int64),
                tf1.cast(ids.nrows(), tf1.int64))
    raise TypeError("sok1x.lookup_sparse: %s: ids must be a tf.SparseTensor or tf.RaggedTensor, "
                    "got %r" % (label, type(ids).__name__))


def _weight_values(weights, ids, label):
    """The float32 [nnz] weights of `ids`, or None."""
    if weights is None:
        return None
    if isinstance(ids, tf1.SparseTensor) != isinstance(weights, tf1.SparseTensor):
        raise TypeError("sok1x.lookup_sparse: %s: the weights must be of the ids' kind (%s), "
                        "got %r" % (label, type(ids).__name__, type(weights).__name__))
    values = weights.values
    if values.dtype != tf1.float32:
        values = tf1.cast(values, tf1.float32)
    return values


def lookup_sparse(params, sp_ids, sp_weights=None, combiners=None, name="sok1x_lookup_sparse"):
    """Returns the pooled embeddings of sok1x variables, as tf.nn.embedding_lookup_sparse.

    params: a sok1x.Variable / DynamicVariable (or v1 embedding variable), or a list of them;
    sp_ids: per variable a tf.SparseTensor or tf.RaggedTensor of int keys [batch, hotness];
    sp_weights: None, or per variable None or float weights of the ids' kind and shape;
    combiners: "sum" or "mean" per variable (default "sum"). Returns float32 [batch, dim] per
    variable (a list when params is a list); a row without keys gives zeros. All variables share
    one exchange. Bad keys (negative, beyond a Variable's rows, wrong dtype) or weights that do
    not match their ids raise InvalidInputError on every rank in that step, changing nothing."""
    single = not isinstance(params, (list, tuple))
    params = [params] if single else list(params)
    count = len(params)
    if count == 0:
        raise ValueError("sok1x.lookup_sparse: no variables given")
    sp_ids = [sp_ids] if single else _as_list(sp_ids, count, "ids")
    weights = _as_list(sp_weights, count, "weights")
    combiners = _as_list(combiners or "sum", count, "combiners")
    tables, items, key_limits = [], [], []
    for variable, ids, weight, combiner in zip(params, sp_ids, weights, combiners):
        table = table_of(variable)
        label = getattr(variable, "table_name", getattr(variable, "name", repr(variable)))
        if table is None:
            raise TypeError("sok1x.lookup_sparse: %s is not a sok1x variable (sok1x.Variable or "
                            "sok1x.DynamicVariable)" % label)
        if combiner not in _COMBINERS:
            raise ValueError("sok1x.lookup_sparse: %s: combiner must be 'sum' or 'mean', got %r"
                             % (label, combiner))
        keys, segment_ids, rows = _ids_parts(ids, label)
        items.append(pooled_lookup_ops.TableInput(keys, segment_ids, rows,
                                                  _weight_values(weight, ids, label), combiner))
        tables.append(table)
        key_limits.append(getattr(variable, "num_rows", None))
    outputs = pooled_lookup_ops.pooled_lookup(tables, params, items, key_limits, name)
    return outputs[0] if single else outputs
