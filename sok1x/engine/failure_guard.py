"""Ends the whole MPI job when this rank leaves abnormally, under any mpiexec, not only sok1x-run.

Under a plain `mpiexec -np N python train.py`, a rank that raises or calls sys.exit(3) while its
peers wait in a collective would leave them waiting forever: MPI_Finalize (which mpi4py calls at
exit) waits for the peers, so the failed rank never exits and mpiexec never notices. `install()`
(runtime.init calls it once sok1x is up) makes every abnormal way out end the job with MPI_Abort
on COMM_WORLD, after printing the rank's traceback (where there is one) and one line

    sok1x: rank R failed: <reason>

to stderr (recorded for sok1x-run too, which then names the rank in its last line):

- an uncaught exception in the main thread (sys.excepthook) or in any other thread
  (threading.excepthook, or on Python 3.7 a wrapper of each Thread's run() made after install();
  SystemExit in a thread ends only that thread, as in Python);
- sys.exit(code) with a non-zero or non-integer code from the main thread, seen at exit (atexit):
  the last such call counts, even one whose SystemExit the program caught and survived (Python
  keeps the real exit status to itself, so a bare `raise SystemExit(3)` escapes this; sok1x-run's
  rank guard, which runs the script itself, sees every form);
- a catchable signal that would end the process (SIGTERM, SIGINT, SIGHUP, SIGQUIT), when no
  handler of the program's own is installed for it. The signal is seen by a watcher thread
  through signal.set_wakeup_fd, so a main thread blocked inside a collective does not delay it;
- an error in a session hook reaches the program as an uncaught exception, like any other.

A normal exit (every rank returns or calls sys.exit(0)) runs no abort and prints nothing.
MPI_Abort works the same way under MPICH's hydra and Open MPI's mpirun: the launcher kills the
other ranks. SIGKILL and crashes in native code cannot be caught; there, every launcher sees the
process die and ends the job itself. A host (MPI) collective that waits longer than
SOK1X_MPI_TIMEOUT_S (comm/wait_watch.py) counts as a failure too. SOK1X_ABORT_ON_FAILURE=0 turns
all of this off.
"""
import atexit
import os
import signal
import sys
import threading
import time

from sok1x.comm import wait_watch

ENV_OPT_OUT = "SOK1X_ABORT_ON_FAILURE"
PREFIX = "sok1x"
SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
_ABORT_GRACE_S = 10.0
_WATCHER_GRACE_S = 0.5  # a signal's handler lets the watcher thread fail the job first

# reentrant: a signal's handler (main thread) may fail the job while that thread holds it
_lock = threading.RLock()
_state = {"installed": False, "failing_thread": None, "exit_code": 0, "watcher": None,
          "caught_signals": set(), "pid": None, "replaced": {}}


def enabled():
    """Returns False when SOK1X_ABORT_ON_FAILURE is set to 0 (or false/no/off)."""
    value = os.environ.get(ENV_OPT_OUT, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def is_installed():
    """Returns True once install() has put the hooks in place in this process."""
    return _state["installed"]


def fail(exit_code, reason):
    """Prints "sok1x: rank R failed: reason" once, records it for sok1x-run, and aborts the job.

    Runs at most once per process: a second caller from another thread waits for the abort to end
    the process; a second call from the thread already failing returns (a signal handler that
    interrupted the first call).
    """
    from sok1x.launch.rank_guard import fail_job
    if _state["pid"] != os.getpid():  # a forked child (no rank of the job): Python's own way
        return
    me = threading.get_ident()
    with _lock:
        first = _state["failing_thread"] is None
        if first:
            _state["failing_thread"] = me
    if not first:
        if _state["failing_thread"] == me:
            return
        while True:  # the first caller's MPI_Abort ends this process
            time.sleep(1.0)
    _stop_main_thread()
    fail_job(exit_code, reason, prefix=PREFIX)
    os._exit(exit_code or 1)  # MPI could not abort (finalized already): still leave now


def _excepthook(previous):
    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        from sok1x.launch.rank_guard import describe_exit
        exit_code, reason = describe_exit(exc if exc is not None else exc_type())
        if exit_code:
            fail(exit_code, reason)
    return hook


def _thread_excepthook(previous):
    def hook(args):
        previous(args)
        if args.exc_type is SystemExit:
            return
        from sok1x.launch.rank_guard import describe_exit
        exc = args.exc_value if args.exc_value is not None else args.exc_type()
        exit_code, reason = describe_exit(exc)
        name = args.thread.name if args.thread is not None else "?"
        fail(exit_code or 1, "in thread %s: %s" % (name, reason))
    return hook


class _ThreadExceptArgs(object):
    """What threading.excepthook is given (Python >= 3.8), for Python 3.7's stand-in."""

    def __init__(self, exc_type, exc_value, exc_traceback, thread):
        self.exc_type, self.exc_value = exc_type, exc_value
        self.exc_traceback, self.thread = exc_traceback, thread


def _print_thread_exception(args):
    """Prints an uncaught thread exception as Python 3.7 does ("Exception in thread NAME:")."""
    if args.exc_type is SystemExit:
        return
    import traceback
    name = args.thread.name if args.thread is not None else threading.get_ident()
    sys.stderr.write("Exception in thread %s:\n" % name)
    traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback)
    sys.stderr.flush()


def _guard_thread_runs(hook):
    """Python 3.7 has no threading.excepthook: every Thread made from now on (subclasses too,
    which must call Thread.__init__) runs its run() under a wrapper that gives an exception
    escaping it to `hook` as _ThreadExceptArgs (the hook prints it, as Python would)."""
    original_init = threading.Thread.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        original_run = self.run

        def run(*run_args, **run_kwargs):
            try:
                original_run(*run_args, **run_kwargs)
            except SystemExit:
                raise
            except BaseException:
                hook(_ThreadExceptArgs(*(sys.exc_info() + (self,))))
        self.run = run

    __init__.__wrapped__ = original_init
    threading.Thread.__init__ = __init__


def _install_thread_hook():
    """Makes an uncaught exception in any thread fail the job (threading.excepthook, or its
    stand-in on Python 3.7)."""
    if hasattr(threading, "excepthook"):
        threading.excepthook = _thread_excepthook(threading.excepthook)  # novermin
    else:
        _guard_thread_runs(_thread_excepthook(_print_thread_exception))


def _exit_recorder(original_exit):
    def exit(status=None):  # noqa: A001 - stands in for sys.exit
        if threading.current_thread() is threading.main_thread():
            _state["exit_code"] = status
        original_exit(status)
    exit.__doc__ = original_exit.__doc__
    exit.__wrapped__ = original_exit
    return exit


def _at_exit():
    if _state["pid"] != os.getpid():  # a forked child's exit is its own
        return
    if _state["failing_thread"] is not None:
        # Another thread (the signal watcher, a failing worker) is aborting the job: the main
        # thread went on and reached a normal exit meanwhile; it must not end the rank with 0.
        time.sleep(_ABORT_GRACE_S)
        os._exit(1)
    status = _state["exit_code"]
    if status is None or status is False or status == 0:
        return
    from sok1x.launch.rank_guard import describe_exit
    exit_code, reason = describe_exit(SystemExit(status))  # Python printed a message already
    fail(exit_code, reason)


def _on_overdue_wait(what, seconds):
    fail(1, "%s waited %.0f s for its peers: one is stuck, or in another collective (raise %s "
            "if a step legitimately waits that long)" % (what, seconds, wait_watch.ENV_TIMEOUT))


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return "signal %d" % number


def _on_signal(number):
    fail(128 + number, "killed by %s" % _signal_name(number))


def _watch(read_fd):
    while True:
        try:
            data = os.read(read_fd, 16)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        for number in data:
            if number in _state["caught_signals"] and _ours(number):
                _on_signal(number)


def _ours(number):
    """Whether signal `number` still goes to this module's handler: a program that set its own
    handler since (a preemption saver's, say) handles that signal itself."""
    try:
        return signal.getsignal(number) is _python_handler
    except (ValueError, OSError):
        return False


def _python_handler(number, frame):
    """Runs in the main thread at its next bytecode after the signal. While another thread
    aborts the job (the watcher usually gets there first: it is given _WATCHER_GRACE_S), the
    main thread stays here rather than go on training; otherwise it fails the job itself, so
    that a watcher thread that has not run (a loaded host) cannot let the program finish and
    exit 0. Where even that fails (the main thread was writing to stderr itself, say), the
    process ends as the signal would have ended it."""
    me = threading.get_ident()
    deadline = time.monotonic() + _WATCHER_GRACE_S
    while (_state["watcher"] is not None and _state["failing_thread"] is None
           and time.monotonic() < deadline):
        time.sleep(0.01)
    failing = _state["failing_thread"]
    if failing is not None and failing != me:
        while True:  # that thread's MPI_Abort ends this process
            time.sleep(1.0)
    try:
        _on_signal(number)
    except BaseException:  # noqa: BLE001 (leave as the signal's default would have)
        os._exit(128 + number)


def _forget_in_child():
    """After os.fork, in the child (a data loader's worker, say): no rank of the job, so none of
    this module's ways out; the signals the parent caught get the handlers they had before again,
    and the signal wakeup pipe, shared with the parent's watcher, is let go (a signal to the child
    reached the parent's watcher through it, failing the parent's job)."""
    if _state["pid"] is None or _state["pid"] == os.getpid():
        return
    try:
        if _state["watcher"] is not None:  # the wakeup fd is this module's (it was -1 before)
            signal.set_wakeup_fd(-1)
        for number in _state["caught_signals"]:
            if _ours(number):  # the handler the program had (Ctrl-C's KeyboardInterrupt)
                signal.signal(number, _state["replaced"].get(number, signal.SIG_DFL))
    except (ValueError, OSError):  # not Python's main thread there: nothing was set up anyway
        pass
    _state["caught_signals"], _state["watcher"] = set(), None


def _stop_main_thread():
    """From another thread: makes the main thread stop at its next bytecode (in
    _python_handler) instead of running more steps while this rank aborts the job."""
    caught = _state["caught_signals"]
    if threading.current_thread() is threading.main_thread() or not caught:
        return
    import _thread
    number = signal.SIGTERM if signal.SIGTERM in caught else min(caught)
    try:
        if _ours(number):
            _thread.interrupt_main(number)
    except TypeError:  # Python < 3.10 interrupts with SIGINT only
        if signal.SIGINT in caught and _ours(signal.SIGINT):
            _thread.interrupt_main()


def _install_signal_handlers():
    """Catches the terminating signals nobody else handles (main thread only); returns their
    numbers."""
    caught = set()
    for name in SIGNALS:
        number = getattr(signal, name, None)
        if number is None:
            continue
        current = signal.getsignal(number)
        if current not in (signal.SIG_DFL, signal.default_int_handler):
            continue  # the program (or its launcher) handles this one itself
        signal.signal(number, _python_handler)
        caught.add(int(number))
        _state["replaced"][int(number)] = current
    _state["caught_signals"] = caught
    if not caught:
        return caught
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        previous = None
    if previous is None or previous != -1:  # someone (asyncio) uses the wakeup fd already
        if previous not in (None, -1):
            signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return caught
    watcher = threading.Thread(target=_watch, args=(read_fd,), name="sok1x-signal-watcher",
                               daemon=True)
    watcher.start()
    _state["watcher"] = watcher
    return caught


def _install_signal_handlers_in_main_thread():
    """Signal handlers can only be set from the main thread, and graph-mode programs bring sok1x
    up inside sess.run, on one of TensorFlow's threads: there, ask Python to run the setting in
    the main thread at its next bytecode (Py_AddPendingCall), i.e. when sess.run returns."""
    if threading.current_thread() is threading.main_thread():
        _install_signal_handlers()
        return
    import ctypes

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    def pending(_):
        try:
            _install_signal_handlers()
        except Exception as exc:  # a pending call must not raise into unrelated code
            sys.stderr.write("sok1x: signal handlers not installed: %s\n" % exc)
        return 0

    _state["pending_call"] = pending  # the C callback must outlive the call
    add = ctypes.pythonapi.Py_AddPendingCall
    add.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    add.restype = ctypes.c_int
    add(ctypes.cast(pending, ctypes.c_void_p), None)


def install():
    """Puts the hooks in place (idempotent); does nothing when SOK1X_ABORT_ON_FAILURE=0.

    Any thread may call it; the signal handlers are then set in the main thread as soon as it
    runs Python code again. Returns True when the hooks are in place.
    """
    with _lock:
        if _state["installed"]:
            return True
        if not enabled():
            return False
        _state["pid"] = os.getpid()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_forget_in_child)
        sys.excepthook = _excepthook(sys.excepthook)
        _install_thread_hook()
        sys.exit = _exit_recorder(sys.exit)
        atexit.register(_at_exit)
        _install_signal_handlers_in_main_thread()
        wait_watch.start(_on_overdue_wait, wait_watch.timeout_from_env())
        _state["installed"] = True
        return True
