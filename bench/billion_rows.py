"""Issue 18's large-table run: a table of --rows keys, trained, dumped, and loaded back on any
number of ranks, with the loaded rows checked against the trained ones by a digest.

    mpiexec -n 4 python3 bench/billion_rows.py --phase train --rows 1000000000 --dim 32 \
        --hbm-gib 60 --dir /some/disk/billion --out train4.json
    mpiexec -n 2 python3 bench/billion_rows.py --phase restore --rows 1000000000 --dim 32 \
        --hbm-gib 60 --dir /some/disk/billion --out restore2.json
    mpiexec -n 2 python3 bench/billion_rows.py --backend cpu --phase train --rows 100000 \
        --dim 8 --dir /tmp/br --out /tmp/br-train.json              # a quick check, then restore

The table is a hybrid DynamicVariable (hash table, placement "mod", no growth): each rank holds
ceil(rows / ranks) keys, --hbm-gib of their vectors (and as many rows of each optimizer slot) in
GPU memory and the rest in page-locked host memory. LazyAdam keeps two slots, m and v, so a
1e9 x 32 table is 384 GB with them (issue 18's run).

train:   every key is inserted (sok1x.assign's path, in chunks, with values drawn from a seeded
         generator), --steps LazyAdam steps train on --batch random keys per rank, the table
         (values, m, v) is dumped into --dir (sok1x's sharded checkpoint), and the digest of the
         trained rows goes to <dir>/digest.json.
restore: the same table is made on this job's ranks (empty), loaded from --dir, and its digest
         compared with <dir>/digest.json: the run fails if they differ.
The checkpoint takes about rows x (12 x dim + 16) bytes (1e9 x 32: 400 GB): a train run stops
at once where --dir has less room. The GPU machines lent so far cannot hold it (nvidia-h200-x4:
235 GiB of disk, 512 GiB of memory, so /dev/shm has about 256 GiB).
The digest: per held row, its key and the bit patterns of its values, m and v mixed into 64 bits;
the sum over every rank's rows (mod 2^64), so it depends on neither the ranks nor the rows'
order. Each phase's seconds (the slowest rank's) and the dump's and load's GB/s go to --out.
"""
import json
import os
import shutil
import sys
import time
import types

import numpy as np

import harness
import sok_steps

TABLE = "bench_billion_rows"
SLOTS = (sok_steps.SLOT_PREFIX + "/m", sok_steps.SLOT_PREFIX + "/v")
MASK = (1 << 64) - 1
_GOLDEN, _MIX1, _MIX2 = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xFF51AFD7ED558CCD),
                         np.uint64(0xC4CEB9FE1A85EC53))


def parse_args(argv):
    parser = harness.parser(__doc__, out=True, backend=True, steps=5)
    parser.add_argument("--phase", choices=("train", "restore"), required=True)
    parser.add_argument("--rows", type=int, default=1_000_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--hbm-gib", type=float, default=0.0,
                        help="GiB of each rank's vectors in GPU memory (0: all of them)")
    parser.add_argument("--batch", type=int, default=65536, help="keys per rank per step")
    parser.add_argument("--chunk", type=int, default=1 << 22, help="keys per insert and digest "
                        "chunk")
    parser.add_argument("--dir", required=True, help="the checkpoint folder")
    return parser.parse_args(argv)


def make_table(rt, args):
    """Declares the hybrid DynamicVariable shard of this job; returns its capacity per rank."""
    from sok1x.backend import random_init
    from sok1x.engine import api
    from sok1x.engine.tables.dynamic_table import make_dynamic
    capacity = -(-args.rows // rt.size)
    hbm = args.hbm_gib if args.hbm_gib > 0 else capacity * args.dim * 4 / 2 ** 30
    spec = random_init.make_spec("uniform", -0.05, 0.05, seed=3)
    api.create_table(TABLE, args.dim, capacity, True, spec, replace=True, placement="mod",
                     dynamic=make_dynamic("hybrid", capacity, capacity, "lru", hbm))
    return capacity


def insert_every_key(rt, args):
    """Puts every key this rank owns (key % ranks == rank) into the table, in chunks."""
    from sok1x.engine.tables import shard_rows
    mine = range(rt.rank, args.rows, rt.size)
    for first in range(0, len(mine), args.chunk):
        part = mine[first:first + args.chunk]
        keys = np.arange(part.start, part.stop, part.step, dtype=np.int64)
        values = np.random.default_rng(first + 7919 * rt.rank).uniform(
            -0.05, 0.05, (keys.shape[0], args.dim)).astype(np.float32)
        shard_rows.assign(TABLE, keys, values)


def train(rt, args):
    """--steps LazyAdam steps on --batch random keys per rank (engine arrays, as sok_steps)."""
    step = sok_steps.SokStep(TABLE, types.SimpleNamespace(slots=1), pooled=False)
    rng = np.random.default_rng(11 + rt.rank)
    for _ in range(args.steps):
        keys = rt.backend.asarray(rng.integers(0, args.rows, size=args.batch, dtype=np.int64))
        step.device_step(keys, None)
    rt.backend.synchronize()


def _mixed(h):
    h ^= h >> np.uint64(33)
    h *= _MIX1
    h ^= h >> np.uint64(29)
    h *= _MIX2
    return h ^ (h >> np.uint64(32))


def chunk_digest(keys, arrays, weights):
    """Sum (mod 2^64) over the rows of a chunk of the 64-bit mix of each row's key and the bits of
    its row in each of `arrays` (float32 [n, dim]); weights: uint64 [dim]."""
    h = _mixed(keys.astype(np.uint64) * _GOLDEN)
    for array in arrays:
        bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
        h = _mixed(h ^ (bits * weights).sum(axis=1, dtype=np.uint64))
    return int(h.sum(dtype=np.uint64))


def digest(rt, args):
    """The table's digest over every rank (see the module's docstring)."""
    from mpi4py import MPI
    from sok1x.engine import checkpoint, runtime
    weights = _mixed(np.arange(1, args.dim + 1, dtype=np.uint64) * _GOLDEN)
    total = 0
    with runtime.entered():
        table = rt.tables[TABLE]
        keys, rows = checkpoint._held_rows(rt, table)
        arrays = [table.values] + [table.slot(name) for name in SLOTS]  # made if never used
        for first in range(0, keys.shape[0], args.chunk):
            stop = min(first + args.chunk, keys.shape[0])
            parts = [np.array(checkpoint._rows_to_host(rt.backend, array, rows[first:stop],
                                                       False, None)) for array in arrays]
            total = (total + chunk_digest(keys[first:stop], parts, weights)) & MASK
    return MPI.COMM_WORLD.allreduce(total, op=MPI.SUM) & MASK


def timed(figures, name, run):
    """Runs run() between barriers; puts the slowest rank's seconds into figures[name]."""
    harness.barrier()
    started = time.perf_counter()
    result = run()
    harness.barrier()
    figures[name + "_s"] = harness.job_max(time.perf_counter() - started)
    harness.say("%s: %.1f s" % (name, figures[name + "_s"]))
    return result


def check_room(args):
    """Stops the run at once, on every rank, when --dir cannot hold the checkpoint: per row its
    key, values, m, v and update time (1e9 x 32: about 400 GB)."""
    os.makedirs(args.dir, exist_ok=True)
    need = int(args.rows * (8 + 3 * 4 * args.dim + 8) * 1.02)
    free = shutil.disk_usage(args.dir).free
    if free < need:
        raise SystemExit("billion_rows: %s has %.0f GB free, the checkpoint of %d x %d rows with "
                         "m and v needs about %.0f GB" % (args.dir, free / 1e9, args.rows,
                                                          args.dim, need / 1e9))


def checkpoint_bytes(folder):
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


def main(argv):
    args = parse_args(argv)
    rt = harness.start_engine(args.backend)
    from sok1x.engine import checkpoint
    figures = {"phase": args.phase, "ranks": rt.size, "rows": args.rows, "dim": args.dim,
               "hbm_gib_per_rank": args.hbm_gib, "bytes_with_slots": args.rows * args.dim * 12}
    figures["capacity_per_rank"] = make_table(rt, args)
    record = os.path.join(args.dir, "digest.json")
    if args.phase == "train":
        check_room(args)
        timed(figures, "insert", lambda: insert_every_key(rt, args))
        timed(figures, "train", lambda: train(rt, args))
        figures["digest"] = "%016x" % timed(figures, "digest", lambda: digest(rt, args))
        timed(figures, "dump", lambda: checkpoint.dump_tables(args.dir, [TABLE]))
        figures["dump_gb_per_s"] = checkpoint_bytes(args.dir) / figures["dump_s"] / 1e9
        if rt.rank == 0:
            with open(record, "w") as out:
                json.dump({"digest": figures["digest"], "ranks": rt.size}, out)
    else:
        timed(figures, "load", lambda: checkpoint.load_tables(args.dir, [TABLE]))
        figures["load_gb_per_s"] = checkpoint_bytes(args.dir) / figures["load_s"] / 1e9
        figures["digest"] = "%016x" % timed(figures, "digest", lambda: digest(rt, args))
        with open(record) as handle:
            trained = json.load(handle)
        figures["trained_digest"], figures["trained_ranks"] = trained["digest"], trained["ranks"]
        figures["equal"] = figures["digest"] == trained["digest"]
    harness.say("%s on %d ranks: digest %s%s" % (
        args.phase, rt.size, figures["digest"], "" if args.phase == "train" else
        (", equal to the trained one (%d ranks)" % figures["trained_ranks"]
         if figures["equal"] else ", DIFFERENT from the trained one %s" % figures[
             "trained_digest"])))
    harness.write_json(args.out, figures)
    if args.phase == "restore" and not figures["equal"]:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
