"""sok1x.dump in SOK v2's file format (sok_format.py) with the guarantees of DESIGN D8.

Each of a table's files is made by one rank (rank 0, or a localized table's owner) under a
temporary name, with SOK's header and its full size; then every rank writes its own rows at
their place in it (sok_format.segments: SOK's rounds, each round every rank's slice in rank
order), chunk by chunk, straight from its shard: no rows cross MPI and no rank holds more than
its shard's keys (a DynamicVariable's, sorted as SOK writes them) and a chunk of rows
(SOK1X_CHECKPOINT_CHUNK_MB / 4). Each rank checksums its pieces; rank 0 joins them into each
file's crc32 and publishes the dump (sok_marker.py), so a crash at any point leaves the previous
dump loadable and never a mix. Jobs dumping into one folder take turns (folder_lock.py) and keep
each other's tables. Collective: every rank calls these, in the same order; an error on any rank
is raised on every rank.
"""
import os
import time
import uuid
import zlib

import numpy as np

from sok1x.engine import runtime as _runtime
from sok1x.engine.checkpoint import checksum, sok_format, sok_marker
from sok1x.engine.checkpoint import tables as sharded_tables
from sok1x.engine.checkpoint.folder_lock import folder_locked
from sok1x.engine.checkpoint.storage import remove_quietly
from sok1x.engine.lookup.exchange_header import confirm_same_op
from sok1x.engine.tables import placement as placements
from sok1x.engine.tables import shard_rows
from sok1x.errors import CheckpointError


def chunk_rows(row_bytes):
    """Rows of `row_bytes` bytes each that a rank moves at a time: a quarter of
    SOK1X_CHECKPOINT_CHUNK_MB, at least one."""
    return max(1, sharded_tables.chunk_bytes() // 4 // int(row_bytes))


def dump_tables(folder, tables, extras=None):
    """Writes each SokTable of `tables` into `folder` (made if missing) as SOK's files, then
    publishes them together. extras: None, or {stem: {file name: bytes}} rank 0 writes beside a
    table's files and publishes with them (the optimizer's step record), so the marker never
    pairs one dump's tables with another's. Raises CheckpointError on every rank, publishing
    nothing, for a table without rows (SOK refuses those too) or a file a rank cannot write."""
    with _runtime.entered() as rt:
        confirm_same_op(rt, "sok1x.dump")  # a training step on another rank: OrderError
        with folder_locked(rt.host, folder, exclusive=True):
            tag = rt.host.broadcast_object("%d-%s" % (int(time.time()), uuid.uuid4().hex[:8])
                                           if rt.rank == 0 else None)
            try:
                _dump_locked(rt, folder, tables, tag, extras or {})
            except BaseException:
                if rt.rank == 0:
                    _remove_temporaries(folder, tables, tag, extras or {})
                raise


def _dump_locked(rt, folder, tables, tag, extras):
    what = "sok1x.dump of %s into %s" % ([t.stem for t in tables], folder)
    error = None
    if rt.rank == 0:  # leftovers of dumps that died go first (the marker must be readable)
        try:
            sok_marker.remove_leftovers(folder, sok_marker.read_marker(folder))
        except CheckpointError as exc:
            error = exc
    rt.host.raise_together(error, what)
    written = {table.stem: _write_table(rt, folder, table, tag, what) for table in tables}
    error = None
    if rt.rank == 0:
        try:
            for stem, files in extras.items():
                for final, data in files.items():
                    with open(os.path.join(folder, sok_marker.temporary_name(final, tag)),
                              "wb") as handle:
                        handle.write(data)
                    written.setdefault(stem, {})[final] = (len(data), zlib.crc32(data))
            sok_marker.publish(folder, written, tag)
        except (CheckpointError, OSError) as exc:
            error = CheckpointError("rank 0 cannot publish the dump in %s: %s" % (folder, exc))
    rt.host.raise_together(error, what)


def _remove_temporaries(folder, tables, tag, extras):
    for table in tables:
        for sok_file in sok_format.files_of(table):
            final = sok_format.file_name(table.stem, sok_file.suffix)
            remove_quietly(os.path.join(folder, sok_marker.temporary_name(final, tag)))
    for files in extras.values():
        for final in files:
            remove_quietly(os.path.join(folder, sok_marker.temporary_name(final, tag)))


class _HeldRows:
    """This rank's rows of one table in SOK's file order: count, and keys / shard rows of a
    range of them (a DynamicVariable's sorted by key, as SOK writes them)."""

    def __init__(self, rt, shard, table):
        self.rt, self.shard = rt, shard
        self.key_dtype = np.uint64 if table.owner is not None and not table.dynamic \
            else np.int64  # SOK writes a localized Variable's keys so
        if shard.use_hashtable:
            keys, rows = sharded_tables._held_rows(rt, shard)
            order = np.argsort(keys, kind="stable")
            self._keys, self._rows = keys[order], rows[order]
            self.count = int(self._keys.shape[0])
        else:
            self._keys = self._rows = None
            limit = shard.values.shape[0] if table.key_limit is None else table.key_limit
            self.count = min(int(shard.values.shape[0]), shard_rows.owned_count(
                shard.placement, int(limit), rt.rank, rt.size))

    def keys(self, start, stop):
        if self._keys is not None:
            return self._keys[start:stop].astype(self.key_dtype, copy=False)
        rows = np.arange(start, stop, dtype=np.int64)
        return placements.global_keys(self.shard.placement, rows, self.rt.rank,
                                      self.rt.size).astype(self.key_dtype)

    def values(self, array, start, stop):
        """Host float32 rows [start, stop) of `array` (the values or a slot)."""
        if self._rows is None:
            rows, contiguous = np.arange(start, stop, dtype=np.int64), True
        else:
            rows, contiguous = self._rows[start:stop], False
        return np.asarray(sharded_tables._rows_to_host(self.rt.backend, array, rows,
                                                       contiguous, None), np.float32)


def _write_table(rt, folder, table, tag, what):
    """Collective: one table's files under their temporary names; returns {final name: (size,
    crc32)} (rank 0's is the one published)."""
    shard = sharded_tables.ready_tables(rt, [table.name], what)[0]
    held = _HeldRows(rt, shard, table)
    counts = rt.host.all_gather_object(held.count)
    if sum(counts) == 0:
        raise CheckpointError("%s: the table holds no rows; SOK's dump format cannot hold an "
                              "empty table" % table.stem)
    layout = sok_format.segments(counts, table.dim, table.owner)
    files = []
    for sok_file in sok_format.files_of(table):
        final = sok_format.file_name(table.stem, sok_file.suffix)
        dtype = np.dtype(held.key_dtype if sok_file.file_type == sok_format.KEY_FILE
                         else np.float32)
        per_row = dtype.itemsize * (1 if sok_file.file_type == sok_format.KEY_FILE
                                    else table.dim)
        header = sok_format.encode_header(sok_file.file_type, sok_file.slot_name, dtype)
        files.append((final, header, per_row, os.path.join(
            folder, sok_marker.temporary_name(final, tag))))
    maker = 0 if table.owner is None else table.owner
    error = None
    if rt.rank == maker:
        try:
            for _, header, per_row, path in files:
                _make_file(path, header, len(header) + sum(counts) * per_row)
        except OSError as exc:
            error = CheckpointError("rank %d cannot make %s: %s" % (rt.rank, path, exc))
    rt.host.raise_together(error, what)  # every file exists, at its size, from here on
    pieces, error = [], None
    mine = [segment for segment in layout if segment[0] == rt.rank]
    try:
        for index, (_, header, per_row, path) in enumerate(files):
            pieces += [(index,) + piece for piece in _write_rows(
                path, len(header), per_row, mine, _source(held, shard, table, index))]
    except (OSError, MemoryError) as exc:
        error = CheckpointError("rank %d cannot write its rows of %s into %s: %s"
                                % (rt.rank, table.stem, folder, exc))
    rt.host.raise_together(error, what)
    every = [p for per_rank in rt.host.all_gather_object(pieces) for p in per_rank]
    out = {}
    for index, (final, header, _, _) in enumerate(files):
        crc, size = zlib.crc32(header), len(header)
        for _, _, length, piece_crc in sorted(p for p in every if p[0] == index):
            crc, size = checksum.combine(crc, piece_crc, length), size + length
        out[final] = (size, crc & 0xFFFFFFFF)
    return out


def _source(held, shard, table, index):
    """read(start, stop) -> host array of rows [start, stop) of the table's file `index`."""
    if index == 0:
        return held.keys
    if index == 1:
        return lambda start, stop: held.values(shard.values, start, stop)
    _, _, engine_slot = table.slots[index - 2]
    array = shard.slot(*engine_slot)
    return lambda start, stop: held.values(array, start, stop)


def _make_file(path, header, size):
    """Creates `path` (new) holding `header`, extended to `size` bytes."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_at(descriptor, header, 0)
        os.ftruncate(descriptor, size)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_at(descriptor, data, offset):
    view = memoryview(data).cast("B")
    while view.nbytes:
        count = os.pwrite(descriptor, view, offset)
        view, offset = view[count:], offset + count


def _write_rows(path, header_bytes, per_row, mine, read):
    """Writes this rank's segments (sok_format.segments' entries) of rows from read(start,
    stop) into file `path`, chunk by chunk; returns [(byte offset, length, crc32)] per
    segment."""
    pieces = []
    descriptor = os.open(path, os.O_WRONLY)
    try:
        for _, first, stop, file_row in mine:
            at = header_bytes + file_row * per_row
            crc, step = 0, chunk_rows(per_row)
            for start in range(first, stop, step):
                data = np.ascontiguousarray(read(start, min(stop, start + step)))
                crc = zlib.crc32(data, crc)
                _write_at(descriptor, data, at + (start - first) * per_row)
            pieces.append((at, (stop - first) * per_row, crc))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return pieces
