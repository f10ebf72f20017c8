"""DeepRec's EmbeddingVariable (tf.get_embedding_variable) on sok1x's engine (DESIGN D12).

DeepRec's EmbeddingVariable is a hash table of [embedding_dim] vectors that grows as keys come;
here it is a sok1x.DynamicVariable of var_type "hbm" (grows, never evicts, as an
EmbeddingVariable without an evict option): a key's row lives on rank hash(key) % world_size,
gets its initial value on first sight, and the table goes to group_embedding_lookup_sparse
(one fused lookup with the group's other tables) and to the program's own optimizer, with no
OptimizerScope, as DeepRec's programs use it. No second table or optimizer: the DynamicVariable's.

DeepRec's option classes (EmbeddingVariableOption, InitializerOption, StorageOption, the
filters and evictions) are here with DeepRec's signatures, so a program builds them as it
does; get_embedding_variable takes the options sok1x honours and refuses the others with a
ValueError naming the variable and the option, before anything is made.
"""
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import tf1

_EV_ATTR = "_sok1x_embedding_variable"


class InitializerOption(object):
    """DeepRec's tf.InitializerOption. initializer: the rows' initializer (it wins over
    get_embedding_variable's). default_value_dim, default_value_no_permission: how DeepRec
    draws and filters initial values; sok1x draws a key's initial value from the initializer's
    distribution by key, so they do not change it."""

    def __init__(self, initializer=None, default_value_dim=4096, default_value_no_permission=.0):
        self.initializer = initializer
        self.default_value_dim = default_value_dim
        self.default_value_no_permission = default_value_no_permission


class StorageOption(object):
    """DeepRec's tf.StorageOption (multi-tier storage). sok1x keeps the rows in its engine:
    only storage_type=None (DeepRec's default) is taken."""

    def __init__(self, storage_type=None, storage_path=None, storage_size=None,
                 cache_strategy=None, layout=None):
        self.storage_type = storage_type
        self.storage_path = storage_path
        self.storage_size = storage_size
        self.cache_strategy = cache_strategy
        self.layout = layout


class EmbeddingVariableOption(object):
    """DeepRec's tf.EmbeddingVariableOption. ht_type, ht_partition_num: DeepRec's hash table
    kind and its lock shards (sok1x's own table stands in; ignored). evict_option,
    filter_option, ckpt: must be None (refused by get_embedding_variable otherwise).
    storage_option: a StorageOption; init_option: an InitializerOption."""

    def __init__(self, ht_type="", ht_partition_num=1000, evict_option=None, ckpt=None,
                 filter_option=None, storage_option=None, init_option=None):
        self.ht_type = ht_type
        self.ht_partition_num = ht_partition_num
        self.evict = evict_option
        self.ckpt = ckpt
        self.filter_strategy = filter_option
        self.storage_option = storage_option if storage_option is not None else StorageOption()
        self.init = init_option if init_option is not None else InitializerOption()


class _Refused(object):
    """A DeepRec option that sok1x takes as a value but get_embedding_variable refuses."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class CounterFilter(_Refused):
    """DeepRec's tf.CounterFilter (feature admission by count): refused by
    get_embedding_variable."""


class CBFFilter(_Refused):
    """DeepRec's tf.CBFFilter (feature admission by a counting Bloom filter): refused by
    get_embedding_variable."""


class GlobalStepEvict(_Refused):
    """DeepRec's tf.GlobalStepEvict (eviction by steps since last update): refused by
    get_embedding_variable."""


class L2WeightEvict(_Refused):
    """DeepRec's tf.L2WeightEvict (eviction by L2 weight): refused by get_embedding_variable."""


def _refusals(ev_option, option_is_deeprecs, **arguments):
    """The (option, why) pairs of the arguments sok1x does not honour."""
    found = []
    unsupported_arguments = {
        "regularizer": "add the regularization to the loss yourself",
        "collections": "sok1x puts the variable in the global (and trainable) collections",
        "caching_device": "sok1x places the rows itself",
        "partitioner": "sok1x already spreads the keys over every rank (hash(key) % world_size)",
        "custom_getter": "sok1x makes the variable itself",
        "constraint": "sok1x's optimizer updates apply no constraint",
        "steps_to_live": "sok1x never evicts an EmbeddingVariable's keys",
        "init_data_source": "initialize from an initializer",
    }
    for name, why in sorted(unsupported_arguments.items()):
        if arguments.get(name) is not None:
            found.append((name, why))
    if not option_is_deeprecs:
        found.append(("ev_option", "expected a tf.EmbeddingVariableOption"))
        return found
    if ev_option.evict is not None:
        found.append(("ev_option.evict_option (%s)" % type(ev_option.evict).__name__,
                      "sok1x never evicts an EmbeddingVariable's keys"))
    if ev_option.filter_strategy is not None:
        found.append(("ev_option.filter_option (%s)" % type(ev_option.filter_strategy).__name__,
                      "sok1x admits every key (sok1x.DynamicVariable's filter_ratio is a "
                      "different, random, admission)"))
    if ev_option.ckpt is not None:
        found.append(("ev_option.ckpt", "sok1x's checkpoints carry the table as a Saver does"))
    if getattr(ev_option.storage_option, "storage_type", None) is not None:
        found.append(("ev_option.storage_option.storage_type",
                      "sok1x keeps the rows in its engine's memory"))
    return found


def _key_dtype(key_dtype, name):
    """tf.int64 or tf.int32; raises ValueError naming the variable otherwise."""
    try:
        dtype = tf1.as_dtype(key_dtype)
    except TypeError:
        dtype = None
    if dtype not in (tf1.int64, tf1.int32):
        raise ValueError("get_embedding_variable(%r): key_dtype must be tf.int64 or tf.int32, "
                         "got %r (hash string keys first, e.g. tf.strings.to_hash_bucket_fast)"
                         % (name, key_dtype))
    return dtype


def get_embedding_variable(name, embedding_dim, key_dtype=tf1.int64, value_dtype=None,
                           initializer=None, regularizer=None, trainable=True, collections=None,
                           caching_device=None, partitioner=None, validate_shape=True,
                           custom_getter=None, constraint=None, steps_to_live=None,
                           init_data_source=None, ev_option=None):
    """DeepRec's tf.get_embedding_variable: returns a sok1x.DynamicVariable (var_type "hbm")
    named `name`, of float32 [embedding_dim] rows keyed by key_dtype (tf.int64 or tf.int32),
    for group_embedding_lookup_sparse and the program's optimizer. initializer: a tf
    initializer (ev_option.init.initializer wins, as in DeepRec); None is DeepRec's
    tf.truncated_normal_initializer(). target_gpu is -1 (keys spread over every rank).

    Raises ValueError, naming the variable and the option, for what sok1x does not honour:
    regularizer, collections, caching_device, partitioner, custom_getter, constraint,
    steps_to_live, init_data_source, an evict, filter or ckpt option, a storage type, a key
    dtype other than int64/int32, a value dtype other than float32, a bad embedding_dim, or a
    name already made in this graph under the same variable scope (a scope with reuse gives
    that variable back, as tf.get_variable does); nothing is made then."""
    if not isinstance(name, str) or not name:
        raise ValueError("get_embedding_variable: name must be a non-empty string, got %r"
                         % (name,))
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
        raise ValueError("get_embedding_variable(%r): embedding_dim must be a positive int, "
                         "got %r" % (name, embedding_dim))
    dtype = _key_dtype(key_dtype, name)
    if value_dtype is not None and _as_dtype(value_dtype) != tf1.float32:
        raise ValueError("get_embedding_variable(%r): value_dtype must be float32 (sok1x "
                         "tables are float32), got %r" % (name, value_dtype))
    option = EmbeddingVariableOption() if ev_option is None else ev_option
    refused = _refusals(option, isinstance(option, EmbeddingVariableOption),
                        regularizer=regularizer, collections=collections,
                        caching_device=caching_device, partitioner=partitioner,
                        custom_getter=custom_getter, constraint=constraint,
                        steps_to_live=steps_to_live, init_data_source=init_data_source)
    if refused:
        raise ValueError("get_embedding_variable(%r): sok1x does not support %s"
                         % (name, "; ".join("%s (%s)" % pair for pair in refused)))
    made = per_graph(tf1.get_default_graph(), "embedding_variables", dict)
    scope = tf1.get_variable_scope()
    full_name = "%s/%s" % (scope.name, name) if scope.name else name
    if full_name in made:
        if scope.reuse:  # True or tf.AUTO_REUSE: DeepRec's variable scopes give it back
            return made[full_name]
        raise ValueError("get_embedding_variable(%r): an EmbeddingVariable %s already exists in "
                         "this graph (a variable_scope with reuse gives it back)"
                         % (name, full_name))
    if scope.reuse is True:
        raise ValueError("get_embedding_variable(%r): no EmbeddingVariable %s exists to reuse "
                         "(the variable_scope has reuse=True)" % (name, full_name))
    return _made(full_name, name, embedding_dim, dtype, initializer, trainable, option)


def _made(full_name, table_name, embedding_dim, key_dtype, initializer, trainable, option):
    """Makes the EmbeddingVariable `full_name` of this graph (checked options)."""
    from sok1x.v2.variables import DynamicVariable
    if option.init.initializer is not None:
        initializer = option.init.initializer
    if initializer is None:
        initializer = tf1.truncated_normal_initializer()
    with tf1.device(None):  # the engine holds the rows; the small handle goes where TF puts it
        variable = DynamicVariable(int(embedding_dim), initializer=initializer, var_type="hbm",
                                   name=table_name, key_type=key_dtype, trainable=trainable)
    setattr(variable, _EV_ATTR, full_name)
    per_graph(tf1.get_default_graph(), "embedding_variables", dict)[full_name] = variable
    return variable


def refused_options(ev_option):
    """The (option, why) pairs of `ev_option` (a tf.EmbeddingVariableOption or None) that sok1x
    does not honour."""
    option = EmbeddingVariableOption() if ev_option is None else ev_option
    return _refusals(option, isinstance(option, EmbeddingVariableOption))


def column_embedding_variable(full_name, embedding_dim, initializer, trainable, ev_option):
    """The EmbeddingVariable `full_name` (a variable scope path) of an embedding column over
    categorical_column_with_embedding, made on first use in this graph with its column's
    (checked) ev_option; the same one again after (a column looked up twice, shared columns).
    Its table is named `full_name` too."""
    graph = tf1.get_default_graph()
    made = per_graph(graph, "embedding_variables", dict)
    if full_name not in made:
        option = EmbeddingVariableOption() if ev_option is None else ev_option
        parent, _, base = full_name.rpartition("/")
        with graph.name_scope(parent + "/" if parent else None):  # absolute: named full_name
            _made(full_name, base, embedding_dim, tf1.int64, initializer, trainable, option)
    return made[full_name]


def _as_dtype(value_dtype):
    try:
        return tf1.as_dtype(value_dtype)
    except TypeError:
        return None  # refused below, naming the variable


def is_embedding_variable(value):
    """True for a variable made by get_embedding_variable."""
    return getattr(value, _EV_ATTR, None) is not None


def check_target_gpu(variable, where):
    """Raises ValueError where a program set an EmbeddingVariable's target_gpu to a rank: sok1x
    spreads its keys over every rank (DeepRec's target_gpu -1)."""
    if is_embedding_variable(variable) and getattr(variable, "target_gpu", -1) != -1:
        raise ValueError(
            "%s: the EmbeddingVariable %r has target_gpu=%r; sok1x spreads an "
            "EmbeddingVariable's keys over every rank (target_gpu=-1); to keep a table on one "
            "rank use sok1x.DynamicVariable(..., mode=\"localized:<rank>\")"
            % (where, getattr(variable, _EV_ATTR), variable.target_gpu))
