"""The all-to-all lookup every front door is built on (SOK's All2All exchange), for one table or
several at once (SOK's fused lookup: one exchange whatever the number of tables). A "table" here
may be a TableGroup (engine/lookup/table_group.py): many tables in one id space, one pass for all.

Forward, on each rank and for each table: de-duplicate the keys, bucket the distinct ones by
owner (the table's placement), exchange the per-owner counts of every table in the op header,
send the keys of all tables to their owners in one exchange, let each owner find (or insert)
their rows and gather their vectors, send the vectors of all tables back in one exchange, and
spread them to every input position. Each distinct key crosses the network once per rank and
direction, however often the batch repeats it. On one rank nothing crosses a network, and the
keys go to the table as they are.
Backward: sum the top gradients of each distinct key, send the sums of all tables to the owners
in one exchange, in the same bucket order, where the sums from different ranks for one row are
added (unique + segment-sum); the result is (values, local rows) per table for IndexedSlices.

    before forward:  rank r holds keys k_t of each table t (any owners)
    after forward:   rank r holds table_t[k_t] for each of its keys, in its input order
    before backward: rank r holds d loss / d table_t[k] for each of its keys
    after backward:  owner o holds, per row of t it owns that was used, the sum of those gradients

Keys and gradients are backend arrays (device arrays on cuda); a step waits on the host twice,
whatever the number of tables: for the forward's header (the keys' checks flag, distinct keys and
per-owner counts are left on the device and ride in it) and for the backward's (the owners'
distinct rows are counted on the device before it, and read with it). A training lookup of hash
tables (a hash group, lookup/table_group.py, or a v1 hash table alone) whose shards cannot fill
up in it waits no more: the header tells every rank each rank's keys and room per table, so
every rank sees alike that no owner can overflow, and the keys each table placed are read in
the next header's wait. Otherwise it waits once more for the keys its hash groups placed, twice
for each hash table alone (its count of new keys, then of the keys it placed), and the ranks
agree on any full shard over MPI. A hash group of growing tables (hbm DynamicVariables) near
a member's capacity counts its new keys first (a wait) and, where a member grows, places them
after the agreement (one wait more).
"""
import collections
import functools

import numpy as np

from sok1x.engine.tables import admission
from sok1x.engine.tables.eviction import EVICTS_IN_PLACE
from sok1x.engine.lookup import bounded_step, distinct_rows, peer_capacity
from sok1x.engine.lookup.checks import (
    KEY_DTYPES,
    V1_LIMIT,
    VARIABLE_LIMIT,
    check_keys_by_bounds,
    first_error,
)
from sok1x.engine.lookup.exchange_header import OVERFLOW, SHARED_WIDTH, exchange_sizes
from sok1x.engine.op_order import as_op_id
from sok1x.engine.tables.table import EmbeddingTable
from sok1x.errors import InvalidInputError

Routing = collections.namedtuple(
    "Routing",
    "inverse distinct perm send_counts recv_counts owner_rows count may_miss row_starts slots "
    "check bounds")
Routing.__new__.__defaults__ = (None, None, None)
Routing.__doc__ = """How one forward pass moved one table's keys: inverse (backend int64
[count], the distinct key of each input position; None on one rank, where keys are not
de-duplicated), distinct (how many distinct keys), perm (backend int64, the distinct key of each
bucketed position; None on one rank: the keys as they came), send_counts / recv_counts (host
int64 [size]), owner_rows (backend int64, the owner's row of each key it received, -1 where a
lookup without insert missed), count (keys in), may_miss (rows may be -1: a hash table looked up
without insert, or with a low-frequency filter), row_starts (a TableGroup's row_starts when it
routed, host int64 [T + 1], which a later growth replaces but never changes; else None), slots
(backend int64, the per-peer capacity slot of each bucketed position, -1 past the keys, when the
lookup sent capacity buffers (lookup/peer_capacity.py): distinct and perm are then padded to the
keys, the counts are the caps, and owner_rows holds -1 at the slots no key filled; else None),
check (the lookup's key checks its backward reads, a bounded_step.Deferred, or None), bounds
(a bounded step on several ranks sized by caps: host int64 [members], per member the most
distinct rows this rank's shard can get in the backward, bounded_step.bounds_of; else None)."""


KeyCheck = collections.namedtuple("KeyCheck", "bounds judge flag error")
KeyCheck.__doc__ = """A step's key checks started on the device: bounds (backend int64 [n, 2], the
(min, max) of each checked array), judge(host bounds) -> the first input error or None, flag
(backend int64 [1], 1 where a bound leaves its range: the op header carries it, so no rank reads
the bounds unless some rank's input is bad), error (what is wrong without looking at the data,
a dtype, or None)."""

_KEY_MAX = np.iinfo(np.int64).max


def start_key_checks(runtime, tables, keys_list, extra_checks=(), key_limits=None):
    """check_step_keys without its wait: the bounds are computed and compared on the device.
    extra_checks: (array, check(bounds) -> error or None, (lowest, highest) allowed) triples.
    Returns a KeyCheck."""
    backend = runtime.backend
    key_limits = key_limits or [None] * len(tables)
    arrays, ranges = [], []
    for table, keys, key_count in zip(tables, keys_list, key_limits):
        if keys.dtype in KEY_DTYPES:
            limit = table.key_limit if key_count is None else key_count
            arrays.append(keys)
            ranges.append((0, _KEY_MAX if limit is None else int(limit) - 1))
    for array, _, allowed in extra_checks:
        arrays.append(array)
        ranges.append(allowed)
    bounds = backend.index_bounds_deferred(arrays)
    flag = backend.flag_outside(bounds, np.array(ranges, dtype=np.int64).reshape(-1, 2))

    def judge(host_bounds):
        errors, position = [], 0
        for table, keys, key_count in zip(tables, keys_list, key_limits):
            if keys.dtype in KEY_DTYPES:
                limit, limit_name = table.key_limit, V1_LIMIT
                if key_count is not None:
                    limit, limit_name = key_count, VARIABLE_LIMIT
                errors.append(check_keys_by_bounds(table.name, keys, host_bounds[position],
                                                   limit, backend.to_host, limit_name))
                position += 1
            else:
                errors.append(InvalidInputError("%s: keys must be int64 or int32, got %s"
                                                % (table.name, keys.dtype)))
        for _, check, _ in extra_checks:
            errors.append(check(host_bounds[position]))
            position += 1
        return first_error(*errors)
    dtype_errors = [InvalidInputError("%s: keys must be int64 or int32, got %s"
                                      % (table.name, keys.dtype))
                    for table, keys in zip(tables, keys_list) if keys.dtype not in KEY_DTYPES]
    return KeyCheck(bounds, judge, flag, first_error(*dtype_errors))


def check_step_keys(runtime, tables, keys_list, extra_checks=(), key_limits=None):
    """Returns the first input error of a step's keys (dtype, negative, beyond the table), or
    None. extra_checks: (array, check(bounds) -> error or None, (lowest, highest)) triples whose
    bounds are read in the same single wait. key_limits: per table None or its number of keys
    (a sok1x.Variable's rows), tighter than its shards' capacity."""
    check = start_key_checks(runtime, tables, keys_list, extra_checks, key_limits)
    return _judged(runtime.backend, check, [])[0]


def _judged(backend, check, sizes):
    """Reads the check's bounds and `sizes` (backend arrays) in one wait; returns (the check's
    error or None, host copies of sizes)."""
    if check is None:
        return None, backend.to_host_many(sizes) if sizes else []
    hosts = backend.to_host_many([check.bounds] + list(sizes))
    return check.judge(hosts[0]), hosts[1:]


def check_error(backend, check):
    """The error of a check whose flag the device set (read now: a failing step may wait)."""
    error = _judged(backend, check, [])[0]
    return error or InvalidInputError("an index of this step lies outside its range")


def lookup_forward_many(runtime, tables, op, keys_list, training, local_error=None,
                        key_check=None, admit_ratios=None, tags_list=None, tag_counts=None,
                        defer_check=None, member_keys=None):
    """Collective. tables: EmbeddingTables (or TableGroups, lookup/table_group.py); keys_list:
    one backend int 1-D array per table. Returns (vectors, routings): per table backend float32
    [n_t, dim_t] in input order, and the Routing its backward pass needs. Raises the step's input
    errors on every rank before any table changes. key_check: the caller's KeyCheck of the
    step's inputs (start_key_checks; default: one of keys_list); admit_ratios: None, or per
    table None or the ratio of new keys a training lookup of a hash table admits
    (engine/tables/admission.py: the others give zeros and no gradient); tags_list: None, or per
    table None or, for a HashGroup (lookup/table_group.py), backend int64 [n_t]: the member of
    each key (a group's keys are de-duplicated per (tag, key), and its tags travel with its keys
    in the same exchange); tag_counts: None, or per table None or, for a HashGroup, host int64
    [members]: how many of this rank's keys each member has (before de-duplication);
    defer_check: None (the checks are read before anything is gathered), "end" (the caller
    reads nothing past the keys' places: no segment ids; a one-rank bounded step reads them
    once its gather is queued) or "backward" (as "end", and the caller runs the lookup's
    backward: the bounded step leaves them to it, bounded_step.py); member_keys: None, or per
    table None or host int64 [members], this rank's keys per member of the table (a dense
    table: one member): a bounded step on several ranks sized by per-peer capacities tells
    every rank them in the header, so that its backward is bounded too (Routing.bounds).

    The host waits once, for the op header: the keys are de-duplicated and bucketed by owner
    before anything is read (the kernels read nothing out of place whatever the keys), and the
    per-owner counts and the checks' flag ride in the header; a rank reads its bounds only when
    some rank's flag is set, to name the bad input."""
    backend, size = runtime.backend, runtime.size
    error = local_error
    if error is None and key_check is None:
        key_check = start_key_checks(runtime, tables, keys_list)
    if error is None:
        error = key_check.error
    flag = None if error is not None else key_check.flag

    def describe():
        return check_error(backend, key_check)
    tags_list = tags_list or [None] * len(tables)
    tagged = [t for t, tags in enumerate(tags_list) if tags is not None and error is None]
    bounded, shared = room_and_keys(tables, keys_list, tagged, training, tag_counts,
                                    admit_ratios)
    send_counts = np.zeros((size, len(tables)), dtype=np.int64)
    prepared, sent_tags, slots, deferred = [], [], None, None
    bounds = [None] * len(tables)
    if error is None and size == 1:  # alone, nothing crosses a network: no de-duplication
        for t, keys in enumerate(keys_list):
            keys = backend.asarray(keys)
            send_counts[0, t] = keys.shape[0]
            prepared.append((keys, None, None, keys))
        sent_tags = [backend.asarray(tags_list[t]) for t in tagged]
        later = defer_check is not None and bounded_step.defers(runtime, tables, training, flag)
        told = exchange_sizes(runtime, op, None, error, None if later else flag,
                              describe_error=describe, shared=shared).shared
        fitting = fitting_units(bounded, told)
        in_place = in_place_units(bounded, told, fitting[0])  # (their counts read later)
        if later:
            deferred = bounded_step.Deferred(backend.read_later(flag), describe,
                                             as_op_id(op).name)
        recv_counts = send_counts
    else:
        owner_counts, plan, telling, distinct_tags = None, None, None, []
        if error is None:  # distinct keys and owner counts stay on the device: the header
            # carries the counts, and its one wait tells how many distinct keys there are
            plan = _sizing_plan(runtime, op, tables, training, admit_ratios)
            prepared, owner_counts, slots, flag = routed_keys(
                backend, size, tables, keys_list, tags_list,
                None if plan is None else plan.caps, flag)
            distinct_tags = [tags_of_distinct(backend, prepared[t], tags_list[t])
                             for t in tagged]
            if shared is None and slots is not None:
                telling = bounded_step.told_keys(runtime, member_keys, SHARED_WIDTH)
                shared = telling or None
        sizes = exchange_sizes(runtime, op, owner_counts, error, flag, describe_error=describe,
                               shared=shared, sized=None if error else plan is not None)
        told = sizes.shared
        fitting = fitting_units(bounded, told)
        # a hash group sized by the caps passes their padded slots (key -1) by in its insert,
        # which only a group no shard of which can fill up, or whose full shards evict every
        # new key in place, takes (_insert_keys): where a shard might fill up otherwise, every
        # rank sees it alike in the header, and the step goes by its counts
        in_place = in_place_units(bounded, told, fitting[0])
        send_counts, recv_counts, prepared, slots = sized_or_counted(
            runtime, plan, sizes, prepared, slots, keys_list,
            counted=any(t not in fitting[0] and t not in in_place for t in tagged))
        if slots is not None and telling:
            bounds = bounded_step.bounds_of(tables, member_keys, told,
                                            plan.caps[:, runtime.rank])
        elif slots is not None and tagged and bounded_step.asked():  # (fit, or evict in place)
            # a hash group's keys per member, every rank's, came with its room in the header
            for t in tagged:
                bounds[t] = bounded_step.rows_bound(tables[t], fitting[1][t], size,
                                                    plan.caps[t, runtime.rank])
        sent_tags = [tags_to_send(backend, prepared[t], tags,
                                  None if slots is None else slots[t],
                                  int(send_counts[:, t].sum()))
                     for tags, t in zip(distinct_tags, tagged)]
    slots = slots or [None] * len(tables)
    outs, owner_rows, passed = owners_round(runtime, op, tables, prepared, sent_tags, tagged,
                                            send_counts, recv_counts, slots, training,
                                            admit_ratios, fitting, in_place)
    routings = []
    for t, (table, keys) in enumerate(zip(tables, keys_list)):
        distinct, inverse, perm, _ = prepared[t]
        routings.append(Routing(inverse, distinct.shape[0], perm, send_counts[:, t].copy(),
                                recv_counts[:, t].copy(), owner_rows[t], keys.shape[0],
                                table.use_hashtable and (not training or
                                                         passed[t] is not None),
                                getattr(table, "row_starts", None), slots[t],
                                deferred if defer_check == "backward" else None, bounds[t]))
    if deferred is not None:
        bounded_step.defer_or_read(runtime, deferred, defer_check == "backward")
    return outs, routings


def owners_round(runtime, op, tables, prepared, sent_tags, tagged, send_counts, recv_counts,
                 slots, training, admit_ratios, fitting, in_place=()):
    """A lookup's work after its op header: each table's keys (and the tagged tables' tags,
    `sent_tags`) to their owners, the owners' rows (a training lookup's inserts: _insert_keys,
    with `fitting`, fitting_units's pair, and `in_place`, in_place_units' set) and vectors, the
    vectors back and spread to every key.
    prepared: per table (distinct keys, inverse, perm, keys to send); counts host int64
    [size, tables]; slots: per table None or its capacity slots. Returns (vectors per table in
    input order, the owners' rows per table, per table None or admission's kept keys)."""
    backend = runtime.backend
    owned = exchange(runtime, [p[3] for p in prepared] + sent_tags,
                     _with_columns(send_counts, tagged), _with_columns(recv_counts, tagged))
    owned, owned_tags = owned[:len(tables)], dict(zip(tagged, owned[len(tables):]))
    passed = [None] * len(tables)
    for t, table in enumerate(tables):
        if training and admit_ratios and admit_ratios[t] is not None and table.use_hashtable:
            owned[t], passed[t] = admission.admitted_keys(backend, table, owned[t],
                                                          admit_ratios[t], table.journal.step)
    owner_rows, vectors = [None] * len(tables), [None] * len(tables)
    if training and any(table.use_hashtable for table in tables):
        _insert_keys(runtime, op, tables, owned, owned_tags, owner_rows, vectors, *fitting,
                     in_place)
    for t, (table, keys, kept) in enumerate(zip(tables, owned, passed)):
        if vectors[t] is not None:  # a hash group's training lookup: done
            continue
        if t in owned_tags:  # a hash group's lookup without insert
            rows = table.find(keys, owned_tags[t])
            found = table.gather(rows)
        elif training and table.use_hashtable and kept is None:
            rows, found = table.inserted_rows_and_vectors(keys)  # one kernel finds, places, copies
        else:
            rows = table.rows_of(keys, bool(training) and table.use_hashtable)
            if kept is not None:
                rows = admission.spread_rows(backend, rows, kept)
            found = table.gather(rows)
        owner_rows[t], vectors[t] = rows, found
    returned = exchange(runtime, vectors, recv_counts, send_counts)
    return spread_back(backend, tables, prepared, returned, slots), owner_rows, passed


def routed_keys(backend, size, tables, keys_list, tags_list, caps, flag):
    """A lookup's keys readied for their owners on several ranks, on the device and without a
    wait: each table's keys de-duplicated (padded to their length), bucketed by owner and, where
    `caps` (host int64 [tables, size], a peer_capacity.Plan's) are given, laid out in per-peer
    capacity buffers. Returns (prepared, owner_counts, slots, flag): prepared, per table
    (distinct keys, inverse, perm, keys to send); owner_counts, backend int64 [tables, size];
    slots, None or per table the capacity slot of each bucketed position; flag, the checks'
    `flag` with bit OVERFLOW set where a count exceeds its cap."""
    started, distinct_counts = backend.unique_many_start(
        [backend.asarray(k) for k in keys_list], ordered=False, tags_list=tags_list)
    distinct = backend.unique_many_padded(started)
    perms, owner_counts = backend.bucket_by_owner_many_deferred(
        [d for d, _ in distinct], size, [table.owner_rule for table in tables], distinct_counts)
    slots = None
    if caps is not None:  # sized by the caps, not the counts
        slots, flag = backend.peer_slots_many(owner_counts, caps,
                                              [keys.shape[0] for keys, _ in distinct], flag,
                                              OVERFLOW)
    prepared = []
    for t, ((keys, inverse), perm) in enumerate(zip(distinct, perms)):
        sends = (backend.take_rows(keys, perm) if slots is None else
                 _packed(backend, keys, perm, slots[t], int(caps[t].sum()), -1))
        prepared.append((keys, inverse, perm, sends))
    return prepared, owner_counts, slots, flag


def sized_or_counted(runtime, plan, sizes, prepared, slots, keys_list, counted=False):
    """After a lookup's op header (sizes, exchange_sizes' Sizes): where its keys went into
    capacity buffers (slots) and no rank overflowed, the caps size the exchange; else its counts
    do (an overflow's caps grow: peer_capacity.settle, on every rank alike), and the keys are
    cut to them. counted: the counts size it anyway (a reason every rank found alike in the
    header; the caps stay as they are, no MPI call). Returns (send_counts, recv_counts,
    prepared, slots or None), counts host int64 [size, tables]."""
    backend = runtime.backend
    if slots is not None and not sizes.overflow and not counted:
        plan.sized += 1
        return (peer_capacity.send_counts(plan), peer_capacity.recv_counts(plan, runtime.rank),
                prepared, slots)
    send_counts = sizes.sent
    if slots is not None:  # overflowed, or counted: this step goes by its counts
        prepared = [(k, i, p, backend.take_rows(k, p)) for k, i, p, _ in prepared]
    if plan is not None and (plan.caps is None or sizes.overflow):
        peer_capacity.settle(runtime, plan, send_counts, [keys.shape[0] for keys in keys_list])
    prepared = [_cut(backend, p, int(send_counts[:, t].sum())) for t, p in enumerate(prepared)]
    return send_counts, sizes.received, prepared, None


def spread_back(backend, tables, prepared, returned, slots):
    """Each table's vectors in its keys' input order: the rows `returned` by the owners (in
    bucket order, or in capacity slots) put back at the distinct keys, then spread to every
    key. prepared: per table (distinct keys, inverse, perm, sent keys); slots: per table None
    or its capacity slots. Returns backend float32 [n_t, dim_t] per table."""
    outs = []
    for t, table in enumerate(tables):
        distinct, inverse, perm, _ = prepared[t]
        spread = returned[t]
        if perm is not None:
            spread = backend.empty((distinct.shape[0], table.dim), np.float32)
            if slots[t] is not None:  # the capacity buffer's rows back to the distinct keys
                backend.move_rows(returned[t], slots[t], spread, perm)
            else:
                backend.put_rows(spread, perm, returned[t])
        outs.append(spread if inverse is None else backend.take_rows(spread, inverse))
    return outs


def _packed(backend, rows, index, slots, length, pad):
    """A per-peer capacity buffer [length, ...]: rows[index[i]] at slots[i] (slots -1 move
    nothing), `pad` everywhere else (-1 for keys: no row; 0 for gradients)."""
    packed = backend.fill_value(backend.empty((length,) + tuple(rows.shape[1:]), rows.dtype),
                                pad)
    backend.move_rows(rows, index, packed, slots)
    return packed


def _sizing_plan(runtime, op, tables, training, admit_ratios):
    """The peer_capacity Plan that sizes a lookup's exchanges (plan_of's), or None where its
    counts do: also a lookup of hash groups without insert (a padded key would be looked up) or
    with a ratio of new keys to admit. Every rank decides alike."""
    plan = peer_capacity.plan_of(runtime, as_op_id(op), tables)
    hashed = [t for t, table in enumerate(tables) if table.use_hashtable]
    if plan is not None and hashed and (not training or (admit_ratios and any(
            admit_ratios[t] is not None for t in hashed))):
        return None
    return plan


def tags_of_distinct(backend, prepared, tags):
    """The tags of a hash group's distinct keys, padded as its keys are (prepared: its (distinct
    keys, inverse, perm, keys to send)): each distinct key gets the tag of the keys it stands
    for (they all have one tag: keys are de-duplicated per (tag, key))."""
    distinct, inverse, _, _ = prepared
    distinct_tags = backend.empty((int(distinct.shape[0]),), np.int64)
    backend.put_rows(distinct_tags, inverse, backend.asarray(tags))
    return distinct_tags


def tags_to_send(backend, prepared, distinct_tags, slots, count):
    """The tags a hash group sends beside its keys (prepared as sized_or_counted left it): in
    bucket order, `count` of them, or in its keys' capacity slots (`slots`; -1 in the padded
    ones, whose keys are -1) of `count` places."""
    perm = prepared[2]
    if slots is not None:
        return _packed(backend, distinct_tags, perm, slots, count, -1)
    return backend.row_view(backend.take_rows(distinct_tags, perm), 0, count)


def room_and_keys(tables, keys_list, tagged, training, tag_counts, admit_ratios):
    """What a training lookup's header tells every rank of its hash units whose count of
    placed keys may wait: per HashGroup (those of `tagged` with tag_counts) this rank's keys per
    member, per hash table alone that may count later (may_count_later, no low-frequency
    filter) its keys; each followed by the rows each member's (the table's) shard has left.
    A table that two units of the lookup reach (named twice) is left out: the bound holds per
    unit. Units are taken in order while their values fit the header (SHARED_WIDTH).
    Returns ([(position, members)], a function making the host int64 values, or None)."""
    if not training:
        return [], None
    units = collections.Counter(map(id, tables))
    # a group whose member is also a unit of its own here (a unit per table, not per member)
    beside = {id(table.group) for table in tables if getattr(table, "group", None) is not None}
    bounded, parts, width = [], [], 0
    for t, table in enumerate(tables):
        if units[id(table)] > 1 or id(table) in beside or (
                id(getattr(table, "group", None)) in units):
            continue
        if t in tagged:
            counts = None if not tag_counts else tag_counts[t]
            if counts is None or len(counts) != len(table.capacities):
                continue
        elif (isinstance(table, EmbeddingTable) and table.may_count_later()
              and not (admit_ratios and admit_ratios[t] is not None)):
            counts = [keys_list[t].shape[0]]
        else:
            continue
        if width + 2 * len(counts) > SHARED_WIDTH:
            break
        width += 2 * len(counts)
        bounded.append((t, len(counts)))
        parts.append((np.asarray(counts, dtype=np.int64), table))
    if not parts:
        return [], None
    # made when the header goes, again if a joined restore repeats it (rooms may change then)
    return bounded, lambda: np.concatenate([a for counts, table in parts
                                            for a in (counts, table.room())])


def _told_units(bounded, told):
    """Per unit of `bounded` (room_and_keys' (position, members)) in the header's values
    `told` (host [size, k]): (position, every rank's keys per member summed, host int64
    [members], each rank's room per member, host int64 [size, members])."""
    at = 0
    for t, members in bounded:
        yield t, told[:, at:at + members].sum(axis=0), told[:, at + members:at + 2 * members]
        at += 2 * members


def fitting_units(bounded, told):
    """Returns (fitting, most): fitting, the units among `bounded` where no shard on any rank
    can fill up in this lookup (told: host [size, k], every rank's room_and_keys values): every
    rank's keys of a member, all sent to one owner, would fit that owner's room; most, per unit
    of `bounded` the host int64 [members] of those keys, the most any owner can get. Every rank
    finds the same."""
    fitting, most = set(), {}
    for t, keys, rooms in _told_units(bounded, told):
        most[t] = keys
        # (a member evicting in place, HashGroup.room's EVICTS_IN_PLACE, has no room left)
        if np.all(keys <= np.maximum(rooms, 0).min(axis=0)):
            fitting.add(t)
    return fitting, most


def in_place_units(bounded, told, fitting):
    """The units among `bounded` not in `fitting` (fitting_units') whose every shard on every
    rank either holds every rank's keys of its member even if all were new, or is full and
    evicts every new key in place (HashGroup.room's EVICTS_IN_PLACE): an owner's insert then
    takes them all (HashGroup.in_place_bounds holds on every owner with a full member; one
    without holds them even if all are new, counting nothing first), or fails the step on every
    rank, and a lookup sized by the caps may carry them, their padded slots passed by. Every
    rank finds the same."""
    return {t for t, keys, rooms in _told_units(bounded, told)
            if t not in fitting and np.all((keys <= rooms) | (rooms == EVICTS_IN_PLACE))}


def _with_columns(counts, tagged):
    """Counts [size, tables] with the columns of the tagged tables added (their tags travel as
    their keys do)."""
    return np.concatenate([counts, counts[:, tagged]], axis=1) if tagged else counts


def _insert_keys(runtime, op, tables, owned, owned_tags, owner_rows, vectors, fitting, most,
                 units_in_place=()):
    """A training lookup's check and insert of owned keys: each hash table alone counts its new
    keys against its capacity before anything changes (a wait each); the HashGroups among
    `tables` (those with owned_tags) place their keys in one launch each and the host reads all
    their counts in one wait, and erases them again if the step fails. Any full shard, on any
    rank, raises on every rank. A group or table in `fitting` (no shard of it can fill up now,
    as every rank found from the op header: fitting_units) neither waits nor takes part in that
    agreement: its counts are read in the next op header's wait (runtime.read_later). most:
    per hash group the header told of, the most keys per member any owner can get
    (fitting_units). Where every hash table not in `fitting` is a group in `units_in_place`
    (in_place_units', none of them in `fitting`: its full shards evict every new key in place,
    the others hold them), nothing waits either, on one rank as on several: the counts, and
    every rank's agreement on them, wait for the next op header (_agreed_in_place), so that the
    host goes on while the GPU evicts.
    Fills owner_rows and vectors for the groups and the tables in `fitting`."""
    backend = runtime.backend
    kept = []  # the groups' inserts in `fitting`: their lookups count once the step goes on
    for t in sorted(fitting):
        table = tables[t]
        if t in owned_tags:
            owner_rows[t], vectors[t], state = kept_insert(runtime, table, owned[t],
                                                           owned_tags[t])
            kept.append((table, state))
            continue
        owner_rows[t], vectors[t], placed = table.inserted_rows_and_vectors_later(owned[t])
        runtime.read_later.append((placed, functools.partial(table.index.settle_size, placed)))
    if all(t in fitting for t, table in enumerate(tables) if table.use_hashtable):
        _count_kept(kept)
        return  # every rank skips the agreement alike: `fitting` is the same everywhere
    if all(t in fitting or (t in owned_tags and t in units_in_place)
           for t, table in enumerate(tables) if table.use_hashtable):
        _agreed_in_place(runtime, op, tables, owned, owned_tags, owner_rows, vectors, most,
                         sorted(units_in_place), kept)
        return  # (every rank alike: the op header told them all what decides it)
    errors = _capacity_errors(backend, [(table, keys) for t, (table, keys)
                                        in enumerate(zip(tables, owned))
                                        if t not in owned_tags and t not in fitting])
    started, placed, growing = [], [], collections.OrderedDict()
    in_place = []  # (group, its eviction, its insert's placed counts): nothing read before
    try:
        for t in owned_tags:
            if t in fitting:
                continue
            bounds = tables[t].in_place_bounds(owned[t], most.get(t))
            if bounds is not None:  # every full member evicts all its new keys, no count first
                evicted = tables[t].make_room_in_place(bounds, owned[t], owned_tags[t])
                state, counts = tables[t].insert_start(owned[t], owned_tags[t], evicted)
                owner_rows[t], vectors[t] = tables[t].insert_kept(state, counts)
                kept.append((tables[t], state))
                in_place.append((tables[t], evicted, counts))
                continue
            needed = tables[t].rows_needed(owned[t], owned_tags[t], most.get(t))
            if needed is not None and np.any(needed > tables[t].capacities):
                errors.append(tables[t].growth_error(needed, owned[t], owned_tags[t]))
                growing[t] = needed  # placed once every rank knows the step goes on
                continue
            started.append((t, tables[t].insert_start(owned[t], owned_tags[t])))
        # the one wait: the started inserts' counts, and what each eviction in place counted
        reading = [s[1] for _, s in started] + [
            a for _, evicted, counts in in_place
            for a in (evicted.unserved, evicted.victims.totals, evicted.victims.served, counts)]
        hosts = backend.to_host_many(reading) if reading else []
        placed = hosts[:len(started)]
        errors += [tables[t].insert_error(state, p)
                   for (t, (state, _)), p in zip(started, placed)]
        errors += _settled_in_place(in_place, hosts[len(started):])
        runtime.host.raise_together(first_error(*errors), as_op_id(op).name)
        if growing:
            placed = _grown_and_placed(backend, tables, owned, owned_tags, growing, started,
                                       list(placed))
    except BaseException:  # whatever stopped the step: no group keeps a key it placed
        _undo_started(backend, tables, started, placed)
        raise
    _count_kept(kept)
    for done, ((t, (state, _)), p) in enumerate(zip(started, placed)):
        try:
            owner_rows[t], vectors[t] = tables[t].insert_finish(state, p, keep=True)
        except BaseException:  # the calls not finished yet keep no key either
            _undo_started(backend, tables, started[done + 1:], placed[done + 1:])
            raise


def _agreed_in_place(runtime, op, tables, owned, owned_tags, owner_rows, vectors, most, units,
                     kept):
    """_insert_keys' groups `units` evicting in place, with no wait between the exchanges (on
    several ranks) or before the rest of the step is queued (on one): each owner evicts and
    inserts its keys of a group (or, holding no full member, inserts them as kept_insert does:
    the op header told every rank that they fit), its counts' copies queued. The next op header
    (the backward's) reads them and agrees with every rank on a new key left without a victim
    (bounded_step.Deferred, agreed: read_left; one rank agrees with itself), where the step
    fails on every rank and is taken back; the kept inserts count their lookups once it
    passed. A replayed evicting class leaves its counts to the same header
    (ReplayedInsert.agreed_check), so an owner may replay while its peers do not: the
    collectives are the same."""
    backend = runtime.backend
    evictions = []
    for t in units:
        group = tables[t]
        bounds = group.in_place_bounds(owned[t], most.get(t))
        if bounds is None:  # no full member here: the header told every rank its keys fit
            owner_rows[t], vectors[t], state = kept_insert(runtime, group, owned[t],
                                                           owned_tags[t])
            kept.append((group, state))
            continue
        evicted = group.make_room_in_place(bounds, owned[t], owned_tags[t])
        state, counts = group.insert_start(owned[t], owned_tags[t], evicted)
        owner_rows[t], vectors[t] = group.insert_kept(state, counts)
        kept.append((group, state))
        evictions.append((group, evicted, counts))
    counted = [a for _, evicted, counts in evictions
               for a in (evicted.unserved, evicted.victims.totals, evicted.victims.served, counts)]
    read = backend.read_many_later(counted) if counted else list
    settled = []

    def settle():  # the evictions' counts handed over, once: their errors
        if not settled:
            settled.append([])  # (first: a read that fails is not made again by the undo)
            settled[0] = _settled_in_place(evictions, read())
        return settled[0]

    def passed():
        settle()
        _count_kept(kept)

    # (a step that fails before its check is read still hands its counts over, first)
    runtime.journal.record(settle)
    bounded_step.leave_agreed(runtime, bounded_step.agreed_check(
        lambda: first_error(*settle()), as_op_id(op).name, passed))


def kept_insert(runtime, group, owned, owned_tags):
    """A HashGroup's insert of its owned tagged keys where no shard of it can fill up
    (fitting_units): nothing read now; the placed keys are kept and counted when the next op
    header reads them (runtime.read_later). The caller counts the lookup (HashGroup.count_kept)
    once the step goes on. Returns (the owners' rows, their vectors, insert_start's state)."""
    state, placed = group.insert_start(owned, owned_tags)
    rows, vectors = group.insert_kept(state, placed)
    runtime.read_later.append((placed, functools.partial(group.settle, placed)))
    return rows, vectors, state


def _settled_in_place(in_place, hosts):
    """Hands each eviction in place (_insert_keys' (group, evicted, placed counts)) its host
    counts (hosts: per eviction its unserved, totals, served and placed, in order), so that
    nothing of it is left to count later; returns the errors of those that could not serve
    every new key (TableFullError: the step fails on every rank and is undone)."""
    errors = []
    for i, (group, evicted, counts) in enumerate(in_place):
        unserved, totals, served, placed = hosts[4 * i:4 * i + 4]
        group.settle(counts, placed)
        evicted.settle(totals, served)
        errors.append(group.in_place_error(totals, unserved))
    return errors


def _count_kept(kept):
    """Counts the kept inserts' lookups (HashGroup.count_kept): the step goes on."""
    for table, state in kept:
        table.count_kept(state)


def _grown_and_placed(backend, tables, owned, owned_tags, growing, started, placed):
    """Grows (or, for hybrid members, evicts from) the hash groups of `growing` ({position: rows
    each member needs}, counted exactly: HashGroup.rows_needed) and places their owned keys
    (one wait more), appending the calls to `started`; returns `placed` with their host counts
    appended."""
    first = len(started)
    for t, needed in growing.items():
        tables[t].make_room(needed, owned[t], owned_tags[t])
        started.append((t, tables[t].insert_start(owned[t], owned_tags[t])))
    calls = started[first:]
    counts = backend.to_host_many([s[1] for _, s in calls])
    placed.extend(counts)
    error = first_error(*[tables[t].insert_error(state, p)
                          for (t, (state, _)), p in zip(calls, counts)])
    if error is not None:  # the count was exact: a fault, not a full shard
        raise RuntimeError("a grown hash group could not place its counted keys: %s" % error)
    return placed


def _capacity_errors(backend, pairs):
    """capacity_error of each table of (table, owned keys) pairs, a table named at several
    positions of the lookup counted once over all its keys (apart, each count could fit where
    together they do not)."""
    keys_of = collections.OrderedDict()
    for table, keys in pairs:
        keys_of.setdefault(id(table), (table, []))[1].append(keys)
    return [table.capacity_error(keys[0] if len(keys) == 1 else backend.join_keys(
        keys, np.zeros(len(keys), np.int64))) for table, keys in keys_of.values()]


def _undo_started(backend, tables, started, placed):
    """Erases the keys of the hash groups' started inserts again (placed: their host counts,
    or empty where the host did not read them yet: read now)."""
    if started and len(placed) != len(started):
        placed = backend.to_host_many([s[1] for _, s in started])
    for (t, (state, _)), p in zip(started, placed):
        tables[t].insert_finish(state, p, keep=False)


def _cut(backend, prepared, distinct):
    """A table's (padded distinct keys, inverse, perm, keys to send) cut to its `distinct` keys
    (every distinct key goes to one owner: the sum of the header's send counts)."""
    keys, inverse, perm, sends = prepared
    return (backend.row_view(keys, 0, distinct), inverse, backend.row_view(perm, 0, distinct),
            backend.row_view(sends, 0, distinct))


def exchange(runtime, sends, send_counts, recv_counts):
    """One all-to-all of every table's rows (counts [size, tables]); alone, the rows themselves."""
    if runtime.size == 1:
        return list(sends)
    return runtime.data.all_to_all_v_many(sends, list(send_counts.T), list(recv_counts.T))


def lookup_forward(runtime, table, op, keys, training, local_error=None):
    """Collective. lookup_forward_many for one table: returns (vectors, routing)."""
    vectors, routings = lookup_forward_many(runtime, [table], op, [keys], training, local_error)
    return vectors[0], routings[0]


def exchange_gradients_many(runtime, tables, op, routings, grads_list, pieces_list=None):
    """Collective. grads_list: per table backend float32 [routing.count, dim] in the forward's
    input order. Returns per table backend (rows [u], summed [u, dim], ranks) of this rank's
    shard: per row used, the sum of its gradients over the job (a row -1 collects keys an
    inference lookup missed); ranks: see _owned_rows. pieces_list: None, or per table None or
    the host cuts [members + 1] of a group's keys member by member: a one-rank bounded step then
    lays each table's rows out in pieces sized by its keys, without a wait (ranks is then a
    bounded_step.Padded, rows and summed are padded with -1 rows and zeros)."""
    backend = runtime.backend
    deferred = bounded_step.take(runtime, routings, op)
    error = None
    for table, routing, grads in zip(tables, routings, grads_list):
        if tuple(grads.shape) != (routing.count, table.dim):
            error = error or InvalidInputError(
                "%s: gradient of shape %s does not match the forward's [%d, %d]"
                % (as_op_id(op).name, list(grads.shape), routing.count, table.dim))
    send_counts = np.stack([routing.send_counts for routing in routings], axis=1)
    recv_counts = np.stack([routing.recv_counts for routing in routings], axis=1)
    padded = _padded_pieces(runtime, tables, routings, pieces_list)
    if padded is None:  # the owners' distinct rows counted before the header, read in its wait
        bounded_step.raise_if_set(runtime, deferred)  # counting reads rows only in range
        deferred = []
        started, sizes = _owned_rows_start(backend, tables, routings)
    host_sizes = exchange_sizes(runtime, op, None, error,
                                also_read=sizes if padded is None else ()).extra
    owned = exchange(runtime, bucketed_gradients(backend, routings, grads_list), send_counts,
                      recv_counts)
    if padded is not None:
        out = [padded_sums(backend, table, routing, received, pieces)
               for table, routing, received, pieces in zip(tables, routings, owned, padded)]
        bounded_step.raise_if_set(runtime, deferred)  # the forward's checks, its work queued
        return out
    return [(rows, backend.segment_sum(received, inverse, rows.shape[0]), ranks)
            for (rows, inverse, ranks), received in zip(
                _owned_rows_finish(backend, started, host_sizes), owned)]


def bucketed_gradients(backend, routings, grads_list):
    """Per table the gradients a backward sends the owners: each key's gradient summed per
    distinct key (several ranks), in bucket order or in the forward's capacity slots (zeros
    where no key is). grads_list: per table backend float32 [routing.count, dim]."""
    bucketed = []
    for routing, grads in zip(routings, grads_list):
        grads = backend.asarray(grads)
        per_key = grads if routing.inverse is None else backend.segment_sum(
            grads, routing.inverse, routing.distinct)
        if routing.slots is not None:
            bucketed.append(_packed(backend, per_key, routing.perm, routing.slots,
                                    int(routing.send_counts.sum()), 0))
        else:
            bucketed.append(per_key if routing.perm is None else backend.take_rows(
                per_key, routing.perm))
    return bucketed


def _padded_pieces(runtime, tables, routings, pieces_list):
    """Per table the host piece_starts of a bounded backward (bounded_step.py), or None where
    the backward counts its rows: a hash table alone, a lookup whose rows may be missing, or a
    group without its cuts; on several ranks, a lookup not sized by per-peer capacities or
    without its bounds (Routing.bounds). A hash group's training lookup is bounded on one rank
    as a dense group's: each member's rows lie in its own range of the group's flat rows."""
    if pieces_list is None:
        return None
    if runtime.size > 1:
        if any(routing.bounds is None or routing.slots is None for routing in routings):
            return None
        return [bounded_step.piece_starts_of(routing.bounds) for routing in routings]
    if not bounded_step.enabled(runtime):
        return None
    out = []
    for table, routing, cuts in zip(tables, routings, pieces_list):
        members = len(_row_starts(table, routing)) - 1
        if ((table.use_hashtable and not _is_group(table)) or routing.may_miss
                or routing.inverse is not None):
            return None
        if cuts is None and members == 1:
            cuts = np.array([0, routing.count], np.int64)
        if cuts is None or len(cuts) != members + 1 or int(cuts[-1]) != routing.count:
            return None
        out.append(bounded_step.piece_starts(cuts))
    return out


def padded_sums(backend, table, routing, received, pieces):
    """(rows, summed, Padded) of a bounded backward: each member's distinct rows ascending in
    its piece, -1 and zeros in the places no row fills."""
    starts = _row_starts(table, routing)
    flat, local, inverse, counts = backend.distinct_rows_padded(
        routing.owner_rows, int(starts[-1]), starts, pieces, counted=True)
    summed = backend.segment_sum(received, inverse, int(pieces[-1]), counts)
    return flat, summed, bounded_step.Padded(pieces, local)


def _owned_rows_start(backend, tables, routings):
    """Queues the distinct owner rows of each routing and leaves their sizes on the device.
    Returns (started, sizes): sizes, backend arrays for the host to read (with the op header)
    and hand to _owned_rows_finish. A table whose rows follow from its keys (a TableGroup
    included) gets them in ascending order with ranks: host int64, how many lie below each
    start of a member's rows and the end (row_starts). A hash table (rows may be -1) gets them in
    any order with ranks None."""
    bounded = [not table.use_hashtable or (_is_group(table) and not routing.may_miss)
               for table, routing in zip(tables, routings)]
    found = [(routing.owner_rows, int(starts[-1]), starts)
             for starts, routing, b in zip(map(_row_starts, tables, routings), routings,
                                           bounded) if b]
    hashed = [routing.owner_rows for routing, b in zip(routings, bounded) if not b]
    found_started, found_sizes = backend.distinct_rows_many_start(found)
    hashed_started, hashed_sizes = backend.unique_many_start(hashed, ordered=False)
    return (bounded, found_started, hashed_started), [found_sizes, hashed_sizes]


def _owned_rows_finish(backend, started, host_sizes):
    """Per table (distinct rows, inverse, ranks) from _owned_rows_start's state and the host
    copies of its sizes."""
    bounded, found_started, hashed_started = started
    found = iter(backend.distinct_rows_many_finish(found_started, host_sizes[0]))
    hashed = iter(backend.unique_many_finish(hashed_started, host_sizes[1]))
    return [next(found) if b else next(hashed) + (None,) for b in bounded]


def _is_group(table):
    return getattr(table, "row_starts", None) is not None


def _row_starts(table, routing):
    """The row_starts a lookup of `table` routed with (a table alone: [0, its rows])."""
    if routing.row_starts is not None:
        return routing.row_starts
    return np.array([0, int(table.values.shape[0])], np.int64)


def lookup_backward_many(runtime, tables, op, routings, grads_list, pieces_list=None):
    """Collective. As exchange_gradients_many, but returns per table backend (values [u, dim],
    rows [u], ranks) of the rows that exist, for an IndexedSlices (ranks: see _owned_rows; a
    bounded_step.Padded where pieces_list made the backward bounded)."""
    backend = runtime.backend
    out = []
    for table, routing, (rows, summed, ranks) in zip(tables, routings, exchange_gradients_many(
            runtime, tables, op, routings, grads_list, pieces_list)):
        if routing.may_miss:  # rare: the gradient of an inference lookup; drop the misses
            host_rows = backend.to_host(rows)
            used = host_rows >= 0
            if _is_group(table):  # a hash group's rows ascending, counted per member
                order = np.flatnonzero(used)[np.argsort(host_rows[used], kind="stable")]
                ranks = np.searchsorted(host_rows[order], routing.row_starts).astype(np.int64)
                index = backend.asarray(order.astype(np.int64))
                rows, summed = backend.take_rows(rows, index), backend.take_rows(summed, index)
            elif not used.all():
                index = backend.asarray(np.flatnonzero(used).astype(np.int64))
                rows, summed = backend.take_rows(rows, index), backend.take_rows(summed, index)
        rows = backend.exportable(rows)  # handed to the framework as it is, and back
        distinct_rows.remember(rows)
        out.append((summed, rows, ranks))
    return out


def lookup_backward(runtime, table, op, routing, grads):
    """Collective. lookup_backward_many for one table: returns backend (values, rows); a
    bounded one-rank step (bounded_step.py) pads them with zeros and rows -1."""
    return lookup_backward_many(runtime, [table], op, [routing], [grads], [None])[0][:2]


def exchange_gradients(runtime, table, op, routing, grads):
    """Collective. exchange_gradients_many for one table: returns backend (rows, summed)."""
    return exchange_gradients_many(runtime, [table], op, [routing], [grads])[0][:2]
