"""The guard on native optimizers (DESIGN D2), installed once when sok1x's optimizers load.

apply_gradients of tf.compat.v1.train.Optimizer, of Keras' OptimizerV2 (tf.compat.v1.keras
.optimizers) and of the TF 2.11+ Keras optimizer is wrapped. With dense variables only, the wrapper
looks at the variables and calls TensorFlow's own method, nothing more. With a sok1x embedding
variable among them:
  - sok1x's own optimizers, which update embedding variables themselves, pass straight through;
  - a supported native optimizer (native_rules.py) inside sok1x.OptimizerScope runs TensorFlow's
    apply_gradients with its per-variable sparse update redirected, for embedding variables only,
    to the engine's update op, so its step counters, global_step and dense variables are TF's;
  - anything else raises UnsupportedOptimizerError naming the variable and what is supported.
get_slot(var, name) of the same classes is wrapped too: for a sok1x.Variable or DynamicVariable
it returns a view of that slot in the variable's engine table (sok1x/v2/slot_views.py), where
TensorFlow's own slot is only a placeholder of the handle's shape.
"""
import contextlib
import functools

from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.errors import UnsupportedOptimizerError
from sok1x.graph_ops.tf_compat import keras_optimizer_base, tf1
from sok1x.optimizers import embedding_update, native_rules, scope

_GUARD_ATTR = "_sok1x_guard"
# Set on optimizer classes that update sok1x embedding variables themselves.
UPDATES_EMBEDDINGS_ATTR = "_sok1x_updates_embeddings"


def _class_name(optimizer):
    cls = type(optimizer)
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def _unsupported(optimizer, variable):
    return UnsupportedOptimizerError(
        "%s cannot update the sok1x embedding variable %s: sok1x applies to embedding variables "
        "only optimizers whose math it reproduces exactly. Supported: %s."
        % (_class_name(optimizer), embedding_update.describe(variable), native_rules.SUPPORTED))


def _outside_scope(optimizer, variable):
    return UnsupportedOptimizerError(
        "%s was asked to update the sok1x embedding variable %s outside sok1x.OptimizerScope. "
        "Its rows live in sok1x's engine: build the update inside `with "
        "sok1x.OptimizerScope(embedding_vars): optimizer.apply_gradients(...)`, embedding_vars "
        "from sok1x.split_embedding_variable_from_others(). Supported: %s."
        % (_class_name(optimizer), embedding_update.describe(variable), native_rules.SUPPORTED))


@contextlib.contextmanager
def _redirected(optimizer, build, keyed=None):
    """Inside, `optimizer` sends the sparse update of embedding variables to the engine (the
    tables of one keyed lookup in one op: keyed, embedding_update.KeyedUpdates)."""
    cls = type(optimizer)

    def sparse_update(values, handle, indices, **kwargs):
        if is_embedding_variable(handle):
            return embedding_update.update_op(optimizer, handle, values, indices, build(optimizer),
                                              keyed)
        return cls._resource_apply_sparse_duplicate_indices(optimizer, values, handle, indices,
                                                            **kwargs)

    def dense_update(grad, handle, **kwargs):
        if is_embedding_variable(handle):
            raise embedding_update.dense_gradient_error(handle)
        return cls._resource_apply_dense(optimizer, grad, handle, **kwargs)

    overrides = {"_resource_apply_sparse_duplicate_indices": sparse_update,
                 "_resource_apply_dense": dense_update}
    own = vars(optimizer)
    saved = {name: own[name] for name in overrides if name in own}
    own.update(overrides)
    try:
        yield
    finally:
        for name in overrides:
            own.pop(name, None)
        own.update(saved)


def _guarded(apply_gradients):
    @functools.wraps(apply_gradients)
    def guarded_apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        embedding = [v for g, v in pairs if g is not None and is_embedding_variable(v)]
        if not embedding or getattr(self, UPDATES_EMBEDDINGS_ATTR, False):
            return apply_gradients(self, pairs, *args, **kwargs)
        build = native_rules.builder_for(self)
        if build is None:
            wrapper = kept_wrapper(self, embedding)
            if wrapper is None:
                raise _unsupported(self, embedding[0])
            # Keras' own order of positional arguments: (grads_and_vars, name, skip_...)
            options = dict(zip(("name", "skip_gradients_aggregation"), args))
            options.update(kwargs)
            return wrapper.apply_gradients(pairs, **options)
        outside = [v for v in embedding if not scope.covers(v)]
        if outside:
            raise _outside_scope(self, outside[0])
        keyed = None if tf1.executing_eagerly() else embedding_update.KeyedUpdates(pairs)
        with _redirected(self, build, keyed):
            return apply_gradients(self, pairs, *args, **kwargs)

    setattr(guarded_apply_gradients, _GUARD_ATTR, True)
    return guarded_apply_gradients


def kept_wrapper(optimizer, embedding, applying=True):
    """For a TF 2.11+ Keras optimizer applied to embedding variables it may update: those that
    need no OptimizerScope (sok1x.Variable / DynamicVariable, as SOK's v2 programs apply it)
    and those of an active sok1x.OptimizerScope (SOK v1's layers, as its DenseDemo applies
    it): the sok1x.OptimizerWrapper kept on it (its twin OptimizerV2 and that one's slots
    persist across steps); None for other optimizers or variables. applying=False (a dump or
    load of its tables) takes any embedding variable. Raises UnsupportedOptimizerError, saying
    why and what to use, for one without a twin."""
    from sok1x.v2.optimizer_wrapper import is_new_keras, OptimizerWrapper
    if not is_new_keras(optimizer):
        return None
    outside = [v for v in embedding if applying and not scope.covers(v)]
    if outside:
        raise _outside_scope(optimizer, outside[0])
    wrapper = getattr(optimizer, "_sok1x_wrapper", None)
    if wrapper is None:
        try:
            wrapper = OptimizerWrapper(optimizer)  # one without a twin is refused, saying why
        except UnsupportedOptimizerError as error:
            raise UnsupportedOptimizerError("%s cannot update the sok1x embedding variable %s: %s"
                                            % (_class_name(optimizer),
                                               embedding_update.describe(embedding[0]),
                                               error)) from None
        # kept as a plain attribute: a Keras optimizer tracks what it is given (the wrapper
        # depends on it, not the other way round; the twin it tracks itself)
        object.__setattr__(optimizer, "_sok1x_wrapper", wrapper)
    return wrapper


def _slot_viewing(get_slot):
    @functools.wraps(get_slot)
    def get_slot_or_view(self, var, name, *args, **kwargs):
        slot = get_slot(self, var, name, *args, **kwargs)
        if slot is None or not is_embedding_variable(var):
            return slot
        from sok1x.v2.slot_views import view_of
        return view_of(self, var, name, slot)

    setattr(get_slot_or_view, _GUARD_ATTR, True)
    return get_slot_or_view


def optimizer_base_classes():
    """The optimizer base classes whose apply_gradients the guard wraps (no duplicates)."""
    bases = []
    for cls in (tf1.train.Optimizer, tf1.keras.optimizers.Optimizer, keras_optimizer_base()):
        if cls is not None and cls not in bases:
            bases.append(cls)
    return bases


def install():
    """Wraps apply_gradients (and get_slot, where it has one) of every optimizer base class once
    (idempotent)."""
    for cls in optimizer_base_classes():
        method = cls.apply_gradients
        if not getattr(method, _GUARD_ATTR, False):
            cls.apply_gradients = _guarded(method)
        get_slot = getattr(cls, "get_slot", None)
        if get_slot is not None and not getattr(get_slot, _GUARD_ATTR, False):
            cls.get_slot = _slot_viewing(get_slot)
