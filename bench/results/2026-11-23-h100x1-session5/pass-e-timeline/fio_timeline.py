"""A timeline of hybrid find_or_insert_values calls (bench/dynamic_table's table, dim 64, load
0.5) at host shares 0.5 and 0.75: an event after each kernel launch, and the host clock
at each, so GPU gaps and host gaps show."""
import time
import numpy as np
import pycuda.driver as driver
import harness
from dynamic_table import make_table, KEYS_PER_CALL
from hash_table import Snapshot, rotations
import sok1x.backend.cuda_hash as cuda_hash
import sok1x.backend.cuda_host_order as cuda_host_order
from sok1x.backend import cuda_context, cuda_launch

marks = []
real_launch = cuda_launch.launch


def traced(function, work_items, *args, **kw):
    real_launch(function, work_items, *args, **kw)
    event = driver.Event()
    event.record(cuda_context.stream())
    marks.append((getattr(function, "sok1x_name", "?"), time.perf_counter(), event))


for module in (cuda_launch, cuda_hash, cuda_host_order):
    module.launch = traced


backend = harness.backend_module("cuda")
rng = np.random.default_rng(5)
for share in (0.5, 0.75, 0.5):
    table, held = make_table(backend, share, 1 << 24, 64, 0.5, rng)
    finds, inserts = rotations(backend, held, KEYS_PER_CALL, rng)
    new = KEYS_PER_CALL - int(KEYS_PER_CALL * 0.6)
    pool = backend.asarray(table._free[::-1][:new].copy())
    snap = Snapshot(backend, table.index)
    with backend.device_context():
        for r in range(6):
            snap.restore()
            keys = inserts()
            backend.synchronize()
            marks.clear()
            start = driver.Event()
            start.record(cuda_context.stream())
            t0 = time.perf_counter()
            table.index.find_or_insert_values(keys, table.values, table.spec, 7, row_pool=pool)
            end = driver.Event()
            end.record(cuda_context.stream())
            t1 = time.perf_counter()
            end.synchronize()
            t2 = time.perf_counter()
            if r < 2:
                continue
            parts, last = [], start
            for i, (_, host_t, event) in enumerate(marks):
                parts.append("%d:%.3f(h%.3f)" % (i, last.time_till(event), (host_t - t0) * 1e3))
                last = event
            print("share %.2f call %.3f ms (host queued %.3f, waited %.3f): %s, tail %.3f" % (
                share, start.time_till(end), (t1 - t0) * 1e3, (t2 - t1) * 1e3, " ".join(parts),
                last.time_till(end)), flush=True)
    del table, snap
    harness.release_memory(backend)
