"""The GPU hash table on HierarchicalKV's benchmark grid: find, find-or-insert, insert-or-assign.

    python3 bench/hash_table.py --out results/hash.json

A table of 2^26 slots (HKV's 64M capacity) is filled to each load factor, then each op runs on
1M keys per call (2^20), in 2^30 keys/s. As in HKV each op moves values of `dim` floats, so here
it is the HashIndex op followed by the row op the engine pairs it with:
    find             index.find + gather_rows (60% of the keys held, 40% not: zero rows)
    find_or_insert   index.find_or_insert_values: one kernel finds, places, initialises the
                     new rows and copies every key's vector out (60% held, 40% new); on a
                     sok1x without it, the three ops of find_or_insert_unfused
    find_or_insert_unfused   index.find_or_insert + init_rows of the new rows (queued before
                     the wait for their count: queue_first) + gather_rows
    insert_or_assign index.find_or_insert + put_rows of the given values (60% held, 40% new)
also: find_index_only (index.find alone) and find_or_insert_engine (with the extra count_missing
the engine runs first to report a full table, EmbeddingTable.capacity_error).
The slots are restored from a snapshot before each inserting call, so every call starts at the
load factor. HierarchicalKV's figures (H200, from the issue) are stored beside ours.
"""
import sys

import numpy as np

import harness
from rows import random_table

SLOT_COUNT = 1 << 26
KEYS_PER_CALL = 1 << 20
LOADS = (0.5, 0.75, 0.9)
DIMS = (8, 32, 64, 128)
HIT_RATE = 0.6
KEY_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: i -> i * M mod 2^63 is a bijection
MASK_63 = np.uint64((1 << 63) - 1)
MISS_BASE = 1 << 40
NEW_BASE = 1 << 41
HKV_H200 = {"source": "HierarchicalKV on an H200, 2026-11-21 (issue 5)",
            "dim 64, load 0.5": {"find": 3.65, "find_or_insert": 1.92, "insert_or_assign": 1.88},
            "dim 8, load 0.5": {"find": 4.02, "find_or_insert": 2.30, "insert_or_assign": 2.26},
            "load 1.0": {"find_or_insert": 1.3}}


def keys_of(first, count):
    """Distinct non-negative int64 keys number first .. first + count - 1."""
    numbers = np.arange(first, first + count, dtype=np.uint64)
    return ((numbers * KEY_MULTIPLIER) & MASK_63).astype(np.int64)


class Snapshot:
    """A copy of a HashIndex's slots and size, to put back between inserting calls."""

    def __init__(self, backend, index):
        self.backend, self.index, self.size = backend, index, index.size
        self.tombstones = getattr(index, "tombstones", 0)
        if backend.NAME == "cuda":
            import pycuda.driver as driver
            from sok1x.backend.cuda import context as cuda_context
            with cuda_context.entered():
                self.copy = driver.mem_alloc(index._slots.nbytes)
                driver.memcpy_dtod_async(self.copy, index._slots.gpudata, index._slots.nbytes,
                                         cuda_context.stream())
        else:
            self.copy = (index._slot_keys.copy(), index._slot_rows.copy())

    def restore(self):
        index = self.index
        if self.backend.NAME == "cuda":
            import pycuda.driver as driver
            from sok1x.backend.cuda import context as cuda_context
            with cuda_context.entered():
                driver.memcpy_dtod_async(index._slots.gpudata, self.copy, index._slots.nbytes,
                                         cuda_context.stream())
        else:
            index._slot_keys[:] = self.copy[0]
            index._slot_rows[:] = self.copy[1]
        index.size, index.tombstones = self.size, self.tombstones


def new_index(backend, slot_count):
    """A HashIndex whose slots number slot_count and may all be used (max_load 1)."""
    if backend.NAME == "cuda":
        return backend.HashIndex(slot_count - 32, max_load=1.0)
    return backend.HashIndex(slot_count)  # cpu (logic checks only): its own slot count


def fill(backend, index, count):
    piece = 1 << 22
    for first in range(0, count, piece):
        n = min(piece, count - first)
        index.assign(backend.asarray(keys_of(first, n)),
                     backend.asarray(np.arange(first, first + n, dtype=np.int64)))


def query_sets(held, keys_per_call, rng, sets=3):
    """(find sets, insert sets): 60% held keys (distinct) and 40% absent keys, shuffled."""
    hits = int(keys_per_call * HIT_RATE)
    finds, inserts = [], []
    for s in range(sets):
        chosen = rng.choice(held, size=hits, replace=False).astype(np.uint64)
        present = ((chosen * KEY_MULTIPLIER) & MASK_63).astype(np.int64)
        absent = keys_of(MISS_BASE + s * keys_per_call, keys_per_call - hits)
        new = keys_of(NEW_BASE + s * keys_per_call, keys_per_call - hits)
        finds.append(rng.permutation(np.concatenate([present, absent])))
        inserts.append(rng.permutation(np.concatenate([present, new])))
    return finds, inserts


class Rotation:
    """Hands out device copies of some query sets in turn, one per call."""

    def __init__(self, backend, sets):
        self.sets = [backend.asarray(keys) for keys in sets]
        self.turn = 0

    def __call__(self):
        self.turn += 1
        return self.sets[self.turn % len(self.sets)]


def rotations(backend, held, keys_per_call, rng):
    """query_sets' find sets and insert sets, each as a Rotation."""
    finds, inserts = query_sets(held, keys_per_call, rng)
    return Rotation(backend, finds), Rotation(backend, inserts)


def device_values(backend, rows, dim, on_gpu):
    """An uninitialised-but-written [rows, dim] float32 value table (its own allocation)."""
    if not on_gpu:
        return np.full((rows, dim), 0.25, np.float32)
    import pycuda.driver as driver
    from pycuda import gpuarray
    from sok1x.backend.cuda import context as cuda_context
    from sok1x.backend.cuda.kernel_launch import fill_bytes
    with cuda_context.entered():
        values = gpuarray.GPUArray((rows, dim), np.float32, allocator=driver.mem_alloc)
        return fill_bytes(values, 0x3C)


def op_figures(times, keys_per_call):
    """{ms (median), ms_min, ms_max, gkeys_per_s (at the median)} of one op's repeats."""
    figures = harness.summary(times, ("ms", "ms_min", "ms_max", "ms_repeats"))
    figures["gkeys_per_s"] = keys_per_call / figures["ms"] * 1e3 / 2 ** 30
    return figures


def measure_load(backend, timer, load, slot_count, keys_per_call, dims, repeats, rng, spec):
    index = new_index(backend, slot_count)
    held = int(load * slot_count)
    fill(backend, index, held)
    snapshot = Snapshot(backend, index)
    finds, inserts = rotations(backend, held, keys_per_call, rng)
    return [measure_dim(backend, timer, index, snapshot, finds, inserts, dim, repeats, spec,
                        {"load": load, "dim": dim, "slots": slot_count,
                         "keys_per_call": keys_per_call})
            for dim in dims]


def measure_dim(backend, timer, index, snapshot, finds, inserts, dim, repeats, spec, entry):
    """Times every op at one dim (finds, inserts: Rotations of query sets); returns `entry` with
    {op: {ms, ms_min, ms_max, gkeys_per_s}} added."""
    keys_per_call = entry["keys_per_call"]
    # An index without find_or_insert_values (sok1x before 2026-11-23's third round) runs the
    # three ops for find_or_insert too, so one script times both trees.
    fused = entry["fused"] = hasattr(index, "find_or_insert_values")
    values = device_values(backend, index.capacity, dim, backend.NAME == "cuda")
    given = random_table(backend, keys_per_call, dim, 6)

    def find():
        backend.gather_rows(values, index.find(finds()))

    def find_index_only():
        index.find(finds())

    def init_new_rows(new_keys, new_rows, count, *rows):  # rows: since issue 21's 4th round
        backend.init_rows(values, new_rows, new_keys, spec, 7, count)

    def find_or_insert_unfused(count_first=False):
        keys = inserts()
        if count_first:
            index.count_missing(keys)
        found, _, _ = index.find_or_insert(keys, queue_first=init_new_rows)
        backend.gather_rows(values, found)

    def find_or_insert(count_first=False):
        if not fused:
            return find_or_insert_unfused(count_first)
        keys = inserts()
        if count_first:
            index.count_missing(keys)
        index.find_or_insert_values(keys, values, spec, 7)

    def insert_or_assign():
        found, _, _ = index.find_or_insert(inserts())
        backend.put_rows(values, found, given)

    ops = {"find": (find, None), "find_index_only": (find_index_only, None),
           "find_or_insert": (find_or_insert, snapshot.restore),
           "find_or_insert_unfused": (find_or_insert_unfused, snapshot.restore),
           "find_or_insert_engine": (lambda: find_or_insert(True), snapshot.restore),
           "insert_or_assign": (insert_or_assign, snapshot.restore)}
    for name, (run, before) in ops.items():
        entry[name] = op_figures(timer.time_ms(run, repeats, warmup=2, before=before),
                                 keys_per_call)
    snapshot.restore()
    harness.log("load %.2f dim %3d: find %.2f (index only %.2f), find_or_insert %.2f "
               "(unfused %.2f, engine %.2f), insert_or_assign %.2f  [2^30 keys/s]" % (
                   entry["load"], dim, entry["find"]["gkeys_per_s"],
                   entry["find_index_only"]["gkeys_per_s"],
                   entry["find_or_insert"]["gkeys_per_s"],
                   entry["find_or_insert_unfused"]["gkeys_per_s"],
                   entry["find_or_insert_engine"]["gkeys_per_s"],
                   entry["insert_or_assign"]["gkeys_per_s"]))
    return entry


def main(argv):
    parser = harness.parser(__doc__, backend=True, out=True, scale=True, repeats=7)
    parser.add_argument("--dims", default=",".join(str(d) for d in DIMS))
    args = parser.parse_args(argv)
    backend = harness.backend_module(args.backend)
    from sok1x.backend import random_init
    spec = random_init.make_spec("uniform", -0.05, 0.05, seed=1)
    timer = harness.StreamTimer(backend)
    rng = harness.seeded_rng()
    dims = [int(d) for d in args.dims.split(",")]
    results = {"hkv": HKV_H200, "grid": [], "environment": harness.environment()}
    for load in LOADS:
        results["grid"] += measure_load(backend, timer, load, SLOT_COUNT // args.scale,
                                        KEYS_PER_CALL // args.scale, dims, args.repeats, rng,
                                        spec)
        harness.write_json(args.out, results)
        harness.release_memory(backend)


if __name__ == "__main__":
    main(sys.argv[1:])
