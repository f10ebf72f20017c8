"""SOK's low-frequency filter for hash tables: a training lookup of sok1x.lookup_sparse(...,
use_low_frequency_filter=True) admits a key its table does not hold yet with probability
`ratio` (the DynamicVariable's filter_ratio; SOK's default 1.0 admits every key), as SOK's HKV
ratio_filter does on the owner of the key. An admitted key is inserted and looked up as in any
training lookup; a key not admitted is not inserted, its vector is zeros (it adds nothing to its
sample's pooled output) and its gradient is dropped. Held keys always pass; a sok1x.Variable
holds every key, so nothing is filtered there.

The draw of a key is a function of (table, key, step) alone (backend/random_init.py's
counter-based generator, which also gives rows their initial values), so a job computes the same
on any number of ranks (D10); a key refused in one step is drawn anew in the next. SOK draws per
occurrence (cuRAND on the owner's GPU); here the occurrences of a key in one step share one draw.
The filter reads the keys and their draws on the host: a cost of filtered lookups only.
"""
import numpy as np

from sok1x.backend.random_init import make_spec
from sok1x.engine.op_keys import name_key

_DRAWS = make_spec("uniform", 0.0, 1.0)


def check_ratio(ratio, where):
    """Returns float `ratio`; raises ValueError naming `where` unless 0 <= ratio <= 1."""
    value = float(ratio)
    if not 0.0 <= value <= 1.0:
        raise ValueError("%s: filter_ratio must lie in [0, 1], got %r" % (where, ratio))
    return value


def admitted_keys(backend, table, keys, ratio, step):
    """Returns (the keys of backend `keys` to look up with insertion, host bool [n] of which
    positions they are, or None where every key passes): held keys, and new keys whose draw
    for (table, key, step) falls below `ratio`. Changes nothing."""
    count = int(keys.shape[0])
    if ratio >= 1.0 or count == 0:
        return keys, None
    host_keys = np.asarray(backend.to_host(keys)).astype(np.int64)
    held = np.asarray(backend.to_host(table.rows_of(backend.asarray(host_keys), False))) >= 0
    draws = backend.zeros((count, 1), np.float32)
    backend.init_rows(draws, backend.asarray(np.arange(count, dtype=np.int64)),
                      backend.asarray(host_keys), _DRAWS,
                      name_key("admission:%s:%d" % (table.name, step)))
    passed = held | (np.asarray(backend.to_host(draws)).reshape(-1) < ratio)
    if passed.all():
        return keys, None
    return backend.asarray(host_keys[passed]), passed


def spread_rows(backend, rows, passed):
    """The rows of every key of a filtered lookup: `rows` (of the passed keys, backend int64) at
    the positions `passed` marks, -1 (a zero vector, no gradient) elsewhere."""
    every = np.full(passed.shape[0], -1, np.int64)
    every[passed] = np.asarray(backend.to_host(rows))
    return backend.asarray(every)
