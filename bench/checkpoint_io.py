"""Sharded checkpoint dump + load of one big table (DESIGN D8) beside a plain parallel write and
read of the same bytes to the same folder, in the same run.

    mpiexec -n 1 python3 bench/checkpoint_io.py --dir /dev/shm --rows 100000000 \
        --out bench/results/checkpoint_io-1gpu.json
    mpiexec -n 2 python3 bench/checkpoint_io.py --dir ... --rows 10000000 --out ...-2gpu.json
    mpiexec -n 2 python3 bench/checkpoint_io.py --backend cpu --rows 1000000 --dir /tmp/ckb \
        --out /tmp/ckb.json                                                   # a quick check

The table: --rows keys (default 10M) x --dim (128) float32, no hash table (or --hashtable: every
key inserted), --slots zero-filled optimizer slots (default 0), initial values from a fixed
uniform initializer. A first, untimed dump sizes the plain file; then each of --repeats (default
5) rounds times, in turn (so the host's load drifts over all alike), two plain writes, a plain
read, a dump and a load, each with a barrier before and after (the slowest rank's time); each
figure is the median over the rounds with min and max:
    dump   sok1x.engine.checkpoint.dump_tables into <--dir>/sok1x-checkpoint-io, emptied before
           each repeat (and removed at the end): every rank streams its
           shard to its own file in chunks of SOK1X_CHECKPOINT_CHUNK_MB (--chunk-mb),
           checksummed, fsync, rename; then the manifest
    load   load_tables, after every shard's rows were zeroed: every rank reads the files its
           placement needs through their checksums and keys, once into a fresh shard made the
           table's at the end (staged, where a second copy fits: device memory on cuda, half a
           chunk on cpu) or twice (checked, then into the table); --load-way forces one
           (SOK1X_CHECKPOINT_LOAD), and the JSON says which ran
    write  every rank writes as many bytes as its shard file to a file of its own, on as many
           threads as the checkpoint's I/O (--io-threads), each its own region, fsync (the
           folder's parallel write bandwidth for this job); and again on one thread (on Linux a
           file's writes queue at its inode lock, and one stream may be the faster: the dump's
           figure is set beside the faster median of the two)
    read   every rank reads its file back the same way
Before each read (the checkpoint's and the plain one) the files' pages are dropped from the page
cache with posix_fadvise(DONTNEED), so both read the disk alike where the system honours it
(/dev/shm keeps them: there both read memory). Only one copy of the bytes is on --dir at a time
(the folder is emptied before each write and dump; 100M x 128 rows: 52.8 GB); the run stops at
once if the folder has less room.
Each rank's peak resident memory added by a dump and by a load (VmHWM, reset before each through
/proc/self/clear_refs) is printed beside D8's bound: the chunk plus a tenth of the rank's shard;
on cuda also the page-locked staging blocks held since the first dump (not in those peaks).

Checks (the run fails if one does not hold): after the last load, a sample of every rank's rows
(--sample, spread over the whole shard) equals cpu_random.initial_values of their keys (the cpu
backend's values), so the load brought back every chunk it zeroed, and the cuda result is the cpu
one. --digest (small tables: it gathers the table on rank 0) prints a SHA-256 of the values
ordered by key (rank-count independent): a cpu and a cuda run of the same --rows/--dim must print
the same digest.
"""
import hashlib
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

TABLE = "bench_checkpoint_io/EmbeddingVariable"


def parse_args(argv):
    parser = harness.parser(__doc__, out=True, backend=True, repeats=True)
    parser.add_argument("--dir", required=True,
                        help="folder on the disk to measure (the run writes in a folder "
                             "sok1x-checkpoint-io there, removed at the end)")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--slots", type=int, default=0, help="optimizer slots to carry")
    parser.add_argument("--hashtable", action="store_true")
    parser.add_argument("--chunk-mb", type=float, default=None,
                        help="SOK1X_CHECKPOINT_CHUNK_MB for the run (default: its default)")
    parser.add_argument("--sample", type=int, default=200_000,
                        help="rows per rank checked against the cpu backend's values")
    parser.add_argument("--io-threads", type=int, default=None,
                        help="threads of the plain write and read, and SOK1X_CHECKPOINT_THREADS "
                             "of the checkpoint (default: its default, 4)")
    parser.add_argument("--load-way", choices=["auto", "staged", "two-pass"], default=None,
                        help="SOK1X_CHECKPOINT_LOAD for the run (default: its default, auto)")
    parser.add_argument("--digest", action="store_true")
    return parser.parse_args(argv)


def _all(value):
    from mpi4py import MPI
    return MPI.COMM_WORLD.allgather(value)


def _drop_cache(path):
    with open(path, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _status_kib(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _timed(run, before=None):
    """(seconds of run() on the slowest rank, barriers around it; peak resident MiB it added on
    this rank)."""
    if before is not None:
        before()
    harness.barrier()
    _reset_peak()
    resident = _status_kib("VmRSS")
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    added = (_status_kib("VmHWM") - resident) / 1024.0
    harness.barrier()
    return harness.job_max(seconds), added


def _regions(size, threads):
    """[(start, stop)] of `threads` contiguous regions of a file of `size` bytes."""
    step = -(-size // threads) or 1
    return [(start, min(size, start + step)) for start in range(0, size, step)]


def _plain_write(path, size, chunk, threads):
    """Writes `size` bytes of `chunk` to `path`, each of `threads` threads its own region of the
    file (pwrite), then fsync."""
    from concurrent.futures import ThreadPoolExecutor
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    piece = memoryview(chunk)[:max(1, chunk.size // threads)]

    def region(bounds):
        for offset in range(bounds[0], bounds[1], piece.nbytes):
            part = piece[:min(piece.nbytes, bounds[1] - offset)]
            while part.nbytes:
                written = os.pwrite(descriptor, part, offset)
                part, offset = part[written:], offset + written
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(region, _regions(size, threads)))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _plain_read(path, buffer, threads):
    """Reads `path` back, each of `threads` threads its own region into its part of
    `buffer`; returns the bytes read."""
    from concurrent.futures import ThreadPoolExecutor
    size = os.stat(path).st_size
    descriptor = os.open(path, os.O_RDONLY)
    step = max(1, buffer.size // threads)
    parts = [memoryview(buffer)[i * step:(i + 1) * step] for i in range(threads)]

    def region(index):
        start, stop = _regions(size, threads)[index]
        total = 0
        for offset in range(start, stop, step):
            total += os.preadv(descriptor, [parts[index][:min(step, stop - offset)]], offset)
        return total
    try:
        with ThreadPoolExecutor(threads) as pool:
            return sum(pool.map(region, range(len(_regions(size, threads)))))
    finally:
        os.close(descriptor)


def _emptied(folder):
    """Empties `folder` (made if missing; rank 0 does it), so only one copy of the bytes is
    there at once."""
    if harness.rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
    harness.barrier()


def _check_room(folder, needed):
    """Stops the run at once if `folder` has less than `needed` bytes free."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    if harness.job_min(free - needed) < 0:
        raise SystemExit("%s has %.1f GB free; the run writes %.1f GB there at once: pick "
                         "another --dir (a local disk or /dev/shm with room), or fewer --rows"
                         % (folder, free / 1e9, needed / 1e9))


def build_table(rt, args):
    from sok1x.backend.random_init import make_spec
    from sok1x.engine import api
    per_rank = -(-args.rows // rt.size)
    capacity = per_rank if not args.hashtable else per_rank + per_rank // 4
    api.create_table(TABLE, args.dim, capacity, args.hashtable,
                     make_spec("uniform", -1.0, 1.0, 11), replace=True)
    table = api.shard(TABLE)
    with _entered():
        if args.hashtable:
            keys = np.arange(rt.rank, args.rows, rt.size, dtype=np.int64)
            for start in range(0, keys.size, 1 << 22):
                table.rows_of(rt.backend.asarray(keys[start:start + (1 << 22)]), insert=True)
        for index in range(args.slots):
            table.slot("Adam/slot%d" % index, 0.0)
    return table


def _entered():
    from sok1x.engine import runtime
    return runtime.entered()


def _table():
    from sok1x.engine import runtime
    return runtime.get().tables[TABLE]


def _sampled_rows(rt, table, sample):
    """Host (keys, values) of `sample` rows spread over this shard (every row if fewer)."""
    from sok1x.engine.tables import placement
    from sok1x.engine.checkpoint import _held_rows
    with _entered():
        if table.use_hashtable:
            keys, rows = _held_rows(rt, table)
        else:  # only the sampled rows' keys: a big shard's would take GBs
            rows = np.arange(table.values.shape[0], dtype=np.int64)
        pick = np.linspace(0, rows.size - 1, num=min(sample, rows.size)).astype(np.int64)
        rows = rows[pick]
        keys = keys[pick] if table.use_hashtable else placement.global_keys(
            table.placement, rows, table.rank, table.size)
        values = rt.backend.to_host(rt.backend.take_rows(table.values,
                                                         rt.backend.asarray(rows)))
    return keys, np.asarray(values)


def check_cpu_equal(rt, table, sample):
    """Raises AssertionError unless a sample of rows equals the cpu backend's initial values;
    returns the rows checked."""
    from sok1x.backend.cpu.random_rows import initial_values
    keys, values = _sampled_rows(rt, table, sample)
    if not keys.size:
        return 0
    want = initial_values(table.spec, table.table_id, keys, table.dim)
    mismatched = int(np.count_nonzero(np.any(values != want, axis=1)))
    assert mismatched == 0, "%d of %d sampled rows differ from the cpu backend" % (
        mismatched, keys.size)
    return int(keys.size)


def digest(rt, table):
    """SHA-256 of every rank's values ordered by key (rank 0; None elsewhere). Gathers the
    table on rank 0: for small tables."""
    keys, values = _sampled_rows(rt, table, 1 << 62)
    parts = rt.host.all_gather_object((keys, values)) if rt.size > 1 else [(keys, values)]
    if rt.rank != 0:
        return None
    all_keys = np.concatenate([k for k, _ in parts])
    order = np.argsort(all_keys, kind="stable")
    sha = hashlib.sha256(all_keys[order].tobytes())
    values = np.concatenate([v for _, v in parts])
    for start in range(0, order.size, 1 << 20):
        sha.update(np.ascontiguousarray(values[order[start:start + (1 << 20)]]).tobytes())
    return sha.hexdigest()


def _shard_files(folder):
    with open(os.path.join(folder, "sok1x-checkpoint.json")) as handle:
        shards = json.load(handle)["tables"][TABLE]["shards"]
    return [(shard["rank"], os.path.join(folder, shard["file"]), shard["size"])
            for shard in shards]


def _rate(size, timings):
    """{GBps: median, GBps_min, GBps_max} of `size` bytes over the repeats' seconds."""
    rates = [size / seconds / 1e9 for seconds in timings]
    return {"GBps": harness.median(rates), "GBps_min": min(rates), "GBps_max": max(rates),
            "seconds": [float(s) for s in timings]}


def _say(text):
    if harness.rank() == 0:
        print(text, flush=True)


def main(argv):
    args = parse_args(argv)
    if args.chunk_mb is not None:
        os.environ["SOK1X_CHECKPOINT_CHUNK_MB"] = str(args.chunk_mb)
    if args.io_threads is not None:
        os.environ["SOK1X_CHECKPOINT_THREADS"] = str(args.io_threads)
    if args.load_way is not None:
        os.environ["SOK1X_CHECKPOINT_LOAD"] = args.load_way
    from sok1x.engine import checkpoint
    from sok1x.engine.checkpoint import format as checkpoint_format
    from sok1x.engine.checkpoint import load as checkpoint_load
    from sok1x.engine.checkpoint import checksum as shard_checksum
    ways = set()
    read_table = checkpoint_load.read_table

    def noted(rt, plan):  # which way each load took
        staged = getattr(plan, "staged", None) is not None  # None before staged loads
        ways.add("staged" if staged else "two-pass")
        return read_table(rt, plan)
    checkpoint_load.read_table = noted
    threads = shard_checksum.threads()
    started = time.perf_counter()
    rt = harness.start_engine(args.backend)
    # No reference to the table object is kept: a load drops a hash table's old shard.
    sampled = check_cpu_equal(rt, build_table(rt, args), args.sample)
    work = os.path.join(args.dir, "sok1x-checkpoint-io")
    _emptied(work)
    per_row = checkpoint_format.row_bytes(args.dim, args.slots)
    _check_room(work, int(args.rows * per_row * 1.02) + (64 << 20))
    _say("table of %d x %d made in %.1f s" % (args.rows, args.dim,
                                              time.perf_counter() - started))

    def dump():
        checkpoint.dump_tables(work, [TABLE])

    def load():
        checkpoint.load_tables(work, [TABLE])

    def zero_and_drop():
        with _entered():
            rt.backend.fill_value(_table().values, 0.0)
            rt.backend.synchronize()
        for _, path, _ in _shard_files(work):
            _drop_cache(path)
    first = _timed(dump, before=lambda: _emptied(work))  # untimed: sizes the plain file
    files = _shard_files(work)
    total = sum(size for _, _, size in files)
    mine = [size for rank, _, size in files if rank == rt.rank][0]
    plain = os.path.join(work, "plain_io.%d.bin" % rt.rank)
    chunk = harness.seeded_rng(rt.rank).integers(
        0, 255, size=min(mine, checkpoint.chunk_bytes()) or 1, dtype=np.uint8)
    dumps, loads, writes, writes1, reads = [], [], [], [], []
    for round_ in range(args.repeats):  # in turn, so the host's load drifts over all alike
        writes.append(_timed(lambda: _plain_write(plain, mine, chunk, threads),
                             before=lambda: _emptied(work)))
        writes1.append(_timed(lambda: _plain_write(plain, mine, chunk, 1),
                              before=lambda: _emptied(work)))
        reads.append(_timed(lambda: _plain_read(plain, chunk, threads),
                            before=lambda: _drop_cache(plain)))
        dumps.append(_timed(dump, before=lambda: _emptied(work)))  # one copy on disk at once
        loads.append(_timed(load, before=zero_and_drop))
        _say("round %d, GB/s: write %.2f, write on 1 thread %.2f, read %.2f, dump %.2f, "
             "load %.2f (%s); peak MiB added: dump %.0f, load %.0f" % tuple(
                 [round_] + [total / timings[-1][0] / 1e9 for timings in (
                     writes, writes1, reads, dumps, loads)]
                 + [", ".join(sorted(ways)), dumps[-1][1], loads[-1][1]]))
    sampled = min(sampled, check_cpu_equal(rt, _table(), args.sample))
    key_digest = digest(rt, _table()) if args.digest else None
    _say("dumps, loads, plain writes and reads done at %.1f s" % (time.perf_counter() - started))
    shard_mib = mine / 2 ** 20
    bound_mib = checkpoint.chunk_bytes() / 2 ** 20 + shard_mib / 10
    pinned_mib = 0.0
    if args.backend == "cuda":  # held from the first dump on, so no peak above counts it
        from sok1x.backend.cuda import staging as cuda_staging
        pinned_mib = cuda_staging.pinned_bytes() / 2 ** 20
    per_rank = _all({"rank": rt.rank, "shard_MiB": shard_mib, "bound_MiB": bound_mib,
                     "page_locked_MiB": pinned_mib,
                     "dump_peak_added_MiB": max([first[1]] + [m for _, m in dumps]),
                     "load_peak_added_MiB": max(m for _, m in loads)})
    result = {
        "environment": harness.environment({"backend": args.backend, "ranks": rt.size}),
        "rows": args.rows, "dim": args.dim, "slots": args.slots, "hashtable": args.hashtable,
        "dir": os.path.abspath(args.dir), "chunk_bytes": checkpoint.chunk_bytes(),
        "file_bytes": total, "repeats": args.repeats, "io_threads": threads,
        "load_ways": sorted(set().union(*_all(sorted(ways)))),
        "dump": _rate(total, [s for s, _ in dumps]), "load": _rate(total, [s for s, _ in loads]),
        "plain_write": _rate(total, [s for s, _ in writes]),
        "plain_write_1thread": _rate(total, [s for s, _ in writes1]),
        "plain_read": _rate(total, [s for s, _ in reads]),
        "peak_added_host_memory": per_rank,
        "sampled_rows_equal_cpu": sampled, "values_digest": key_digest,
        "seconds_in_all": time.perf_counter() - started,
    }
    result["dump_vs_write"] = result["dump"]["GBps"] / max(
        result["plain_write"]["GBps"], result["plain_write_1thread"]["GBps"])
    result["load_vs_read"] = result["load"]["GBps"] / result["plain_read"]["GBps"]
    if rt.rank == 0:
        print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))
        for entry in per_rank:
            print("rank %d: peak host memory added: dump %.1f MiB, load %.1f MiB, page-locked "
                  "staging held throughout %.1f MiB (bound: chunk + 10%% of its %.0f MiB shard "
                  "= %.1f MiB)" % (
                      entry["rank"], entry["dump_peak_added_MiB"],
                      entry["load_peak_added_MiB"], entry["page_locked_MiB"],
                      entry["shard_MiB"], entry["bound_MiB"]))
    harness.write_json(args.out, result)
    if rt.rank == 0:
        shutil.rmtree(work, ignore_errors=True)
    harness.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
