"""SOK v2's sparse_operation_kit.distributed_variable: Variable, and DistributedVariable /
LocalizedVariable, which make (and, with isinstance, recognise) its two kinds of sok1x.Variable."""
from sok1x.v2 import variables as _variables
from sok1x.v2.variables import Variable


class _ModeType(type):
    def __instancecheck__(cls, instance):
        if _variables.kind_of(instance) != _variables.VARIABLE:
            return False
        return (getattr(instance, "mode", "distributed") == "distributed") == cls._distributed


class DistributedVariable(metaclass=_ModeType):
    """DistributedVariable(initial_value, ..., name=None, dtype=None, initializer=None,
    shape=None): sok1x.Variable(initial_value, mode="distributed"), row i on rank
    i % world_size. SOK's ResourceVariable arguments are accepted; those sok1x has no use for
    are ignored."""
    _distributed = True

    def __new__(cls, initial_value=None, trainable=None, collections=None, validate_shape=True,
                caching_device=None, name=None, dtype=None, variable_def=None,
                import_scope=None, constraint=None, distribute_strategy=None,
                synchronization=None, aggregation=None, shape=None, initializer=None,
                global_gpu_id=None, num_gpus=None):
        value = initializer if initial_value is None else initial_value
        return Variable(value, dtype=dtype, mode="distributed", name=name,
                        trainable=True if trainable is None else trainable, shape=shape)


class LocalizedVariable(metaclass=_ModeType):
    """LocalizedVariable(initial_value, ..., target_gpu=r): sok1x.Variable(initial_value,
    mode="localized:r"), every row on rank r."""
    _distributed = False

    def __new__(cls, initial_value=None, trainable=None, collections=None, validate_shape=True,
                caching_device=None, name=None, dtype=None, variable_def=None,
                import_scope=None, constraint=None, distribute_strategy=None,
                synchronization=None, aggregation=None, shape=None, initializer=None,
                global_gpu_id=None, target_gpu=None):
        value = initializer if initial_value is None else initial_value
        return Variable(value, dtype=dtype, mode="localized:%d" % int(target_gpu), name=name,
                        trainable=True if trainable is None else trainable, shape=shape)


__all__ = ["DistributedVariable", "LocalizedVariable", "Variable"]
