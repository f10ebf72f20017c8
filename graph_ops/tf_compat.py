"""TensorFlow version differences, resolved once at import.

sok1x runs on TensorFlow 1.15 and on TensorFlow 2.x in graph mode through tf.compat.v1; both
have `tf.compat.v1`, so every graph-mode name is taken from there. DLPack (the zero-copy seam of
graph_ops/boundary.py) came with TensorFlow 2.2: HAS_DLPACK says whether this one has it.
"""
import sys

import tensorflow as tf

tf1 = tf.compat.v1
keras = tf.keras
VERSION = tuple(int(part) for part in tf.__version__.split(".")[:2])

_experimental = getattr(tf, "experimental", None)
_dlpack = getattr(_experimental, "dlpack", None) if VERSION >= (2, 2) else None
HAS_DLPACK = _dlpack is not None
# TensorFlow 2.x: True when a tf.function is being traced from an eager program (TF 1.15 lacks it).
_executing_eagerly_outside_functions = getattr(tf1, "executing_eagerly_outside_functions", None)


def _leave_sok1x_unconverted():
    """Adds sok1x to the packages autograph calls as they are (as it does numpy and tensorflow).

    A Keras layer's call, and what a user's converted call reaches, would otherwise be
    rewritten: sok1x's graph-building code, and with it the closures its ops run at step time
    (the kernels' and py_func's callbacks), which then run every call through autograph's
    converted_call: on TensorFlow 2.15 a 400-step job of one layer took 45 s instead of 3.7
    through the kernels, 9.6 s instead of 3.9 through host staging; on 1.15 a checkpoint write
    failed on a writable memoryview. The rule list is not public API; 1.15 and 2.x keep it at
    the same place, and TensorFlow's own tests prepend to it alike.
    """
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:  # a TensorFlow without autograph converts nothing
        return
    rules = tuple(getattr(config, "CONVERSION_RULES", ()))
    if not any(isinstance(rule, config.DoNotConvert) and rule.matches("sok1x") for rule in rules):
        config.CONVERSION_RULES = (config.DoNotConvert("sok1x"),) + rules


_leave_sok1x_unconverted()


def tf2_behavior():
    """True when TensorFlow 2 behaviour is on (TensorFlow 2.x unless the program called
    tf.compat.v1.disable_v2_behavior(); never on 1.15): a TF1 program run on TensorFlow 2 sees
    False, as SOK's kit_lib.in_tensorflow2 tells such programs."""
    from tensorflow.python import tf2
    return bool(tf2.enabled())


def inside_function():
    """True while building a tf.function's graph in an eager program (TensorFlow 2.x): graph
    ops whose gradient tf.GradientTape finds by op type, not through gradient_override_map."""
    return (_executing_eagerly_outside_functions is not None and not tf1.executing_eagerly()
            and _executing_eagerly_outside_functions())


def py_func(func, inputs, output_dtypes, name):
    """Returns the outputs of a stateful PyFunc op (op type "PyFunc") running `func` on NumPy
    arrays."""
    if not isinstance(output_dtypes, (list, tuple)):
        # One result goes back in a list: given a bare 0-d array, TensorFlow's kernel keeps a
        # reference to its value (py_func.cc, IsSingleNone: PyArray_GETITEM, never released),
        # a Python int or float each call (TensorFlow wraps bytes in a list for the same reason).
        func = _one_result_in_a_list(func)
    return tf1.py_func(func, inputs, output_dtypes, stateful=True, name=name)


def _one_result_in_a_list(func):
    """Returns a function that calls `func` and returns its one result in a list. A function of
    its own, not a `def` inside py_func's `if`: TensorFlow 1.15's autograph, which converts
    py_func when a Keras layer's call reaches it, turns a name defined in a branch into an
    unbound local."""
    def listed(*args):
        return [func(*args)]
    return listed


def py_function(func, inputs, output_dtypes, name):
    """Returns the outputs of an EagerPyFunc op (tf.py_function) running `func` on eager
    tensors, in graph mode and eagerly alike."""
    return tf1.py_function(func, inputs, output_dtypes, name=name)


def to_dlpack(tensor):
    """Returns a DLPack capsule over an eager tensor (TensorFlow >= 2.2)."""
    return _dlpack.to_dlpack(tensor)


def from_dlpack(capsule):
    """Returns an eager tensor adopting a DLPack capsule's memory (TensorFlow >= 2.2)."""
    return _dlpack.from_dlpack(capsule)


# Python 3.11 gives an instance of a class with a __dict__ a block of attribute values (PyMem, 16
# bytes for none), made in object_new and freed by the class's tp_dealloc. TensorFlow's EagerTensor
# (tensorflow/python/eager/pywrap_tensor.cc; 2.15 here) inherits that kind of __dict__ from its
# Python base class, but its EagerTensor_dealloc frees only the dict slot of its own struct: every
# EagerTensor made leaves its block behind. Deleting the instance's __dict__ first frees the block
# (Python turns the values into a dict, then drops the dict). Older Pythons keep no such block.
_drop_instance_dicts = sys.version_info >= (3, 11)


def release_eager_tensors(tensors):
    """Frees the attribute block each EagerTensor in `tensors` would leak when TensorFlow drops it
    (Python >= 3.11, see above; a no-op elsewhere) and returns `tensors`. For tensors only
    TensorFlow holds after this: their instance attributes are gone."""
    global _drop_instance_dicts
    for tensor in tensors if _drop_instance_dicts else ():
        try:
            del tensor.__dict__
        except (AttributeError, TypeError):  # a TensorFlow whose EagerTensor has a fixed __dict__
            _drop_instance_dicts = False
            break
    return tensors


def layer_compute_dtype(layer):
    """Returns the tf.DType a Keras layer computes in: float16 under dtype="mixed_float16" or
    "float16", or Keras' global mixed_float16 policy (TensorFlow 1.15:
    tf.keras.mixed_precision.experimental.set_policy; 2.x: set_global_policy); else float32."""
    dtype = getattr(layer, "compute_dtype", None) or getattr(layer, "_compute_dtype", None)
    return tf1.as_dtype(dtype or tf1.float32)


def keras_dtype(dtype):
    """Returns `dtype` as this TensorFlow's Keras layers take it: a dtype policy's name
    ("mixed_float16") becomes a Policy on TensorFlow 1.15, whose layers take only a Policy object
    for one (2.x takes the name too); anything else is returned as it is."""
    experimental = getattr(keras.mixed_precision, "experimental", None)
    if (isinstance(dtype, str) and VERSION < (2, 0) and experimental is not None
            and dtype.startswith("mixed_")):
        return experimental.Policy(dtype)
    return dtype


def set_keras_global_policy(name):
    """Sets Keras' global dtype policy ("mixed_float16", "float32") on TensorFlow 1.15 and 2.x."""
    mixed_precision = keras.mixed_precision
    if hasattr(mixed_precision, "set_global_policy"):
        mixed_precision.set_global_policy(name)
    else:
        mixed_precision.experimental.set_policy(name)


def saveable_classes():
    """Returns (SaveableObject, SaveSpec): how an object other than a variable joins
    tf.compat.v1.train.Saver (as TensorFlow's MutableHashTable does). Not public API in 1.15 or
    2.x; both keep it at the same private place."""
    from tensorflow.python.training.saving import saveable_object
    return saveable_object.SaveableObject, saveable_object.SaveSpec


def replace_input(op, index, tensor):
    """Makes the existing op `op` take `tensor` as its input `index` (Operation._update_input:
    not public API in TensorFlow 1.15 or 2.x; both have it). Used where TensorFlow built the op
    (a Saver's save op) and sok1x must give it a value read after its own op."""
    op._update_input(index, tensor)  # pylint: disable=protected-access


def is_partitioned_variable(value):
    """True for a tf.compat.v1 PartitionedVariable (what get_variable returns given a
    partitioner; its class is not public API in TensorFlow 1.15 or 2.x, both keep it here)."""
    from tensorflow.python.ops import variables
    return isinstance(value, variables.PartitionedVariable)


_keras_modules = {}


def keras_optimizer_base():
    """The base class of tf.keras.optimizers as TensorFlow installed it (TF 2.11+: the new Keras
    optimizer; before: OptimizerV2), as it was before sok1x.init() swapped the module for its
    legacy one (use_legacy_keras_optimizers)."""
    _remember_keras_modules()
    return getattr(_keras_modules["keras"], "Optimizer", None)


def _remember_keras_modules():
    if not _keras_modules:
        import tensorflow as tf
        _keras_modules["keras"] = getattr(tf.keras, "optimizers", None)
        _keras_modules["tf"] = getattr(tf, "optimizers", None)


def use_legacy_keras_optimizers(legacy=True):
    """SOK's sok.init(use_legacy_optimizer=True): where TensorFlow (2.11+) has the legacy
    OptimizerV2 module, tf.keras.optimizers and tf.optimizers become it, so a program's
    tf.keras.optimizers.SGD is the OptimizerV2 SOK's programs expect (its _slots, its sparse
    apply). legacy=False puts TensorFlow's own modules back."""
    import tensorflow as tf
    _remember_keras_modules()
    own_keras, own_tf = _keras_modules["keras"], _keras_modules["tf"]
    old = getattr(own_keras, "legacy", None)
    if old is None or getattr(getattr(old, "Optimizer", None), "__name__", "") != "OptimizerV2":
        return
    tf.keras.optimizers = old if legacy else own_keras  # tf.keras: the loaded module, not
    # the lazy loader `keras` above may still be
    if own_tf is not None:
        tf.optimizers = getattr(own_tf, "legacy", old) if legacy else own_tf


def trackable_base():
    """The base class of objects tf.train.Checkpoint walks (TensorFlow 2.x:
    tf.__internal__.tracking.Trackable), or `object` where there is none public (1.15)."""
    internal = getattr(tf, "__internal__", None)
    tracking = getattr(internal, "tracking", None)
    return getattr(tracking, "Trackable", object)
