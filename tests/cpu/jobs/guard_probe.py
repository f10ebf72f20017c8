"""One process (no launcher) for test_failing_rank: sok1x's failure guard installed, then

    guard_probe.py sigterm-in-install   SIGTERM lands while install() still holds the guard's
                                        lock (after the handlers are set): the process must end
                                        killed by SIGTERM, not hang
    guard_probe.py fork-child           a forked worker (multiprocessing's fork, as a data
                                        loader's) is ended by SIGTERM, as Pool.terminate ends
                                        its workers: the worker dies of it and the parent goes
                                        on ("child exitcode N", then "parent survived");
                                        a worker's Ctrl-C is Python's KeyboardInterrupt again
                                        ("child SIGINT handler: default_int_handler")
    guard_probe.py own-handler          the program sets its own SIGTERM handler after the guard
                                        is up, then gets SIGTERM: its handler runs ("handled")
                                        and the process goes on ("survived")
"""
import multiprocessing
import os
import signal
import sys
import time

from sok1x.comm import wait_watch
from sok1x.engine import failure_guard


def sigterm_in_install():
    start = wait_watch.start

    def starting(*args, **kwargs):  # runs inside install(), the lock held, the handlers set
        os.kill(os.getpid(), signal.SIGTERM)
        total = 0
        for number in range(1000):  # bytecodes: the Python handler runs here
            total += number
        return start(*args, **kwargs)
    wait_watch.start = starting
    failure_guard.install()
    print("install returned", flush=True)


def _worker():
    handler = signal.getsignal(signal.SIGINT)
    print("child SIGINT handler: %s" % getattr(handler, "__name__", handler), flush=True)
    time.sleep(30)


def fork_child():
    failure_guard.install()
    time.sleep(0.2)
    worker = multiprocessing.get_context("fork").Process(target=_worker)
    worker.start()
    time.sleep(0.5)
    worker.terminate()
    worker.join(10)
    print("child exitcode %s" % worker.exitcode, flush=True)
    time.sleep(1.0)  # the parent's signal watcher would have acted by now
    print("parent survived", flush=True)


def own_handler():
    failure_guard.install()
    handled = []
    signal.signal(signal.SIGTERM, lambda number, frame: handled.append(number))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.5)  # the guard's signal watcher would have acted by now
    print("handled" if handled else "not handled", flush=True)
    print("survived", flush=True)


if __name__ == "__main__":
    {"sigterm-in-install": sigterm_in_install, "fork-child": fork_child,
     "own-handler": own_handler}[sys.argv[1]]()
