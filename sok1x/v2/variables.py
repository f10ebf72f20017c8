"""SOK's v2 variables (DESIGN D6, D11): sok1x.Variable, a dense table spread over the ranks, and
sok1x.DynamicVariable, a hash table.

Each returns the table's handle variable (sok1x/common/handle_variable.py): a small trainable
TensorFlow variable tagged as a sok1x embedding variable, so it is in trainable_variables, gets
IndexedSlices gradients from sok1x.lookup_sparse, is what GradientTape.gradient and
split_embedding_variable_from_others see, and goes to sok1x.OptimizerWrapper or, inside
sok1x.OptimizerScope, to a native TensorFlow optimizer. The table itself lives in the engine;
`handle.table_name` names it (sok1x.dump / sok1x.load find it by that name).

    sok1x.Variable(value, mode="distributed")   global row i on rank i % world_size, local row
                                                i // world_size
    sok1x.Variable(value, mode="localized:r")   every row on rank r
    sok1x.DynamicVariable(dimension, ...)       key on rank hash(key) % world_size, rows found
                                                or inserted on first sight
"""
import numpy as np

from sok1x.backend.random_init import make_spec
from sok1x.common.handle_variable import create_handle
from sok1x.engine import api, runtime
from sok1x.engine.tables import admission
from sok1x.engine.tables import shard_rows
from sok1x.graph_ops import init_ops
from sok1x.graph_ops.tf_compat import tf1
from sok1x.common.initializers import spec_from_initializer
from sok1x.optimizers.scope import mark_without_scope
from sok1x.v2 import shard_access
from sok1x.v2.shard_faces import show_as_sok
from sok1x.v2.sok_names import attach_reads

VARIABLE, DYNAMIC = "variable", "dynamic"
_eager_names = {}


def _table_name(name, default):
    """A table name unique in the graph (eagerly: in the process), the same on every rank when
    every rank creates its variables in the same order."""
    base = name or default
    if not tf1.executing_eagerly():
        return tf1.get_default_graph().unique_name(base, mark_as_used=False)
    count = _eager_names.get(base, 0)
    _eager_names[base] = count + 1
    return base if count == 0 else "%s_%d" % (base, count)


def _parse_mode(mode, name):
    """Returns the engine placement of a Variable mode; raises ValueError naming the variable."""
    if mode in (None, "distributed"):
        return "mod"
    if isinstance(mode, str) and mode.startswith("localized:"):
        rank = mode.split(":", 1)[1]
        if rank.isdigit():
            if int(rank) >= _world_size_hint():
                raise ValueError("sok1x.Variable %s: mode %r names rank %s, but the job has %d "
                                 "ranks" % (name, mode, rank, _world_size_hint()))
            return ("rank", int(rank))
    raise ValueError("sok1x.Variable %s: mode must be 'distributed' or 'localized:<rank>', got %r"
                     % (name, mode))


def _check_float32(dtype, name):
    if dtype is not None and tf1.as_dtype(dtype) != tf1.float32:
        raise ValueError("sok1x variable %s: only float32 values are supported, got dtype %r"
                         % (name, dtype))


def _as_array(initial_value, name):
    """The initial value as a NumPy array if the caller already holds it whole (an array, a
    list, an eager or constant tensor), else None."""
    if isinstance(initial_value, np.ndarray) or isinstance(initial_value, (list, tuple)):
        return np.asarray(initial_value)
    if isinstance(initial_value, (tf1.Tensor, tf1.Variable)) or hasattr(initial_value, "numpy"):
        if hasattr(initial_value, "numpy") and tf1.executing_eagerly():
            return np.asarray(initial_value.numpy())
        value = tf1.get_static_value(initial_value)
        if value is None:
            return None  # a computed tensor: its rows are taken when the initializer runs
        return np.asarray(value)
    return None


def _computed(initial_value):
    """True for a graph tensor whose value is only known when the graph runs."""
    return isinstance(initial_value, (tf1.Tensor, tf1.Variable)) and not tf1.executing_eagerly()


def _check_rows(array, name):
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError("sok1x.Variable %s: the initial value must be [rows, dim], got shape %s"
                         % (name, list(array.shape)))


def Variable(initial_value, dtype=None, mode="distributed", name=None, trainable=True,  # noqa: N802
             shape=None, **kwargs):
    """Returns a sok1x.Variable's handle: a dense table of [rows, dim] float32 values.

    initial_value: a NumPy array (or list, or tensor, computed ones included) [rows, dim], of
    which each rank keeps only its own rows (a computed tensor is evaluated by the initializer
    on every rank); or an initializer (a tf.keras / tf.compat.v1 initializer, its name,
    or a number) with shape=[rows, dim], drawn per row by sok1x's counter-based generator so no
    rank ever holds the whole table. mode: "distributed" (global row i on rank i % world_size at
    local row i // world_size) or "localized:r" (the whole table on rank r). Raises ValueError
    for a bad mode, dtype, shape or initializer."""
    label = name or "sok_variable"
    _check_float32(dtype, label)
    placement = _parse_mode(mode, label)
    if callable(initial_value) and not hasattr(initial_value, "get_config"):
        initial_value = initial_value()  # a function returning the value, as tf.Variable takes
    array = _as_array(initial_value, label)
    computed = None
    if array is None and _computed(initial_value):
        computed = tf1.convert_to_tensor(initial_value)
        if computed.shape.ndims != 2 or not computed.shape.is_fully_defined():
            raise ValueError("sok1x.Variable %s: a computed initial value needs a known shape "
                             "[rows, dim], got %s" % (label, computed.shape))
        _check_float32(computed.dtype, label)
        num_rows, dim = (int(d) for d in computed.shape)
        spec = make_spec("constant", 0.0)
    elif array is not None:
        _check_rows(array, label)
        num_rows, dim = array.shape
        array = array.astype(np.float32, copy=False)
        spec = make_spec("constant", 0.0)
    else:
        if shape is None or len(shape) != 2:
            raise ValueError("sok1x.Variable %s: an initializer needs shape=[rows, dim], got %r"
                             % (label, shape))
        num_rows, dim = (int(s) for s in shape)
        spec = spec_from_initializer(initial_value, label)
    if placement == "mod":
        capacity = max(1, -(-num_rows // _world_size_hint()))
    else:
        capacity = num_rows
    table_name = _table_name(name, "sok_variable")
    _eager_bring_up()

    fill, fill_inputs = None, ()
    if computed is not None:
        # Every rank evaluates the tensor in its initializer and keeps only its own rows.
        def fill(value):
            rank, size = _world_hint()
            keys = shard_rows.owned_keys(placement, num_rows, rank, size)
            shard_rows.assign(table_name, keys, np.asarray(value, np.float32)[keys],
                              key_limit=num_rows)
        fill_inputs = (computed,)
    elif array is not None:
        # Only this rank's rows are kept (a copy of them), not the caller's whole array.
        rank, size = _world_hint()
        keys = shard_rows.owned_keys(placement, num_rows, rank, size)
        local_rows = array[keys]
        del array

        def fill():
            shard_rows.assign(table_name, keys, local_rows, key_limit=num_rows)

    handle = create_handle(None, table_name, dim, capacity, False, spec, placement=placement,
                           fill=fill, trainable=trainable, fill_inputs=fill_inputs)
    _v2_defaults()
    mark_without_scope(handle)  # SOK v2 programs apply native optimizers to it directly
    _describe(handle, table_name, VARIABLE, dim, num_rows)
    handle.rows_held = shard_rows.owned_count(placement, num_rows, *_world_hint())
    attach_reads(handle, lambda: shard_access.export(handle)[1])
    show_as_sok(handle)
    handle.mode = mode or "distributed"
    handle.target_gpu = _target_gpu(placement)
    return handle


def _target_gpu(placement):
    """SOK's target_gpu: the rank holding every row of a "localized:r" variable, -1 for one
    spread over all ranks."""
    return placement[1] if isinstance(placement, tuple) else -1


def _v2_defaults():
    """SOK v2 programs may never call sok.init(): in graph mode their variables bring sok1x up
    with its defaults (init_ops.allow_default_init)."""
    if not tf1.executing_eagerly():
        init_ops.allow_default_init()


def _eager_bring_up():
    """Executing eagerly, a v2 variable made before any sok.init() brings sok1x up with its
    defaults at once (collective: every rank makes its variables in the same order)."""
    if tf1.executing_eagerly() and not runtime.is_initialized():
        runtime.init()


def _world_hint():
    """(rank, world size) of this process: the runtime's once up, else MPI COMM_WORLD's, from
    which the runtime takes them (DESIGN D4)."""
    if runtime.is_initialized():
        rt = runtime.get()
        return rt.rank, rt.size
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _world_size_hint():
    return _world_hint()[1]


_DYNAMIC_INITIALIZERS = {"random": "random_uniform", "uniform": "random_uniform",
                         "normal": "random_normal", "zeros": "zeros", "ones": "ones"}


# Per rank, when the caller gives none: SOK's hybrid (HierarchicalKV) needs both capacities; an
# "hbm" table grows from DEFAULT_INIT_CAPACITY up to DEFAULT_HBM_MAX_CAPACITY keys per rank.
DEFAULT_INIT_CAPACITY = 64 * 1024
DEFAULT_HBM_MAX_CAPACITY = 1 << 26


def DynamicVariable(dimension, initializer=None, var_type=None, name=None,  # noqa: N802
                    key_type=None, dtype=None, init_capacity=None, max_capacity=None,
                    max_hbm_for_vectors=None, evict_strategy="lru", trainable=True,
                    mode="distributed", filter_ratio=1.0, **kwargs):
    """Returns a sok1x.DynamicVariable's handle: a hash table of float32 [dimension] vectors; a
    key is held on rank hash(key) % world_size (mode "distributed"), or every key on rank r
    (mode "localized:r"), and gets a row on first lookup.

    initializer: "random" / "uniform" (uniform in [-0.05, 0.05]), "normal", "zeros", "ones", a
    number (constant) or a tf initializer; var_type: "hybrid" (SOK's default: grows up to
    max_capacity keys per rank, then evicts by evict_strategy "lru" or "lfu", and keeps vectors
    beyond max_hbm_for_vectors GiB in host memory) or "hbm" (grows, never evicts); key_type:
    tf.int64 or tf.int32; init_capacity / max_capacity: keys per rank (defaults: 65536 or
    max_capacity if smaller; init_capacity for hybrid, 2^26 for hbm); filter_ratio: the
    probability that a new key enters the table in a lookup_sparse(...,
    use_low_frequency_filter=True) (SOK's HKV config; default 1.0). Evicted keys:
    sok1x.sparse_read_and_evict(handle). Raises ValueError for bad arguments."""
    from sok1x.engine.tables.dynamic_table import make_dynamic
    label = name or "sok_dynamic_variable"
    _check_float32(dtype, label)
    if int(dimension) <= 0:
        raise ValueError("sok1x.DynamicVariable %s: dimension must be a positive integer, got %r"
                         % (label, dimension))
    if key_type is not None and tf1.as_dtype(key_type) not in (tf1.int64, tf1.int32):
        raise ValueError("sok1x.DynamicVariable %s: key_type must be tf.int64 or tf.int32, got %r"
                         % (label, key_type))
    var_type = var_type or "hybrid"
    filter_ratio = admission.check_ratio(filter_ratio, "sok1x.DynamicVariable %s" % label)
    if init_capacity is None:
        init_capacity = DEFAULT_INIT_CAPACITY if max_capacity is None else min(
            DEFAULT_INIT_CAPACITY, int(max_capacity))
    init_capacity = int(init_capacity)
    if max_capacity is None and var_type == "hbm":
        max_capacity = max(init_capacity, DEFAULT_HBM_MAX_CAPACITY)
    try:
        dynamic = make_dynamic(var_type, init_capacity, max_capacity, evict_strategy,
                               max_hbm_for_vectors or 0.0)
    except ValueError as exc:
        raise ValueError("sok1x.DynamicVariable %s: %s" % (label, exc)) from exc
    if initializer is None or (isinstance(initializer, str)
                               and initializer in _DYNAMIC_INITIALIZERS):
        initializer = _DYNAMIC_INITIALIZERS.get(initializer or "random")
    elif isinstance(initializer, str):
        try:
            initializer = float(initializer)
        except ValueError:
            pass
    spec = spec_from_initializer(initializer, label)
    table_name = _table_name(name, "sok_dynamic_variable")
    _eager_bring_up()
    placement = _parse_mode(mode, label)
    handle = create_handle(None, table_name, int(dimension), dynamic.max_capacity, True, spec,
                           placement="hash" if placement == "mod" else placement,
                           trainable=trainable, dynamic=dynamic)
    # As SOK's: evicted keys are dropped until a sparse_read_and_evict of it is built or called
    # (shard_access.read_evicted), so a job that never reads them holds none on the host.
    api.drop_evicted(table_name)
    _v2_defaults()
    mark_without_scope(handle)
    _describe(handle, table_name, DYNAMIC, int(dimension), None)
    handle.mode = mode or "distributed"
    handle.target_gpu = _target_gpu(placement)
    attach_reads(handle, lambda: shard_access.export(handle)[1])
    # SOK's DynamicVariable.size: int64 [1], the number of keys this rank holds.
    def key_count():
        return tf1.reshape(tf1.size(shard_access.export(handle)[0], out_type=tf1.int64), [1])
    handle.rows_held = None
    if tf1.executing_eagerly():
        show_as_sok(handle, key_count=key_count)
    else:
        show_as_sok(handle)
        handle.size = key_count()
    handle.var_type = dynamic.var_type
    handle.key_type = tf1.as_dtype(key_type or tf1.int64)
    handle.init_capacity, handle.max_capacity = dynamic.init_capacity, dynamic.max_capacity
    handle.max_hbm_for_vectors = dynamic.max_hbm_for_vectors
    handle.evict_strategy = dynamic.evict_strategy
    handle.filter_ratio = filter_ratio
    return handle


def _describe(handle, table_name, kind, dim, num_rows):
    """Attributes every v2 handle carries: table_name (the engine table), sok1x_kind, dimension,
    num_rows (None for a DynamicVariable); the front doors add rows_held (rows of the table on
    this rank, None for a DynamicVariable)."""
    handle.table_name = table_name
    handle.sok1x_kind = kind
    handle.dimension = dim
    handle.num_rows = num_rows


def kind_of(variable):
    """VARIABLE or DYNAMIC for a v2 handle, None for anything else."""
    return getattr(variable, "sok1x_kind", None)
