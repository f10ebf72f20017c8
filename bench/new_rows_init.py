"""What a full group's new rows cost to initialise, as dlrm26_full's evicting step makes them:
26 members of --rows rows, dim 128, --new new keys (random rows, a device count of them in
an array as long as the lookup's 26 x 16384 keys), the vectors by random_init's uniform recipe
and LazyAdam's two slots reset to zero.

    python3 bench/new_rows_init.py --out results/new_rows_init.json

Timed on the sok1x stream, medians of --repeats with min and max (us), each part launched as
named:
    vectors            init_rows_tagged_float32 alone (the vectors)
    three_launches     the vectors, then each slot's reset by init_rows_float32 (before 681f2b1)
    one_pass           the vectors and both slots in one launch, as the backend launches it
                       (init_rows_tagged's slots; random_rows.TAGGED_LANES_LOG2)
    one_pass_lanesN    the same with N threads a row (32 until 2026-11-28 at dim 128), to see
                       whether the kernel waits on its rows' loads (fewer threads a row put more
                       rows in flight) or on its arithmetic
"""
import sys

import numpy as np

import harness

MEMBERS, DIM, BOUND = 26, 128, 26 * 16384


def main(argv):
    parser = harness.parser(__doc__, out=True, repeats=9)
    parser.add_argument("--rows", type=int, default=5500, help="rows a member")
    parser.add_argument("--new", type=int, default=83000, help="new keys of the step, all members")
    args = parser.parse_args(argv)
    backend = harness.backend_module("cuda")
    from sok1x.backend import random_init
    from sok1x.backend.cuda import random_rows
    from sok1x.backend.cuda.groups import device_constant
    from sok1x.backend.cuda.kernel_launch import launch, ptr, split_args
    timer = harness.StreamTimer(backend)
    rng = harness.seeded_rng()
    total = MEMBERS * args.rows
    spec = random_init.make_spec("uniform", -1.0, 1.0, seed=5)
    zero = random_init.make_spec("constant", 0.0)
    results = {"environment": harness.environment(), "rows": total, "new": args.new,
               "dim": DIM, "parts": {}}
    with backend.device_context():
        values = backend.zeros((total, DIM), np.float32)
        slots = [backend.zeros((total, DIM), np.float32) for _ in range(2)]
        picked = np.full(BOUND, -1, np.int64)
        picked[:args.new] = rng.permutation(total)[:args.new]
        rows = backend.asarray(picked)
        keys = backend.asarray(rng.integers(0, 2 ** 40, size=BOUND).astype(np.int64))
        tags = backend.asarray(np.maximum(picked, 0) // args.rows)
        count = backend.asarray(np.array([args.new], np.uint64))
        table_ids = np.arange(MEMBERS, dtype=np.uint64)
        ids = device_constant(table_ids.view(np.int64))
        kind, seed, _, a, b = random_init.kernel_arguments(spec, 0)

        def lanes(shift):
            def run():
                launch(random_rows._kernels()["tagged"], BOUND << shift,
                       *split_args(values, DIM), ptr(rows), ptr(keys), ptr(tags), BOUND,
                       ptr(count), DIM, shift, kind, seed, ptr(ids), a, b, 0.0, 0.0,
                       *split_args(slots[0], DIM), *split_args(slots[1], DIM), 2)
            return run

        def three():
            backend.init_rows_tagged(values, rows, keys, tags, spec, table_ids, count)
            for slot in slots:
                backend.init_rows(slot, rows, keys, zero, 0, count)
        parts = [("vectors", lambda: backend.init_rows_tagged(values, rows, keys, tags, spec,
                                                              table_ids, count)),
                 ("three_launches", three),
                 ("one_pass", lambda: backend.init_rows_tagged(
                     values, rows, keys, tags, spec, table_ids, count,
                     [(slot, 0.0) for slot in slots]))]
        parts += [("one_pass_lanes%d" % (1 << shift), lanes(shift)) for shift in (5, 4, 3, 2)]
        for name, run in parts:
            results["parts"][name] = timer.part_us(name, run, args.repeats)
        backend.synchronize()
    harness.write_json(args.out, results)


if __name__ == "__main__":
    main(sys.argv[1:])
