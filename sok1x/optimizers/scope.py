"""sok1x.OptimizerScope: where native TensorFlow optimizers may update sok1x embedding variables."""
from sok1x.graph_ops.embedding_tag import is_embedding_variable

_active_scopes = []


class OptimizerScope:
    """Context manager (SOK's sok.OptimizerScope). Inside `with sok1x.OptimizerScope(variables):`
    a supported native optimizer's apply_gradients updates the sok1x embedding variables among
    `variables` through sok1x's engine, with its own math and hyper-parameters (see
    sok1x.optimizers). Other variables are ignored here and keep TensorFlow's own path.

    variables: a variable or an iterable of them, e.g. the embedding variables from
    sok1x.split_embedding_variable_from_others(model.trainable_variables)."""

    def __init__(self, variables):
        if hasattr(variables, "dtype"):
            variables = [variables]
        try:
            variables = list(variables)
        except TypeError:
            raise TypeError("sok1x.OptimizerScope takes a variable or an iterable of variables, "
                            "got %r" % (variables,)) from None
        self._embedding_variables = tuple(v for v in variables if is_embedding_variable(v))

    @property
    def embedding_variables(self):
        """The sok1x embedding variables this scope lets native optimizers update."""
        return self._embedding_variables

    def __enter__(self):
        _active_scopes.append(self)
        return self

    def __exit__(self, *exc_info):
        _active_scopes.remove(self)
        return False


_WITHOUT_SCOPE_ATTR = "_sok1x_without_optimizer_scope"


def mark_without_scope(handle):
    """Lets supported native optimizers update `handle` outside OptimizerScope: the handles of
    DeepRec's group front doors and of SOK v2's variables, whose programs apply native
    optimizers to them directly. Returns handle."""
    setattr(handle, _WITHOUT_SCOPE_ATTR, True)
    return handle


def covers(variable):
    """True if an active OptimizerScope was given the embedding variable `variable`, or it is a
    handle marked by mark_without_scope()."""
    if needs_no_scope(variable):
        return True
    return any(v is variable for scope in _active_scopes for v in scope.embedding_variables)


def needs_no_scope(variable):
    """True for a handle marked by mark_without_scope()."""
    return bool(getattr(variable, _WITHOUT_SCOPE_ATTR, False))
