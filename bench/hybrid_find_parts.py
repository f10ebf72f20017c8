"""Where one find call of bench/dynamic_table.py goes on a hybrid table, part by part, beside
what the same host rows cost read alone.

    python3 bench/hybrid_find_parts.py --out results/find_parts.json [--rows-log2 26] [--dim 64]
        [--share 0.75] [--load 0.75]

The table and the call are dynamic_table.py's (2^20 keys, 60% held). Timed on the sok1x stream,
medians of --repeats with min and max (ms):
    find              the whole op: index.find + the table's gather
    index_find        index.find alone (keys to rows)
    host_order        the gather's order alone (host_row_order.host_order: count, scan, scatter)
    gather            the table's gather alone (order included), of the rows index_find gave
    call_host_rows    a gather from the host part alone (a plain mapped array) of the call's host
                      rows, in ascending address order: the bound at this call's density
    probe_host_rows   the same number of host rows drawn from the whole part, ascending: the
                      density dynamic_table.py's `read_sorted` probe reads at
    call_rows_as_given  the call's host rows in the call's order (random)
    read_w{4,8,16}_{grid,full}  call_host_rows by rows.cu's take_rows in words of 4, 8 or 16
                      bytes, launched as launch() sizes a kernel (grid: a grid-stride loop over
                      at most 16 blocks a multiprocessor) or with a thread for every word (full,
                      as HierarchicalKV's read_kernel)
GiB/s are given for the host rows' bytes.
"""
import sys

import numpy as np

import harness
from dynamic_table import KEYS_PER_CALL, make_table
from hash_table import rotations


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=7)
    parser.add_argument("--rows-log2", type=int, default=26)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--share", type=float, default=0.75)
    parser.add_argument("--load", type=float, default=0.75)
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    from sok1x.backend.cuda import host_row_order as cuda_host_order
    timer = harness.StreamTimer(backend)
    rng = harness.seeded_rng()
    table, held = make_table(backend, args.share, 1 << args.rows_log2, args.dim, args.load, rng)
    finds, _ = rotations(backend, held, KEYS_PER_CALL, rng)
    host = table.values.parts[1]
    hbm_rows = int(table.values.hbm_rows)
    results = {"environment": harness.environment(), "dim": args.dim, "share": args.share,
               "load": args.load, "rows": 1 << args.rows_log2, "parts": {}}
    with backend.device_context():
        keys = finds()
        rows = table.index.find(keys)
        looked_up = backend.to_host(rows)
        places = looked_up[looked_up >= hbm_rows] - hbm_rows
        call_sorted = backend.asarray(np.sort(places))
        call_random = backend.asarray(places)
        probe = backend.asarray(np.sort(rng.choice(int(host.shape[0]), places.shape[0],
                                                   replace=False)).astype(np.int64))
        parts = [("find", lambda: table.gather(table.index.find(finds()))),
                 ("index_find", lambda: table.index.find(keys)),
                 ("host_order", lambda: cuda_host_order.host_order(table.values, rows, True)),
                 ("gather", lambda: table.gather(rows)),
                 ("call_host_rows", lambda: backend.gather_rows(host, call_sorted)),
                 ("probe_host_rows", lambda: backend.gather_rows(host, probe)),
                 ("call_rows_as_given", lambda: backend.gather_rows(host, call_random))]
        for word in (4, 8, 16):
            for grid in ("grid", "full"):
                parts.append(("read_w%d_%s" % (word, grid),
                              _read(backend, host, call_sorted, word, grid == "full")))
        gib = places.shape[0] * args.dim * 4 / 2 ** 30
        results["host_rows"] = int(places.shape[0])
        for name, run in parts:
            ms = timer.time_ms(run, args.repeats)
            figures = results["parts"][name] = harness.summary(
                ms, ("ms", "ms_min", "ms_max", "ms_repeats"))
            figures["host_gib_per_s"] = gib / figures["ms"] * 1e3
            harness.log("%-20s %.3f ms (%.3f-%.3f), host rows at %.1f GiB/s" % (
                name, figures["ms"], figures["ms_min"], figures["ms_max"],
                figures["host_gib_per_s"]))
        backend.synchronize()
    harness.write_json(args.out, results)


def _read(backend, host, index, word, full):
    """A call of rows.cu's take_rows (words of `word` bytes) of host[index] (a plain array)."""
    from sok1x.backend.cuda import rows as cuda_rows
    from sok1x.backend.cuda.kernel_launch import BLOCK, launch, ptr, split_args
    words_per_row = host.shape[1] * 4 // word
    out = backend.zeros((index.shape[0], host.shape[1]), np.float32)
    take = cuda_rows._row_copy_kernels(word)[0]
    work = index.shape[0] * words_per_row

    def run():
        launch(take, work, *split_args(host, words_per_row), host.shape[0], ptr(index),
               index.shape[0], words_per_row, 1, ptr(out), 0,
               blocks=-(-work // BLOCK) if full else None)
    return run


if __name__ == "__main__":
    main(sys.argv[1:])
