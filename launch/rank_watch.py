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

Signals: the parent is the process mpiexec started, so it is the one that gets signalled: hydra
and Open MPI signal its process group (so that processes a rank started get the signal too), older
Open MPI the process alone, and users `kill` the process id that hydra or ps shows. So the child
moves to a process group of its own, and the parent passes each stop signal that reaches it on to
that group, noting it: the script (and what it started) receives each such signal once, whether it
was sent to the parent's group or to the parent alone, and the guard is told which arrived, so a
rank that a stop ended is not taken for the rank that failed. A signal sent to the script's own
process reaches it alone (that rank failed); one sent to both processes (pkill -f) reaches it
twice. Stop signals stay blocked from before the fork until both processes can handle them, and
the parent stops passing them on before it reaps the child, whose process id could then be reused.

A SIGKILL cannot be passed on. The child asks Linux to kill it when the parent dies
(PR_SET_PDEATHSIG), and a small third process, in a group of its own, SIGKILLs the script's group
should the parent vanish before the script has ended: so a launcher's SIGKILL to the parent's
group still ends the processes the script started. SIGSTOP and SIGCONT sent to the parent's group
(job control) reach the parent alone: they do not suspend the script.

The script runs in the guard's own process, as under a plain mpiexec, where Linux cannot be asked
to kill the child with its parent (not Linux); where the process already runs other threads
(`python -m sok1x.launch.rank_guard` imports sok1x, and NumPy starts OpenBLAS's threads), whose
locks a fork could leave locked in the child for good; and where the process is in the foreground
of a terminal (run from a shell): in a process group of its own the script would stop when it read
the terminal, with its parent waiting for ever, and would not see Ctrl-C or Ctrl-Z. Hydra starts
each rank in a session of its own, and Open MPI in a process group of its own, away from it.

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


def _in_terminal_foreground():
    """Returns True when this process is in the foreground process group of its terminal."""
    try:
        terminal_fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # ENXIO: no controlling terminal
        return False
    try:
        return os.tcgetpgrp(terminal_fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(terminal_fd)


def _flush_standard_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def _discard_pending(signals):
    """Drops those of `signals` that are pending (blocked) in this process."""
    for signum in set(signals) & signal.sigpending():
        handler = signal.getsignal(signum)
        if handler is None:  # set outside Python: it could not be put back
            continue
        signal.signal(signum, signal.SIG_IGN)  # ignoring a pending signal discards it
        signal.signal(signum, handler)


def _become_watched_child(parent_pid, set_parent_death_signal, ready_fd):
    """In the child: dies with the parent, moves to a process group of its own, and then writes a
    byte to ready_fd (the parent forwards nothing before, so nothing arrives twice)."""
    set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os._exit(1)
    try:
        os.setpgid(0, 0)
    except OSError:  # the parent sees the shared group and forwards nothing
        pass
    # Pending since the fork, these were sent to the group just left: the parent has them too.
    _discard_pending(STOP_SIGNALS)
    os.write(ready_fd, b"+")
    os.close(ready_fd)


class _StopSignalForwarder:
    """Notes each stop signal that reaches this process in `seen`, and passes it on to the
    process group of the child `script_pid` (the script and what it started)."""

    def __init__(self, script_pid):
        self.script_pid = script_pid
        self.seen = []
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._pass_on)

    def _pass_on(self, signum, _frame):
        self.seen.append(signum)
        if self.script_pid is None:
            return
        try:
            group = os.getpgid(self.script_pid)
            if group != os.getpgrp():  # else the child never left: the signal reached it already
                os.killpg(group, signum)
        except OSError:
            pass

    def stop(self):
        """Notes only from now on (before the child is reaped, and its process id free)."""
        self.script_pid = None


def _close_descriptors_but(kept_fd):
    """Points stdin, stdout and stderr at /dev/null and closes every other descriptor but
    kept_fd, so that this process holds none of the rank's pipes open."""
    null_fd = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null_fd, fd)
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) != kept_fd:
            try:
                os.close(int(name))
            except OSError:  # the listing's own descriptor, closed already
                pass


def _fork_group_sweeper(script_pid):
    """Forks the process that SIGKILLs the script's process group should this process end before
    writing to the returned descriptor (once the script has ended); returns that descriptor."""
    word_read_fd, word_write_fd = os.pipe()
    if os.fork() != 0:
        os.close(word_read_fd)
        return word_write_fd
    try:  # the stop signals stay blocked here: they are the script's to handle
        os.setpgid(0, 0)  # out of reach of a SIGKILL to the parent's group
        _close_descriptors_but(word_read_fd)
        if not os.read(word_read_fd, 1):  # the parent died with the script still running
            os.killpg(script_pid, signal.SIGKILL)
    finally:
        os._exit(0)


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


def _tell_sweeper_script_ended(sweeper_fd):
    """Lets the sweeper go without sweeping: what the script left running is left alone."""
    try:
        os.write(sweeper_fd, b"+")
        os.close(sweeper_fd)
    except OSError:  # the sweeper is gone
        pass


def _watch(child_pid, ready_fd, mask, on_child_end):
    """The parent's part: passes stop signals on to the script until it has ended, reports its
    end to on_child_end and ends as it ended. Never returns."""
    wait_status = _EXITED_1  # should the wait itself fail: the child dies with this process
    try:
        os.read(ready_fd, 1)  # a byte once the child is in its own group; none if it died first
        os.close(ready_fd)
        sweeper_fd = _fork_group_sweeper(child_pid)
        forwarder = _StopSignalForwarder(child_pid)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.waitid(os.P_PID, child_pid, os.WEXITED | os.WNOWAIT)
        forwarder.stop()
        wait_status = os.waitpid(child_pid, 0)[1]
        _tell_sweeper_script_ended(sweeper_fd)
        # Python runs the handlers of signals that arrived during the waits before this line.
        ended_at, stop_signals_seen = time.time(), frozenset(forwarder.seen)
        on_child_end(child_pid, wait_status, ended_at, stop_signals_seen)
    except BaseException:  # a record that cannot be written must not change how the rank ends
        _print_exception()
    finally:
        end_as(wait_status)


def fork_watched(on_child_end):
    """Forks the rank's process. Returns True in the child, which goes on to run the script.

    The parent never returns: it passes the stop signals it receives on to the script, waits for
    it, calls on_child_end(child_pid, wait_status, ended_at, stop_signals_seen) (ended_at:
    time.time() once the wait returned; stop_signals_seen: the stop signals that had reached the
    parent by then), and ends as the child ended. Returns False, without forking, where the
    module's docstring says the script runs in this process.
    """
    set_parent_death_signal = _parent_death_signal_setter()
    if (set_parent_death_signal is None or not hasattr(os, "waitid") or _runs_other_threads()
            or _in_terminal_foreground()):
        return False
    _flush_standard_streams()
    ignoring_children = signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN
    if ignoring_children:  # inherited: Linux would reap the child, and waitpid find none
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Held back until each process has its handling in place: until then, SIGINT would raise
    # KeyboardInterrupt in the parent and SIGTERM end it, taking the child along.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    ready_read_fd, ready_write_fd = os.pipe()
    parent_pid = os.getpid()
    child_pid = os.fork()
    if child_pid != 0:
        os.close(ready_write_fd)
        _watch(child_pid, ready_read_fd, mask, on_child_end)
    os.close(ready_read_fd)
    _become_watched_child(parent_pid, set_parent_death_signal, ready_write_fd)
    if ignoring_children:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return True
