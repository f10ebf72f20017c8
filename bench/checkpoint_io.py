"""Sharded checkpoint dump + load of one big table (DESIGN D8) beside a plain parallel write and
read of the same bytes to the same folder, in the same run.

    mpiexec -n 1 python3 bench/checkpoint_io.py --dir /local/disk/ckpt-bench \\
        --out bench/results/checkpoint_io-1gpu.json
    mpiexec -n 4 python3 bench/checkpoint_io.py --dir ... --rows 100000000 --out ...-4gpu.json
    mpiexec -n 2 python3 bench/checkpoint_io.py --backend cpu --rows 1000000 --dir /tmp/ckb \\
        --out /tmp/ckb.json                                                   # a quick check

The table: --rows keys (default 10M) x --dim (128) float32, no hash table (or --hashtable: every
key inserted), --slots zero-filled optimizer slots (default 0), initial values from a fixed
uniform initializer. Timed, with a barrier before and after (the slowest rank's time), each the
median of --repeats with min and max:
    dump   sok1x.engine.checkpoint.dump_tables: every rank streams its shard to its own file in
           chunks of SOK1X_CHECKPOINT_CHUNK_MB (--chunk-mb), checksummed, fsync, rename; then the
           manifest
    load   load_tables: every rank streams the files its placement needs into a fresh shard
    write  every rank writes as many bytes as its shard file to a file of its own, in chunks of
           the same size, fsync (the disk's parallel write bandwidth for this job)
    read   every rank reads its file back
Before each read (the checkpoint's and the plain one) the files' pages are dropped from the page
cache with posix_fadvise(DONTNEED), so both read the disk alike where the system honours it.
Each rank's peak resident memory added by a dump and by a load is reported (VmHWM, reset before
each through /proc/self/clear_refs).

Checks (the run fails if one does not hold): after a load that follows zeroing every shard, each
rank's rows equal what it held before the dump, bit for bit; and a sample of rows equals
cpu_random.initial_values of their keys (the cpu backend's values), so the cuda result is the
cpu one. --digest prints a SHA-256 of the values ordered by key (rank-count independent): a cpu
and a cuda run of the same --rows/--dim must print the same digest.
"""
import hashlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

TABLE = "bench_checkpoint_io/EmbeddingVariable"


def parse_args(argv):
    parser = harness.parser(__doc__, out=True, backend=True, repeats=True)
    parser.add_argument("--dir", required=True, help="folder on the disk to measure")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--slots", type=int, default=0, help="optimizer slots to carry")
    parser.add_argument("--hashtable", action="store_true")
    parser.add_argument("--chunk-mb", type=float, default=None,
                        help="SOK1X_CHECKPOINT_CHUNK_MB for the run (default: its default)")
    parser.add_argument("--digest", action="store_true")
    return parser.parse_args(argv)


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
    the rank that added most)."""
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
    return harness.job_max(seconds), harness.job_max(added)


def _plain_write(path, size, chunk):
    with open(path, "wb") as out:
        for start in range(0, size, chunk.size):
            out.write(memoryview(chunk)[:min(chunk.size, size - start)])
        out.flush()
        os.fsync(out.fileno())


def _plain_read(path, buffer):
    total = 0
    with open(path, "rb") as handle:
        while True:
            got = handle.readinto(buffer)
            if not got:
                return total
            total += got


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


def held(rt, table):
    """Host (keys, values) of every row this shard holds, ordered by key."""
    from sok1x.engine.checkpoint import _held_rows
    with _entered():
        keys, rows = _held_rows(rt, table)
        order = np.argsort(keys, kind="stable")
        values = rt.backend.to_host(rt.backend.take_rows(table.values,
                                                         rt.backend.asarray(rows[order])))
    return keys[order], np.asarray(values)


def check_cpu_equal(table, keys, values, sample=100_000):
    """Raises AssertionError unless a sample of rows equals the cpu backend's initial values."""
    from sok1x.backend.cpu_random import initial_values
    if not keys.size:
        return 0
    pick = np.linspace(0, keys.size - 1, num=min(sample, keys.size)).astype(np.int64)
    want = initial_values(table.spec, table.table_id, keys[pick], table.dim)
    mismatched = int(np.count_nonzero(np.any(values[pick] != want, axis=1)))
    assert mismatched == 0, "%d of %d sampled rows differ from the cpu backend" % (
        mismatched, pick.size)
    return int(pick.size)


def digest(rt, keys, values):
    """SHA-256 of every rank's values ordered by key (rank 0; None elsewhere)."""
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


def main(argv):
    args = parse_args(argv)
    if args.chunk_mb is not None:
        os.environ["SOK1X_CHECKPOINT_CHUNK_MB"] = str(args.chunk_mb)
    from sok1x.engine import checkpoint, runtime
    rt = harness.start_engine(args.backend)
    table = build_table(rt, args)
    before_keys, before_values = held(rt, table)
    sampled = check_cpu_equal(table, before_keys, before_values)
    os.makedirs(args.dir, exist_ok=True)

    dumps = [_timed(lambda: checkpoint.dump_tables(args.dir, [TABLE]))
             for _ in range(args.repeats)]
    files = _shard_files(args.dir)
    total = sum(size for _, _, size in files)
    mine = [size for rank, _, size in files if rank == rt.rank][0]

    def zero_and_drop():
        with _entered():
            runtime.get().tables[TABLE].values.fill(0.0)
        for _, path, _ in files:
            _drop_cache(path)
    loads = [_timed(lambda: checkpoint.load_tables(args.dir, [TABLE]), before=zero_and_drop)
             for _ in range(args.repeats)]
    after_keys, after_values = held(rt, runtime.get().tables[TABLE])
    assert np.array_equal(after_keys, before_keys), "the load brought back other keys"
    assert np.array_equal(after_values, before_values), "the load brought back other values"

    plain = os.path.join(args.dir, "plain_io.%d.bin" % rt.rank)
    chunk = harness.seeded_rng(rt.rank).integers(
        0, 255, size=min(mine, checkpoint.chunk_bytes()) or 1, dtype=np.uint8)
    writes = [_timed(lambda: _plain_write(plain, mine, chunk)) for _ in range(args.repeats)]
    reads = [_timed(lambda: _plain_read(plain, chunk), before=lambda: _drop_cache(plain))
             for _ in range(args.repeats)]
    os.remove(plain)
    key_digest = digest(rt, after_keys, after_values) if args.digest else None
    result = {
        "environment": harness.environment({"backend": args.backend, "ranks": rt.size}),
        "rows": args.rows, "dim": args.dim, "slots": args.slots, "hashtable": args.hashtable,
        "chunk_bytes": checkpoint.chunk_bytes(), "file_bytes": total,
        "dump": _rate(total, [s for s, _ in dumps]), "load": _rate(total, [s for s, _ in loads]),
        "plain_write": _rate(total, [s for s, _ in writes]),
        "plain_read": _rate(total, [s for s, _ in reads]),
        "dump_peak_added_MiB": max(m for _, m in dumps),
        "load_peak_added_MiB": max(m for _, m in loads),
        "shard_MiB": mine / 2 ** 20,
        "sampled_rows_equal_cpu": sampled, "values_digest": key_digest,
    }
    result["dump_vs_write"] = result["dump"]["GBps"] / result["plain_write"]["GBps"]
    result["load_vs_read"] = result["load"]["GBps"] / result["plain_read"]["GBps"]
    if rt.rank == 0:
        print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))
    harness.write_json(args.out, result)
    harness.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
