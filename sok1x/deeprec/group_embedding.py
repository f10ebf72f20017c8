"""DeepRec's GroupEmbedding lookup on stock TensorFlow (DESIGN D12, seed 002):
group_embedding_lookup_sparse looks up several tables in ONE fused lookup (one exchange), and
enable_distributed_strategy brings sok1x up.

Tables can be sok1x embedding variables (the handle variables of sok1x's layers and variables)
or plain TensorFlow variables [vocab, dim]. A plain variable is sharded by sok1x on first use:
a sok1x table of the same shape (row i on rank i % world_size, as sok1x.Variable) is created
beside it, with a small trainable handle variable recorded on it (`handle_of(variable)`). Lookups,
gradients and optimizer updates go to that table; the gradient reaches the user's optimizer as
tf.IndexedSlices of the handle, so `optimizer.minimize(loss)` trains it (no OptimizerScope is
needed for these handles: DeepRec programs know nothing of it). The TensorFlow variable itself
keeps its initial value and gets no gradient.

The table's initial values come from the variable's initializer, drawn by sok1x's counter-based
generator (the same for a row on any number of ranks, DESIGN D10): constant (zeros, ones, a
scalar), random_uniform, random_normal and truncated_normal initializers are recognised from
the variable's initial-value graph (glorot_uniform is a uniform, glorot_normal a truncated
normal). They are the same distributions as TensorFlow's, not the same numbers. A variable with
another initial value (an array, say) is an error naming it: create a sok1x variable instead.
"""
import numpy as np

from sok1x.common.handle_variable import create_graph_handle
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.engine import runtime
from sok1x.errors import Sok1xError
from sok1x.graph_ops import embedding_ops, pooled_lookup_ops
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import tf1
from sok1x.backend.random_init import make_spec

SUPPORTED_STRATEGY = "collective"
COMBINERS = ("sum", "mean")
_HANDLE_ATTR = "_sok1x_group_handle"
# Handles the group front doors make: native optimizers update them without OptimizerScope.
WITHOUT_SCOPE_ATTR = "_sok1x_without_optimizer_scope"


def enable_distributed_strategy(strategy="collective", **init_options):
    """DeepRec's tf.config.experimental.enable_distributed_strategy: brings sok1x up now (every
    rank must call it; sok1x.init's options may be passed). Raises ValueError for a strategy
    other than "collective", the only one DeepRec's GroupEmbedding distributes with."""
    if strategy != SUPPORTED_STRATEGY:
        raise ValueError(
            "enable_distributed_strategy(strategy=%r): sok1x supports only strategy=%r (SOK's "
            "model-parallel embeddings over every rank)" % (strategy, SUPPORTED_STRATEGY))
    runtime.init(**init_options)


def world_size():
    """The job's number of ranks, known before sok1x is up (MPI COMM_WORLD)."""
    if runtime.is_initialized():
        return runtime.get().size
    from sok1x.comm.process_group import import_mpi
    return import_mpi().COMM_WORLD.Get_size()


def mark_without_scope(handle):
    """Lets supported native optimizers update `handle` outside sok1x.OptimizerScope."""
    setattr(handle, WITHOUT_SCOPE_ATTR, True)
    return handle


def table_handle(table_name, dim, vocabulary_size, init_spec):
    """Returns the handle variable of a sharded table [vocabulary_size, dim] named table_name,
    creating it (and declaring the table) on first use in this graph."""
    handles = per_graph(tf1.get_default_graph(), "group_handles", dict)
    if table_name not in handles:
        capacity = -(-int(vocabulary_size) // world_size())
        table = embedding_ops.TableSpec(table_name, int(dim), max(capacity, 1), False, init_spec)
        handles[table_name] = mark_without_scope(create_graph_handle(table))
    return handles[table_name]


def unique_table_name(base):
    """Returns `base`, or base_N, a name no sok1x table of this graph has yet."""
    taken = per_graph(tf1.get_default_graph(), "group_handles", dict)
    graph = tf1.get_default_graph()
    name, count = base, 0
    while name in taken or _op_exists(graph, name):
        count += 1
        name = "%s_%d" % (base, count)
    return name


def _op_exists(graph, name):
    try:
        graph.get_operation_by_name(name)
        return True
    except KeyError:
        return False


def handle_of(variable):
    """Returns the sok1x handle variable created beside the plain TF variable `variable` by a
    group lookup, or None."""
    return getattr(variable, _HANDLE_ATTR, None)


# ---------------------------------------------------------------------------------------------
# The initializer of a plain variable, read from its initial-value graph.

def _static(tensor):
    """The constant value of `tensor` (a difference of constants included: random_uniform's
    range), or None."""
    if tensor.op.type == "Sub":
        a, b = (_static(t) for t in tensor.op.inputs)
        return None if a is None or b is None else a - b
    value = tf1.get_static_value(tensor)
    return None if value is None else np.asarray(value, dtype=np.float64)


def _scalar(tensor):
    value = _static(tensor)
    if value is None or value.size == 0 or not np.all(value == value.reshape(-1)[0]):
        return None
    return float(value.reshape(-1)[0])


def _affine(tensor):
    """Matches x * scale + shift (either factor order, shift or scale may be absent); returns
    (x, scale, shift) with constants as floats, or None."""
    op, scale, shift = tensor.op, 1.0, 0.0
    if op.type in ("Add", "AddV2"):
        for x, c in (op.inputs, op.inputs[::-1]):
            if _scalar(c) is not None:
                shift, tensor, op = _scalar(c), x, x.op
                break
        else:
            return None
    if op.type == "Mul":
        for x, c in (op.inputs, op.inputs[::-1]):
            if _scalar(c) is not None:
                return x, _scalar(c), shift
        return None
    return tensor, scale, shift


_RANDOM_OPS = {"RandomUniform": "uniform", "RandomStandardNormal": "normal",
               "TruncatedNormal": "truncated_normal"}


def spec_of_variable(variable):
    """Returns the InitializerSpec matching `variable`'s initializer; raises Sok1xError naming
    the variable when it is not one sok1x can draw."""
    initial = getattr(variable, "initial_value", None)
    constant = None if initial is None else _scalar(initial)
    if constant is not None:
        return make_spec("constant", constant)
    matched = None if initial is None else _affine(tf1.convert_to_tensor(initial))
    if matched is not None:
        random, scale, shift = matched
        kind = _RANDOM_OPS.get(random.op.type)
        if kind is not None:
            seed = random.op.get_attr("seed2") if random.op.get_attr("seed") else 0
            if kind == "uniform":
                return make_spec("uniform", shift, shift + scale, seed)
            if scale > 0:
                return make_spec(kind, shift, scale, seed)
    raise Sok1xError(
        "%s: sok1x shards a plain TensorFlow variable into a table whose rows it draws itself, "
        "and it can only draw constant, random_uniform, random_normal and truncated_normal "
        "initial values; this variable's initial value is something else (an array?). Give it "
        "one of those initializers, or create a sok1x variable for it."
        % variable.name)


def shard_plain_variable(variable):
    """Returns the sok1x handle standing for the plain TF variable [vocab, dim] `variable`,
    creating it (and the sharded table) on first use."""
    handle = handle_of(variable)
    if handle is not None:
        return handle
    shape = variable.shape
    if shape.ndims != 2 or not shape.is_fully_defined():
        raise ValueError("group_embedding_lookup_sparse: %s has shape %s; a table must be "
                         "[vocabulary_size, dim] with both known" % (variable.name, shape))
    name = unique_table_name(variable.op.name + "/sok1x_shards")
    handle = table_handle(name, int(shape[1]), int(shape[0]), spec_of_variable(variable))
    setattr(variable, _HANDLE_ATTR, handle)
    return handle


# ---------------------------------------------------------------------------------------------

def _as_list(value):
    """A list of `value`'s entries; one non-list value is a list of one (as DeepRec takes it)."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _as_sparse(value, what, index):
    """A tf.SparseTensor of `value` (RaggedTensor rows become SparseTensor rows), or None."""
    if value is None or isinstance(value, tf1.SparseTensor):
        return value
    if isinstance(value, tf1.RaggedTensor):
        if value.ragged_rank != 1:
            raise ValueError("group_embedding_lookup_sparse: %s[%d] is a RaggedTensor of ragged "
                             "rank %d; it must be [batch, (ids)]" % (what, index,
                                                                    value.ragged_rank))
        return value.to_sparse()
    raise TypeError("group_embedding_lookup_sparse: %s[%d] must be a tf.SparseTensor or "
                    "tf.RaggedTensor, got %r" % (what, index, type(value).__name__))


def check_combiner(combiner, where):
    """Raises ValueError unless `combiner` is one DeepRec's group lookup has."""
    if combiner not in COMBINERS:
        raise ValueError("%s: combiner %r is not supported; DeepRec's group embedding combines by "
                         "%s" % (where, combiner, " or ".join(repr(c) for c in COMBINERS)))


def _check_ids(sp_ids, index):
    if sp_ids.values.dtype not in (tf1.int64, tf1.int32):
        raise TypeError("group_embedding_lookup_sparse: sp_ids[%d] holds %s; ids must be int64 "
                        "or int32" % (index, sp_ids.values.dtype.name))
    rank = sp_ids.dense_shape.shape[0]
    if rank is not None and int(rank) != 2:
        raise ValueError("group_embedding_lookup_sparse: sp_ids[%d] has rank %d; it must be "
                         "[batch, max_ids] (rank 2)" % (index, int(rank)))


def table_input(sp_ids, sp_weights, combiner):
    """The fused op's TableInput of one table: SparseTensor ids [batch, max_ids] (and weights
    with the same indices, or None) pooled by `combiner` into batch rows."""
    weights = None if sp_weights is None else tf1.cast(sp_weights.values, tf1.float32)
    return pooled_lookup_ops.TableInput(
        sp_ids.values, tf1.cast(sp_ids.indices[:, 0], tf1.int64),
        tf1.cast(sp_ids.dense_shape[0], tf1.int64), weights, combiner)


def _handle_of_param(param, index):
    """(handle, number of keys or None) of one entry of params."""
    if table_of(param) is not None:
        return param, getattr(param, "num_rows", None)
    if hasattr(param, "initial_value") and hasattr(param, "op"):
        return shard_plain_variable(param), int(param.shape[0])
    raise TypeError("group_embedding_lookup_sparse: params[%d] must be a sok1x embedding "
                    "variable or a tf.Variable [vocabulary_size, dim], got %r"
                    % (index, type(param).__name__))


def group_embedding_lookup_sparse(params, sp_ids, combiners, partition_strategy="mod",
                                  sp_weights=None, name=None):
    """DeepRec's tf.nn.group_embedding_lookup_sparse: looks up every table in ONE fused sok1x
    lookup (one exchange). params: list of sok1x embedding variables or tf.Variables
    [vocab, dim]; sp_ids: list of tf.SparseTensor [batch, max_ids] or tf.RaggedTensor
    [batch, (ids)] of int ids, one per table; combiners: list of "sum" | "mean"; sp_weights:
    None, or a list (entries may be None) of float SparseTensors (or RaggedTensors) with the
    same indices as the ids. A single value stands for a list of one, as in DeepRec. Later
    DeepRec versions put sp_weights before partition_strategy: a list in the fourth place is
    taken as sp_weights. Returns a list of float32
    [batch, dim_t] tensors, each as tf.nn.embedding_lookup_sparse(param, ids, weights, combiner)
    computes it, except that a row with no ids gives zeros and every row of dense_shape[0] is
    returned. Raises ValueError / TypeError for a partition_strategy other than "mod", lists of
    different lengths, a combiner other than sum or mean, ids that are not an int SparseTensor."""
    if isinstance(partition_strategy, (list, tuple)) and (
            sp_weights is None or isinstance(sp_weights, str)):
        partition_strategy, sp_weights = sp_weights or "mod", partition_strategy
    if partition_strategy != "mod":
        raise ValueError("group_embedding_lookup_sparse: partition_strategy=%r is not supported; "
                         "sok1x shards tables by 'mod' (row i on rank i %% world_size)"
                         % (partition_strategy,))
    params, sp_ids, combiners = _as_list(params), _as_list(sp_ids), _as_list(combiners)
    weights = [None] * len(params) if sp_weights is None else _as_list(sp_weights)
    lengths = {"params": len(params), "sp_ids": len(sp_ids), "combiners": len(combiners),
               "sp_weights": len(weights)}
    if len(set(lengths.values())) != 1:
        raise ValueError("group_embedding_lookup_sparse: params, sp_ids, combiners and sp_weights "
                         "must have one entry per table; got lengths %s" % lengths)
    if not params:
        raise ValueError("group_embedding_lookup_sparse: params is empty")
    handles, items, key_limits = [], [], []
    for index, (param, ids, weight, combiner) in enumerate(zip(params, sp_ids, weights,
                                                               combiners)):
        check_combiner(combiner, "group_embedding_lookup_sparse: combiners[%d]" % index)
        ids = _as_sparse(ids, "sp_ids", index)
        if ids is None:
            raise TypeError("group_embedding_lookup_sparse: sp_ids[%d] is None" % index)
        _check_ids(ids, index)
        weight = _as_sparse(weight, "sp_weights", index)
        handle, key_limit = _handle_of_param(param, index)
        handles.append(handle)
        key_limits.append(key_limit)
        items.append(table_input(ids, weight, combiner))
    with tf1.name_scope(name, "group_embedding_lookup_sparse"):
        return pooled_lookup_ops.pooled_lookup([table_of(h) for h in handles], handles, items,
                                               key_limits, name or "group_embedding_lookup")
