"""Per-peer capacities: a lookup's exchanges sized by a bound fixed before the step, not by a
count read back (DESIGN D14, issue 45's first step).

With SOK1X_PEER_CAPACITY=1, a lookup on more than one rank of tables whose rows follow from their
keys (sok1x.Variable, v1 tables without a hash table, and their table groups), and a training
lookup of hash groups (key_exchange.lookup_forward_many: where no shard of a group can fill up
in the step, which every rank reads alike in the op header, its one insert passes the padded
slots' key -1 by, and its keys' tags travel in the same slots; otherwise, and for a hash table
alone, the step goes by its counts), sends each owner o a fixed number of slots per table t,
cap[t, o], whatever this step's keys:

    rank r's send buffer of table t: sum(cap[t, :]) keys; owner o's block follows the blocks of
    the owners below it, its i-th distinct key (in bucket order) in the block's slot i; the
    slots no key fills hold key -1

and every buffer of the step is sized by a bound: the distinct keys, their inverse and bucket
order are as long as the batch's keys (padded), what crosses the network and what the owner o
finds, gathers and sums is size * cap[t, o] rows. No kernel reads a count to know where the
keys end: backend.peer_slots_many turns the per-owner counts on the device into slots, a slot
-1 moves nothing (backend.move_rows), a key -1 has row -1, whose vector is zeros and whose
gradient adds to no row (backend.distinct_rows_many, backend.segment_sum).

The caps are the same numbers on every rank (each rank's send to a peer is that peer's
receive), set where every rank decides alike: at an op's first lookup, which runs the counted
way (its counts are in the op header), every rank tells every rank over MPI how many keys it
sent each owner and how many keys it had (one small all-reduce), and

    cap[t, o] = min(bound_t, most_to + 4 * sqrt(most_to), rounded up to a multiple of 8), >= 1

most_to the most keys any rank sent owner o, bound_t the most keys any rank had (no owner can
get more). A count of keys spread at random over the owners varies by about its square root, so
4 of those above the most seen leaves room for a step's chance while sending few padded slots;
an owner that got no keys (a table placed on one rank, skewed keys) gets one slot. (DESIGN D14's
"a multiple of the even share" sent 25% padding with a quarter's headroom, and every owner the
same: a table on one rank sent size times its keys.) A step in which some rank's count exceeds a
cap (more keys than before, or skewed ones) sets bit 2 of that rank's op header error field on
the device; the header reaches every rank, so every rank sees the overflow alike, runs the step
the counted way (the header carried its counts) and raises the caps that step needed: caps only
grow, so no two tables take turns overflowing. The header also tells whether each rank sizes the
lookup this way: ranks started with different SOK1X_PEER_CAPACITY fail it on every rank
(InitError), never hang.

With SOK1X_BOUNDED_STEP=1 as well, such a lookup's backward is bounded too (bounded_step.py's
several ranks) and a caller's replay=True records it (replayed_step.py, replayed_ranks.py): a
recorded class keeps the caps it was recorded with, and an overflow drops it.

Cost, per table of dim d and lookup: memory, 8 * n bytes of slots (n the rank's keys), and
sum(cap[t, :]) * (8 + 4 * d) bytes each way for the key and vector buffers sent, size *
cap[t, rank] received (the backward's gradients alike); on the wire, the caps' slots of the
other ranks, against the distinct keys' own bytes the counted way: with uniform keys about
1 + 4 / sqrt(most_to) times as many (a little more: most_to is the largest count seen, and the
caps round up to 8).
"""
import numpy as np

from sok1x.engine import environment

ENV = "SOK1X_PEER_CAPACITY"
SPREADS = 4  # a cap's room above the most keys seen, in standard deviations of a count
ALIGN = 8


class Plan:
    """An op's per-peer capacities: caps, host int64 [tables, size] (slots per table and owner),
    or None until settle sets them (then the op's lookup runs the counted way); sized, how many
    of its lookups the caps sized; settled, how many times settle set them."""
    __slots__ = ("caps", "sized", "settled")

    def __init__(self):
        self.caps, self.sized, self.settled = None, 0, 0


def enabled():
    """True when SOK1X_PEER_CAPACITY=1 (read once per op, when its plan is made)."""
    return environment.get(ENV, "0") in ("1", "true", "True")


def plan_of(runtime, op, tables):
    """Returns the Plan of a lookup `op` of `tables` (an OpId), or None where its exchanges are
    sized by counts (one rank, a hash table alone among them, or SOK1X_PEER_CAPACITY unset; a
    hash group's rows do not follow from its keys, but its one insert passes a padded slot's key
    -1 by: key_exchange.lookup_forward_many sizes its training lookups where no shard of it can
    fill up). Ranks that answer differently fail the lookup in its op header
    (exchange_header.py)."""
    kinds = tuple(_kind(table) for table in tables)
    key = (op.name, op.tower, kinds)  # a name may be used again with other tables
    if key not in runtime.capacities:
        usable = runtime.size > 1 and enabled() and "hash table" not in kinds
        runtime.capacities[key] = Plan() if usable else None
    return runtime.capacities[key]


def _kind(table):
    """What sizes a table's lookup: "dense" (its rows follow from its keys), "hash group" (a
    HashGroup: one insert of tagged keys) or "hash table" (a hash table alone: its insert counts
    its keys first)."""
    if not table.use_hashtable:
        return "dense"
    return "hash group" if getattr(table, "row_starts", None) is not None else "hash table"


def send_counts(plan):
    """Host int64 [size, tables]: the rows a sized lookup sends each rank per table."""
    return np.ascontiguousarray(plan.caps.T)


def recv_counts(plan, rank):
    """Host int64 [size, tables]: the rows a sized lookup receives from each rank per table
    (every rank sends this rank its cap for this rank)."""
    return np.repeat(plan.caps[:, rank][None, :], plan.caps.shape[1], axis=0)


def settle(runtime, plan, sent, key_counts):
    """Collective (one small MPI all-reduce): sets plan.caps from a lookup that ran the counted
    way (the op's first, or one that overflowed its caps: every rank knows from the op header),
    never below what they were. sent: host int64 [size, tables], the distinct keys this rank
    sent each rank; key_counts: this rank's keys per table (the bound)."""
    sent = np.asarray(sent, np.int64).T  # [tables, size]
    mine = np.concatenate([sent.reshape(-1), np.asarray(key_counts, np.int64)])
    told = runtime.host.all_reduce(mine, op="max")
    most, bound = told[:sent.size].reshape(sent.shape), told[sent.size:]
    room = most + SPREADS * np.sqrt(most)
    caps = np.minimum(np.maximum(bound, 1)[:, None], ALIGN * np.ceil(room / ALIGN))
    caps = np.maximum(caps, 1).astype(np.int64)
    if plan.caps is not None and plan.caps.shape == caps.shape:
        caps = np.maximum(caps, plan.caps)  # caps only grow: no two tables take turns
    plan.caps = caps
    plan.settled += 1
