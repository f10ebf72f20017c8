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


def covers(variable):
    """True if an active OptimizerScope was given the embedding variable `variable`, or it is a
    handle of DeepRec's group front doors (sok1x.group_embedding), whose programs know no
    OptimizerScope."""
    if getattr(variable, "_sok1x_without_optimizer_scope", False):
        return True
    return any(v is variable for scope in _active_scopes for v in scope.embedding_variables)
