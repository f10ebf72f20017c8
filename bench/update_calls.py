"""What one optimizer update costs the host, uncaptured and replayed (one process):

    python3 bench/update_calls.py --out results/update_calls.json

A bounded one-rank step of one table (dim 128, LazyAdam) is run with replay=True until its
forward, backward and update are recorded (engine/lookup/replayed_step.py); then, with one
replayed backward's (values, rows), in host microseconds per call (median of --repeats rounds of
--calls calls, min-max, each round after the GPU is waited for):

    update_uncaptured  api.apply_optimizer_updates on views of those arrays (the uncaptured
                       path: the rule's checks, its slots, the kernel, the time stamp)
    update_replayed    the same call on the arrays themselves: the hyper-parameters written,
                       the recorded graph replayed, the time stamp

with the kernel launches a call queues. Each call applies the update once more (the learning
rate of one step), which changes the table, not what is timed.
"""
import os

from sok1x.backend import random_init
from sok1x.engine import api, runtime
from sok1x.engine.lookup import bounded_step

import harness
import sok_steps

SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=5)
DIM = 128


def main():
    parser = harness.parser(__doc__, out=True, backend=True, scale=True, repeats=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    os.environ[bounded_step.ENV] = "1"
    rt = harness.start_engine(args.backend)
    backend = rt.backend
    keys_count, vocabulary = 16384 // args.scale, (1 << 20) // args.scale
    api.create_table("update_calls", DIM, vocabulary, False, SPEC, replace=True)
    rng = harness.seeded_rng()
    hyper = sok_steps.lazy_adam_hyper(1)

    def step():
        keys = backend.asarray(rng.integers(0, vocabulary, size=keys_count))
        out, token = api.dense_lookup("update_calls", "fwd", keys, True, checks="backward",
                                      replay=True)
        return api.dense_lookup_grad("update_calls", "bwd", token, out)

    with runtime.entered():
        for _ in range(4):  # forward recorded at the 2nd, backward at the 3rd, update at the 4th
            values, rows = step()
            api.apply_optimizer_updates(["update_calls"], "lazy_adam", "Adam", {}, hyper,
                                        [values], [rows])
        values, rows = step()
        views = (backend.reshape(values, tuple(values.shape)),
                 backend.reshape(rows, tuple(rows.shape)))
        assert views[0] is not values and views[1] is not rows

        def update(pair):
            return lambda: api.apply_optimizer_updates(["update_calls"], "lazy_adam", "Adam", {},
                                                       hyper, [pair[0]], [pair[1]])
        result = {"backend": args.backend, "keys": keys_count, "rows": vocabulary, "dim": DIM,
                  "calls": args.calls, "repeats": args.repeats, "parts": {},
                  "environment": harness.environment()}
        for name, pair in (("update_uncaptured", views), ("update_replayed", (values, rows))):
            before = backend.counts().get("launches", 0)
            update(pair)()
            launches = backend.counts().get("launches", 0) - before
            entry = harness.per_call_us(update(pair), args.calls, args.repeats, backend.synchronize)
            entry["launches"] = launches
            result["parts"][name] = entry
            harness.say("%-18s %8.1f us a call (%.1f-%.1f), %d kernel launches"
                        % (name, entry["median_us"], entry["min_us"], entry["max_us"],
                           launches))
    harness.write_json(args.out, result)


if __name__ == "__main__":
    main()
