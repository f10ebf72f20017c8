"""The gradients of a table group (engine/lookup/table_group.py) on their way to the update.

A group's backward pass sums its members' gradients in one pass over the group's flat rows
(rows of member t at row_starts[t] onwards); the update wants them either per member (a
framework applies each table's IndexedSlices) or per group (one update for all members).
split_gradient cuts the group's result into per-member views, 64-byte aligned, and remembers
it; group_gradients and keyed_gradient take the members' gradients back, recognise the
group's own result handed back unchanged (no work), and otherwise check, join and sum them.
"""
import collections

import numpy as np

from sok1x.backend.cuts import cut_points
from sok1x.engine.lookup import distinct_rows
from sok1x.errors import InvalidInputError

ALIGN_ROWS = 8  # int64 rows per 64 bytes: TensorFlow takes no tensor less aligned than that

Padded = collections.namedtuple("Padded", "piece_starts local")
Padded.__doc__ = """How a bounded backward (lookup/bounded_step.py) laid out its distinct rows, a
piece per member already: piece_starts (host int64 [T + 1], piece_starts(its keys' cuts)), local
(backend int64 [piece_starts[-1]]: each row less its member's first row, -1 where no row is)."""


def piece_starts(cuts):
    """Host int64 [T + 1]: where each member's piece starts, 64-byte aligned, for pieces of
    np.diff(cuts) rows (cuts host [T + 1])."""
    sizes = np.diff(np.asarray(cuts, dtype=np.int64))
    return cut_points(-(-sizes // ALIGN_ROWS) * ALIGN_ROWS)


def split_gradient(backend, group, summed, rows, ranks, starts):
    """Returns per member (values [u_t, dim], rows [u_t] of its own) as views of the group's
    backward result: summed [u, dim] for flat rows [u] ascending, laid out by `starts` (the
    row_starts the lookup routed with: a growth since may have replaced group.row_starts);
    ranks (host): how many rows lie below each of starts, or a bounded backward's Padded (its
    rows and values lie in their pieces already, -1 rows and zeros where no row is). Each
    member's rows start 64-byte aligned, so a framework takes them without a copy. Remembers
    the result for a whole-group update."""
    if isinstance(ranks, Padded):
        own_starts, own_rows = ranks.piece_starts, ranks.local
        sizes, value_starts = np.diff(own_starts), own_starts
    else:
        sizes, value_starts = np.diff(ranks), ranks
        own_starts = piece_starts(ranks)
        own_rows = backend.local_rows(rows, starts, own_starts[:-1] - ranks[:-1],
                                      int(own_starts[-1]))
    # (sizes: a member each; the starts: one more, the end)
    firsts, own_firsts = np.asarray(value_starts[:-1]), np.asarray(own_starts[:-1])
    if not sizes.shape[0] == firsts.shape[0] == own_firsts.shape[0] == len(group.members):
        raise RuntimeError("split_gradient: %d members, %d sizes, %d and %d starts"
                           % (len(group.members), sizes.shape[0], firsts.shape[0],
                              own_firsts.shape[0]))
    pieces = list(zip(backend.row_views(summed, firsts, firsts + sizes),
                      backend.row_views(own_rows, own_firsts, own_firsts + sizes)))
    distinct_rows.remember_all(own_rows, [r for _, r in pieces])
    group.last_gradient = (rows, summed, pieces, starts)
    return pieces


def _same_memory(arrays, pieces):
    """True if each array is its piece, or lies on the same memory (a framework handed it back
    through DLPack); empty arrays match empty pieces."""
    if all(a is b for a, b in zip(arrays, pieces)):
        return True
    return [_address(a) for a in arrays] == [_address(b) for b in pieces]


def _address(array):
    return distinct_rows.address(array) if array.shape[0] else (None, 0)


def group_gradients(backend, tables, values_list, rows_list):
    """Returns [(group, flat rows, values, positions, counts)] for each group all of whose
    members are in `tables` once: the group's distinct flat rows, their gradient values, the
    members' places in `tables` (group order) and how many distinct rows each has. The gradient
    of the group's last backward pass, handed back unchanged (the same memory), is used as it
    is (with the members' values joined where any was replaced, e.g. clipped); any other is
    checked (one wait for all members' bounds), joined into the group's rows and summed per row
    (one wait). Raises InvalidInputError naming the table for a gradient that does not fit,
    before anything changes."""
    out = []
    for group, positions in _complete_groups(tables):
        values = [_float32(backend, values_list[p]) for p in positions]
        rows = [backend.asarray(rows_list[p]) for p in positions]
        for table, v, r in zip(group.members, values, rows):
            if len(r.shape) != 1 or tuple(v.shape) != (r.shape[0], group.dim) or (
                    r.dtype not in (np.int64, np.int32)):
                raise InvalidInputError(
                    "%s: an update needs gradient values [n, %d] and int rows [n], got %s and "
                    "%s %s" % (table.name, group.dim, list(v.shape), r.dtype, list(r.shape)))
        last = group.last_gradient
        if last is not None and last[3] is group.row_starts and _same_memory(
                rows, [r for _, r in last[2]]):
            same = _same_memory(values, [v for v, _ in last[2]])
            out.append((group, last[0], last[1] if same else backend.join_rows(values),
                        positions, [int(r.shape[0]) for r in rows]))
        else:
            distinct, summed, counts = _joined_gradient(backend, group, values, rows)
            out.append((group, distinct, summed, positions, counts))
    return out


def _complete_groups(tables):
    """(group, positions in group order) for each group whose members are all in `tables`."""
    groups = collections.OrderedDict()
    for position, table in enumerate(tables):
        if getattr(table, "group", None) is not None:
            groups.setdefault(id(table.group), (table.group, {}))[1][id(table)] = position
    for group, places in groups.values():
        positions = [places.get(id(member)) for member in group.members]
        if len(places) == len(group.members) and None not in positions:
            yield group, positions


def _float32(backend, values):
    values = backend.asarray(values)
    if values.dtype != np.float32:
        values = backend.asarray(backend.to_host(values).astype(np.float32))
    return values


def _joined_gradient(backend, group, values, rows):
    """(distinct flat rows, summed values, distinct rows per member) of the members'
    gradients (values, own rows), checked."""
    bounds = backend.index_bounds(rows)
    for t, (table, r) in enumerate(zip(group.members, rows)):
        held = int(group.held_rows[t])
        low, high = (int(b) for b in bounds[t])
        if r.shape[0] and (low < -1 or high >= held):  # -1: padding, skipped
            raise InvalidInputError(
                "%s: gradient rows must be in [0, %d) (this rank's shard), got %d..%d. Apply "
                "the gradient of this table's own lookup." % (table.name, held, low, high))
    total = int(group.row_starts[-1])
    flat = backend.join_keys(rows, group.row_starts[:-1])
    (distinct, inverse, ranks), = backend.distinct_rows_many([(flat, total, group.row_starts)])
    summed = backend.segment_sum(backend.join_rows(values), inverse, int(distinct.shape[0]))
    return distinct, summed, [int(c) for c in np.diff(ranks)]


def keyed_gradient(backend, group, values, rows, counts):
    """Returns (distinct flat rows, their summed values, host distinct rows per member) of a
    keyed gradient: values [n, dim], rows [n] each member's own rows, counts host int64 [T]
    how many are member t's (member after member). The group's last keyed backward result
    handed back unchanged (the same memory) is used as it is (its values may be replaced); any
    other is checked (one wait for all members' bounds), moved into the group's rows and
    summed per row (one wait). Raises InvalidInputError naming the table for rows that do not
    fit, before anything changes."""
    values = _float32(backend, values)
    last = group.last_keyed
    if last is not None and last[3] is group.row_starts and _same_memory([rows], [last[0]]):
        return last[2], (last[1] if _same_memory([values], [last[1]]) else values), counts.copy()
    cuts = cut_points(counts)
    bounds = backend.part_bounds([rows], cuts)
    held = group.held_rows
    bad = (np.diff(cuts) > 0) & ((bounds[:, 0] < -1) | (bounds[:, 1] >= held))  # -1: padding
    if np.any(bad):
        t = int(np.argmax(bad))
        raise InvalidInputError(
            "%s: gradient rows must be in [0, %d) (this rank's shard), got %d..%d. Apply the "
            "gradient of this table's own lookup." % (group.members[t].name, int(held[t]),
                                                     int(bounds[t, 0]), int(bounds[t, 1])))
    flat = backend.offset_parts(rows, cuts, group.row_starts[:-1])
    (distinct, inverse, ranks), = backend.distinct_rows_many(
        [(flat, int(group.row_starts[-1]), group.row_starts)])
    summed = backend.segment_sum(values, inverse, int(distinct.shape[0]))
    return distinct, summed, np.diff(ranks).astype(np.int64)
