"""An MPI job for test_failing_rank: every rank runs training steps on the engine (no TensorFlow,
so the job starts fast); the last rank fails at step FAIL_STEP in the way argv[1] names, while
the other ranks go on into the step's collectives and wait for it.

Modes: raise (uncaught ValueError), exit-3 (sys.exit(3)), sigterm (the rank sends itself SIGTERM
and goes on), sigterm-blocked (the rank is blocked in a collective when SIGTERM arrives: its
peers sleep first), sigterm-slow-watcher (sigterm, with sok1x's signal watcher thread acting
only after the job's steps are over), kill-9 (SIGKILL: nothing to catch, the launcher must see
the death), stall (the rank stays alive and never joins), thread-raise (a thread of the rank
raises), clean (nothing fails; every rank prints "rank R finished"), soak STEPS (nothing fails;
every rank prints its resident memory every STEPS//20 steps as "RSS rank step kib").
"""
import os
import signal
import sys
import threading
import time

import numpy as np

from sok1x.backend import random_init
from sok1x.engine import api, runtime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_memory import resident_kib  # noqa: E402

FAIL_STEP = 5
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=3)
BATCH, DIM = 64, 8


def step(rt, rng):
    keys = rng.integers(0, 5000, size=(BATCH, 2))
    vectors, token = api.dense_lookup("table", "lookup", keys, True)
    grads = np.ones(np.shape(vectors), np.float32)
    values, rows = api.dense_lookup_grad("table", "lookup_grad", token, grads)
    api.apply_optimizer_update("table", "sgd", "SGD", {}, {"lr": 0.01}, values, rows)


def fail(mode, rt):
    if mode == "raise":
        raise ValueError("rank %d broke on purpose" % rt.rank)
    if mode == "exit-3":
        sys.exit(3)
    if mode == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    if mode == "sigterm-blocked":
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    if mode == "sigterm-slow-watcher":  # a loaded host: the signal watcher runs only later
        from sok1x.engine import failure_guard
        on_signal = failure_guard._on_signal

        def later(number):
            if threading.current_thread() is not threading.main_thread():
                time.sleep(5.0)  # the steps left end well before this
            on_signal(number)
        failure_guard._on_signal = later
        os.kill(os.getpid(), signal.SIGTERM)
    if mode == "stall":
        time.sleep(600)  # alive, never joins: the peers' MPI wait must time out
    if mode == "kill-9":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "thread-raise":
        def broken():
            raise RuntimeError("a worker thread of rank %d broke" % rt.rank)
        threading.Thread(target=broken, name="worker").start()


def main(mode, steps):
    rt = runtime.init(backend="cpu")
    api.create_table("table", DIM, 10000, False, SPEC)
    rng = np.random.default_rng(rt.rank)
    failing = rt.rank == rt.size - 1
    print("rank %d up" % rt.rank, flush=True)
    for number in range(steps):
        if number == FAIL_STEP and mode not in ("clean", "soak"):
            if failing:
                fail(mode, rt)
            elif mode == "sigterm-blocked":
                time.sleep(600)  # the failing rank waits for us inside the step's collective
        step(rt, rng)
        if mode == "soak" and number % max(1, steps // 20) == 0:
            print("RSS %d %d %d" % (rt.rank, number, resident_kib()), flush=True)
    print("rank %d finished" % rt.rank, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50)
