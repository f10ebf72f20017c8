"""Kernel times of hybrid find_or_insert_values (bench/dynamic_table's table) at host shares 0.5
and 0.75, dim 64, load 0.5: run under ncu (per-kernel durations)."""
import sys
import numpy as np
import harness
from dynamic_table import make_table, KEYS_PER_CALL
from hash_table import Snapshot, rotations

backend = harness.backend_module("cuda")
rng = np.random.default_rng(5)
for share in (0.5, 0.75):
    table, held = make_table(backend, share, 1 << 24, 64, 0.5, rng)
    finds, inserts = rotations(backend, held, KEYS_PER_CALL, rng)
    new = KEYS_PER_CALL - int(KEYS_PER_CALL * 0.6)
    pool = backend.asarray(table._free[::-1][:new].copy())
    snap = Snapshot(backend, table.index)
    with backend.device_context():
        for r in range(3):
            table.gather(table.index.find(finds()))
            table.index.find_or_insert_values(inserts(), table.values, table.spec, 7, row_pool=pool)
            backend.synchronize()
            snap.restore()
    print("share", share, "done", flush=True)
    del table
    harness.release_memory(backend)
