"""DynamicVariable's shard (engine/dynamic_table.py) on HierarchicalKV's grid point: dim 64,
load 0.5, find and find_or_insert in 2^30 keys/s, for var_type "hbm" and for "hybrid" with half
the vectors in page-locked host memory that the kernels read over PCIe.

    python3 bench/dynamic_table.py --out results/dynamic.json [--scale 16 for a quick check]

The table holds 2^26 rows (HKV's 64M capacity) and is filled with 2^25 keys (load 0.5 of the
capacity, as HKV counts it; the index itself has twice as many slots as rows, so its own load is
0.25). For hybrid, the held keys' rows are spread over both parts (a random half of the rows),
the free rows likewise, so finds and inserts go half to GPU memory and half to host memory. Each
call handles 2^20 keys:
    find                    index.find + the table's gather (60% of the keys held, 40% not)
    find_or_insert          index.find_or_insert with a row pool + init of the new rows + gather
                            (60% held, 40% new)
    find_or_insert_engine   the engine's whole training path for those keys:
                            DynamicTable.capacity_error + rows_of + gather (counts, statistics)
Each inserting call is rolled back (the step journal, untimed) so every call starts at load 0.5.
The PCIe figure is a timed 256 MiB host-to-device copy from page-locked memory; `pcie_bound`
is what it allows hybrid's gather: (2^30 keys/s) = bandwidth / (dim * 4 bytes * host share).
HierarchicalKV's H200 figures are stored beside ours.
"""
import sys
import types

import numpy as np

import harness
from hash_table import HIT_RATE, HKV_H200, keys_of, op_figures, rotations

ROWS = 1 << 26
KEYS_PER_CALL = 1 << 20
DIM = 64
LOAD = 0.5


def make_table(backend, var_type, rows, dim, rng):
    """A DynamicTable of `rows` rows (no growth) filled to LOAD; returns (table, held count)."""
    from sok1x.backend import random_init
    from sok1x.engine.dynamic_table import DynamicTable, make_dynamic
    from sok1x.engine.step_journal import StepJournal
    spec = random_init.make_spec("uniform", -0.05, 0.05, seed=1)
    host_gib = rows * dim * 4 / 2 / 2 ** 30 if var_type == "hybrid" else 0.0
    dynamic = make_dynamic(var_type, rows, rows, "lru", host_gib)
    place = types.SimpleNamespace(backend=backend, rank=0, size=1, journal=StepJournal())
    with backend.device_context():
        table = DynamicTable(place, "bench_" + var_type, dim, spec, "hash", dynamic)
        held = int(LOAD * rows)
        order = rng.permutation(rows) if var_type == "hybrid" else np.arange(rows)
        piece = 1 << 22
        for first in range(0, held, piece):
            n = min(piece, held - first)
            table.index.assign(backend.asarray(keys_of(first, n)),
                               backend.asarray(order[first:first + n].astype(np.int64)))
        table._high_water = rows
        table._free = np.ascontiguousarray(order[held:][::-1].astype(np.int64))
        backend.synchronize()
    return table, held


def pcie_gib_per_s(backend, timer):
    """Host-to-device bandwidth from page-locked memory (GiB/s), or None on cpu."""
    if backend.NAME != "cuda":
        return None
    import pycuda.driver as driver
    from sok1x.backend import cuda_context
    nbytes = 256 << 20
    with cuda_context.entered():
        host = driver.pagelocked_empty(nbytes, np.uint8)
        device = driver.mem_alloc(nbytes)

        def copy():
            driver.memcpy_htod_async(device, host, cuda_context.stream())
        ms = harness.median(timer.time_ms(copy, 5))
    return nbytes / 2 ** 30 / (ms / 1e3)


def measure(backend, timer, var_type, rows, keys_per_call, dim, repeats, rng):
    table, held = make_table(backend, var_type, rows, dim, rng)
    finds, inserts = rotations(backend, held, keys_per_call, rng)
    from sok1x.engine import hybrid_rows
    journal = table.journal

    def find():
        table.gather(table.index.find(finds()))

    new_per_call = keys_per_call - int(keys_per_call * HIT_RATE)
    placed = []

    def find_or_insert():
        keys = inserts()
        pool, _ = table._take_rows(new_per_call)
        found, new_keys, new_rows = table.index.find_or_insert(keys,
                                                               row_pool=backend.asarray(pool))
        hybrid_rows.init_rows(backend, table.values, new_rows, new_keys, table.spec, 7)
        table.gather(found)
        placed.append(new_keys)

    def find_or_insert_engine():
        keys = inserts()
        assert table.capacity_error(keys) is None
        table.gather(table.rows_of(keys, True))

    free_before = (table._free, table._high_water)

    def erase_placed():  # the index path inserts without the journal: erase by hand
        while placed:
            table.index.erase(placed.pop())
        table._free, table._high_water = free_before

    def new_step():
        journal.rollback()
        journal.begin_step()

    entry = {"var_type": var_type, "rows": rows, "dim": dim, "keys_per_call": keys_per_call,
             "hbm_rows": table.hbm_rows}
    with backend.device_context():
        for name, run, before in (("find", find, None),
                                  ("find_or_insert", find_or_insert, erase_placed),
                                  ("find_or_insert_engine", find_or_insert_engine, new_step)):
            entry[name] = op_figures(timer.time_ms(run, repeats, warmup=2, before=before),
                                     keys_per_call)
        journal.rollback()
        erase_placed()
    harness.log("%s dim %d: find %.2f, find_or_insert %.2f (engine path %.2f) [2^30 keys/s]" % (
        var_type, dim, entry["find"]["gkeys_per_s"], entry["find_or_insert"]["gkeys_per_s"],
        entry["find_or_insert_engine"]["gkeys_per_s"]))
    return entry


def main(argv):
    args = harness.parser(__doc__, backend=True, out=True, scale=True, repeats=7).parse_args(argv)
    backend = harness.backend_module(args.backend)
    timer = harness.StreamTimer(backend)
    rng = harness.seeded_rng()
    bandwidth = pcie_gib_per_s(backend, timer)
    results = {"hkv": HKV_H200, "pcie_h2d_gib_per_s": bandwidth, "grid": [],
               "environment": harness.environment()}
    for var_type in ("hbm", "hybrid"):
        entry = measure(backend, timer, var_type, ROWS // args.scale,
                        KEYS_PER_CALL // args.scale, DIM, args.repeats, rng)
        if var_type == "hybrid" and bandwidth:
            entry["pcie_bound_gkeys_per_s"] = bandwidth / (DIM * 4 * 0.5)
        results["grid"].append(entry)
        harness.write_json(args.out, results)
        harness.release_memory(backend)


if __name__ == "__main__":
    main(sys.argv[1:])
