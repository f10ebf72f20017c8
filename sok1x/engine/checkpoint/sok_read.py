"""sok1x.load of SOK v2's files (sok_format.py): a folder sok1x dumped (its marker, sok_marker.py,
names each table's files with their sizes and checksums) or one SOK dumped (SOK's files alone),
on any number of ranks, each rank keeping the keys its placement gives it.

Two passes, in bounded memory (a chunk of each file at a time, SOK1X_CHECKPOINT_CHUNK_MB / 4,
and the keys this rank keeps: a byte per row of a sok1x.Variable's shard, the keys of a
DynamicVariable's):
  1. check, changing nothing: every file's header, size and the marker's checksum (each rank
     checksums a share of each file; the shares are joined), and every key (negative, beyond a
     Variable's rows, twice, more than a shard holds), on every rank: any error, naming the
     file, is raised on every rank;
  2. read: the file's rows stream into the tables, written over theirs (SOK's load: keys the
     file lacks keep their rows).
Collective: every rank calls these, in the same order.
"""
import collections
import os
import zlib

import numpy as np

from sok1x.backend import cpu as host_ops
from sok1x.engine import runtime as _runtime
from sok1x.engine.checkpoint import checksum, sok_format, sok_marker
from sok1x.engine.checkpoint import tables as sharded_tables
from sok1x.engine.checkpoint.folder_lock import folder_locked
from sok1x.engine.checkpoint.sok_write import chunk_rows
from sok1x.engine.lookup.exchange_header import confirm_same_op
from sok1x.engine.tables import placement as placements
from sok1x.engine.tables import shard_rows
from sok1x.errors import CheckpointError

_Plan = collections.namedtuple("_Plan", "table shard files keys key_dtype holds step")
_Plan.__doc__ = """One table's checked files: shard (this rank's engine table), files
[(SokFile, path, dtype, crc32 or None)] (key, weight, slots), keys (how many), key_dtype, holds
(this rank holds rows of the table), step (rows a chunk)."""


def is_sok_folder(folder, stems):
    """True when `folder` holds a sok1x dump in SOK's format of every stem (its marker names
    them), or SOK's own key file of the first."""
    try:
        marker = sok_marker.read_marker(folder)
    except CheckpointError:
        return True  # SOK's format's load names the damaged marker
    if stems and all(stem in marker["tables"] for stem in stems):
        return True
    return bool(stems) and os.path.exists(os.path.join(
        folder, sok_format.file_name(stems[0], "key")))


def load_tables(folder, tables):
    """Restores each SokTable of `tables` from `folder`. Raises CheckpointError on every rank,
    changing no table, for a missing, damaged or mismatched file (named)."""
    what = "sok1x.load of %s from %s" % ([t.stem for t in tables], folder)
    with _runtime.entered() as rt:
        confirm_same_op(rt, "sok1x.load")  # a training step on another rank: OrderError
        with folder_locked(rt.host, folder, exclusive=False):  # not while a job dumps there
            shards = sharded_tables.ready_tables(rt, [t.name for t in tables], what)
            plans, shares, error = [], [], None
            try:
                marker = sok_marker.read_marker(folder)
                for table, shard in zip(tables, shards):
                    plans.append(_plan(rt, folder, marker, table, shard))
                    shares.append(_checksum_shares(rt, plans[-1]))
                for plan in plans:
                    _check_keys(rt, plan)
            except (CheckpointError, OSError, MemoryError) as exc:
                error = exc if isinstance(exc, CheckpointError) else CheckpointError(
                    "rank %d cannot read %s: %s" % (rt.rank, folder, exc))
            rt.host.raise_together(error, what)
            _compare_checksums(plans, rt.host.all_gather_object(shares))
            error = None
            try:
                for plan in plans:
                    if plan.holds:
                        _read_rows(rt, plan)
            except (CheckpointError, OSError, MemoryError) as exc:
                error = CheckpointError(
                    "rank %d could not read %s after checking it (%s): tables %s may be partly "
                    "restored; load them again" % (rt.rank, folder, exc,
                                                   [t.stem for t in tables]))
            rt.host.raise_together(error, what)


def _plan(rt, folder, marker, table, shard):
    """Checks one table's files' headers and sizes (against the marker's where it names them);
    returns its _Plan."""
    files, keys, key_dtype = [], None, None
    finals = [sok_format.file_name(table.stem, f.suffix) for f in sok_format.files_of(table)]
    where = sok_marker.files_to_read(marker, table.stem, finals, folder)
    for sok_file, final in zip(sok_format.files_of(table), finals):
        path, size, crc32 = where[final]
        if not os.path.exists(path):
            raise CheckpointError("SOK dump file %s is missing: table %s cannot be loaded from "
                                  "%s" % (path, table.stem, folder))
        if size is not None and os.path.getsize(path) != size:
            raise CheckpointError("SOK dump file %s is %d bytes; sok1x's marker %s says %d: the "
                                  "file is truncated or was replaced" % (
                                      path, os.path.getsize(path), sok_marker.MARKER_NAME, size))
        dtype, count = sok_format.open_file(path, sok_file.file_type, sok_file.slot_name)
        if keys is None:
            keys, key_dtype = count, dtype
        elif count != keys * table.dim:
            raise CheckpointError("SOK dump file %s holds %d values: not %d keys x dim %d"
                                  % (path, count, keys, table.dim))
        files.append((sok_file, path, dtype, crc32))
    holds = placements.holds_rows(shard.placement, rt.rank)
    return _Plan(table, shard, files, keys, key_dtype, holds, chunk_rows(4 * table.dim))


def _checksum_shares(rt, plan):
    """[(crc32, length)] of this rank's share of each file the marker has a checksum for."""
    out = []
    for _, path, _, crc32 in plan.files:
        if crc32 is None:
            out.append(None)
            continue
        size = os.path.getsize(path)
        first, stop = size * rt.rank // rt.size, size * (rt.rank + 1) // rt.size
        crc, step = 0, max(1, sharded_tables.chunk_bytes() // 4)
        with open(path, "rb") as handle:
            for at in range(first, stop, step):
                handle.seek(at)
                crc = zlib.crc32(handle.read(min(step, stop - at)), crc)
        out.append((crc, stop - first))
    return out


def _compare_checksums(plans, shares_by_rank):
    """Raises CheckpointError (on every rank alike) for a file whose joined checksum is not
    the marker's."""
    for index, plan in enumerate(plans):
        for number, (_, path, _, crc32) in enumerate(plan.files):
            if crc32 is None:
                continue
            crc = 0
            for shares in shares_by_rank:
                part_crc, length = shares[index][number]
                crc = checksum.combine(crc, part_crc, length)
            if crc & 0xFFFFFFFF != int(crc32):
                raise CheckpointError(
                    "SOK dump file %s fails the checksum sok1x's marker %s holds: the file is "
                    "corrupt (changed after it was dumped); dump again or restore a copy"
                    % (path, sok_marker.MARKER_NAME))


def _chunks(path, dtype, count, per_row, step):
    """Yields arrays of `step` rows (fewer at the end) of SOK file `path`'s `count` rows of
    `per_row` values; raises CheckpointError naming the file if it ends early."""
    with open(path, "rb") as handle:
        for start in range(0, count, step):
            rows = min(step, count - start)
            handle.seek(sok_format.HEADER_BYTES + start * per_row * dtype.itemsize)
            data = handle.read(rows * per_row * dtype.itemsize)
            if len(data) != rows * per_row * dtype.itemsize:
                raise CheckpointError("SOK dump file %s ended early: the file is truncated"
                                      % path)
            values = np.frombuffer(data, dtype)
            yield values.reshape(rows, per_row) if per_row > 1 else values


def _as_keys(raw, path):
    """int64 keys of a key chunk; raises CheckpointError naming the file for keys outside
    sok1x's int64 range (negative, or beyond it)."""
    if raw.size and (raw.dtype.kind == "i" and int(raw.min()) < 0 or
                     int(raw.max()) > np.iinfo(np.int64).max):
        raise CheckpointError("SOK dump file %s holds keys outside sok1x's int64 range"
                              % path)
    return raw.astype(np.int64)


def _owned(rt, shard, keys):
    return host_ops.owners_of(keys, rt.size, *shard.owner_rule) == rt.rank


def _check_keys(rt, plan):
    """Checks every key this rank keeps (the table's rows, twice, room); changes nothing."""
    if not plan.holds:
        return
    table, shard = plan.table, plan.shard
    path = plan.files[0][1]
    held = None if shard.use_hashtable else np.zeros(shard.values.shape[0], bool)
    kept = []
    for raw in _chunks(path, plan.key_dtype, plan.keys, 1, plan.step):
        keys = _as_keys(raw, path)
        if table.key_limit is not None and keys.size and int(keys.max()) >= table.key_limit:
            raise CheckpointError("SOK dump file %s holds key %d; table %s has %d rows"
                                  % (path, int(keys.max()), table.stem, table.key_limit))
        mine = keys[_owned(rt, shard, keys)]
        if held is None:
            kept.append(mine)
            continue
        rows = np.asarray(rt.backend.to_host(placements.direct_rows(
            host_ops, shard.placement, mine, rt.size)), np.int64)
        if np.unique(rows).size != rows.size or held[rows].any():
            raise CheckpointError("SOK dump file %s holds a key twice (table %s): the file is "
                                  "corrupt" % (path, table.stem))
        held[rows] = True
    if held is None:
        mine = np.sort(np.concatenate(kept)) if kept else np.zeros([0], np.int64)
        if mine.size > 1 and bool(np.any(mine[1:] == mine[:-1])):
            raise CheckpointError("SOK dump file %s holds key %d twice (table %s): the file is "
                                  "corrupt" % (path, int(mine[1:][mine[1:] == mine[:-1]][0]),
                                               table.stem))
        error = shard.capacity_error(rt.backend.asarray(mine))
        if error is not None:
            raise CheckpointError("%s: the keys of %s do not fit: %s" % (table.stem, path,
                                                                          error))


def _read_rows(rt, plan):
    """Writes the file's rows of the keys this rank holds over the table's, chunk by chunk."""
    table = plan.table
    key_path = plan.files[0][1]
    arrays = [(path, dtype, None) for _, path, dtype, _ in plan.files[1:2]]
    arrays += [(path, dtype, engine) for (_, path, dtype, _), (_, _, engine) in
               zip(plan.files[2:], table.slots)]
    streams = [_chunks(path, dtype, plan.keys, table.dim, plan.step)
               for path, dtype, _ in arrays]
    key_stream = _chunks(key_path, plan.key_dtype, plan.keys, 1, plan.step)
    for raw, *rows in zip(key_stream, *streams):
        keys = _as_keys(raw, key_path)
        mine = _owned(rt, plan.shard, keys)
        if not mine.any():
            continue
        for values, (_, _, engine) in zip(rows, arrays):
            shard_rows.assign(table.name, keys[mine], np.asarray(values[mine], np.float32),
                              table.key_limit, engine)
