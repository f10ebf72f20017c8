"""Loading a sharded checkpoint into a table (DESIGN D8): a read plan, then one of two ways to
read, chosen per table; either way no table changes before every rank read and checked every
file of every table without an error.

Each rank reads the shard files that can hold rows its placement gives it: only its own when
the checkpoint was saved on this many ranks with this placement, else every file (resharding is
a read plan, not a gather: no collective moves rows). check_table reads each file through its
checksum and checks its header and every key it holds (negative, duplicated, beyond the table,
more rows than the shard can hold), then:
  - staged (each byte read once): while checking, the rows stream into a fresh shard (a new
    table of the same settings that is not yet the runtime's); read_table then makes it the
    table's: a hash table's fresh shard replaces the old one, a table without one gets the
    fresh rows copied into its own arrays (on the device, on cuda), so the arrays that table
    groups view stay. A failure drops the fresh shard. It needs room for a second copy of the
    rank's rows in the table's own memory: on cuda the device's free memory less
    DEVICE_RESERVE; in host memory (the cpu backend, a hybrid table's host rows) at most
    `host_room` (D8 bounds the host memory a load adds by the chunk plus a tenth of the shard;
    the caller passes a quarter of a chunk, which the three read buffers leave).
  - two-pass (where there is no such room): the check reads every file and changes nothing;
    read_table streams them again (from the page cache, where they fit) into the table itself.
    A table without a hash table is written in place; a hash table's old shard is dropped and a
    new one filled (its rows are handed out anew), so the two never coexist.
SOK1X_CHECKPOINT_LOAD=staged or two-pass forces one way (default auto). In both, rows a file
holds in order go from the read buffer into the table in one copy (backend.write_rows: from a
page-locked block straight to the device on cuda), and rows no file holds get initial values.
Host memory: three read buffers of a file chunk (the chunks the writer made, a quarter of a chunk;
engine/checkpoint/format.py), plus one byte per row (which rows a file held) or, for a hash
table, its keys; no second copy of the shard on the host, but a staged one within host_room.
"""
import collections
import os

import numpy as np

from sok1x.backend import cpu as host_ops
from sok1x.engine.checkpoint import format as checkpoint_format
from sok1x.engine.tables import hybrid_rows
from sok1x.engine.tables import placement as placements
from sok1x.engine.checkpoint.storage import ShardReader
from sok1x.errors import CheckpointError

FILL_ROWS = 1 << 16  # rows per upload when rows no file held get their initial slot values
LOAD_ENV = "SOK1X_CHECKPOINT_LOAD"
AUTO, STAGED, TWO_PASS = "auto", "staged", "two-pass"
DEVICE_RESERVE = 1 << 30  # device memory a staged load leaves free (for the steps after it)


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


LoadPlan = collections.namedtuple("LoadPlan", "name slots kept shards held rows staged room")
LoadPlan.__doc__ = """What check_table found for one table on this rank: slots (name, initial) in
the files' order, kept (the same, (None, None) for a slot not restored), shards (manifest dicts of
the files to read, with "where": the path), held (a table without a hash table: bool per shard row,
True for rows a file holds; else None), rows (how many rows this rank gets), staged (the fresh
shard holding them all, or None: read_table reads the files again) and room (check_table's
host_room, which also bounds the read buffers)."""


def _owned(rt, table, keys, times, where):
    """Returns the mask of `keys` (host int64) that this rank keeps; raises CheckpointError naming
    `where` for a negative key, or a trained one (time > 0) beyond a table without hash table."""
    if keys.size and int(keys.min()) < 0:
        raise CheckpointError("%s holds negative key %d (table %s): the file is corrupt"
                              % (where, int(keys.min()), table.name))
    keep = host_ops.owners_of(keys, rt.size, *table.owner_rule) == rt.rank
    limit = table.key_limit
    if limit is not None:
        beyond = keys >= limit
        trained = beyond & (times > 0)
        if trained.any():
            raise CheckpointError(
                "%s holds trained key %d, but table %s on %d ranks holds keys below %d "
                "(max_vocabulary_size_per_gpu x ranks): raise max_vocabulary_size_per_gpu "
                "or restore on more ranks" % (where, int(keys[trained][0]), table.name,
                                              rt.size, limit))
        keep &= ~beyond  # untrained rows beyond the limit are fresh rows: the same anyway
    return keep


def _direct_rows(rt, table, keys):
    return np.asarray(rt.backend.to_host(placements.direct_rows(
        host_ops, table.placement, keys, rt.size)), np.int64)


def _chunks(rt, reader, header, per_row, dim, slot_count, uploads, host_room):
    """Yields (keys, values, [slots], times) of each chunk of an opened shard file: views of
    the backend's host buffers, which take at most three times host_room (the writer's chunks
    are a quarter of a chunk, host_room's size; a file written with larger ones reads fewer
    ahead). uploads: the caller queues copies from them (a buffer is filled again only once
    they ran)."""
    step = max(1, min(header["chunk_rows"], header["rows"]))  # the writer's chunks
    counts = [min(step, header["rows"] - start) for start in range(0, header["rows"], step)]
    pieces = reader.chunks([c * per_row for c in counts], rt.backend.host_buffer,
                           rt.backend.synchronize if uploads else None, room=3 * host_room)
    for count, piece in zip(counts, pieces):
        yield checkpoint_format.split_chunk(piece, count, dim, slot_count)


def _opened(shard, table, slots, verify):
    """A ShardReader past the header of manifest dict `shard`, and the header."""
    path = shard["where"]
    reader = ShardReader(path, shard["size"], shard["crc32"], verify)
    try:
        header, _ = checkpoint_format.read_header(reader.read, path)
        checkpoint_format.check_header(header, path, table.name, table.dim, slots)
        if header["rows"] != int(shard["rows"]):
            raise CheckpointError("%s holds %d rows; the manifest says %d" % (
                path, header["rows"], int(shard["rows"])))
    except BaseException:
        reader.close()
        raise
    return reader, header


def check_table(rt, table, entry, directory, slot_prefixes, host_room):
    """Reads this rank's share of `entry`'s shard files (in `directory`) through their checksums
    and checks every key; returns the LoadPlan for read_table, its rows staged in a fresh shard
    where there is room (see the module's docstring; host_room: bytes of host memory a staged
    copy may take). slot_prefixes: restore only slots whose names start with one of them + "/"
    (None: all). Raises CheckpointError naming the file for anything wrong with it; changes no
    table."""
    if int(entry["dim"]) != table.dim:
        raise CheckpointError("the checkpoint in %s holds rows of dim %d; table %s has dim %d"
                              % (directory, int(entry["dim"]), table.name, table.dim))
    slots = [(str(name), float(initial)) for name, initial in entry["slots"]]
    kept = [(name, initial) if slot_prefixes is None or any(
        name.startswith(prefix + "/") for prefix in slot_prefixes) else (None, None)
        for name, initial in slots]
    per_row = checkpoint_format.row_bytes(table.dim, len(slots))
    shards = [dict(shard, where=shard_path(directory, shard))
              for shard in files_to_read(rt.rank, rt.size, table, entry)]
    expected = _expected_rows(rt, table, entry, shards)
    staged = None
    if _load_mode(rt, table, shards, kept, expected, host_room) == STAGED:
        staged = _fresh_shard(rt, table, expected)
    sink = None if staged is None else _RowSink(rt, staged, kept)
    held = None if table.use_hashtable else np.zeros(table.values.shape[0], bool)
    hash_keys, count = [], 0
    for shard in shards:
        reader, header = _opened(shard, table, slots, True)
        try:
            for keys, values, slot_arrays, times in _chunks(
                    rt, reader, header, per_row, table.dim, len(slots), sink is not None,
                    host_room):
                keep = _owned(rt, table, keys, times, shard["where"])
                mine = keys[keep]
                if held is not None:
                    rows = _direct_rows(rt, table, mine)
                    if _repeats_any(rows) or held[rows].any():
                        raise CheckpointError(
                            "%s holds key %d twice (table %s): the file is corrupt"
                            % (shard["where"], _repeated(mine, held, rows), table.name))
                    held[rows] = True
                else:
                    hash_keys.append(mine)  # a copy: boolean indexing made it
                if sink is not None:
                    sink.add(keys, keep, values, slot_arrays, times, shard["where"])
                count += mine.size
            reader.finish()
        finally:
            reader.close()
    if hash_keys:
        _check_hash_keys(rt, table, np.concatenate(hash_keys), shards)
    if sink is not None:
        sink.finish(held)
    return LoadPlan(table.name, slots, kept, shards, held, count, staged, host_room)


def _expected_rows(rt, table, entry, shards):
    """About how many rows this rank gets from `shards` (exact when it reads its own file)."""
    total = sum(int(shard["rows"]) for shard in shards)
    if (len(shards) == 1 and len(entry["shards"]) == rt.size) or table.placement.kind == "rank":
        return total
    return -(-total // rt.size)


def _load_mode(rt, table, shards, kept, expected, host_room):
    """STAGED or TWO_PASS for `table` (see the module's docstring)."""
    mode = os.environ.get(LOAD_ENV, AUTO)
    if mode not in (AUTO, STAGED, TWO_PASS):
        raise CheckpointError("%s=%r: expected %s, %s or %s" % (LOAD_ENV, mode, AUTO, STAGED,
                                                                TWO_PASS))
    if not shards:
        return TWO_PASS  # nothing to read
    if mode != AUTO:
        return mode
    restored = sum(1 for name, _ in kept if name is not None)
    per_row = 4 * table.dim * (1 + restored) + 8 + (32 if table.use_hashtable else 0)
    need = max(int(table.values.shape[0]), expected) * per_row
    free = rt.backend.free_device_memory()
    if free is None or getattr(table, "hbm_rows", None) is not None:
        return STAGED if need <= host_room else TWO_PASS
    return STAGED if need + DEVICE_RESERVE <= free else TWO_PASS


def _fresh_shard(rt, table, expected):
    """A new, empty shard of `table`'s settings that is not the runtime's (a DynamicTable grown
    once, while empty, to the rows expected)."""
    from sok1x.engine.tables.dynamic_table import make_table
    fresh = make_table(rt, table.name, *table.settings, initialize=False,
                       spare=getattr(table, "spare", None))
    if expected > fresh.capacity and hasattr(fresh, "_grow"):
        fresh._grow(min(expected, fresh.max_capacity))
    return fresh


def _too_many(rt, table, count, files):
    """CheckpointError if a hash table cannot hold `count` rows, else None."""
    room = getattr(table, "max_capacity", table.capacity)
    if count <= room:
        return None
    return CheckpointError(
        "%s: table %s gets %d rows on rank %d, more than its capacity %d "
        "(max_vocabulary_size_per_gpu or max_capacity): raise it or restore on more ranks"
        % (files, table.name, count, rt.rank, room))


def _check_hash_keys(rt, table, keys, shards):
    """Raises CheckpointError for a key held twice, or more keys than the shard can hold."""
    keys.sort()
    twice = keys[1:][keys[1:] == keys[:-1]]
    files = ", ".join(shard["where"] for shard in shards)
    if twice.size:
        raise CheckpointError("%s holds a key twice (%d, table %s): the file is corrupt"
                              % (files, int(twice[0]), table.name))
    error = _too_many(rt, table, keys.size, files)
    if error is not None:
        raise error


def read_table(rt, plan):
    """Puts the rows of `plan` (check_table's) into the runtime's table plan.name: its staged
    shard, or a second stream of its files. A table without a hash table is written in place; a
    hash table's shard is replaced (for a stream, the old one is dropped first: the caller holds
    no reference to it)."""
    if plan.staged is not None:
        _take_staged(rt, plan)
        return
    table = rt.tables[plan.name]
    if table.use_hashtable and table.group is not None:
        _emptied_in_place(rt, table)
        if plan.rows > table.capacity:  # an hbm DynamicTable: its group re-laid once, not per
            table._grow(plan.rows)  # chunk
    elif table.use_hashtable:
        from sok1x.engine.tables.dynamic_table import make_table
        settings, spare = table.settings, getattr(table, "spare", None)
        rt.stash.clear()  # a lookup's saved state would keep the old shard alive
        del rt.tables[plan.name], table  # the old shard's memory goes before the new one's comes
        rt.backend.release_unused()
        table = make_table(rt, plan.name, *settings, initialize=False, spare=spare)
        rt.tables[plan.name] = table
        if plan.rows > table.capacity:  # a DynamicTable: grown once, while it is empty
            table._grow(plan.rows)
    sink = _RowSink(rt, table, plan.kept)
    per_row = checkpoint_format.row_bytes(table.dim, len(plan.slots))
    for shard in plan.shards:
        reader, header = _opened(shard, table, plan.slots, False)
        try:
            for keys, values, slot_arrays, times in _chunks(rt, reader, header, per_row,
                                                            table.dim, len(plan.slots), True,
                                                            plan.room):
                sink.add(keys, _owned(rt, table, keys, times, shard["where"]), values,
                         slot_arrays, times, shard["where"])
            reader.finish()
        finally:
            reader.close()
    sink.finish(plan.held)


def _emptied_in_place(rt, table):
    """Empties a hash group's member (engine/lookup/table_group.py) where it is, for a load: its
    arrays are views of the group's flat arrays, which stay while the other members view them,
    so a new shard beside them would hold the table's memory twice. Its fixed-capacity rows
    stay; it gets an empty key index, and its slots their initial values (rows past its keys
    must hold them when the index hands them out)."""
    backend = rt.backend
    rt.stash.clear()  # a lookup's saved state holds rows of the old keys
    table.group.forget_steps()
    table.index = backend.HashIndex(table.rows_for(table.capacity))
    for name, array in table.slots.items():
        hybrid_rows.fill(backend, array, table.slot_initial[name])
    if hasattr(table, "emptied"):  # a hybrid DynamicTable: no freed row, no statistics
        table.emptied()


def _take_staged(rt, plan):
    """Makes the rows of plan.staged the table's (see the module's docstring)."""
    fresh, backend = plan.staged, rt.backend
    table = rt.tables[plan.name]
    if fresh.use_hashtable and table.group is None:
        rt.tables[plan.name] = fresh
        backend.release_unused()  # the old shard's memory
        return
    if fresh.use_hashtable:  # a hash group's member: its rows copied in place, its index taken
        rt.stash.clear()
        table.group.forget_steps()
        if fresh.capacity > table.capacity:  # an hbm DynamicTable: grown through its group
            table._grow(fresh.capacity)
        elif fresh.capacity < table.capacity:  # ... or the fresh shard to the member's rows
            fresh._grow(table.capacity)
        table.index = fresh.index
        if hasattr(table, "emptied"):  # a hybrid DynamicTable: the fresh shard's rows in use
            table.emptied()
            table._free, table._high_water = fresh._free, fresh._high_water
    restored = _reset_unrestored_slots(backend, table, plan.kept)
    hybrid_rows.copy_rows(backend, table.values, fresh.values)  # rows maybe split
    backend.write_rows(table.times, 0, fresh.times)
    for name, initial in restored.items():
        hybrid_rows.copy_rows(backend, table.slot(name, initial), fresh.slots[name])
    backend.synchronize()  # the copies ran: the fresh shard's memory may go


def _reset_unrestored_slots(backend, table, kept):
    """Gives `table`'s slots that `kept` ((name, initial) per file slot, (None, None) for one
    not restored) does not restore their initial values; returns {name: initial} of those it
    restores."""
    restored = {name: initial for name, initial in kept if name is not None}
    for name, array in table.slots.items():
        if name not in restored:
            hybrid_rows.fill(backend, array, table.slot_initial[name])
    return restored


class _RowSink:
    """Writes the owned rows of streamed chunks into `table`: in place (no hash table), or into
    a new hash table shard, handing out its rows in order. kept: (name, initial) of each file
    slot, (None, None) for one not restored; the table's other slots get their initial
    values."""

    def __init__(self, rt, table, kept):
        self.rt, self.table, self.backend, self.kept = rt, table, rt.backend, kept
        self.used = 0
        # the slots it restores made now: a shard the files give no row still has them
        for name, initial in _reset_unrestored_slots(self.backend, table, kept).items():
            table.slot(name, initial)

    def add(self, keys, keep, values, slots, times, where):
        """Puts the rows of this chunk that this rank owns (mask `keep`, checked)."""
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
            if first is not None and not hybrid_rows.is_split(array):
                self.backend.write_rows(array, first, source)  # one copy, no index
            else:
                hybrid_rows.put_rows(self.backend, array, device_rows if device_rows is not None
                                     else self.backend.asarray(rows), source)
        table = self.table
        put(table.values, mine(values))
        for (name, initial), array in zip(self.kept, slots):
            if name is not None:
                put(table.slot(name, initial), mine(array))
        put(table.times, mine(times))

    def finish(self, held):
        """Gives the rows of a table without a hash table that no file held (False in `held`)
        their initial values, slots and no update time."""
        if held is None or held.all():
            return
        table, backend = self.table, self.backend
        rows = np.flatnonzero(~held)
        table.initialize_rows(rows)
        backend.fill_rows(table.times, backend.asarray(rows), 0.0)
        for name, initial in self.kept:
            if name is not None:
                array = table.slot(name, initial)
                for start in range(0, rows.size, FILL_ROWS):
                    part = rows[start:start + FILL_ROWS]
                    backend.put_rows(array, backend.asarray(part), backend.asarray(
                        np.full((part.size, table.dim), initial, np.float32)))

    def _rows_for(self, keys, where):
        table, backend = self.table, self.backend
        if not table.use_hashtable:
            return _direct_rows(self.rt, table, keys)
        needed = self.used + keys.size
        if needed > table.capacity:
            error = _too_many(self.rt, table, needed, where)
            if error is not None:
                raise error
            table._grow(needed)  # a DynamicTable: capacity doubles up to max_capacity
        rows = np.arange(self.used, needed, dtype=np.int64)
        table.index.assign(backend.asarray(keys), backend.asarray(rows))
        self.used = needed
        if hasattr(table, "_high_water"):
            table._high_water = needed
        return rows


def _contiguous(rows):
    """True if host rows are first, first + 1, ..., first + n - 1 (n >= 1)."""
    return bool(rows.size) and int(rows[-1]) - int(rows[0]) == rows.size - 1 and (
        rows.size < 3 or bool(np.all(np.diff(rows) == 1)))


def _repeats_any(rows):
    """True if host int64 `rows` hold a value twice (a file's rows ascend: no sort then)."""
    if rows.size < 2 or bool(np.all(rows[1:] > rows[:-1])):
        return False
    return np.unique(rows).size != rows.size


def _repeated(keys, seen, rows):
    values, counts = np.unique(rows, return_counts=True)
    twice = set(values[counts > 1].tolist()) | set(rows[seen[rows]].tolist())
    return int(keys[np.isin(rows, list(twice))][0])
