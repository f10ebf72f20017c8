"""Runs one rank's script and, when it fails, ends the whole MPI job instead of leaving it waiting.

sok1x-run starts every rank as `python <this file> script.py args` (or `-m module`); under a plain
mpiexec, `python -m sok1x.launch.rank_guard script.py` works too. Run by path, the guard imports
only the standard library and job_status.py and rank_watch.py beside it, never the sok1x package:
a rank whose script does not need sok1x starts fast, and a broken sok1x install is reported like
any other failure.

The script runs through runpy, as `python script.py` would run it. When it raises, or calls
sys.exit with a non-zero code, the guard prints the traceback and "sok1x-run: rank R failed:
<reason>" to stderr, records the failure for sok1x-run (job_status), and calls MPI_Abort on
COMM_WORLD, so ranks blocked in a collective stop at once. If the script failed before bringing
MPI up, the guard brings it up to abort; should that block (another rank never starts MPI),
sok1x-run stops the job from outside.

Under sok1x-run (its status folder on this host) the guard first forks (rank_watch): the script
runs in the child, and the parent records a death the script could not report (a signal, os._exit)
with its time and prints the same one line, so that sok1x-run names the first rank that died even
where mpiexec's own report names another. Under a plain mpiexec the script runs in the guard's own
process, and so it does where that process already runs other threads (rank_watch says why).
"""
import faulthandler
import importlib
import importlib.util
import os
import runpy
import socket
import sys
import time
import traceback


def _load_sibling(name):
    """Returns launch/<name>.py: from the package when imported, else from beside this file."""
    if __package__:
        return importlib.import_module("%s.%s" % (__package__, name))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location("_sok1x_launch_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


job_status = _load_sibling("job_status")
rank_watch = _load_sibling("rank_watch")
USAGE = "usage: python rank_guard.py (script.py | -m module) [args ...]"
GUARD_PATH = os.path.abspath(__file__)

# Where MPI launchers announce a process's rank: Open MPI, MPICH/Intel MPI (hydra), PMIx, MVAPICH,
# Slurm.
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                   "SLURM_PROCID")
_KEYBOARD_INTERRUPT_CODE = 130
_OUTPUT_DRAIN_S = 0.3
# Set on the sys module once a failure line is printed: one line per process, though the guard
# runs as __main__ and sok1x's failure_guard imports this module again as sok1x.launch.rank_guard.
_REPORTED_MARK = "_sok1x_failure_reported"


def rank_from_environment():
    """Returns the rank that the MPI launcher gave this process, or None outside a launcher."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def describe_exit(exc):
    """Returns (exit_code, reason) for the exception that ended a script; exit_code 0 is success."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or code is False or code == 0:
            return 0, ""
        if isinstance(code, int):
            return (code & 0xFF) or 1, "exited with code %d" % code
        return 1, "exited with message: %s" % code
    if isinstance(exc, KeyboardInterrupt):
        return _KEYBOARD_INTERRUPT_CODE, "interrupted (KeyboardInterrupt)"
    text = str(exc).strip().replace("\n", " ")
    name = type(exc).__name__
    return 1, ("%s: %s" % (name, text)) if text else name


def parse_target(argv):
    """Splits the guard's arguments into (module, script, script_args), one of the first two None.

    Raises SystemExit with the usage line when no script or module is given.
    """
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(USAGE)
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit(USAGE)
        return argv[1], None, list(argv[2:])
    return None, argv[0], list(argv[1:])


def run_target(module, script, script_args):
    """Runs the module or script as __main__, with sys.argv and sys.path[0] set as Python does."""
    if module is not None:
        sys.argv = [module] + script_args
        sys.path[0] = os.getcwd()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    sys.argv = [script] + script_args
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def _mpi_ready_to_abort():
    """Returns mpi4py's MPI with MPI initialized, or None where no abort is possible or needed."""
    try:
        from mpi4py import MPI
        if MPI.Is_finalized():
            return None
        if not MPI.Is_initialized():
            MPI.Init()
        return MPI
    except Exception:  # no mpi4py or no MPI library: exiting is all that is left
        return None


def _print_traceback(exc):
    """Prints the traceback without the guard's and runpy's own frames."""
    launch_files = (GUARD_PATH, runpy.__file__, "<frozen runpy>")
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in launch_files:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def _say_failed(prefix, rank, reason):
    """Writes "<prefix>: rank R failed: <reason>" to stderr, after what stdout holds."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    sys.stderr.write("%s: rank %s failed: %s\n" % (prefix, "?" if rank is None else rank, reason))
    sys.stderr.flush()


def fail_job(exit_code, reason, prefix="sok1x-run"):
    """Reports this rank's failure on stderr ("<prefix>: rank R failed: <reason>") and to
    sok1x-run, then aborts the MPI job. A process reports once: a later call only aborts.

    Returns exit_code when the job could not be aborted (outside MPI, or MPI already finalized).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    rank = rank_from_environment()
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        rank = mpi.COMM_WORLD.Get_rank()
    if not getattr(sys, _REPORTED_MARK, False):
        setattr(sys, _REPORTED_MARK, True)
        _say_failed(prefix, rank, reason)
        status_dir = job_status.status_dir_from_environment()
        if status_dir is not None and rank is not None:
            try:
                job_status.record_failure(status_dir, rank, exit_code, reason)
            except OSError:
                pass
    if rank is not None:
        mpi = _mpi_ready_to_abort()
        if mpi is not None:
            # mpiexec's proxy stops forwarding a rank's output once it hears of the abort: give
            # it a moment to pass the line on first (without, hydra lost it now and then).
            time.sleep(_OUTPUT_DRAIN_S)
            if mpi.COMM_WORLD.Get_size() == 1:
                _exit_alone(exit_code)
            mpi.COMM_WORLD.Abort(exit_code)
    return exit_code


def _exit_alone(exit_code):
    """Ends a one-rank job at once with exit_code, running no exit-time destructor: MPI_Abort
    has no peer to stop there, and its exit runs native destructors (Horovod's, after Horovod
    brought MPI up itself) that wait for the GIL mpi4py holds during the abort, for ever."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing left to flush
            pass
    os._exit(exit_code or 1)


def describe_death(wait_status):
    """Returns (exit_code, signal number or None, reason) for a process's wait status; exit_code 0
    is a clean exit. A death by a signal gets exit code 1."""
    if os.WIFSIGNALED(wait_status):
        number = os.WTERMSIG(wait_status)
        return 1, number, "killed by signal %s" % job_status.signal_description(number)
    exit_code = os.WEXITSTATUS(wait_status)
    return exit_code, None, ("exited with code %d without a Python exception (os._exit, or exit() "
                             "in native code)" % exit_code)


def _record_death(status_dir, rank, pid, wait_status, ended_at, stop_signals_seen):
    """Reports the end of the rank's process (rank_watch's parent calls this) where the script
    could not: a death by a signal, or a non-zero exit without a failure on record. Not once a stop
    signal has reached the parent: however the script then ended (the signal, or its own handler's
    exit code), that rank was stopped; it did not fail."""
    exit_code, number, reason = describe_death(wait_status)
    if exit_code == 0 or stop_signals_seen or job_status.has_failure(status_dir, rank):
        return
    host = socket.gethostname()
    try:
        job_status.record_failure(status_dir, rank, exit_code, reason, when=ended_at, pid=pid,
                                  host=host, signal_number=number)
    except OSError:
        pass
    _say_failed("sok1x-run", rank, "%s, PID %d on %s" % (reason, pid, host))


def _watch_this_rank():
    """Under sok1x-run (its status folder on this host), forks so that a parent process records
    how the rank's process ends (rank_watch), and records the rank's process ids. Returns in the
    process that goes on to run the script."""
    status_dir = job_status.status_dir_from_environment()
    rank = rank_from_environment()
    if status_dir is None or rank is None:
        return
    watched = rank_watch.fork_watched(
        lambda *child_end: _record_death(status_dir, rank, *child_end))
    pids = (os.getppid(), os.getpid()) if watched else (os.getpid(),)
    try:
        job_status.record_start(status_dir, rank, *pids)
    except OSError:
        pass


def main(argv=None):
    """Runs the rank's target; returns 0 on success, or aborts the job and returns the exit code."""
    module, script, script_args = parse_target(sys.argv[1:] if argv is None else argv)
    _watch_this_rank()
    if not faulthandler.is_enabled():
        faulthandler.enable()
    try:
        run_target(module, script, script_args)
    except BaseException as exc:  # every way a script can end must reach the job
        exit_code, reason = describe_exit(exc)
        if exit_code == 0:
            return 0
        if not isinstance(exc, SystemExit):
            _print_traceback(exc)
        elif not isinstance(exc.code, int):
            sys.stderr.write("%s\n" % exc.code)
        return fail_job(exit_code, reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
