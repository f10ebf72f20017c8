"""The files through which rank guards tell sok1x-run what happened to their rank.

sok1x-run makes a fresh folder and names it in SOK1X_RUN_STATUS_DIR. Each rank guard on the same
host writes `rank-R.pid` when it starts (the process ids of the rank: the one mpiexec started, and
the one running the script where they differ) and `rank-R.failed` (JSON: rank, exit code, message,
time) when the rank fails: the script's process writes it for a Python exception or sys.exit, the
guard's watching parent (rank_watch) for a death by a signal or os._exit, adding the process id,
host and signal. Ranks on other hosts do not see the folder and write nothing; their failures reach
the job through MPI alone. Every write goes to a temporary name and is renamed, so the launcher
never reads half a record.
"""
import json
import os
import signal
import time

STATUS_DIR_VARIABLE = "SOK1X_RUN_STATUS_DIR"
_PID_SUFFIX = ".pid"
_FAILED_SUFFIX = ".failed"


def status_dir_from_environment():
    """Returns the folder named by SOK1X_RUN_STATUS_DIR when it exists on this host, else None."""
    path = os.environ.get(STATUS_DIR_VARIABLE)
    if path and os.path.isdir(path):
        return path
    return None


def signal_description(number):
    """Returns "9 (SIGKILL)" for 9; the bare number for a signal Python does not name."""
    try:
        return "%d (%s)" % (number, signal.Signals(number).name)
    except ValueError:
        return str(number)


def _write_atomically(path, text):
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _path(status_dir, rank, suffix):
    return os.path.join(status_dir, "rank-%d%s" % (rank, suffix))


def record_start(status_dir, rank, *pids):
    """Writes rank-R.pid, one process id a line, so the launcher can map a process id that mpiexec
    reports to a rank."""
    _write_atomically(_path(status_dir, rank, _PID_SUFFIX), "".join("%d\n" % pid for pid in pids))


def record_failure(status_dir, rank, exit_code, message, when=None, pid=None, host=None,
                   signal_number=None):
    """Writes rank-R.failed: the rank's exit code, a one-line reason and the time it failed (now
    unless `when` is given); a death adds the process id, host and killing signal (or None)."""
    record = {"rank": rank, "exit_code": exit_code, "message": message,
              "time": time.time() if when is None else when}
    if pid is not None:
        record.update(pid=pid, host=host, signal=signal_number)
    _write_atomically(_path(status_dir, rank, _FAILED_SUFFIX), json.dumps(record))


def has_failure(status_dir, rank):
    """Returns True when rank R has recorded a failure already."""
    return os.path.exists(_path(status_dir, rank, _FAILED_SUFFIX))


def _names_ending(status_dir, suffix):
    try:
        return [name for name in os.listdir(status_dir) if name.endswith(suffix)]
    except OSError:
        return []


def any_failure(status_dir):
    """Returns True once some rank has recorded a failure (cheap enough to poll)."""
    return bool(_names_ending(status_dir, _FAILED_SUFFIX))


def read_failures(status_dir):
    """Returns the failure records (dicts with rank, exit_code, message, time, and pid, host and
    signal for a death), earliest first."""
    records = []
    for name in _names_ending(status_dir, _FAILED_SUFFIX):
        try:
            with open(os.path.join(status_dir, name)) as handle:
                records.append(json.load(handle))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda record: record["time"])


def read_rank_pids(status_dir):
    """Returns {pid: rank} for every process of a rank on this host that recorded its start."""
    rank_of_pid = {}
    for name in _names_ending(status_dir, _PID_SUFFIX):
        try:
            rank = int(name[len("rank-"):-len(_PID_SUFFIX)])
            with open(os.path.join(status_dir, name)) as handle:
                for line in handle.read().split():
                    rank_of_pid[int(line)] = rank
        except (OSError, ValueError):
            continue
    return rank_of_pid
