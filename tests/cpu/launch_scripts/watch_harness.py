"""Calls rank_watch.fork_watched (loaded by path from argv[1], as the guard loads it) in the way
argv[2] names; used by test_launch.py.

Each process writes what it sees, a line at a time: "watched <True|False> <pid>" where
fork_watched returned, "SIGUSR1 in <pid>" where a SIGUSR1 was handled, and, from the watching
parent, "ended <exit code, or minus the signal> seen <stop signals>". The process that goes on
(the child, or the only process) sleeps CHILD_S and leaves through os._exit(7).

Modes: plain; broken-stderr (on_child_end finds stderr gone and raises); thread (another thread
runs when fork_watched is called); signal-parent-after-fork (the parent sends itself SIGUSR1 as
soon as fork_watched's first os.fork returns, before fork_watched has its own handlers in place);
signal-group-from-child (the child sends SIGUSR1 to the process group it was born in as soon as
that os.fork returns).
"""
import importlib.util
import os
import signal
import sys
import threading
import time

CHILD_S = 1.0

spec = importlib.util.spec_from_file_location("rank_watch", sys.argv[1])
rank_watch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rank_watch)
mode = sys.argv[2]


def say(line):
    os.write(1, (line + "\n").encode())


class BrokenStream:
    """sys.stderr once the pipe behind it is gone."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def on_child_end(child_pid, wait_status, ended_at, stop_signals_seen):
    code = (-os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status)
            else os.WEXITSTATUS(wait_status))
    say("ended %d seen %s" % (code, sorted(int(number) for number in stop_signals_seen)))
    if mode == "broken-stderr":
        sys.stderr = BrokenStream()
        raise ValueError("the record could not be written")


def fork_then_signal():
    os.fork = real_fork  # the first fork only: fork_watched's own (not its sweeper's)
    child_pid = real_fork()
    if child_pid != 0 and mode == "signal-parent-after-fork":
        os.kill(os.getpid(), signal.SIGUSR1)
    if child_pid == 0 and mode == "signal-group-from-child":
        os.killpg(os.getpgrp(), signal.SIGUSR1)
    return child_pid


signal.signal(signal.SIGUSR1, lambda number, frame: say("SIGUSR1 in %d" % os.getpid()))
real_fork = os.fork
os.fork = fork_then_signal
if mode == "thread":
    threading.Thread(target=time.sleep, args=(CHILD_S * 2,), daemon=True).start()
say("watched %s %d" % (rank_watch.fork_watched(on_child_end), os.getpid()))
time.sleep(CHILD_S)
os._exit(7)
