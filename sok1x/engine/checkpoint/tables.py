"""Sharded checkpoints of tables (DESIGN D8), as PyTorch's distributed checkpoint makes them.

Save is plan, then write: every rank streams the rows it holds (global keys, values, every
optimizer slot, update times) to its own shard file, chunk by chunk (engine/checkpoint/format.py,
engine/checkpoint/storage.py), in parallel with the others; then one small collective gathers each
file's size and checksum into the manifest (engine/checkpoint/manifest.py), which the caller
writes last: a dump's manifest file, or the Saver's checkpoint entry. Load reads the manifest and
each rank streams the files its placement needs (engine/checkpoint/load.py), so a checkpoint
written on one number of ranks loads on any other. Every function here is collective: all ranks
call it, in the same order, and an error on any rank is raised on every rank
(host.raise_together) before any table changes. Rows travel through MPI only in
incremental_tables, in calls of bounded size (engine/bounded_collectives.py).
"""
import os
import re
import time
import uuid

import numpy as np

from sok1x.engine.checkpoint import format as checkpoint_format
from sok1x.engine.checkpoint.folder_lock import folder_locked
from sok1x.engine.checkpoint import load as checkpoint_load
from sok1x.engine.checkpoint import manifest as checkpoint_manifest
from sok1x.engine.checkpoint import optimizer_steps
from sok1x.engine.tables import hybrid_rows
from sok1x.engine.tables import placement as placements
from sok1x.engine import runtime as _runtime
from sok1x.engine.bounded_collectives import all_gather_rows
from sok1x.engine.lookup.exchange_header import confirm_same_op
from sok1x.engine.checkpoint.storage import ShardWriter, remove_quietly, write_atomically
from sok1x.errors import CheckpointError

CHUNK_ENV = "SOK1X_CHECKPOINT_CHUNK_MB"
DEFAULT_CHUNK_MB = 256
MANIFEST_NAME = "sok1x-checkpoint.json"


def chunk_bytes():
    """Bytes of rows a rank holds in host memory at once while saving (SOK1X_CHECKPOINT_CHUNK_MB,
    default 256)."""
    return int(float(os.environ.get(CHUNK_ENV, DEFAULT_CHUNK_MB)) * 2 ** 20)


def file_name(table_name):
    """Table `table_name` as a file name: every character other than letters, digits, '_', '-'
    and '.' replaced by '_' ('/' by '-')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", table_name.replace("/", "-"))


def shard_file_name(stem, table_name, rank, size):
    """The shard file of `table_name` written by `rank` of `size` ranks, for a save named
    `stem`."""
    return "%s.%s.%d-of-%d.shard" % (stem, file_name(table_name), rank, size)


_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
MOST_SAVER_SHARDS = 36 ** 4


def saver_shard_name(stem, table_index, rank, generation="t"):
    """'<stem>.data-<generation>XXXX-of-rYYYY' (table_index and rank in four base-36 digits;
    generation a letter, engine/checkpoint/generations.py): a Saver's shard beside checkpoint
    prefix `stem`. TensorFlow deletes '<prefix>.data-?????-of-?????' with the checkpoint
    (max_to_keep), so the shards go with it; its reader opens only its own numbered data files."""
    def digits(number):
        return "".join(_BASE36[(number // 36 ** p) % 36] for p in (3, 2, 1, 0))
    return "%s.data-%s%s-of-r%s" % (stem, generation, digits(table_index), digits(rank))


def ready_tables(rt, names, what):
    """Returns the tables `names`; raises on every rank if any rank cannot have one."""
    from sok1x.engine.api import _ready_table
    tables, error = [], None
    for name in names:
        table, problem = _ready_table(rt, name)
        error = error or problem
        tables.append(table)
    rt.host.raise_together(error, what)
    if len({file_name(name) for name in names}) != len(names):
        raise CheckpointError("%s: tables %s map to the same file name; give them distinct "
                              "names" % (what, list(names)))
    return tables


def _held_rows(rt, table):
    """Returns host (global keys int64, shard rows int64, ordered by row) of this shard's rows."""
    if table.use_hashtable:
        keys, rows = table.index.export()
        return (np.asarray(rt.backend.to_host(keys), np.int64),
                np.asarray(rt.backend.to_host(rows), np.int64))
    rows = np.arange(table.values.shape[0], dtype=np.int64)
    return placements.global_keys(table.placement, rows, table.rank, table.size), rows


def _slot_lists(rt, tables, slot_prefixes):
    """Collective: per table, the slots (name, initial) every rank writes: the union over ranks
    (a rank that lacks one writes its initial value), those matching slot_prefixes."""
    seen = rt.host.all_gather_object([dict(table.slot_initial) for table in tables])
    out = []
    for t in range(len(tables)):
        every = {}
        for per_rank in seen:
            every.update(per_rank[t])
        out.append(sorted((name, initial) for name, initial in every.items()
                          if slot_prefixes is None or any(
                              name.startswith(prefix + "/") for prefix in slot_prefixes)))
    return out


def _rows_to_host(backend, array, rows, contiguous, fill):
    """Host rows `rows` (host int64) of `array` (a backend array, SplitRows, or None: `fill`): a
    view on cpu; on cuda a view of a reused page-locked block, held by the writer until it is
    written (rows in order: one copy from the device, no gather)."""
    if array is None:
        return fill
    if contiguous and not hybrid_rows.is_split(array):
        first = int(rows[0]) if rows.size else 0
        return np.asarray(backend.download_staged(backend.row_view(array, first,
                                                                   first + rows.size)))
    index = backend.asarray(rows)
    if len(array.shape) == 1:
        picked = backend.take_rows(array, index)
    else:
        picked = hybrid_rows.gather_rows(backend, array, index)
    return np.asarray(backend.download_staged(picked))


def _chunk_keys(table, held, start, stop):
    """Host (global keys, shard rows) of rows [start, stop) in file order: of `held` (a hash
    table's _held_rows), or made for the chunk alone (a table without one: its rows in order)."""
    if held is not None:
        return held[0][start:stop], held[1][start:stop]
    rows = np.arange(start, stop, dtype=np.int64)
    return placements.global_keys(table.placement, rows, table.rank, table.size), rows


def _write_shard(rt, table, slots, path, rows_per_chunk):
    """Streams this rank's rows of `table` into shard file `path`; returns its manifest dict.
    The writer thread writes the two file chunks before this one while it is copied to the
    host (triple buffering: each file chunk a quarter of chunk_bytes())."""
    backend = rt.backend
    held = _held_rows(rt, table) if table.use_hashtable else None
    count = int(held[0].shape[0]) if held is not None else int(table.values.shape[0])
    rows = held[1] if held is not None else None
    contiguous = rows is None or count == 0 or (rows[0] == 0 and rows[-1] == count - 1)
    arrays = [(table.values, None)] + [(table.slots.get(name), initial) for name, initial in slots]
    writer = ShardWriter(path, in_flight_bytes=2 * rows_per_chunk * checkpoint_format.row_bytes(
        table.dim, len(slots)))
    try:
        writer.write(checkpoint_format.encode_header(table.name, table.dim, count, slots,
                                                     rt.rank, rt.size, rows_per_chunk))
        for start in range(0, count, rows_per_chunk):
            stop = min(count, start + rows_per_chunk)
            keys, chunk_rows = _chunk_keys(table, held, start, stop)
            writer.write(keys)
            for array, initial in arrays:
                fill = None if array is not None else np.full(
                    (stop - start, table.dim), initial, np.float32)
                writer.write(np.asarray(_rows_to_host(backend, array, chunk_rows, contiguous,
                                                      fill), np.float32))
            writer.write(np.asarray(_rows_to_host(backend, table.times, chunk_rows, contiguous,
                                                  None), np.float64))
        size, crc32 = writer.commit()
    finally:
        writer.discard()
    return {"rank": rt.rank, "file": os.path.basename(path), "path": os.path.abspath(path),
            "rows": count, "size": size, "crc32": crc32}


def save_shards(directory, stem, table_names, slot_prefixes=None, name_file=None):
    """Collective. Every rank writes its shard of each table into `directory` (made if missing)
    as shard_file_name(stem, ...) (or name_file(table index, rank)): keys, values, the slots
    whose names start with one of `slot_prefixes` + "/" (every slot when None), update times.
    Returns the manifest (dict, the same on every rank) for the caller to write LAST. Raises
    CheckpointError on every rank if any rank could not write."""
    what = "saving sok1x tables %s" % list(table_names)
    with _runtime.entered() as rt:
        tables = ready_tables(rt, table_names, what)
        slot_lists = _slot_lists(rt, tables, slot_prefixes)
        shards, error = [], None
        try:
            os.makedirs(directory, exist_ok=True)
            for table, slots in zip(tables, slot_lists):
                path = os.path.join(directory, name_file(len(shards), rt.rank) if name_file
                                    else shard_file_name(stem, table.name, rt.rank, rt.size))
                # A quarter of a chunk per file chunk: the writer holds two while the next
                # is copied, the reader three (each array of one fits a page-locked block of
                # a power of two no larger: three quarters of a chunk in all).
                rows_per_chunk = checkpoint_format.chunk_rows(table.dim, len(slots),
                                                              chunk_bytes() // 4)
                shards.append(_write_shard(rt, table, slots, path, rows_per_chunk))
        except (OSError, MemoryError) as exc:
            error = CheckpointError("rank %d cannot write its shard into %s: %s"
                                    % (rt.rank, directory, exc))
        rt.host.raise_together(error, what)
        every = rt.host.all_gather_object(shards)
        entries = {table.name: checkpoint_manifest.table_entry(
            table, slots, [per_rank[t] for per_rank in every])
            for t, (table, slots) in enumerate(zip(tables, slot_lists))}
        return checkpoint_manifest.make(rt.size, entries)


def load_shards(directory, manifests, where, table_names, slot_prefixes=None):
    """Collective. Replaces each table with the rows of the checkpoint whose shards are in
    `directory` and whose manifest is `manifests` (this rank's copy, as a list of byte strings
    whose tables together are the set; None for one that could not be read), redistributed over
    this job's ranks; only the slots matching `slot_prefixes` (all when None). Every file is
    checked (checksum, header, keys) before any table changes, its rows staged in a fresh shard
    where there is room (engine/checkpoint/load.py): any error, named after the file, is raised
    on every rank first, changing nothing. `where` names the manifest."""
    what = "restoring sok1x tables %s" % list(table_names)
    with _runtime.entered() as rt:
        tables = ready_tables(rt, table_names, what)
        plans, error = [], None
        try:
            if any(data is None for data in manifests):
                raise CheckpointError("no sok1x checkpoint manifest at %s" % where)
            manifest = checkpoint_manifest.merged(
                [checkpoint_manifest.decode(data, where) for data in manifests])
            for table in tables:
                entry = checkpoint_manifest.entry_of(manifest, table.name, where)
                plans.append(checkpoint_load.check_table(rt, table, entry, directory,
                                                         slot_prefixes, chunk_bytes() // 4))
        except CheckpointError as exc:
            error = exc.with_traceback(None)  # its frames hold staged shards
        except (OSError, MemoryError) as exc:
            error = CheckpointError("rank %d cannot read the checkpoint %s: %s"
                                    % (rt.rank, where, exc))
        tables = table = None  # a hash table's old shard is dropped before its new one is made
        try:
            rt.host.raise_together(error, what)
        except BaseException:
            del plans[:]  # the staged shards go
            rt.backend.release_unused()
            raise
        try:
            while plans:
                checkpoint_load.read_table(rt, plans.pop(0))
        except (CheckpointError, OSError, MemoryError) as exc:
            error = CheckpointError(
                "rank %d could not read the checkpoint %s after checking it (%s): tables %s "
                "may be partly restored; restore them again" % (
                    rt.rank, where, exc, list(table_names)))
        rt.host.raise_together(error, what)


def _read_quietly(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _previous_entries(path):
    """The table entries of the manifest in folder `path`, or {} (none, or unreadable)."""
    data = _read_quietly(os.path.join(path, MANIFEST_NAME))
    if data is None:
        return {}
    try:
        return checkpoint_manifest.decode(data, path)["tables"]
    except CheckpointError:
        return {}


def _remove_unnamed_dump_files(path, manifest):
    """Removes the dump shards (and temporary files of dumps) in folder `path` that `manifest`
    does not name: leftovers of a dump that died. Only under the folder's exclusive lock."""
    named = {shard["file"] for entry in manifest["tables"].values() for shard in entry["shards"]}
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        leftover = name.startswith("dump-") and (name.endswith(".shard") or ".tmp-" in name)
        if (leftover and name not in named) or name.startswith(MANIFEST_NAME + ".tmp-"):
            remove_quietly(os.path.join(path, name))


def dump_tables(path, table_names, slot_prefixes=None, steps=None):
    """Collective. Writes every rank's shard of each table into folder `path` (made if
    missing), then the folder's manifest (sok1x-checkpoint.json, written atomically by each rank
    once all shards are on disk): keys, values and the slots whose names start with one of
    `slot_prefixes` + "/" (every slot when None); steps: None, or (optimizer name, record) of
    the optimizer's step state (checkpoint/optimizer_steps.py), kept in each table's entry.
    Tables dumped before into `path` stay, also by other jobs at the same time (they take
    turns: checkpoint/folder_lock.py); these tables' previous shards, and dump files no manifest
    names, are removed once the new manifest is in place. A crash leaves the previous manifest
    and its shards: the tables load whole, as they were, or as they are now."""
    with _runtime.entered() as rt:
        confirm_same_op(rt, "sok1x.dump")  # a training step on another rank: OrderError
        with folder_locked(rt.host, path, exclusive=True):
            _dump_locked(rt, path, table_names, slot_prefixes, steps)


def _dump_locked(rt, path, table_names, slot_prefixes, steps):
    """dump_tables' work, while this job holds the folder's lock."""
    previous = _previous_entries(path)
    stem = "dump-%s" % rt.host.broadcast_object(
        "%d-%s" % (int(time.time()), uuid.uuid4().hex[:8]) if rt.rank == 0 else None)
    manifest = save_shards(path, stem, table_names, slot_prefixes)
    if steps is not None:
        for entry in manifest["tables"].values():
            entry[optimizer_steps.MANIFEST_KEY] = {steps[0]: steps[1]}
    entries = dict(previous)
    entries.update(manifest["tables"])
    manifest["tables"] = entries
    error = None
    try:
        write_atomically(os.path.join(path, MANIFEST_NAME), checkpoint_manifest.encode(manifest))
    except OSError as exc:
        error = CheckpointError("rank %d cannot write %s: %s" % (
            rt.rank, os.path.join(path, MANIFEST_NAME), exc))
    rt.host.raise_together(error, "sok1x.dump into %s" % path)
    for name in table_names:
        for shard in previous.get(name, {}).get("shards", []):
            if shard["rank"] == rt.rank or (rt.rank == 0 and shard["rank"] >= rt.size):
                remove_quietly(os.path.join(path, shard["file"]))
    _remove_unnamed_dump_files(path, manifest)


def load_tables(path, table_names, slot_prefixes=None, steps=None):
    """Collective. Restores each table from folder `path` (see dump_tables): the table then holds
    exactly the checkpoint's rows and the slots matching `slot_prefixes` (all when None),
    redistributed over this job's ranks. steps: None, or (optimizer name, the names of its step
    state): returns the record of that optimizer's steps the tables were dumped with (None if
    none was). Raises CheckpointError on every rank, changing no table, for a missing manifest
    or shard, a corrupt or truncated file, a mismatched table, or step records that are corrupt,
    of another optimizer or that differ between the tables."""
    where = os.path.join(path, MANIFEST_NAME)
    with _runtime.entered() as rt:
        confirm_same_op(rt, "sok1x.load")  # a training step on another rank: OrderError
        with folder_locked(rt.host, path, exclusive=False):  # not while another job dumps
            data = _read_quietly(where)
            record = None
            if steps is not None:
                record, error = None, None
                try:
                    record = _recorded_steps(data, where, table_names, *steps)
                except CheckpointError as exc:
                    error = exc
                rt.host.raise_together(error, "restoring sok1x tables %s" % list(table_names))
            load_shards(path, [data], where, table_names, slot_prefixes)
    return record


def _recorded_steps(data, where, table_names, optimizer, expected):
    """The step record of `optimizer` in manifest bytes `data` for the tables (None if none);
    raises CheckpointError (a manifest that cannot be read is load_shards' to report)."""
    try:
        tables = checkpoint_manifest.decode(data, where)["tables"]
    except (CheckpointError, TypeError):
        return None
    found = [("%s (table %s)" % (where, name), optimizer_steps.of_entry(tables[name], optimizer))
             for name in table_names if name in tables]
    return optimizer_steps.agreed(found, expected)


def incremental_tables(table_names, since_utc):
    """Collective. Returns, on every rank, one (keys int64 [n], values float32 [n, dim]) per table:
    the rows inserted or updated at or after `since_utc` (seconds since the epoch)."""
    out = []
    with _runtime.entered() as rt:
        confirm_same_op(rt, "sok1x.incremental_model_dump")  # against a step: OrderError
        tables = ready_tables(rt, table_names, "sok1x.incremental_model_dump")
        for table in tables:
            keys, rows = _held_rows(rt, table)
            times = np.asarray(rt.backend.to_host(table.times))[rows]
            chosen = rows[times >= float(since_utc)]
            values = np.asarray(rt.backend.to_host(table.gather(rt.backend.asarray(chosen))))
            all_keys, _ = all_gather_rows(rt.host, keys[times >= float(since_utc)])
            all_values, _ = all_gather_rows(rt.host, values.reshape(-1, table.dim))
            out.append((all_keys, all_values))
    return out
