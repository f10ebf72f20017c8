"""Initial values of embedding rows as a function of (seed, table_id, key, column) alone (D10).

No backend keeps random state: each value is drawn from a counter-based generator, so a key gets
the same vector on any number of ranks, in any arrival order, on cpu and cuda alike. The cuda
kernel (cuda_kernels/random_init.cu) follows the same recipe step for step:

    stream  = mix64(mix64(seed * GOLDEN + table_id) ^ key)
    bits(c, d) = mix64(stream + (2 * c + d + 1) * GOLDEN)      column c, draw d
    uniform(c, d) = (bits >> 40) * 2**-24                        in [0, 1)
    normal(c, k)  = sqrt(-2 ln(1 - uniform(c, 2k))) * cos(2 pi uniform(c, 2k + 1))   (float64)
    truncated normal: the first normal(c, k), k = 0..7, with |z| <= 2; else clamp the last to +-2

mix64 is splitmix64's finaliser on unsigned 64-bit integers (wrapping arithmetic).
"""
import collections

GOLDEN = 0x9E3779B97F4A7C15
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB
TRUNCATED_TRIES = 8

KINDS = ("constant", "uniform", "normal", "truncated_normal")

InitializerSpec = collections.namedtuple("InitializerSpec", "kind a b seed")
InitializerSpec.__doc__ = """What initial values a table gets.

kind: one of KINDS; a, b: (value, unused) for constant, (minval, maxval) for uniform,
(mean, stddev) for normal and truncated_normal; seed: a non-negative int.
"""

DEFAULT_SPEC = InitializerSpec("uniform", -0.05, 0.05, 0)


def kernel_arguments(spec, table_id):
    """(kind number, seed, table_id, a, b) as the cuda kernels take a spec (random_init.cuh):
    kind as its index in KINDS, seed and table_id as unsigned 64-bit, b as maxval - minval for
    uniform."""
    mask = 0xFFFFFFFFFFFFFFFF
    a, b = float(spec.a), float(spec.b)
    if spec.kind == "uniform":
        b = float(spec.b) - float(spec.a)
    return KINDS.index(spec.kind), int(spec.seed) & mask, int(table_id) & mask, a, b


def make_spec(kind, a=0.0, b=0.0, seed=0):
    """Returns a checked InitializerSpec; raises ValueError naming the bad field."""
    if kind not in KINDS:
        raise ValueError("initializer kind must be one of %s, got %r" % (KINDS, kind))
    if seed is None:
        seed = 0
    if int(seed) < 0:
        raise ValueError("initializer seed must be >= 0, got %r" % (seed,))
    if kind == "uniform" and not a < b:
        raise ValueError("uniform initializer needs minval < maxval, got %r, %r" % (a, b))
    if kind in ("normal", "truncated_normal") and not b > 0:
        raise ValueError("%s initializer needs stddev > 0, got %r" % (kind, b))
    return InitializerSpec(kind, float(a), float(b), int(seed) & 0xFFFFFFFFFFFFFFFF)
