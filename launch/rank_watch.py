"""A rank's process watched by its parent: the one process that can learn how, and when, it died.

A process killed by a signal, or leaving through os._exit, cannot say why; only its parent learns
it (waitpid). So under sok1x-run the rank guard forks once, before running anything: the child
runs the script, as the guard alone would, and the parent only waits for it, hands the child's end
to the guard (which records it, with the time, in the job's status folder), and then ends the way
the child ended (the same exit code, or the same signal), so that mpiexec sees what it would have
seen without the parent.

Why the parent, and not sok1x-run watching process ids: mpiexec learns of a rank's death when the
rank's output pipes close (and, under MPICH's hydra, its PMI connection), and the parent holds
those open until it has recorded the death. So the first rank to die is on record before mpiexec
starts stopping the others, whatever mpiexec then reports: hydra names the first process it
happens to notice, and when two die close together that is not always the first to die. A watcher
outside the rank's process tree would race mpiexec the same way, and could not learn the signal.

Signals: MPI launchers signal a rank's whole process group (hydra and Open MPI both do), which
holds parent and child alike. The parent ignores the signals that stop a job, noting each, so the
child handles every such signal exactly once, as it would alone; the guard is told which arrived,
so a rank that a job-wide stop ended is not taken for the rank that failed. The child asks Linux
to kill it when the parent dies (PR_SET_PDEATHSIG): a parent killed with SIGKILL takes its child
along. Where that cannot be asked (not Linux), or where the process already runs other threads
(`python -m sok1x.launch.rank_guard` imports sok1x, and NumPy starts OpenBLAS's threads), nothing
forks and the script runs in the guard's own process, as under a plain mpiexec.

Imports only the standard library (the guard loads this file by path).
"""
import os
import signal
import sys
import threading
import time
import traceback

# What launchers and batch systems send to stop (or ask to checkpoint) a job's processes.
STOP_SIGNALS = tuple(getattr(signal, name) for name in
                     ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2")
                     if hasattr(signal, name))
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_EXITED_1 = 1 << 8  # the wait status of a process that exited with code 1


def _parent_death_signal_setter():
    """Returns a function that makes Linux SIGKILL the calling process when its parent dies
    (returning True when it could), or None where there is no prctl."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None

    def set_parent_death_signal():
        zero = ctypes.c_ulong(0)
        return prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL),
                     zero, zero, zero) == 0
    return set_parent_death_signal


def _runs_other_threads():
    """Returns True when a thread besides this one runs in the process, native ones included
    (OpenBLAS's, once NumPy is imported) where /proc lists them."""
    try:
        return len(os.listdir("/proc/self/task")) > 1
    except OSError:
        return threading.active_count() > 1


def _flush_standard_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def _note_stop_signals():
    """Makes this process ignore the stop signals; returns the list each one is appended to."""
    seen = []

    def note(signum, _frame):
        seen.append(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, note)
    return seen


def _wait_for(child_pid):
    """Returns the child's wait status once it has ended (stops and continues are skipped)."""
    while True:
        pid, status = os.waitpid(child_pid, 0)
        if pid == child_pid and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
            return status


def _without_core_dump():
    # The child dumped core already if that was asked for; a second dump, of this small process,
    # would overwrite it where both write to the same file name.
    try:
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    except (ImportError, OSError, ValueError):
        pass


def _print_exception():
    """Prints the exception being handled to stderr, where stderr can still be written."""
    try:
        traceback.print_exc()
    except Exception:  # stderr's pipe is gone: the exit code must still mirror the child's
        pass


def end_as(wait_status):
    """Ends this process as the child with `wait_status` ended: its exit code, or its signal."""
    _flush_standard_streams()
    if os.WIFSIGNALED(wait_status):
        number = os.WTERMSIG(wait_status)
        _without_core_dump()
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL's disposition cannot be set: it is the default
            pass
        os.kill(os.getpid(), number)
        os._exit(128 + number)  # only where the signal did not end this process after all
    os._exit(os.WEXITSTATUS(wait_status))


def fork_watched(on_child_end):
    """Forks the rank's process. Returns True in the child, which goes on to run the script.

    The parent never returns: it waits for the child, calls on_child_end(child_pid, wait_status,
    ended_at, stop_signals_seen) (ended_at: time.time() as the wait returned; stop_signals_seen:
    the stop signals that had reached the parent by then), and ends as the child ended.
    Returns False, without forking, where a child could outlive its parent (no prctl), or where
    other threads run: a lock one of them holds would stay locked in the child for good.
    """
    set_parent_death_signal = _parent_death_signal_setter()
    if set_parent_death_signal is None or not hasattr(os, "fork") or _runs_other_threads():
        return False
    _flush_standard_streams()
    ignoring_children = signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN
    if ignoring_children:  # inherited: Linux would reap the child, and waitpid find none
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Held back until each process has its handling in place: until then, SIGINT would raise
    # KeyboardInterrupt in the parent and SIGTERM end it, taking the child along.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    parent_pid = os.getpid()
    child_pid = os.fork()
    if child_pid == 0:
        set_parent_death_signal()
        if os.getppid() != parent_pid:  # the parent died before the request was in place
            os._exit(1)
        if ignoring_children:
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return True
    seen = _note_stop_signals()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    wait_status = _EXITED_1  # should the wait itself fail: the child dies with this process
    try:
        wait_status = _wait_for(child_pid)
        # Python runs the handlers of signals that arrived during the wait before this line.
        ended_at, stop_signals_seen = time.time(), frozenset(seen)
        on_child_end(child_pid, wait_status, ended_at, stop_signals_seen)
    except BaseException:  # a record that cannot be written must not change how the rank ends
        _print_exception()
    finally:
        end_as(wait_status)
