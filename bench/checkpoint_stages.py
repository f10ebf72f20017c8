"""Where a sharded checkpoint's dump and load spend their time (DESIGN D8), stage by stage, on one
table, beside what the host's threads can do on their own: a probe to find what bounds
bench/checkpoint_io.py's figures, not a benchmark of its own.

    mpiexec -n 1 python3 bench/checkpoint_stages.py --backend cuda --rows 2000000 \
        --dir /dev/shm --out /tmp/stages.json

Host: cores this process may use, zlib's version, one thread's zlib.crc32 over 256 MB, a plain
write and read of 1 GB to --dir on 1 and on 4 threads, in 4 MB blocks, and the backend's copies
of 256 MB of rows to a page-locked block and back (GB/s, best of 3).
Engine: --repeats dumps and loads of a --rows x --dim table (bench/checkpoint_io.py's), each
timed whole, with the seconds spent in each stage summed over the calls (the threads' stages
overlap the caller's, so they add up to more than the wall time):
    caller   keys (a chunk's keys), to_host (a chunk's rows off the device, waited), writer_wait
             (waiting for earlier chunks' writes), check_keys (_owned, direct rows, repeats),
             rows_in (queueing a chunk's rows into the table), next_chunk (waiting for the read
             ahead), sync (waits for the stream), fresh_shard, take_staged
    threads  pwrite, preadv (the syscalls), crc32 (zlib), read_chunk (a chunk's parallel read)
and once more with zlib.crc32 replaced by a constant (the files' checksums are then 0 and agree),
to show what the checksum costs. Each figure is the median over the repeats.
"""
import collections
import json
import os
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_io  # noqa: E402
import harness  # noqa: E402

_seconds = collections.defaultdict(float)
_lock = threading.Lock()
_checksum = {"on": True}


def _add(name, seconds):
    with _lock:
        _seconds[name] += seconds


def _timed(function, name):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _add(name, time.perf_counter() - start)
    return timed


class _Proxy:
    """A module whose attributes are `module`'s but those in `replaced`."""

    def __init__(self, module, replaced):
        self._module, self._replaced = module, replaced

    def __getattr__(self, name):
        return self._replaced.get(name) or getattr(self._module, name)


def _timed_generator(function, name):
    def timed(*args, **kwargs):
        inner = function(*args, **kwargs)
        while True:
            start = time.perf_counter()
            try:
                item = next(inner)
            except StopIteration:
                _add(name, time.perf_counter() - start)
                return
            _add(name, time.perf_counter() - start)
            yield item
    return timed


def _crc32(data, running=0):
    if not _checksum["on"]:
        return running
    start = time.perf_counter()
    try:
        return zlib.crc32(data, running)
    finally:
        _add("crc32", time.perf_counter() - start)


def instrument(rt):
    """Wraps the checkpoint's stages in timers (see the module's docstring); zlib.crc32 is a
    constant while _checksum["on"] is False."""
    from sok1x.engine import checkpoint
    from sok1x.engine.checkpoint import load as checkpoint_load
    from sok1x.engine.checkpoint import checksum as shard_checksum
    from sok1x.engine.checkpoint import storage as shard_storage
    shard_storage.os = _Proxy(os, {"pwrite": _timed(os.pwrite, "pwrite"),
                                   "preadv": _timed(os.preadv, "preadv")})
    shard_checksum.zlib = _Proxy(zlib, {"crc32": _crc32})
    for module, name, stage in [
            (checkpoint, "_chunk_keys", "keys"), (checkpoint, "_rows_to_host", "to_host"),
            (checkpoint_load, "_owned", "check_keys"), (checkpoint_load, "_direct_rows",
                                                         "check_keys"),
            (checkpoint_load, "_repeats_any", "check_keys"),
            (checkpoint_load, "_fresh_shard", "fresh_shard"),
            (checkpoint_load, "_take_staged", "take_staged")]:
        if hasattr(module, name):
            setattr(module, name, _timed(getattr(module, name), stage))
    writer, reader, sink = (shard_storage.ShardWriter, shard_storage.ShardReader,
                            checkpoint_load._RowSink)
    writer._wait = _timed(writer._wait, "writer_wait")
    reader.read_into = _timed(reader.read_into, "read_chunk")
    reader.chunks = _timed_generator(reader.chunks, "next_chunk")
    sink.add = _timed(sink.add, "rows_in")
    rt.backend.synchronize = _timed(rt.backend.synchronize, "sync")


def _best_rate(nbytes, run, repeats=3):
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
    return nbytes / best / 1e9


def host_figures(folder):
    """{name: GB/s} of zlib.crc32 on one thread and plain 4 MB-block I/O on 1 and 4 threads."""
    data = np.random.default_rng(1).integers(0, 255, size=1 << 30, dtype=np.uint8)
    path = os.path.join(folder, "stages_probe.bin")
    block = 4 << 20
    out = {"cores": len(os.sched_getaffinity(0)), "zlib": zlib.ZLIB_RUNTIME_VERSION,
           "crc32_1thread_GBps": _best_rate(256 << 20, lambda: zlib.crc32(data[:256 << 20]))}

    def io(threads, write):
        def run():
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | (os.O_TRUNC if write else 0))
            step = data.size // threads

            def region(index):
                for offset in range(index * step, (index + 1) * step, block):
                    view = memoryview(data)[offset:offset + block]
                    if write:
                        os.pwrite(descriptor, view, offset)
                    else:
                        os.preadv(descriptor, [view], offset)
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(region, range(threads)))
            os.close(descriptor)
        return run
    for threads in (1, 4):
        out["write_%dthreads_GBps" % threads] = _best_rate(data.size, io(threads, True))
        out["read_%dthreads_GBps" % threads] = _best_rate(data.size, io(threads, False))
    os.remove(path)
    return out


def copy_figures(rt, table, nbytes=256 << 20):
    """{d2h_GBps, h2d_GBps}: the backend's copy of the table's first rows (about `nbytes`) to a
    reused host block and back from one, as a dump and a staged load make them (best of 3)."""
    rows = min(int(table.values.shape[0]), max(1, nbytes // (4 * table.dim)))
    size = rows * 4 * table.dim
    view = rt.backend.row_view(table.values, 0, rows)
    buffer = rt.backend.host_buffer(size).view(np.float32).reshape(rows, table.dim)
    buffer[...] = np.asarray(rt.backend.download_staged(view))  # the upload puts them back

    def download():
        np.asarray(rt.backend.download_staged(view))

    def upload():
        rt.backend.write_rows(table.values, 0, buffer)
        rt.backend.synchronize()
    return {"d2h_GBps": _best_rate(size, download), "h2d_GBps": _best_rate(size, upload)}


def measure(rt, work, repeats):
    """{dump, load: {seconds, stages}} medians over `repeats` dumps and loads into `work`."""
    from sok1x.engine import checkpoint
    runs = {"dump": [], "load": []}
    for _ in range(repeats):
        for name, call in (("dump", checkpoint.dump_tables), ("load", checkpoint.load_tables)):
            harness.barrier()
            _seconds.clear()
            start = time.perf_counter()
            call(work, [checkpoint_io.TABLE])
            took = time.perf_counter() - start
            runs[name].append((took, dict(_seconds)))
    result = {}
    for name, rounds in runs.items():
        stages = sorted({stage for _, seen in rounds for stage in seen})
        result[name] = {"seconds": harness.median([took for took, _ in rounds]),
                        "seconds_all": [took for took, _ in rounds],
                        "stages": {stage: harness.median([seen.get(stage, 0.0)
                                                          for _, seen in rounds])
                                   for stage in stages}}
    return result


def main(argv):
    parser = harness.parser(__doc__, out=True, backend=True, repeats=3)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args(argv)
    args.slots, args.hashtable = 0, False
    work = os.path.join(args.dir, "sok1x-checkpoint-stages")
    os.makedirs(work, exist_ok=True)
    result = {"host": host_figures(work), "rows": args.rows, "dim": args.dim}
    rt = harness.start_engine(args.backend)
    table = checkpoint_io.build_table(rt, args)
    with checkpoint_io._entered():
        buffer_copies = copy_figures(rt, table)
    result["host"].update(buffer_copies)
    del table
    from sok1x.engine import checkpoint
    checkpoint.dump_tables(work, [checkpoint_io.TABLE])  # warm: page-locked blocks, pools
    result["file_bytes"] = sum(size for _, _, size in checkpoint_io._shard_files(work))
    instrument(rt)
    result["with_crc32"] = measure(rt, work, args.repeats)
    _checksum["on"] = False
    result["without_crc32"] = measure(rt, work, args.repeats)
    for case in ("with_crc32", "without_crc32"):
        for name in ("dump", "load"):
            result[case][name]["GBps"] = result["file_bytes"] / result[case][name]["seconds"] / 1e9
    if harness.rank() == 0:
        print(json.dumps(result, indent=1, sort_keys=True))
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    harness.write_json(args.out, result)
    harness.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
