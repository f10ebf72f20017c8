"""Turns a TensorFlow initializer into the engine's InitializerSpec (random_init.py).

Accepted: None (SOK's default, uniform in [-0.05, 0.05]), the strings "ones", "zeros",
"random_uniform", "random_normal", "truncated_normal", a number (constant), and instances of the
tf.keras / tf.compat.v1 initializers Ones, Zeros, Constant (scalar value), RandomUniform,
RandomNormal and TruncatedNormal, whose seed is kept. The values themselves come from sok1x's
counter-based generator, not TensorFlow's: the same distribution, and the same vector for a key on
any number of ranks (D10).
"""
import numbers

from sok1x.backend.random_init import DEFAULT_SPEC, make_spec

_BY_CLASS = {
    "Ones": lambda c: make_spec("constant", 1.0),
    "Zeros": lambda c: make_spec("constant", 0.0),
    "Constant": lambda c: make_spec("constant", _scalar(c.get("value", 0.0))),
    "RandomUniform": lambda c: make_spec(
        "uniform", c.get("minval", -0.05), c.get("maxval", 0.05), c.get("seed")),
    "RandomNormal": lambda c: make_spec(
        "normal", c.get("mean", 0.0), c.get("stddev", 0.05), c.get("seed")),
    "TruncatedNormal": lambda c: make_spec(
        "truncated_normal", c.get("mean", 0.0), c.get("stddev", 0.05), c.get("seed")),
}
_BY_NAME = {
    "ones": "Ones", "zeros": "Zeros", "random_uniform": "RandomUniform",
    "random_normal": "RandomNormal", "truncated_normal": "TruncatedNormal",
}


def _scalar(value):
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            "a Constant embedding_initializer needs a scalar value, got %r" % (value,)) from exc


def spec_from_initializer(initializer, layer):
    """Returns the InitializerSpec for `initializer`; raises ValueError naming `layer`."""
    if initializer is None:
        return DEFAULT_SPEC
    if isinstance(initializer, numbers.Number):
        return make_spec("constant", float(initializer))
    if isinstance(initializer, str):
        class_name, config = _BY_NAME.get(initializer), {}
    else:
        class_name = type(initializer).__name__
        config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    build = _BY_CLASS.get(class_name)
    if build is None:
        raise ValueError(
            "%s: embedding_initializer %r is not supported; use one of %s (or their names %s)"
            % (layer, initializer, sorted(_BY_CLASS), sorted(_BY_NAME)))
    try:
        return build(config)
    except ValueError as exc:
        raise ValueError("%s: embedding_initializer: %s" % (layer, exc)) from exc
