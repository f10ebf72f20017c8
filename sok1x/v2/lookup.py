"""sok1x.lookup_sparse (SOK's v2 lookup): tf.nn.embedding_lookup_sparse over sok1x variables,
several of them in one fused lookup that shares one exchange (DESIGN D11)."""
from sok1x.common.sparse_ids import ids_parts, weight_values
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.graph_ops import pooled_lookup_ops

_COMBINERS = ("sum", "mean")


def _as_list(value, count, what):
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError("sok1x.lookup_sparse: %d %s for %d variables" % (len(value), what,
                                                                             count))
        return list(value)
    return [value] * count


def lookup_sparse(params, sp_ids, sp_weights=None, combiners=None,
                  use_low_frequency_filter=False, name="sok1x_lookup_sparse"):
    """Returns the pooled embeddings of sok1x variables, as tf.nn.embedding_lookup_sparse.

    params: a sok1x.Variable / DynamicVariable (or v1 embedding variable), or a list of them;
    sp_ids: per variable a tf.SparseTensor or tf.RaggedTensor of int keys [batch, hotness];
    sp_weights: None, or per variable None or float weights of the ids' kind and shape;
    combiners: "sum" or "mean" per variable (default "sum"); use_low_frequency_filter: SOK's
    filter of new keys, for DynamicVariables: a key a table does not hold yet enters it with
    probability the variable's filter_ratio, else it gives a zero vector (counted in a mean's
    divisor) and no gradient (sok1x/engine/tables/admission.py). Returns float32 [batch, dim] per
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
        where = "sok1x.lookup_sparse: %s" % label
        keys, segment_ids, rows = ids_parts(ids, where)
        ratio = getattr(variable, "filter_ratio", None) if use_low_frequency_filter else None
        items.append(pooled_lookup_ops.TableInput(keys, segment_ids, rows,
                                                  weight_values(weight, ids, where), combiner,
                                                  ratio))
        tables.append(table)
        key_limits.append(getattr(variable, "num_rows", None))
    outputs = pooled_lookup_ops.pooled_lookup(tables, params, items, key_limits, name)
    return outputs[0] if single else outputs
