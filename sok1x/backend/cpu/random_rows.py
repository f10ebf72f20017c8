"""NumPy implementation of random_init's recipe: initial rows from (seed, table_id, key)."""
import numpy as np

from sok1x.backend import random_init as recipe

_U64 = np.uint64


def _mix64(x):
    """splitmix64's finaliser on a uint64 array (wrapping)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(recipe.MIX_1)
    x = x ^ (x >> _U64(27))
    x = x * _U64(recipe.MIX_2)
    return x ^ (x >> _U64(31))


def _uniform(stream, column, draw):
    """Returns uniform [0, 1) float64 values, [n, dim], for the given column and draw index."""
    counter = (_U64(2) * column + _U64(draw) + _U64(1)) * _U64(recipe.GOLDEN)
    bits = _mix64(stream[:, None] + counter[None, :])
    return (bits >> _U64(40)).astype(np.float64) * (2.0 ** -24)


def _normal(stream, column, k):
    u1 = _uniform(stream, column, 2 * k)
    u2 = _uniform(stream, column, 2 * k + 1)
    return np.sqrt(-2.0 * np.log(1.0 - u1)) * np.cos(2.0 * np.pi * u2)


def initial_values(spec, table_id, keys, dim):
    """Returns float32 [len(keys), dim] initial vectors for int64 `keys` under `spec`."""
    keys = np.asarray(keys, dtype=np.int64)
    if spec.kind == "constant":
        return np.full((keys.shape[0], dim), spec.a, dtype=np.float32)
    with np.errstate(over="ignore"):
        table_stream = _mix64(_U64(spec.seed) * _U64(recipe.GOLDEN) + _U64(table_id))
        stream = _mix64(table_stream ^ keys.astype(_U64))
        column = np.arange(dim, dtype=_U64)
        if spec.kind == "uniform":
            values = spec.a + (spec.b - spec.a) * _uniform(stream, column, 0)
        elif spec.kind == "normal":
            values = spec.a + spec.b * _normal(stream, column, 0)
        else:
            z = _normal(stream, column, 0)
            for k in range(1, recipe.TRUNCATED_TRIES):
                redo = np.abs(z) > 2.0
                if not redo.any():
                    break
                z = np.where(redo, _normal(stream, column, k), z)
            values = spec.a + spec.b * np.clip(z, -2.0, 2.0)
    return values.astype(np.float32)
