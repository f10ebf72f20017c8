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

A HashGroup's training lookup is cut the same way. Its prepare half also lays its keys' tags out in
the keys' slots; its header tells every rank each rank's keys and room per member
(key_exchange.room_and_keys), from which every rank finds alike whether any shard of the group can
fill up in the step, and the most keys of each member an owner can get, which bound the backward's
rows (Routing.bounds); its exchange half sends the tags beside the keys and inserts them on the
owner (the recorded insert, table_group.ReplayedInsert, whose ready() is asked after the header
with those most keys). A step in which a shard might fill up goes on uncaptured on every rank, the
counted way (its insert may grow, evict or fail, as an uncaptured one does), unless every full
shard evicts its new keys in place and the others fit: that step goes sized by the caps, and a full
hybrid group's class of such steps (ReplayedInsert, evicting) replays its exchange half as one
recorded work: the keys and tags to the owners, the pick, the erase and the insert into the
victims' rows (owners_part), the vectors back (returning_part). Its counts are read, and every
rank agrees on a key left without a victim, at the next op header (the backward's:
bounded_step.agreed_check), where the uncaptured step's owners agree too
(key_exchange._agreed_in_place), so that nothing waits between the two exchanges; its victims
are bounded by the header's most keys of each member an owner can get. An owner whose
insert is not ready (a hybrid member with freed rows to hand out, say) places the keys as an
uncaptured step that fits does (kept_half), or evicts them uncaptured (uncaptured_rest, in place),
in the same exchanges, while its peers replay. The header has read every rank's checks before the
insert, so no step with a bad key places one.

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
    fitting_units,
    in_place_units,
    kept_insert,
    owners_round,
    padded_sums,
    room_and_keys,
    routed_keys,
    sized_or_counted,
    spread_back,
    tags_of_distinct,
    tags_to_send,
)

_PREPARED = 3  # prepare()'s outputs: bounds, flag, owner counts, then the prepared arrays
_SLOTS = _PREPARED + 4  # then the capacity slots; a hash group's: its distinct and sent tags


def prepare(runtime, table, routed, fixed, caps):
    """The prepare half on the fixed keys: routed(fixed) -> (KeyCheck, keys in the table's id
    space) or, for a HashGroup, (KeyCheck, keys, their tags). Returns ([bounds, flag,
    owner_counts, distinct, inverse, perm, sends, slots] and, with tags, [distinct tags, sent
    tags], the KeyCheck's judge)."""
    backend = runtime.backend
    check, keys, *tags = routed(fixed)
    prepared, owner_counts, slots, flag = routed_keys(backend, runtime.size, [table], [keys],
                                                      tags or [None], caps, check.flag)
    outputs = [check.bounds, flag, owner_counts] + list(prepared[0]) + [slots[0]]
    if tags:  # the tags travel in the keys' slots
        distinct_tags = tags_of_distinct(backend, prepared[0], tags[0])
        outputs += [distinct_tags, tags_to_send(backend, prepared[0], distinct_tags, slots[0],
                                                int(caps[0].sum()))]
    return outputs, check.judge


def exchange_half(runtime, table, outputs, plan, insert=None):
    """The exchange half on a prepare half's outputs, sized by the caps of `plan`: the keys to
    their owners, their rows and vectors there (owners_part: a HashGroup's with its `insert`),
    the vectors back and spread to every key (returning_part). Returns [owner rows, vectors]
    + what else the insert returned."""
    rows, gathered, *more = owners_part(runtime, table, outputs, plan, insert)
    vectors, = returning_part(runtime, table, outputs, plan, gathered)
    return [rows, vectors] + more


def owners_part(runtime, table, outputs, plan, insert=None):
    """The exchange half's first part, to the owners (sized by `plan`'s caps): the prepared
    keys go to their owners (a HashGroup's sent tags beside them), where insert(owned keys,
    owned tags) -> (rows, vectors, [more arrays]) finds or places them (a dense table's rows
    follow from its keys). Returns [owner rows, their vectors] + more."""
    sends, columns, more = [outputs[_PREPARED + 3]], [0], []
    if len(outputs) > _SLOTS + 1:
        sends.append(outputs[_SLOTS + 2])
        columns.append(0)
    owned = exchange(runtime, sends, peer_capacity.send_counts(plan)[:, columns],
                     peer_capacity.recv_counts(plan, runtime.rank)[:, columns])
    if insert is None:
        rows = table.rows_of(owned[0], False)
        gathered = table.gather(rows)
    else:
        rows, gathered, more = insert(owned[0], owned[1])
    return [rows, gathered] + list(more)


def returning_part(runtime, table, outputs, plan, gathered):
    """The exchange half's second part: the owners' `gathered` vectors back (sized by `plan`'s
    caps) and spread to every key in input order. Returns [vectors]."""
    prepared, slots = tuple(outputs[_PREPARED:_SLOTS]), outputs[_SLOTS]
    returned = exchange(runtime, [gathered], peer_capacity.recv_counts(plan, runtime.rank),
                        peer_capacity.send_counts(plan))
    return spread_back(runtime.backend, [table], [prepared], returned, [slots])


def kept_half(runtime, table, outputs, plan):
    """exchange_half of a HashGroup whose replayed insert is not ready on this rank, or whose
    class evicts in a step whose keys all fit (its peers may replay theirs: the collectives are
    the same), its keys placed as an uncaptured lookup that fits places them
    (key_exchange.kept_insert), counted at once: the header told every rank that no shard of it
    can fill up, and that every key is good."""
    def insert(owned, tags):
        rows, vectors, state = kept_insert(runtime, table, owned, tags)
        table.count_kept(state)
        return rows, vectors, []
    return exchange_half(runtime, table, outputs, plan, insert)


def header(runtime, op, table, outputs, judge, member_keys):
    """The op header between the halves, on a prepare half's outputs: raises every rank's
    input or order error on every rank. Returns (sizes, told, fitting, in_place):
    exchange_sizes' Sizes; bounded_step.told_keys' function (None where the backward stays
    counted, and for a HashGroup, whose header tells every rank's keys and room per member
    instead); for a HashGroup, key_exchange's fitting pair (whether no shard of it can fill up
    in the step, and the most keys per member an owner can get), else None; and whether a
    HashGroup's full shards evict every new key in place while the others fit
    (key_exchange.in_place_units: the step goes sized by the caps, replayed by an evicting
    class, else uncaptured)."""
    bounds, flag, owner_counts = outputs[:_PREPARED]
    telling = rooms = None
    if len(outputs) > _SLOTS + 1:  # a HashGroup's (its tags prepared): its keys and room
        rooms, shared = room_and_keys([table], [None], [0], True, [member_keys], None)
    else:
        telling = shared = bounded_step.told_keys(runtime, [member_keys], SHARED_WIDTH)
    describe = functools.partial(check_error, runtime.backend, KeyCheck(bounds, judge, flag, None))
    sizes = exchange_sizes(runtime, op, owner_counts, None, flag, describe_error=describe,
                           shared=shared, sized=True)
    if rooms is None:
        return sizes, telling, None, False
    fitting = fitting_units(rooms, sizes.shared)
    return sizes, telling, fitting, bool(in_place_units(rooms, sizes.shared, fitting[0]))


def fits(fitting):
    """Whether a HashGroup's header (header()'s fitting) lets its exchange half run sized by
    the caps (no shard of it can fill up: its replayed insert or kept_half), for None (a
    dense table's) too."""
    return fitting is None or 0 in fitting[0]


def routing(runtime, table, outputs, rows, count, plan, sizes, telling, member_keys,
            fitting=None):
    """The Routing of a forward sized by `plan`'s caps (its backward's too) from the prepare
    half's outputs and the owner rows: its backward bounded by the keys the header told
    (telling, or a HashGroup's `fitting`)."""
    distinct, inverse, perm = outputs[_PREPARED:_PREPARED + 3]
    caps = plan.caps
    bounds = None
    if telling is not None:
        bounds = bounded_step.bounds_of([table], [member_keys], sizes.shared,
                                        caps[:, runtime.rank])[0]
    elif fitting is not None:
        bounds = bounded_step.rows_bound(table, fitting[1][0], runtime.size,
                                         caps[0, runtime.rank])
    return Routing(inverse, int(distinct.shape[0]), perm, caps[0].copy(),
                   peer_capacity.recv_counts(plan, runtime.rank)[:, 0], rows, count, False,
                   getattr(table, "row_starts", None), outputs[_SLOTS], None, bounds)


def uncaptured_rest(runtime, op, table, outputs, plan, sizes, count, fitting=None,
                    in_place=False):
    """A step some rank's keys overflowed (sizes.overflow), or in which a HashGroup's shard
    might fill up (not fits(fitting)), every rank alike: the exchange the counted way from the
    prepare half's outputs (a HashGroup's insert as an uncaptured lookup's: it may grow, evict
    or fail on every rank); an overflow's caps grow. Where the group's full shards evict every
    new key in place (header()'s in_place), its insert is an uncaptured one that leaves its
    counts and every rank's agreement on them to the next op header
    (key_exchange._agreed_in_place), and, where no rank overflowed, the exchange is sized by
    the caps, as an uncaptured lookup's is then. Returns (vectors, Routing)."""
    prepared = [tuple(outputs[_PREPARED:_SLOTS])]
    send_counts, recv_counts, prepared, slots = sized_or_counted(
        runtime, plan, sizes, prepared, [outputs[_SLOTS]], [outputs[_PREPARED]],
        counted=not in_place)
    tags, tagged = [], []
    if fitting is not None:
        tags = [outputs[_SLOTS + 2] if slots else tags_to_send(
            runtime.backend, prepared[0], outputs[_SLOTS + 1], None,
            int(send_counts[:, 0].sum()))]
        tagged = [0]
    (vectors,), (rows,), _ = owners_round(runtime, op, [table], prepared, tags, tagged,
                                          send_counts, recv_counts, slots or [None], True,
                                          None, fitting or (set(), {}), {0} if in_place else ())
    if slots:
        return vectors, routing(runtime, table, outputs, rows, count, plan, sizes, None, None,
                                fitting)
    distinct, inverse, perm, _ = prepared[0]
    return vectors, Routing(inverse, int(distinct.shape[0]), perm, send_counts[:, 0].copy(),
                            recv_counts[:, 0].copy(), rows, count, False,
                            getattr(table, "row_starts", None))


def backward_run(runtime, table, routing, grads, pieces, kept=None):
    """The device work of a bounded backward on several ranks: each key's gradient summed per
    distinct key, sent to the owners in the forward's capacity slots, and laid out there in a
    piece per member (`pieces`, from Routing.bounds), padded. kept: None, or the recorded
    work's int8 marks of the rows an earlier replay may have stored a sum in, the only padded
    places its sums zero (backend/kept_sums.py). Returns [rows, summed, local]."""
    backend = runtime.backend
    send = routing.send_counts.reshape(-1, 1)
    recv = routing.recv_counts.reshape(-1, 1)
    received, = exchange(runtime, bucketed_gradients(backend, [routing], [grads]), send, recv)
    with backend.sums_kept(kept):  # (None: every padded place zeroed)
        rows, summed, padded = padded_sums(backend, table, routing, received, pieces)
    return [rows, summed, padded.local]
