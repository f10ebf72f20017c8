"""DeepRec's GroupEmbedding lookup on stock TensorFlow (DESIGN D12, seed 002):
group_embedding_lookup_sparse looks up several tables together, under one of DeepRec's two
strategies, chosen by enable_distributed_strategy / enable_group_embedding (DeepRec's default,
without any call, is "localized"):

- "collective": every table in ONE fused sok1x lookup (one exchange), sharded over the ranks
  (model parallel). Tables are sok1x embedding variables or plain TensorFlow variables
  [vocab, dim]; a plain variable is sharded into a sok1x table that is its own values
  (plain_variables.py). The gradient reaches the user's optimizer as tf.IndexedSlices of the
  table's handle variable, so `optimizer.minimize(loss)` trains it with no OptimizerScope.
- "localized": plain variables are looked up on the rank's own device by TensorFlow over the
  variables themselves (data parallel: each rank holds every row, the program's optimizer
  trains them as stock TensorFlow does); sok1x variables among them still go through sok1x.
"""
import importlib
import importlib.util

from sok1x.common.handle_variable import create_graph_handle
from sok1x.common.sparse_ids import ids_parts, weight_values
from sok1x.deeprec import plain_variables
from sok1x.deeprec.embedding_variables import check_target_gpu
from sok1x.deeprec.variable_faces import is_plain_table
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.engine import runtime
from sok1x.graph_ops import embedding_ops, pooled_lookup_ops
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import is_partitioned_variable, tf1
from sok1x.optimizers.scope import mark_without_scope

COLLECTIVE, LOCALIZED = "collective", "localized"
STRATEGIES = (COLLECTIVE, LOCALIZED)
COMBINERS = ("sum", "mean")
# DeepRec's default strategy when the program enables none.
_strategy = [LOCALIZED]


def enable_distributed_strategy(strategy="collective", **init_options):
    """DeepRec's tf.config.experimental.enable_distributed_strategy: the strategy of the group
    lookups built from now on. "collective" brings sok1x up now (every rank must call it;
    sok1x.init's options may be passed), then Horovod where it is installed (hvd.init(), as
    DeepRec does: hvd.size() works right after), and shards the tables over the ranks;
    "localized" looks plain variables up on each rank's own device (data parallel). Raises
    ValueError for another strategy."""
    if strategy not in STRATEGIES:
        raise ValueError(
            "enable_distributed_strategy(strategy=%r): sok1x supports %s (DeepRec's "
            "GroupEmbedding strategies)" % (strategy, " and ".join(repr(s) for s in STRATEGIES)))
    if strategy == COLLECTIVE:
        runtime.init(**init_options)
        _bring_up_horovod()
    _strategy[0] = strategy


def _bring_up_horovod():
    """hvd.init() where horovod.tensorflow is installed, as DeepRec's collective strategy does
    (after sok1x, so MPI is already up with the thread support both need); idempotent."""
    try:
        found = importlib.util.find_spec("horovod.tensorflow") is not None
    except (ImportError, ValueError):  # a broken or half-installed horovod package
        found = False
    if found:
        importlib.import_module("horovod.tensorflow").init()


def enable_group_embedding(fusion_type="collective", **init_options):
    """DeepRec's older spelling, tf.config.experimental.enable_group_embedding (and
    tensorflow.python.framework.config.enable_group_embedding): fusion_type "localized" or
    "collective", as enable_distributed_strategy's strategy."""
    if fusion_type not in STRATEGIES:
        raise ValueError("enable_group_embedding(fusion_type=%r): sok1x supports %s"
                         % (fusion_type, " and ".join(repr(s) for s in STRATEGIES)))
    enable_distributed_strategy(fusion_type, **init_options)


def strategy():
    """The group lookups' strategy now: "localized" (DeepRec's default) or "collective"."""
    return _strategy[0]


def world_size():
    """The job's number of ranks, known before sok1x is up (MPI COMM_WORLD)."""
    if runtime.is_initialized():
        return runtime.get().size
    from sok1x.comm.process_group import import_mpi
    return import_mpi().COMM_WORLD.Get_size()


def table_handle(table_name, dim, vocabulary_size, init_spec, fill=None):
    """Returns the handle variable of a sharded table [vocabulary_size, dim] named table_name,
    creating it (and declaring the table) on first use in this graph; fill() runs when its
    initializer has made the shard."""
    handles = per_graph(tf1.get_default_graph(), "group_handles", dict)
    if table_name not in handles:
        capacity = -(-int(vocabulary_size) // world_size())
        table = embedding_ops.TableSpec(table_name, int(dim), max(capacity, 1), False, init_spec)
        handles[table_name] = mark_without_scope(create_graph_handle(table, fill))
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
    return plain_variables.handle_of(variable)


def shard_plain_variable(variable):
    """Returns the sok1x handle standing for the plain TF variable [vocab, dim] `variable`,
    creating it (and the sharded table that takes its rows from the variable) on first use."""
    return plain_variables.shard_plain_variable(variable, table_handle, unique_table_name)


# ---------------------------------------------------------------------------------------------

def _as_list(value):
    """A list of `value`'s entries; one non-list value is a list of one (as DeepRec takes it)."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_combiner(combiner, where):
    """Raises ValueError unless `combiner` is one DeepRec's group lookup has."""
    if combiner not in COMBINERS:
        raise ValueError("%s: combiner %r is not supported; DeepRec's group embedding combines by "
                         "%s" % (where, combiner, " or ".join(repr(c) for c in COMBINERS)))


def table_input(sp_ids, sp_weights, combiner, where="group_embedding_lookup_sparse"):
    """The fused op's TableInput of one table: ids [batch, max_ids] (SparseTensor or
    RaggedTensor, and weights of the same kind and indices, or None) pooled by `combiner` into
    batch rows."""
    keys, segment_ids, rows = ids_parts(sp_ids, where)
    return pooled_lookup_ops.TableInput(keys, segment_ids, rows,
                                        weight_values(sp_weights, sp_ids, where), combiner)


def _is_plain_variable(param):
    return table_of(param) is None and is_plain_table(param)


def _handle_of_param(param, index):
    """(handle, number of keys or None) of one entry of params."""
    if table_of(param) is not None:
        check_target_gpu(param, "group_embedding_lookup_sparse: params[%d]" % index)
        return param, getattr(param, "num_rows", None)
    if _is_plain_variable(param):
        return shard_plain_variable(param), int(param.get_shape()[0])
    raise TypeError("group_embedding_lookup_sparse: params[%d] must be a sok1x embedding "
                    "variable or a tf.Variable [vocabulary_size, dim] (partitioned or not), "
                    "got %r"
                    % (index, type(param).__name__))


def group_embedding_lookup_sparse(params, sp_ids, combiners, partition_strategy="mod",
                                  sp_weights=None, name=None):
    """DeepRec's tf.nn.group_embedding_lookup_sparse. Under the "collective" strategy every
    table is looked up in ONE fused sok1x lookup (one exchange); under "localized" (DeepRec's
    default) plain variables are looked up by TensorFlow on this rank, sok1x variables in one
    fused sok1x lookup. params: list of sok1x embedding variables or tf.Variables
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
    for index, combiner in enumerate(combiners):
        check_combiner(combiner, "group_embedding_lookup_sparse: combiners[%d]" % index)
    with tf1.name_scope(name, "group_embedding_lookup_sparse"):
        if strategy() == LOCALIZED:
            local = [i for i, p in enumerate(params) if _is_plain_variable(p)]
        else:
            local = []
        outputs = [None] * len(params)
        for index in local:
            outputs[index] = localized_lookup(params[index], sp_ids[index], weights[index],
                                              combiners[index], index)
        shared = [i for i in range(len(params)) if i not in local]
        if shared:
            vectors = _fused_lookup([params[i] for i in shared], [sp_ids[i] for i in shared],
                                    [weights[i] for i in shared], [combiners[i] for i in shared],
                                    shared, name or "group_embedding_lookup")
            for index, vector in zip(shared, vectors):
                outputs[index] = vector
        return outputs


def _fused_lookup(params, sp_ids, weights, combiners, positions, name):
    """One fused sok1x lookup of the tables `params` (at `positions` of the call)."""
    items = []
    for index, ids, weight, combiner in zip(positions, sp_ids, weights, combiners):
        where = "group_embedding_lookup_sparse: sp_ids[%d]" % index
        if ids is None:
            raise TypeError("%s is None" % where)
        items.append(table_input(ids, weight, combiner, where))
    # Only once every input is known good: a plain variable's table is made here.
    handles_and_limits = [_handle_of_param(p, i) for i, p in zip(positions, params)]
    handles = [handle for handle, _ in handles_and_limits]
    key_limits = [limit for _, limit in handles_and_limits]
    with tf1.control_dependencies(plain_variables.rows_from_variable(handles)):
        return pooled_lookup_ops.pooled_lookup([table_of(h) for h in handles], handles, items,
                                               key_limits, name)


def localized_lookup(variable, ids, weights, combiner, index=0):
    """The "localized" lookup of one plain variable: TensorFlow's gather and segment sums over
    the variable itself on this rank (its gradient is TensorFlow's IndexedSlices of the
    variable; a PartitionedVariable is read as tf.nn.embedding_lookup's default "mod" reads
    it), pooled as the collective path pools: every row of the batch, zeros for a row
    without ids, "mean" dividing by the row's weight sum."""
    where = "group_embedding_lookup_sparse: sp_ids[%d]" % index
    if ids is None:
        raise TypeError("%s is None" % where)
    keys, segment_ids, rows = ids_parts(ids, where)
    weight = weight_values(weights, ids, where)
    if is_partitioned_variable(variable):
        vectors = tf1.nn.embedding_lookup(list(variable), keys, partition_strategy="mod")
    else:
        vectors = tf1.gather(variable, keys)
    if weight is not None:
        vectors = vectors * tf1.expand_dims(tf1.cast(weight, vectors.dtype), 1)
    pooled = tf1.math.unsorted_segment_sum(vectors, segment_ids, rows)
    if combiner == "mean":
        counts = tf1.ones_like(keys, tf1.float32) if weight is None else weight
        totals = tf1.math.unsorted_segment_sum(counts, segment_ids, rows)
        totals = tf1.where(tf1.equal(totals, 0.0), tf1.ones_like(totals), totals)
        pooled = pooled / tf1.expand_dims(tf1.cast(totals, pooled.dtype), 1)
    return pooled
