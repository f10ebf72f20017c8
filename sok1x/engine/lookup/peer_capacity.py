"""Per-peer capacities: a lookup's exchanges sized by a bound fixed before the step, not by a
count read back (DESIGN D14, issue 45's first step).

With SOK1X_PEER_CAPACITY=1, a lookup on more than one rank of tables whose rows follow from their
keys (sok1x.Variable, v1 tables without a hash table, and their table groups) sends each owner a
fixed number of slots per table, cap_t, whatever this step's keys:

    rank r's send buffer of table t: [size, cap_t] keys; owner o's i-th distinct key (in bucket
    order) goes to slot o * cap_t + i; the slots no key fills hold key -1

and every buffer of the step is sized by a bound: the distinct keys, their inverse and bucket
order are as long as the batch's keys (padded), and what crosses the network, what the owner
finds, gathers and sums is size * cap_t rows. Kernels read the real counts from the device
(backend.peer_slots_many turns the per-owner counts into slots): a slot -1 moves nothing
(backend.move_rows), a key -1 has row -1, whose vector is zeros and whose gradient adds to no
row (backend.distinct_rows_many, backend.segment_sum).

cap_t is one number on every rank (each rank's send to a peer is that peer's receive), set where
every rank decides alike: at an op's first lookup, which runs the counted way (its counts are in
the op header), every rank tells every rank over MPI the most keys it sent one peer and its
number of keys (one small all-reduce), and

    cap_t = min(bound_t, most_t + 4 * sqrt(most_t), rounded up to a multiple of 8)

most_t the most keys any rank sent any peer, bound_t the most keys any rank had (no peer can
get more). A count of keys spread at random over the owners varies by about its square root, so
4 of those above the most seen leaves room for a step's chance while sending few padded slots
(a multiple of the even share, as DESIGN D14 has it, would send 25% more with a quarter's
headroom and still need the overflow path for skewed keys). A step in which some rank's count exceeds a cap (more keys
than before, or skewed ones) sets bit 2 of that rank's op header error field on the device; the
header reaches every rank, so every rank sees the overflow alike, runs the step the counted way
(the header carried its counts) and sets the caps again from it: never a wrong answer.

Cost, per table of dim d and lookup: memory, 8 * n bytes of slots (n the rank's keys), and
size * cap_t * (8 + 4 * d) bytes each way for the key and vector buffers (the backward's
gradients alike); on the wire, (size - 1) * cap_t * (8 + 4 * d) bytes each way a rank, against
the distinct keys' own bytes the counted way: with uniform keys, 1 + 4 / sqrt(most_t) times
as many (1.06 for 4,096 keys a peer).
"""
import os

import numpy as np

from sok1x.engine.lookup.exchange_header import OVERFLOW  # noqa: F401  (the flag's bit)

ENV = "SOK1X_PEER_CAPACITY"
SPREADS = 4  # a cap's room above the most keys seen, in standard deviations of a count
ALIGN = 8


class Plan:
    """An op's per-peer capacities: caps, host int64 [tables], or None until settle sets them
    (then the op's lookup runs the counted way); sized, how many of its lookups the caps sized;
    settled, how many times settle set them."""
    __slots__ = ("caps", "sized", "settled")

    def __init__(self):
        self.caps, self.sized, self.settled = None, 0, 0


def enabled():
    """True when SOK1X_PEER_CAPACITY=1 (read once per op, when its plan is made)."""
    return os.environ.get(ENV, "0") in ("1", "true", "True")


def plan_of(runtime, op, tables):
    """Returns the Plan of a lookup `op` of `tables` (an OpId), or None where its exchanges are
    sized by counts (one rank, a hash table among them, or SOK1X_PEER_CAPACITY unset). Every rank
    answers alike."""
    hashed = tuple(bool(table.use_hashtable) for table in tables)
    key = (op.name, op.tower, hashed)  # a name may be used again with other tables
    if key not in runtime.capacities:
        usable = runtime.size > 1 and enabled() and not any(hashed)
        runtime.capacities[key] = Plan() if usable else None
    return runtime.capacities[key]


def settle(runtime, plan, send_counts, key_counts):
    """Collective (one small MPI all-reduce): sets plan.caps from a lookup that ran the counted
    way (the op's first, or one that overflowed its caps: every rank knows from the op header).
    send_counts: host int64 [size, tables], the distinct keys this rank sent each rank;
    key_counts: this rank's keys per table (the bound)."""
    mine = np.concatenate([np.asarray(send_counts, np.int64).max(axis=0),
                           np.asarray(key_counts, np.int64)])
    most, bound = np.split(runtime.host.all_reduce(mine, op="max"), 2)
    plan.settled += 1
    plan.caps = np.array([_cap(int(m), int(b)) for m, b in zip(most, bound)], dtype=np.int64)


def _cap(most, bound):
    """The cap of one table (see the module's docstring), at least 1."""
    room = most + SPREADS * np.sqrt(most)
    return max(1, min(max(bound, 1), ALIGN * int(np.ceil(room / ALIGN))))
