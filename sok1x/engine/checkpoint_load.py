"""Loading a sharded checkpoint into a table (DESIGN D8): a read plan, then a stream of chunks.

Each rank reads the shard files that can hold rows its placement gives it: only its own when
the checkpoint was saved on this many ranks with this placement, else every file (resharding is
a read plan, not a gather: no collective moves rows). It keeps the rows it owns and writes them
into a FRESH shard; the caller installs the fresh shards only once every rank read every table
without an error, so a bad file changes nothing. Host memory: one chunk's buffer (the chunks the
writer made, engine/checkpoint_format.py).
"""
import os

import numpy as np

from sok1x.backend import cpu as host_ops
from sok1x.engine import checkpoint_format, hybrid_rows
from sok1x.engine import placement as placements
from sok1x.engine.shard_storage import ShardReader
from sok1x.errors import CheckpointError


def files_to_read(rank, size, table, entry):
    """The manifest's shard dicts whose files this rank must read for `table`."""
    kind, owner = entry["placement"]
    saved_placement = placements.Placement(str(kind), int(owner))
    if not placements.holds_rows(table.placement, rank):
        return []
    same_layout = (len(entry["shards"]) == size and saved_placement == table.placement
                   and bool(entry.get("use_hashtable")) == table.use_hashtable)
    if same_layout:
        owner = table.placement.rank if table.placement.kind == "rank" else rank
        return [shard for shard in entry["shards"] if shard["rank"] == owner]
    return list(entry["shards"])


def shard_path(directory, shard):
    """Where to read `shard` (a manifest dict): beside the manifest in `directory` (a shared
    folder, or a copy of one), else where it was written (ranks that saved into folders of
    their own on a shared file system)."""
    beside = os.path.join(directory, shard["file"])
    written = shard.get("path")
    if written and not os.path.exists(beside) and os.path.exists(written):
        return written
    return beside


class _RowSink:
    """Writes the owned rows of streamed chunks into `fresh` (a new shard of `table`)."""

    def __init__(self, rt, fresh, slot_names):
        self.rt, self.fresh, self.backend = rt, fresh, rt.backend
        self.slot_names = slot_names  # (name, initial) to keep, in the file's slot order or None
        self.used = 0
        self.seen = None if fresh.use_hashtable else np.zeros(fresh.values.shape[0], bool)

    def add(self, keys, values, slots, times, where):
        """Keeps the rows of this chunk that this rank owns; raises CheckpointError naming
        `where` for a negative, duplicated or out-of-range key."""
        fresh = self.fresh
        if keys.size and int(keys.min()) < 0:
            raise CheckpointError("%s holds negative key %d (table %s): the file is corrupt"
                                  % (where, int(keys.min()), fresh.name))
        keep = host_ops.owners_of(keys, self.rt.size, *fresh.owner_rule) == self.rt.rank
        limit = fresh.key_limit
        if limit is not None:
            beyond = keys >= limit
            trained = beyond & (times > 0)
            if trained.any():
                raise CheckpointError(
                    "%s holds trained key %d, but table %s on %d ranks holds keys below %d "
                    "(max_vocabulary_size_per_gpu x ranks): raise max_vocabulary_size_per_gpu "
                    "or restore on more ranks" % (where, int(keys[trained][0]), fresh.name,
                                                  self.rt.size, limit))
            keep &= ~beyond  # untrained rows beyond the limit are fresh rows: the same anyway
        if keep.all():  # a shard read by its own rank: every row, no copies

            def mine(array):
                return array
        else:
            chosen = np.flatnonzero(keep)
            if not chosen.size:
                return

            def mine(array):
                return np.ascontiguousarray(array[chosen])
        rows = self._rows_for(mine(keys), where)
        first = int(rows[0]) if _contiguous(rows) else None
        device_rows = None if first is not None else self.backend.asarray(rows)

        def put(array, source):
            if first is not None and isinstance(array, np.ndarray):  # the cpu backend
                array[first:first + rows.size] = source
            else:
                hybrid_rows.put_rows(self.backend, array, device_rows if device_rows is not None
                                     else self.backend.asarray(rows),
                                     self.backend.asarray(source))
        put(fresh.values, mine(values))
        for (name, initial), array in zip(self.slot_names, slots):
            if name is not None:
                put(fresh.slot(name, initial), mine(array))
        put(fresh.times, mine(times))

    def finish(self):
        """Gives the rows of a table without a hash table that no file held their initial
        values (the fresh shard was made without them)."""
        if self.seen is not None and not self.seen.all():
            self.fresh.initialize_rows(np.flatnonzero(~self.seen))

    def _rows_for(self, keys, where):
        fresh, backend = self.fresh, self.backend
        if not fresh.use_hashtable:
            rows = np.asarray(backend.to_host(placements.direct_rows(
                host_ops, fresh.placement, keys, self.rt.size)), np.int64)
            if np.unique(rows).size != rows.size or self.seen[rows].any():
                raise CheckpointError("%s holds key %d twice (table %s): the file is corrupt"
                                      % (where, _repeated(keys, self.seen, rows), fresh.name))
            self.seen[rows] = True
            return rows
        count = keys.size
        if np.unique(keys).size != count or fresh.index.count_missing(
                backend.asarray(keys)) != count:
            raise CheckpointError("%s holds a key twice (table %s): the file is corrupt"
                                  % (where, fresh.name))
        needed = self.used + count
        room = getattr(fresh, "max_capacity", fresh.capacity)
        if needed > room:
            raise CheckpointError(
                "%s: table %s gets more than %d rows on rank %d, its capacity "
                "(max_vocabulary_size_per_gpu or max_capacity): raise it or restore on more "
                "ranks" % (where, fresh.name, room, self.rt.rank))
        if needed > fresh.capacity:
            fresh._grow(needed)  # a DynamicTable: capacity doubles up to max_capacity
        rows = np.arange(self.used, needed, dtype=np.int64)
        fresh.index.assign(backend.asarray(keys), backend.asarray(rows))
        self.used = needed
        if hasattr(fresh, "_high_water"):
            fresh._high_water = needed
        return rows


def _contiguous(rows):
    """True if host rows are first, first + 1, ..., first + n - 1 (n >= 1)."""
    return bool(rows.size) and int(rows[-1]) - int(rows[0]) == rows.size - 1 and (
        rows.size < 3 or bool(np.all(np.diff(rows) == 1)))


def _repeated(keys, seen, rows):
    values, counts = np.unique(rows, return_counts=True)
    twice = set(values[counts > 1].tolist()) | set(rows[seen[rows]].tolist())
    return int(keys[np.isin(rows, list(twice))][0])


def read_table(rt, table, entry, directory, slot_prefixes, fresh):
    """Streams this rank's share of `entry`'s shard files (in `directory`) into `fresh`.
    slot_prefixes: keep only slots whose names start with one of them + "/" (None: all).
    Raises CheckpointError naming the file for anything wrong with it."""
    if int(entry["dim"]) != table.dim:
        raise CheckpointError("the checkpoint in %s holds rows of dim %d; table %s has dim %d"
                              % (directory, int(entry["dim"]), table.name, table.dim))
    slots = [(str(name), float(initial)) for name, initial in entry["slots"]]
    kept = [(name, initial) if slot_prefixes is None or any(
        name.startswith(prefix + "/") for prefix in slot_prefixes) else (None, None)
        for name, initial in slots]
    sink = _RowSink(rt, fresh, kept)
    per_row = checkpoint_format.row_bytes(table.dim, len(slots))
    for shard in files_to_read(rt.rank, rt.size, table, entry):
        path = shard_path(directory, shard)
        reader = ShardReader(path, shard["size"], shard["crc32"])
        try:
            header, _ = checkpoint_format.read_header(reader.read, path)
            checkpoint_format.check_header(header, path, table.name, table.dim, slots)
            if header["rows"] != int(shard["rows"]):
                raise CheckpointError("%s holds %d rows; the manifest says %d" % (
                    path, header["rows"], int(shard["rows"])))
            step = max(1, min(header["chunk_rows"], header["rows"]))  # the writer's chunks
            counts = [min(step, header["rows"] - start)
                      for start in range(0, header["rows"], step)]
            for count, piece in zip(counts, reader.chunks([c * per_row for c in counts])):
                keys, values, slot_arrays, times = checkpoint_format.split_chunk(
                    piece, count, table.dim, len(slots))
                sink.add(keys, values, slot_arrays, times, path)
            reader.finish()
        finally:
            reader.close()
    sink.finish()
