"""Checkpoints of tables (DESIGN D8): whole tables, independent of the number of ranks.

A save gathers every rank's rows (global keys, values, optimizer slots, update times) to rank 0,
which encodes them (engine/checkpoint_format.py); a restore decodes on rank 0, checks, and sends
each rank the rows its table's placement gives it, so a checkpoint written on one number of ranks
loads on any other. Every function here is collective: all ranks call it, in the same order, and
an error on any rank is raised on every rank (host.raise_together) before anything changes.
"""
import os
import re
import time

import numpy as np

from sok1x.backend import cpu as host_ops
from sok1x.engine import checkpoint_format, hybrid_rows
from sok1x.engine import placement as placements
from sok1x.engine import runtime as _runtime
from sok1x.engine.exchange_header import confirm_same_op
from sok1x.errors import CheckpointError

SUFFIX = ".sok1x"


def file_name(table_name):
    """The file (in a dump directory) of table `table_name`: its name with every character other
    than letters, digits, '_', '-' and '.' replaced by '_' ('/' by '-')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", table_name.replace("/", "-")) + SUFFIX


def _wanted(name, slot_prefixes):
    return slot_prefixes is None or any(name.startswith(prefix + "/") for prefix in slot_prefixes)


def _ready_tables(rt, names, what):
    """Returns the tables `names`; raises on every rank if any rank cannot have one."""
    from sok1x.engine.api import _ready_table
    tables, error = [], None
    for name in names:
        table, problem = _ready_table(rt, name)
        error = error or problem
        tables.append(table)
    rt.host.raise_together(error, what)
    return tables


def _held_rows(rt, table):
    """Returns host (global keys int64, shard rows int64) of every row this shard holds."""
    if table.use_hashtable:
        keys, rows = table.index.export()
        return (np.asarray(rt.backend.to_host(keys), np.int64),
                np.asarray(rt.backend.to_host(rows), np.int64))
    rows = np.arange(table.values.shape[0], dtype=np.int64)
    return placements.global_keys(table.placement, rows, table.rank, table.size), rows


def _gather_to_root(host, array):
    """Returns on rank 0 the concatenation of every rank's `array` (rows), None elsewhere."""
    array = np.ascontiguousarray(array)
    if host.size == 1:
        return array
    counts = np.asarray(host.all_gather_object(int(array.size)), dtype=np.int64)
    received = None
    if host.rank == 0:
        received = np.empty(int(counts.sum()), dtype=array.dtype)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        spec = [received.reshape(-1), (counts, displs)]
    else:
        spec = None
    host._call("Gatherv", host.comm.Gatherv, array.reshape(-1), spec, 0)
    return None if received is None else received.reshape((-1,) + array.shape[1:])


def _snapshot(rt, table, slot_prefixes):
    """Collective: returns the checkpoint of `table` on rank 0 as a list of buffers
    (checkpoint_format.encode_parts), None elsewhere."""
    backend = rt.backend
    # Every rank writes the same slots: the union, made where missing (at its initial value).
    every = {}
    for seen in rt.host.all_gather_object(dict(table.slot_initial)):
        every.update(seen)
    slot_list = sorted((name, initial) for name, initial in every.items()
                       if _wanted(name, slot_prefixes))
    keys, rows = _held_rows(rt, table)
    index = backend.asarray(rows)

    def rows_of(array):
        return np.asarray(backend.to_host(hybrid_rows.gather_rows(backend, array, index)))
    keys = _gather_to_root(rt.host, keys)
    values = _gather_to_root(rt.host, rows_of(table.values))
    slots = [(name, initial, _gather_to_root(rt.host, rows_of(table.slot(name, initial))))
             for name, initial in slot_list]
    times = _gather_to_root(rt.host, np.asarray(backend.to_host(table.times))[rows])
    data, error = None, None
    if rt.rank == 0:
        try:
            data = checkpoint_format.encode_parts(table.name, table.dim, keys, values, slots,
                                                  times)
        except (ValueError, MemoryError) as exc:
            error = CheckpointError("saving %s: %s" % (table.name, exc))
    rt.host.raise_together(error, "saving %s" % table.name)
    return data


def _write_atomically(path, parts):
    """Writes the buffers `parts`, one after another, to `path` through a temporary file renamed
    over it once complete."""
    temporary = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(temporary, "wb") as out:
            for part in parts:
                out.write(part)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _route(rt, table, content, where):
    """Collective. content: rank 0's decoded checkpoint (None elsewhere). Returns this rank's
    (keys, values, slots [(name, initial, array)], times), or raises on every rank."""
    host = rt.host
    error, plan = None, None
    if rt.rank == 0:
        keys, times = content["keys"], content["times"]
        keep = np.ones(keys.shape[0], dtype=bool)
        limit = table.key_limit
        if content["dim"] != table.dim:
            error = CheckpointError("%s holds rows of dim %d; table %s has dim %d" % (
                where, content["dim"], table.name, table.dim))
        elif limit is not None:
            beyond = keys >= limit
            trained = beyond & (times > 0)
            if trained.any():
                error = CheckpointError(
                    "%s holds trained key %d, but table %s on %d ranks holds keys below %d "
                    "(max_vocabulary_size_per_gpu x ranks): raise max_vocabulary_size_per_gpu "
                    "or restore on more ranks" % (where, int(keys[trained][0]), table.name,
                                                  rt.size, limit))
            keep = ~beyond  # untrained rows beyond the limit are fresh rows: the same anyway
        if error is None:
            owners = host_ops.owners_of(keys[keep], rt.size, *table.owner_rule)
            order = np.flatnonzero(keep)[np.argsort(owners, kind="stable")]
            counts = np.bincount(owners, minlength=rt.size).astype(np.int64)
            room = getattr(table, "max_capacity", table.capacity)
            if table.use_hashtable and counts.max(initial=0) > room:
                error = CheckpointError(
                    "%s holds %d rows for one rank of table %s, more than its capacity %d "
                    "(max_vocabulary_size_per_gpu or max_capacity): raise it or restore on more "
                    "ranks" % (where, int(counts.max()), table.name, room))
            plan = (order, counts)
    host.raise_together(error, "restoring %s" % table.name)
    if rt.size == 1:  # every row stays here: no copies through the exchange
        order = plan[0]
        whole = order.size == content["keys"].shape[0]

        def mine(array):
            return array if whole else array[order]
        return (mine(content["keys"]), mine(content["values"]),
                [(n, i, mine(a)) for n, i, a in content["slots"]], mine(content["times"]))
    slot_list = host.broadcast_object(
        None if content is None else [(n, i) for n, i, _ in content["slots"]])
    counts = host.broadcast_object(None if plan is None else plan[1])
    send_counts = counts if rt.rank == 0 else np.zeros(rt.size, np.int64)
    recv_counts = np.zeros(rt.size, np.int64)
    recv_counts[0] = counts[rt.rank]

    def scatter(array, row_shape, dtype):
        if rt.rank == 0:
            send = np.ascontiguousarray(array[plan[0]], dtype=dtype)
        else:
            send = np.zeros((0,) + row_shape, dtype=dtype)
        return host.all_to_all_v(send, send_counts, recv_counts)
    dim = table.dim
    keys = scatter(None if content is None else content["keys"], (), np.int64)
    values = scatter(None if content is None else content["values"], (dim,), np.float32)
    slots = [(name, initial, scatter(None if content is None else content["slots"][i][2],
                                     (dim,), np.float32))
             for i, (name, initial) in enumerate(slot_list)]
    times = scatter(None if content is None else content["times"], (), np.float64)
    return keys, values, slots, times


def _replace_shard(rt, table, keys, values, slots, times, slot_prefixes):
    """Makes `table` anew on this rank holding exactly these rows (the rest at initial values):
    keys take rows 0..n-1 of the fresh shard (or their own rows without a hash table)."""
    from sok1x.engine.dynamic_table import make_table
    backend = rt.backend
    fresh = make_table(rt, table.name, *table.settings)
    count = int(keys.shape[0])
    if table.use_hashtable:
        if count > fresh.capacity:
            fresh._grow(count)  # a DynamicTable (EmbeddingTable's capacity was checked)
        rows = backend.asarray(np.arange(count, dtype=np.int64))
        fresh.index.assign(backend.asarray(keys), rows)
        if hasattr(fresh, "_high_water"):
            fresh._high_water = count
    else:
        rows = placements.direct_rows(backend, fresh.placement, backend.asarray(keys), rt.size)
    fresh.put(rows, backend.asarray(values))
    for name, initial, array in slots:
        if _wanted(name, slot_prefixes):
            hybrid_rows.put_rows(backend, fresh.slot(name, initial), rows, backend.asarray(array))
    backend.put_rows(fresh.times, rows, backend.asarray(times))
    rt.tables[table.name] = fresh


def save_table_bytes(table_name, slot_prefixes=None):
    """Collective. Returns table `table_name`'s checkpoint bytes on rank 0, None on the others."""
    with _runtime.entered() as rt:
        table, = _ready_tables(rt, [table_name], "saving %s" % table_name)
        parts = _snapshot(rt, table, slot_prefixes)
        return None if parts is None else b"".join(parts)


def restore_table_bytes(table_name, data, where, slot_prefixes=None):
    """Collective. data: rank 0's checkpoint bytes (ignored elsewhere); where: what to name in
    errors. Replaces the table with the checkpoint's rows, redistributed over this job's ranks."""
    with _runtime.entered() as rt:
        table, = _ready_tables(rt, [table_name], "restoring %s" % table_name)
        content, error = None, None
        if rt.rank == 0:
            try:
                content = checkpoint_format.decode(data, where)
            except CheckpointError as exc:
                error = exc
        rt.host.raise_together(error, "restoring %s" % table_name)
        _replace_shard(rt, table, *_route(rt, table, content, where), slot_prefixes)


def _check_names(path, table_names):
    files = [os.path.join(path, file_name(name)) for name in table_names]
    if len(set(files)) != len(files):
        raise CheckpointError("tables %s map to the same file name in %s; give them distinct "
                              "names" % (list(table_names), path))
    return files


def dump_tables(path, table_names, slot_prefixes=None):
    """Collective. Writes one file per table into directory `path` (made if missing) on rank 0:
    keys, values and the slots whose names start with one of `slot_prefixes` + "/" (every slot
    when None). Each file appears complete or not at all; the previous one stays until then."""
    files = _check_names(path, table_names)
    with _runtime.entered() as rt:
        confirm_same_op(rt, "sok1x.dump")  # a training step on another rank: OrderError
        tables = _ready_tables(rt, table_names, "sok1x.dump")
        for table, target in zip(tables, files):
            data = _snapshot(rt, table, slot_prefixes)
            error = None
            if rt.rank == 0:
                try:
                    os.makedirs(path, exist_ok=True)
                    _write_atomically(target, data)
                except OSError as exc:
                    error = CheckpointError("cannot write %s: %s" % (target, exc))
            rt.host.raise_together(error, "sok1x.dump of %s" % table.name)


def load_tables(path, table_names, slot_prefixes=None):
    """Collective. Restores each table from its file in `path` (see dump_tables): the table then
    holds exactly the file's rows and the slots matching `slot_prefixes` (all when None),
    redistributed over this job's ranks. Raises CheckpointError on every rank for a missing,
    corrupt or truncated file, or a table of another dim."""
    files = _check_names(path, table_names)
    with _runtime.entered() as rt:
        confirm_same_op(rt, "sok1x.load")  # a training step on another rank: OrderError
        tables = _ready_tables(rt, table_names, "sok1x.load")
        for table, source in zip(tables, files):
            content, error = None, None
            if rt.rank == 0:
                try:
                    with open(source, "rb") as handle:
                        content = checkpoint_format.decode(handle.read(), source)
                except OSError as exc:
                    error = CheckpointError("cannot read the checkpoint of %s: %s"
                                            % (table.name, exc))
                except CheckpointError as exc:
                    error = exc
            rt.host.raise_together(error, "sok1x.load of %s" % table.name)
            _replace_shard(rt, table, *_route(rt, table, content, source), slot_prefixes)


def incremental_tables(table_names, since_utc):
    """Collective. Returns, on every rank, one (keys int64 [n], values float32 [n, dim]) per table:
    the rows inserted or updated at or after `since_utc` (seconds since the epoch)."""
    out = []
    with _runtime.entered() as rt:
        confirm_same_op(rt, "sok1x.incremental_model_dump")  # against a step: OrderError
        tables = _ready_tables(rt, table_names, "sok1x.incremental_model_dump")
        for table in tables:
            keys, rows = _held_rows(rt, table)
            times = np.asarray(rt.backend.to_host(table.times))[rows]
            chosen = rows[times >= float(since_utc)]
            values = np.asarray(rt.backend.to_host(table.gather(rt.backend.asarray(chosen))))
            all_keys, _ = rt.host.all_gather_v(keys[times >= float(since_utc)])
            all_values, _ = rt.host.all_gather_v(values.reshape(-1, table.dim))
            out.append((all_keys, all_values))
    return out


_MEET_TAG = 0x5C0C  # point-to-point: never confused with the collectives on the communicator


def meet(what, timeout):
    """Collective with a deadline: returns once every rank has called meet(); raises
    CheckpointError (naming the ranks that never came) if they have not within `timeout` seconds.
    Saves start with it, so a save that only some ranks run (checkpoint_dir given on rank 0
    alone, say) fails with advice instead of waiting forever in the gather."""
    with _runtime.entered() as rt:
        comm, size = rt.host.comm, rt.size
        if size == 1:
            return
        deadline = time.monotonic() + float(timeout)
        if rt.rank == 0:
            pending = {peer: comm.irecv(source=peer, tag=_MEET_TAG) for peer in range(1, size)}
        else:
            sent = comm.isend(rt.rank, dest=0, tag=_MEET_TAG)
            pending = {0: comm.irecv(source=0, tag=_MEET_TAG)}
        while pending and time.monotonic() < deadline:
            for peer in [p for p, request in pending.items() if request.test()[0]]:
                del pending[peer]
            if pending:
                time.sleep(0.002)
        if pending:
            error = CheckpointError(
                "%s: rank %d waited %.0f s for rank(s) %s to join it, and they did not. A save "
                "of sok1x tables is collective: every rank must run it at the same step. With "
                "MonitoredTrainingSession give checkpoint_dir (and the same "
                "save_checkpoint_steps; not save_checkpoint_secs, whose timers differ per rank) "
                "on EVERY rank: only rank 0 writes the tables' contents, and every rank's files "
                "are identical. The wait is SOK1X_CHECKPOINT_TIMEOUT seconds."
                % (what, rt.rank, float(timeout), sorted(pending)))
            _abort_soon(comm, error)
            raise error
        if rt.rank == 0:
            for request in [comm.isend(0, dest=peer, tag=_MEET_TAG) for peer in range(1, size)]:
                request.wait()
        else:
            sent.wait()


ABORT_GRACE_SECONDS = 10.0


def _abort_soon(comm, error):
    """The ranks that did not come to a save wait inside a collective for this one, and MPI
    cannot call them back: the job cannot go on. The error is raised here; the job is aborted
    when this process exits (before MPI_Finalize, which would wait for them forever), or
    ABORT_GRACE_SECONDS later if it is still running, so it never hangs."""
    import atexit
    import sys
    import threading

    def abort():
        sys.stderr.write("sok1x: aborting the MPI job: %s\n" % error)
        sys.stderr.flush()
        comm.Abort(1)

    def abort_later():
        time.sleep(ABORT_GRACE_SECONDS)
        abort()
    atexit.register(abort)
    threading.Thread(target=abort_later, name="sok1x-abort", daemon=True).start()
