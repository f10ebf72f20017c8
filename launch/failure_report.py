"""Which rank made a job fail, and the exit code and last line sok1x-run ends with.

The best witnesses are the ranks' own records (job_status), earliest first: the rank guard's for a
Python exception or sys.exit (rank, exit code, reason), and its watching parent's for a death by a
signal or os._exit (rank_watch: process id, host, signal), each with the time it happened. The
first by time names the rank that failed first, whatever mpiexec reports after it: MPICH's hydra
names the first process it happens to notice, which, when two die close together (the second
killed in the clean-up), is not always the first to die. Where no rank left a record (ranks on
other hosts, a guard killed with SIGKILL), mpiexec's own report names it: Open MPI names the rank,
hydra names the process id, which the ranks' start records map to a rank.
"""
import re
import signal

from sok1x.launch import job_status

# Open MPI (4 and 5): "process rank 1 with PID 7349 on node vm exited on signal 9 (Killed)."
_OPEN_MPI_SIGNAL = re.compile(
    r"process\s+rank\s+(\d+)\s+with\s+PID\s+(\d+)\s+on\s+node\s+(\S+)\s+exited\s+on\s+signal\s+"
    r"(\d+)")
# Open MPI: "Process name: [prterun-vm-7362@1,1]" or "[[36262,1],1]", then "Exit code: 3".
_OPEN_MPI_EXIT = re.compile(
    r"Process\s+name:\s*\[(?:\[[^\]]*\]|[^\],]*),(\d+)\]\s*Exit\s+code:\s*(\d+)")
# MPICH hydra: "=   PID 4206 RUNNING AT vm", then "EXIT STRING: Killed (signal 9)".
_HYDRA_PID = re.compile(r"PID\s+(\d+)\s+RUNNING\s+AT\s+(\S+)")
_HYDRA_SIGNAL = re.compile(r"EXIT\s+STRING:.*?\(signal\s+(\d+)\)")


class JobFailure:
    """Why a job failed: exit_code for sok1x-run, and a one-line message naming the rank."""

    def __init__(self, exit_code, message):
        self.exit_code = exit_code or 1
        self.message = message


# Where to look next after a signal that ended a rank without a word from it.
_NATIVE_CRASH_HINT = ("a crash in native code: faulthandler printed the rank's Python stack above, "
                      "and a core dump (ulimit -c) holds the rest")
_SIGNAL_HINTS = {
    signal.SIGKILL: "if nothing in the job sent it, look for the kernel's out-of-memory killer in "
                    "`dmesg`",
    signal.SIGSEGV: _NATIVE_CRASH_HINT, signal.SIGBUS: _NATIVE_CRASH_HINT,
    signal.SIGILL: _NATIVE_CRASH_HINT, signal.SIGFPE: _NATIVE_CRASH_HINT,
    signal.SIGABRT: "a native library aborted: " + _NATIVE_CRASH_HINT,
}


def _death_message(record):
    """Words a record that a rank's watching parent made of its process's death."""
    who = "rank %d (PID %d on %s)" % (record["rank"], record["pid"], record.get("host") or "?")
    number = record.get("signal")
    if number is None:
        return "%s %s" % (who, record["message"])
    hint = _SIGNAL_HINTS.get(number)
    return "%s was killed by signal %s%s" % (who, job_status.signal_description(number),
                                              ": " + hint if hint else "")


def _from_rank_records(status_dir):
    failures = job_status.read_failures(status_dir) if status_dir else []
    if not failures:
        return None
    first = failures[0]
    if first.get("pid") is not None:
        return JobFailure(first["exit_code"], _death_message(first))
    return JobFailure(first["exit_code"], "rank %d failed (exit code %d): %s" % (
        first["rank"], first["exit_code"], first["message"]))


def _from_open_mpi_report(output):
    match = _OPEN_MPI_SIGNAL.search(output)
    if match:
        rank, pid, host, number = match.groups()
        return JobFailure(1, "rank %s (PID %s on %s) was killed by signal %s" % (
            rank, pid, host, job_status.signal_description(int(number))))
    match = _OPEN_MPI_EXIT.search(output)
    if match:
        rank, code = match.groups()
        return JobFailure(int(code), "rank %s exited with code %s" % (rank, code))
    return None


def _from_hydra_report(output, rank_of_pid):
    match = _HYDRA_PID.search(output)
    if not match:
        return None
    pid, host = int(match.group(1)), match.group(2)
    who = "rank %d (PID %d on %s)" % (rank_of_pid[pid], pid, host) if pid in rank_of_pid else (
        "the process with PID %d on %s (rank unknown)" % (pid, host))
    signal_match = _HYDRA_SIGNAL.search(output, match.end())
    if signal_match:
        return JobFailure(1, "%s was killed by signal %s" % (
            who, job_status.signal_description(int(signal_match.group(1)))))
    return JobFailure(1, "%s ended abnormally" % who)


def explain_failure(result, status_dir):
    """Returns a JobFailure for a finished job (a job.JobResult), or None when it succeeded."""
    from_records = _from_rank_records(status_dir)
    if from_records is not None:
        return from_records
    if result.interrupted_by is not None:
        return JobFailure(128 + int(result.interrupted_by), "sok1x-run received signal %s and "
                          "stopped the job"
                          % job_status.signal_description(int(result.interrupted_by)))
    if result.returncode == 0:
        return None
    rank_of_pid = job_status.read_rank_pids(status_dir) if status_dir else {}
    reported = (_from_open_mpi_report(result.output_tail)
                or _from_hydra_report(result.output_tail, rank_of_pid))
    if reported is not None:
        return reported
    code = result.returncode if result.returncode > 0 else 1
    return JobFailure(code, "mpiexec exited with code %d and no rank said why (a rank that calls "
                            "os._exit or is killed outside Python leaves no record)"
                      % result.returncode)
