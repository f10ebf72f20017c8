"""Where one find_or_insert call of bench/dynamic_table.py goes: GPU and host time per phase.

    python3 bench/dynamic_breakdown.py --out results/breakdown.json [--rows-log2 24] [--dim 64]
        [--share 0.75]

The bare table path (index.find_or_insert_values: one kernel finds, places, initialises and
copies out) and the engine path (DynamicTable.inserted_rows_and_vectors, as key_exchange's
training lookup: on hbm rows, find_or_insert + queued init, then the gather), on an hbm table
(or, with --share, a hybrid one with that share of its vectors in host memory, new keys taking
the free list's rows as dynamic_table.py's do) filled to load 0.5, 2^20 keys per call (60% held,
40% new),
slots restored between calls. Events recorded on the sok1x stream split each call into:
`to_kernel` (from the call's start to the GPU passing the index kernel: the Python before the
launch plus the kernel), `queued_and_wait` (from there to the call's return: the work queued
before the host's wait, the wait, and on the engine path the statistics and, for hbm rows, the
gather queued after it), `rest` (what is queued after the call returns: nothing now, both paths
return their vectors); host clock: `host_to_return` (start to the call returning) and
`host_all`. Medians of --repeats calls (ms),
with min and max.
"""
import sys
import time

import harness
from dynamic_table import make_table
from hash_table import HIT_RATE, Snapshot, rotations


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=9)
    parser.add_argument("--rows-log2", type=int, default=24)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--share", type=float, default=0.0,
                        help="share of the vectors in host memory (0: var_type hbm)")
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    import pycuda.driver as driver
    from sok1x.backend.cuda import context as cuda_context
    rng = harness.seeded_rng()
    rows, keys_per_call = 1 << args.rows_log2, 1 << 20
    table, held = make_table(backend, args.share, rows, args.dim, 0.5, rng)
    _, inserts = rotations(backend, held, keys_per_call, rng)
    pool = None  # hbm: the index's own next rows, as the engine's
    if table._free.size:
        new_per_call = keys_per_call - int(keys_per_call * HIT_RATE)
        pool = backend.asarray(table.free_rows()[:new_per_call])  # the next free rows
    snapshot = Snapshot(backend, table.index)
    results = {"environment": harness.environment(), "dim": args.dim, "rows": rows,
               "host_share": args.share}
    with cuda_context.entered():
        stream = cuda_context.stream()
        marks = [driver.Event() for _ in range(4)]

        def bare(keys):
            def queue(*placed):  # (new_keys, new_rows, count[, rows]: since issue 21's 4th round)
                marks[1].record(stream)
            table.index.find_or_insert_values(keys, table.values, table.spec, 7, row_pool=pool,
                                              queue_first=queue)

        def marking(real):  # the index op, recording mark 1 where its queue_first runs
            def call(*args, queue_first=None, **options):
                def queue(*placed):
                    marks[1].record(stream)
                    queue_first(*placed)
                return real(*args, queue_first=queue, **options)
            return call

        def engine(keys):
            table.journal.begin_step()
            index = table.index
            for op in ("find_or_insert", "find_or_insert_values"):  # whichever the table takes
                setattr(index, op, marking(getattr(index, op)))
            try:
                assert table.capacity_error(keys) is None
                table.inserted_rows_and_vectors(keys)
            finally:
                del index.find_or_insert, index.find_or_insert_values

        for name, call in (("bare", bare), ("engine", engine)):
            phases = {p: [] for p in ("to_kernel", "queued_and_wait", "rest", "gpu_all",
                                      "host_to_return", "host_all")}
            for repeat in range(args.repeats + 2):
                table.journal.rollback()
                snapshot.restore()
                keys = inserts()
                backend.synchronize()
                start = time.perf_counter()
                marks[0].record(stream)
                call(keys)
                returned = time.perf_counter()
                marks[2].record(stream)
                marks[3].record(stream)
                marks[3].synchronize()
                done = time.perf_counter()
                if repeat < 2:
                    continue
                # Events: 0 start, 1 after the kernel (queue_first's start), 2 host back, 3 end.
                phases["to_kernel"].append(marks[0].time_till(marks[1]))
                phases["queued_and_wait"].append(marks[1].time_till(marks[2]))
                phases["rest"].append(marks[2].time_till(marks[3]))
                phases["host_to_return"].append((returned - start) * 1e3)
                phases["host_all"].append((done - start) * 1e3)
                phases["gpu_all"].append(marks[0].time_till(marks[3]))
            results[name] = {p: harness.summary(v, ("ms", "ms_min", "ms_max"))
                             for p, v in phases.items()}
            harness.log("%s dim %d share %.2f: %s" % (name, args.dim, args.share, ", ".join(
                "%s %.3f" % (p, results[name][p]["ms"]) for p in phases)))
        table.journal.rollback()
    harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
