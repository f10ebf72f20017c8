"""The device work of a replayed forward on several ranks (engine/lookup/replayed_step.py), in
the two halves its op header cuts it into (DESIGN D14 on several ranks).

A lookup on several ranks opens with its op header, which every rank reads before any key
crosses: it tells whether every rank is in the same op (D3), whether some rank's input is bad
(D7), and whether some rank's keys overflow a per-peer capacity (lookup/peer_capacity.py). A
recorded forward keeps that: it is two recorded works with the header between them, so a rank
never replays an exchange its peers do not make, and a bad or overflowing step is known to
every rank before anything moves.

    prepare (recorded):  the key checks, the keys in the table's id space, de-duplicated,
                         bucketed by owner and laid out in the caps' slots (routed_keys)
    op header (host):    the checks' and overflow flag and the per-owner counts cross; with
                         them every rank's keys per member (bounded_step.told_keys), which
                         bound the backward's rows on each owner (Routing.bounds)
    exchange (recorded): the keys to their owners, the rows and the gather there, the vectors
                         back, spread to every key (spread_back)

Both halves read and write the same arrays at every replay: the exchange half reads the prepare
half's outputs. Every rank makes the same collectives whether it replays or not (the uncaptured
lookup sized by the same caps sends the same header and the same two exchanges), so ranks need
not record or replay in the same steps. A step whose keys overflow a cap goes on the counted way
from the prepare half's outputs, on every rank (the header told them all), and its caps grow:
the class is recorded again at a later sight.
"""
import functools

from sok1x.engine.lookup import bounded_step, peer_capacity
from sok1x.engine.lookup.exchange_header import SHARED_WIDTH, exchange_sizes
from sok1x.engine.lookup.key_exchange import (
    KeyCheck,
    Routing,
    bucketed_gradients,
    check_error,
    exchange,
    padded_sums,
    routed_keys,
    sized_or_counted,
    spread_back,
)

_PREPARED = 3  # prepare()'s outputs: bounds, flag, owner counts, then the prepared arrays


def prepare(runtime, table, routed, fixed, caps):
    """The prepare half on the fixed keys: routed(fixed) -> (KeyCheck, keys in the table's id
    space). Returns ([bounds, flag, owner_counts, distinct, inverse, perm, sends, slots], the
    KeyCheck's judge)."""
    check, keys = routed(fixed)
    prepared, owner_counts, slots, flag = routed_keys(runtime.backend, runtime.size, [table],
                                                      [keys], [None], caps, check.flag)
    return [check.bounds, flag, owner_counts] + list(prepared[0]) + [slots[0]], check.judge


def owner_round(runtime, table, prepared, slots, send_counts, recv_counts):
    """The exchange half: the keys to their owners, their rows and vectors there, the vectors
    back and spread to every key (prepared: (distinct, inverse, perm, sends); slots: the
    capacity slots or None; counts host int64 [size, 1]). Returns [owner rows, vectors]."""
    owned, = exchange(runtime, [prepared[3]], send_counts, recv_counts)
    rows = table.rows_of(owned, False)
    returned = exchange(runtime, [table.gather(rows)], recv_counts, send_counts)
    vectors, = spread_back(runtime.backend, [table], [prepared], returned, [slots])
    return [rows, vectors]


def exchange_half(runtime, table, outputs, plan):
    """owner_round on a prepare half's outputs, sized by the caps of `plan`."""
    prepared, slots = tuple(outputs[_PREPARED:_PREPARED + 4]), outputs[_PREPARED + 4]
    return owner_round(runtime, table, prepared, slots, peer_capacity.send_counts(plan),
                       peer_capacity.recv_counts(plan, runtime.rank))


def header(runtime, op, outputs, judge, member_keys):
    """The op header between the halves, on a prepare half's outputs: raises every rank's
    input or order error on every rank. Returns (sizes, told): exchange_sizes' Sizes and
    bounded_step.told_keys' function (None where the backward stays counted)."""
    bounds, flag, owner_counts = outputs[:_PREPARED]
    telling = bounded_step.told_keys(runtime, [member_keys], SHARED_WIDTH)
    describe = functools.partial(check_error, runtime.backend, KeyCheck(bounds, judge, flag, None))
    sizes = exchange_sizes(runtime, op, owner_counts, None, flag, describe_error=describe,
                           shared=telling, sized=True)
    return sizes, telling


def routing(runtime, table, outputs, rows, count, plan, sizes, telling, member_keys):
    """The Routing of a forward sized by `plan`'s caps (its backward's too) from the prepare
    half's outputs and the owner rows."""
    distinct, inverse, perm = outputs[_PREPARED:_PREPARED + 3]
    caps = plan.caps
    bounds = None
    if telling is not None:
        bounds = bounded_step.bounds_of([table], [member_keys], sizes.shared,
                                        caps[:, runtime.rank])[0]
    return Routing(inverse, int(distinct.shape[0]), perm, caps[0].copy(),
                   peer_capacity.recv_counts(plan, runtime.rank)[:, 0], rows, count, False,
                   getattr(table, "row_starts", None), outputs[_PREPARED + 4], None, bounds)


def counted_rest(runtime, table, outputs, plan, sizes, count):
    """A step some rank's keys overflowed (sizes.overflow, every rank alike): the exchange the
    counted way from the prepare half's outputs; the caps grow. Returns (vectors, Routing)."""
    prepared = [tuple(outputs[_PREPARED:_PREPARED + 4])]
    send_counts, recv_counts, prepared, _ = sized_or_counted(
        runtime, plan, sizes, prepared, [outputs[_PREPARED + 4]], [outputs[_PREPARED]])
    rows, vectors = owner_round(runtime, table, prepared[0], None, send_counts, recv_counts)
    distinct, inverse, perm, _ = prepared[0]
    return vectors, Routing(inverse, int(distinct.shape[0]), perm, send_counts[:, 0].copy(),
                            recv_counts[:, 0].copy(), rows, count, False,
                            getattr(table, "row_starts", None))


def backward_run(runtime, table, routing, grads, pieces):
    """The device work of a bounded backward on several ranks: each key's gradient summed per
    distinct key, sent to the owners in the forward's capacity slots, and laid out there in a
    piece per member (`pieces`, from Routing.bounds), padded. Returns [rows, summed, local]."""
    backend = runtime.backend
    send = routing.send_counts.reshape(-1, 1)
    recv = routing.recv_counts.reshape(-1, 1)
    received, = exchange(runtime, bucketed_gradients(backend, [routing], [grads]), send, recv)
    rows, summed, padded = padded_sums(backend, table, routing, received, pieces)
    return [rows, summed, padded.local]
