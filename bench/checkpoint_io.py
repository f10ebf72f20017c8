"""Checkpoint dump + load of one big table (DESIGN D8) beside a plain write/read of as many bytes
to the same directory, in the same run.

    mpiexec -n 1 python3 bench/checkpoint_io.py --backend cuda --dir /local/disk/ckpt-bench \\
        --out bench/results/checkpoint_io-1gpu.json
    mpiexec -n 4 python3 bench/checkpoint_io.py --backend cuda --dir ... --out ...-4gpu.json
    python3 bench/checkpoint_io.py --backend cpu --rows 1000000 --dir /tmp/ckpt-bench  # quick

The table: --rows keys (default 10M) x --dim (128) float32, no hash table (or --hashtable: every
key inserted), --slots zero-filled optimizer slots (default 0), initial values from a fixed
uniform initializer. Timed, with a barrier before and after, each the median of --repeats:
    dump   sok1x.engine.checkpoint.dump_tables (gather to rank 0, encode with crc32, write to a
           temporary file, fsync, rename)
    load   load_tables (read, check, send each rank its rows, rebuild the shards)
    write  rank 0 writes the same number of bytes to a file in --dir with one write + fsync
    read   rank 0 reads that file back
Before each read (the checkpoint's and the plain one) the file's pages are dropped from the page
cache with posix_fadvise(DONTNEED), so both read the disk alike where the system honours it.

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

import harness

TABLE = "bench_checkpoint_io/EmbeddingVariable"


def parse_args(argv):
    parser = harness.parser(__doc__, backend=True, repeats=3,
                            out={"required": False, "default": None})
    parser.add_argument("--dir", required=True, help="directory on the disk to measure")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--slots", type=int, default=0, help="optimizer slots to carry")
    parser.add_argument("--hashtable", action="store_true")
    parser.add_argument("--digest", action="store_true")
    return parser.parse_args(argv)


def _drop_cache(path):
    with open(path, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _timed(rt, run, before=None):
    """Seconds of run() on the slowest rank, barriers around it."""
    if before is not None:
        before()
    rt.host.barrier()
    start = time.perf_counter()
    run()
    rt.host.barrier()
    return max(rt.host.all_gather_object(time.perf_counter() - start))


def _plain_write(path, data):
    with open(path, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _plain_read(path):
    with open(path, "rb") as handle:
        return len(handle.read())


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


def main(argv):
    args = parse_args(argv)
    from sok1x.engine import checkpoint, runtime
    rt = harness.start_engine(args.backend)
    table = build_table(rt, args)
    before_keys, before_values = held(rt, table)
    sampled = check_cpu_equal(table, before_keys, before_values)
    os.makedirs(args.dir, exist_ok=True)
    target = os.path.join(args.dir, checkpoint.file_name(TABLE))

    dump_s = [_timed(rt, lambda: checkpoint.dump_tables(args.dir, [TABLE]))
              for _ in range(args.repeats)]
    size = rt.host.broadcast_object(os.path.getsize(target) if rt.rank == 0 else None)

    def zero_shard():
        with _entered():
            runtime.get().tables[TABLE].values.fill(0.0)

    def drop_target():
        if rt.rank == 0:
            _drop_cache(target)
    load_s = []
    for _ in range(args.repeats):
        zero_shard()
        load_s.append(_timed(rt, lambda: checkpoint.load_tables(args.dir, [TABLE]),
                             before=drop_target))
    after_keys, after_values = held(rt, runtime.get().tables[TABLE])
    assert np.array_equal(after_keys, before_keys), "the load brought back other keys"
    assert np.array_equal(after_values, before_values), "the load brought back other values"

    plain = os.path.join(args.dir, "plain_io.bin")
    write_s, read_s = [], []
    if rt.rank == 0:
        data = np.random.default_rng(0).integers(0, 255, size=size, dtype=np.uint8).tobytes()
        for _ in range(args.repeats):
            start = time.perf_counter()
            _plain_write(plain, data)
            write_s.append(time.perf_counter() - start)
            _drop_cache(plain)
            start = time.perf_counter()
            assert _plain_read(plain) == size
            read_s.append(time.perf_counter() - start)
        del data
        os.remove(plain)
    key_digest = digest(rt, after_keys, after_values) if args.digest else None
    harness.finish()
    if rt.rank != 0:
        return 0
    median = harness.median
    result = {
        "backend": args.backend, "ranks": rt.size, "rows": args.rows, "dim": args.dim,
        "slots": args.slots, "hashtable": args.hashtable, "file_bytes": size,
        "dump_s": median(dump_s), "load_s": median(load_s),
        "plain_write_s": median(write_s), "plain_read_s": median(read_s),
        "sampled_rows_equal_cpu": sampled, "values_digest": key_digest,
    }
    result["dump_GBps"] = size / result["dump_s"] / 1e9
    result["load_GBps"] = size / result["load_s"] / 1e9
    result["plain_write_GBps"] = size / result["plain_write_s"] / 1e9
    result["plain_read_GBps"] = size / result["plain_read_s"] / 1e9
    result["dump_vs_write"] = result["dump_GBps"] / result["plain_write_GBps"]
    result["load_vs_read"] = result["load_GBps"] / result["plain_read_GBps"]
    print(json.dumps(result, indent=1))
    if args.out:
        harness.write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
