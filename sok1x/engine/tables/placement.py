"""Where a table's rows live: which rank owns a key and at which row of its shard (DESIGN D6).

    "mod"        owner key % world_size; without a hash table, row key // world_size
                 (the v1 layers, sok1x.Variable's "distributed" mode)
    ("rank", r)  every key on rank r; without a hash table, row = key (Variable "localized:r")
    "hash"       owner scramble(key) % world_size (sok1x.DynamicVariable): popular small keys
                 spread over the ranks whatever their pattern
"""
import collections

from sok1x.backend.owner_rules import OWNER_FIXED, OWNER_HASH, OWNER_MOD

Placement = collections.namedtuple("Placement", "kind rank")
Placement.__doc__ = "kind: 'mod', 'rank' or 'hash'; rank: the owner for 'rank', else 0."

MOD = Placement("mod", 0)
HASH = Placement("hash", 0)


def parse(value):
    """Returns the Placement of "mod", "hash", ("rank", r) or a Placement; raises ValueError."""
    if isinstance(value, Placement):
        return value
    if value in ("mod", "hash"):
        return Placement(value, 0)
    if isinstance(value, (tuple, list)) and len(value) == 2 and value[0] == "rank":
        if int(value[1]) < 0:
            raise ValueError("placement rank must be >= 0, got %r" % (value[1],))
        return Placement("rank", int(value[1]))
    raise ValueError("placement must be 'mod', 'hash' or ('rank', r), got %r" % (value,))


def check_rank(placement, world_size):
    """Returns a ValueError if the placement names a rank the job does not have, else None."""
    if placement.kind == "rank" and placement.rank >= world_size:
        return ValueError("a table placed on rank %d, but the job has %d ranks"
                          % (placement.rank, world_size))
    return None


def holds_rows(placement, rank):
    """True if `rank` holds rows of a table with this placement."""
    return placement.kind != "rank" or placement.rank == rank


def owner_rule(placement):
    """Returns (rule, fixed_rank) for the backend's bucket_by_owner / owners_of."""
    if placement.kind == "rank":
        return OWNER_FIXED, placement.rank
    return (OWNER_HASH if placement.kind == "hash" else OWNER_MOD), 0


def key_limit(placement, capacity, world_size):
    """The largest key + 1 that a table without a hash table holds."""
    return capacity if placement.kind == "rank" else capacity * world_size


def direct_rows(backend, placement, keys, world_size):
    """Rows of owned keys in a table without a hash table (backend int64 array)."""
    if placement.kind == "rank" or world_size == 1:
        return keys
    return backend.floor_divide(keys, world_size)


def global_keys(placement, rows, rank, world_size):
    """The keys of rows [0, n) of `rank`'s shard of a table without a hash table (host NumPy)."""
    if placement.kind == "rank":
        return rows
    return rows * world_size + rank
