"""sok1x-run against real MPI jobs (the mpich wheel's mpiexec beside this Python), plus the parts
of the launcher that need no job: command-line splitting, Open MPI flags, reading mpiexec's reports.

Every job runs under a timeout, and a job that outlives it is stopped and fails the test, so a hang
never hangs the suite. Run from outside the repository, against the installed package.
"""
import fcntl
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import termios
import time

import pytest
from mpi_jobs import Finished, lane_a_only, run_stoppable

from sok1x.launch import failure_report, job_status, mpi_launcher, rank_guard, runner
from sok1x.launch.job import JobResult

pytestmark = [pytest.mark.timeout(300), lane_a_only()]

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_scripts")
REPORT_RANK = os.path.join(SCRIPTS, "report_rank.py")
FAIL_ONE_RANK = os.path.join(SCRIPTS, "fail_one_rank.py")
WATCH_HARNESS = os.path.join(SCRIPTS, "watch_harness.py")
SOK1X_RUN = os.path.join(os.path.dirname(sys.executable), "sok1x-run")
JOB_TIMEOUT_S = 120
FAILED_JOB_LIMIT_S = 30


def launch(args, env_changes=None, command=None):
    """Runs sok1x-run (or `command`) with args; stops the whole job and fails if it hangs."""
    env = dict(os.environ)
    for name in (mpi_launcher.MPIEXEC_VARIABLE, "NCCL_NVLS_ENABLE"):
        env.pop(name, None)
    env.update(env_changes or {})
    return run_stoppable((command or [SOK1X_RUN]) + list(args), env, JOB_TIMEOUT_S)


def rank_reports(finished):
    """Returns {rank: report} from report_rank.py's REPORT lines."""
    reports = [json.loads(found) for found in re.findall(r"REPORT (\{[^}]*\})", finished.stdout)]
    return {report["rank"]: report for report in reports}


def explain(finished):
    return finished.explain()


def test_sok1x_run_is_installed_beside_python():
    assert os.path.exists(SOK1X_RUN), "install sok1x (pip install .) into %s" % sys.prefix


def test_every_rank_runs_and_sees_the_job_size():
    finished = launch(["-np", "2", REPORT_RANK])
    assert finished.returncode == 0, explain(finished)
    reports = rank_reports(finished)
    assert sorted(reports) == [0, 1], explain(finished)
    assert all(report["size"] == 2 for report in reports.values())


def test_script_arguments_pass_through_unchanged():
    script_args = ["--alpha", "1", "two words", "-np", "5", "--", "-m"]
    finished = launch(["-np", "2", REPORT_RANK] + script_args)
    assert finished.returncode == 0, explain(finished)
    for report in rank_reports(finished).values():
        assert report["args"] == script_args


def test_ranks_get_nccl_nvls_disabled_by_default():
    finished = launch(["-np", "2", REPORT_RANK])
    assert finished.returncode == 0, explain(finished)
    reports = rank_reports(finished)
    assert len(reports) == 2, explain(finished)
    assert all(report["NCCL_NVLS_ENABLE"] == "0" for report in reports.values())


def test_a_user_setting_of_nccl_nvls_wins():
    finished = launch(["-np", "2", REPORT_RANK], env_changes={"NCCL_NVLS_ENABLE": "1"})
    assert finished.returncode == 0, explain(finished)
    reports = rank_reports(finished)
    assert len(reports) == 2, explain(finished)
    assert all(report["NCCL_NVLS_ENABLE"] == "1" for report in reports.values())


def test_python_dash_m_sok1x_launch_runs_a_job():
    finished = launch(["-m", "sok1x.launch", "-np", "2", REPORT_RANK, "x"],
                      command=[sys.executable])
    assert finished.returncode == 0, explain(finished)
    assert sorted(rank_reports(finished)) == [0, 1], explain(finished)


def test_a_module_target_runs_with_dash_m(tmp_path):
    (tmp_path / "rank_module.py").write_text(
        "import sys\nfrom mpi4py import MPI\n"
        "sys.stdout.write('MODULE rank %d args %s\\n' % (MPI.COMM_WORLD.rank, sys.argv[1:]))\n")
    finished = launch(["-np", "2", "-m", "rank_module", "a"],
                      env_changes={"PYTHONPATH": str(tmp_path)})
    assert finished.returncode == 0, explain(finished)
    assert sorted(re.findall(r"MODULE rank (\d)", finished.stdout)) == ["0", "1"]
    assert "args ['a']" in finished.stdout


@pytest.mark.parametrize("mode, exit_code, reason", [
    ("raise-in-barrier", 1, "ValueError: rank 1 broke on purpose"),
    ("raise-in-recv", 1, "ValueError: rank 1 broke on purpose"),
    ("exit-3", 3, "exited with code 3"),
    ("kill-9", 1, "killed by signal 9"),
    ("os-exit-5", 5, "exited with code 5 without a Python exception"),
    ("raise-before-mpi", 1, "RuntimeError: rank 1 broke before MPI"),
    ("raise-beside-no-mpi", 1, "RuntimeError: rank 1 broke while rank 0 never started MPI"),
])
def test_one_failing_rank_ends_the_job_and_is_named(mode, exit_code, reason):
    finished = launch(["-np", "2", FAIL_ONE_RANK, mode])
    assert finished.returncode == exit_code, explain(finished)
    assert finished.seconds < FAILED_JOB_LIMIT_S, explain(finished)
    assert "rank 1" in finished.last_stderr_line, explain(finished)
    assert reason in finished.last_stderr_line, explain(finished)
    assert "rank 0 finished" not in finished.stdout
    # One line from the rank: the guard's, or its watching parent's where the script said nothing.
    assert len(re.findall(r"^sok1x-run: rank 1 failed: ", finished.stderr, re.M)) == 1, \
        explain(finished)


def rank_pids(text):
    """Returns {rank: (script's process id, its parent's)} from fail_one_rank.py's pids lines."""
    return {int(rank): (int(pid), int(parent))
            for rank, pid, parent in re.findall(r"rank (\d+)\D{0,10}pids (\d+) (\d+)", text)}


def test_the_first_rank_to_die_is_named_though_mpiexec_names_another():
    """Rank 1 dies from SIGKILL; rank 0 dies from SIGKILL a moment later. mpiexec notices rank
    0's death first (rank 1's pipes stay open in a child of its), so hydra's report names rank 0,
    as it did now and then in CI when its clean-up killed rank 0 close behind rank 1. sok1x-run
    must name rank 1, the first to die."""
    finished = launch(["-np", "2", FAIL_ONE_RANK, "kill-9-then-rank-0"])
    assert finished.returncode == 1, explain(finished)
    assert finished.seconds < FAILED_JOB_LIMIT_S, explain(finished)
    assert re.match(r"sok1x-run: job failed: rank 1 \(PID \d+ on \S+\) was killed by signal 9 ",
                    finished.last_stderr_line), explain(finished)
    pids = rank_pids(finished.stdout)
    hydra_named = re.findall(r"PID (\d+) RUNNING AT", finished.stdout + finished.stderr)
    if hydra_named:  # else not hydra: nothing to check of how mpiexec saw it
        assert int(hydra_named[0]) in pids.get(0, ()), (
            "the race was not reproduced:\n" + explain(finished))


def start_hanging_job():
    """Starts sok1x-run on fail_one_rank.py's hang mode; returns (process, stdout read so far)
    once both ranks wait."""
    env = dict(os.environ)
    env.pop(mpi_launcher.MPIEXEC_VARIABLE, None)
    process = subprocess.Popen([SOK1X_RUN, "-np", "2", FAIL_ONE_RANK, "hang"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    seen = ""
    while seen.count("waiting") < 2:
        line = process.stdout.readline().decode("utf-8", "replace")
        if not line:
            stop_job_group(process)
            raise AssertionError("the job ended before both ranks started:\n" + seen)
        seen += line
    return process, seen


def stop_job_group(process):
    """Kills sok1x-run's whole session if it still runs."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def finish_job(process, seen, started):
    """Waits for the job to end; returns Finished, its stdout starting with `seen`."""
    try:
        stdout, stderr = process.communicate(timeout=FAILED_JOB_LIMIT_S)
    finally:
        stop_job_group(process)
    return Finished(process.returncode, seen + stdout.decode(), stderr.decode(),
                    time.monotonic() - started)


def test_sigterm_to_sok1x_run_stops_the_whole_job():
    process, seen = start_hanging_job()
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)  # to sok1x-run alone, as a batch system would
    finished = finish_job(process, seen, started)
    assert finished.returncode == 128 + signal.SIGTERM, explain(finished)
    assert "SIGTERM" in finished.last_stderr_line, explain(finished)


@pytest.mark.parametrize("target", ["script's process", "guard's process", "guard's group"])
def test_a_signal_to_a_ranks_script_fails_it_one_to_its_guard_stops_it(target):
    """SIGTERM to rank 0's script process alone is that rank failing. SIGTERM to the process
    mpiexec started (the guard's watching parent, as a user's kill or Open MPI would send it), or
    to that process's group (as hydra stops a job), stops it: no "rank 0 failed" line."""
    process, seen = start_hanging_job()
    started = time.monotonic()
    script_pid, guard_pid = rank_pids(seen)[0]
    if target == "script's process":
        os.kill(script_pid, signal.SIGTERM)
    elif target == "guard's process":
        os.kill(guard_pid, signal.SIGTERM)
    else:
        os.killpg(os.getpgid(guard_pid), signal.SIGTERM)
    finished = finish_job(process, seen, started)
    assert finished.returncode == 1, explain(finished)
    failed_lines = re.findall(r"^sok1x-run: rank 0 failed: .*$", finished.stderr, re.M)
    if target == "script's process":
        assert failed_lines == ["sok1x-run: rank 0 failed: killed by signal 15 (SIGTERM), "
                                "PID %d on %s" % (script_pid, socket.gethostname())], \
            explain(finished)
        assert finished.last_stderr_line.startswith(
            "sok1x-run: job failed: rank 0 (PID %d on " % script_pid), explain(finished)
    else:
        assert failed_lines == [], explain(finished)


def start_guard(tmp_path, script_text, preexec_fn=None):
    """Starts rank_guard.py by path on a script of script_text, as sok1x-run starts rank 0 (with
    its status folder, no mpiexec), in a session of its own; returns (process, status folder)
    once the script has printed its first line, or at once where it prints none."""
    script = tmp_path / "rank_script.py"
    script.write_text(script_text)
    status_dir = tmp_path / "status"
    status_dir.mkdir()
    env = {name: value for name, value in os.environ.items()
           if name not in rank_guard._RANK_VARIABLES}
    env.update({job_status.STATUS_DIR_VARIABLE: str(status_dir), "PMI_RANK": "0"})
    process = subprocess.Popen([sys.executable, rank_guard.GUARD_PATH, str(script)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, start_new_session=True,
                               preexec_fn=preexec_fn, universal_newlines=True)
    if "ready" in script_text:
        assert process.stdout.readline().strip() == "ready", process.stderr.read()
    return process, str(status_dir)


def finish_guard(process):
    """Returns (exit code, stdout, stderr) once the guard has ended; kills its session first
    where it has not within FAILED_JOB_LIMIT_S."""
    try:
        stdout, stderr = process.communicate(timeout=FAILED_JOB_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        stderr += "\n(killed: still running after %d s)" % FAILED_JOB_LIMIT_S
    return process.returncode, stdout, stderr


EXIT_3_ON_SIGTERM = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda number, frame: os._exit(3))
print("ready", flush=True)
time.sleep(60)
"""


COUNT_SIGTERMS = """
import signal, time
received = []
signal.signal(signal.SIGTERM, lambda number, frame: received.append(number))
print("ready", flush=True)
deadline = time.monotonic() + 10
while not received and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.5)  # time for a second delivery to arrive
print("SIGTERM received %d times" % len(received))
"""


@pytest.mark.parametrize("target", ["guard's process", "guard's group"])
def test_a_stop_signal_to_the_guard_reaches_the_script_once(tmp_path, target):
    """SIGTERM to the guard's watching parent alone, or to its process group, reaches the script
    exactly once, and the rank's end is a stop: nothing on record."""
    process, status_dir = start_guard(tmp_path, COUNT_SIGTERMS)
    if target == "guard's process":
        os.kill(process.pid, signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGTERM)
    returncode, stdout, stderr = finish_guard(process)
    assert (returncode, stdout.strip()) == (0, "SIGTERM received 1 times"), stderr
    assert len(set(job_status.read_rank_pids(status_dir))) == 2  # the guard forked
    assert not job_status.has_failure(status_dir, 0), job_status.read_failures(status_dir)


START_A_PROCESS = """
import subprocess, sys, time
started = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("ready", flush=True)
print(started.pid, flush=True)
time.sleep(60)
"""


def is_running(pid):
    """Returns True while process `pid` exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_to_the_guards_group_reaches_the_processes_the_script_started(tmp_path):
    """MPI launchers stop a rank with SIGKILL to its process group, so that the processes the
    rank started die too; that holds though the script runs in a group of its own."""
    process, _ = start_guard(tmp_path, START_A_PROCESS)
    started_pid = int(process.stdout.readline())
    os.killpg(process.pid, signal.SIGKILL)
    finish_guard(process)
    deadline = time.monotonic() + 5
    while is_running(started_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    running = is_running(started_pid)
    if running:
        os.kill(started_pid, signal.SIGKILL)
    assert not running, "the script's own process outlived the SIGKILL to its rank's group"


def test_a_rank_that_exits_non_zero_while_its_job_is_stopped_was_stopped(tmp_path):
    """The script leaves through os._exit(3) from its own SIGTERM handler when the job is stopped
    (SIGTERM to the guard's process group): that rank was stopped; no failure is on record."""
    process, status_dir = start_guard(tmp_path, EXIT_3_ON_SIGTERM)
    os.killpg(process.pid, signal.SIGTERM)
    returncode, _, stderr = finish_guard(process)
    assert returncode == 3, stderr
    assert not job_status.has_failure(status_dir, 0), job_status.read_failures(status_dir)
    assert "failed" not in stderr, stderr


REPORT_SIGCHLD = """
import signal
print("SIGCHLD ignored:", signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN)
"""


def ignore_sigchld():
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)


def test_a_rank_started_with_sigchld_ignored_is_still_watched(tmp_path):
    """Started with SIGCHLD ignored (inherited), the guard still forks, waits for its child and
    ends as it ended; the script sees SIGCHLD ignored, as it would alone."""
    process, status_dir = start_guard(tmp_path, REPORT_SIGCHLD, preexec_fn=ignore_sigchld)
    returncode, stdout, stderr = finish_guard(process)
    assert (returncode, stdout.strip()) == (0, "SIGCHLD ignored: True"), stderr
    assert len(set(job_status.read_rank_pids(status_dir))) == 2  # the guard forked


def run_watch_harness(mode, **popen_args):
    """Runs watch_harness.py in `mode` on the installed rank_watch.py, in a session of its own;
    returns (exit code, stdout lines, stderr)."""
    rank_watch_path = os.path.join(os.path.dirname(rank_guard.GUARD_PATH), "rank_watch.py")
    popen_args.setdefault("stdin", subprocess.DEVNULL)
    process = subprocess.Popen([sys.executable, WATCH_HARNESS, rank_watch_path, mode],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True, universal_newlines=True, **popen_args)
    returncode, stdout, stderr = finish_guard(process)
    return returncode, stdout.splitlines(), stderr


def test_the_watching_parent_ends_as_the_child_though_its_report_fails_and_stderr_is_gone():
    returncode, lines, stderr = run_watch_harness("broken-stderr")
    assert "ended 7 seen []" in lines, stderr
    assert returncode == 7, stderr


def test_a_process_running_other_threads_is_not_forked():
    """Forking a threaded process can leave the child holding a lock no thread will release
    (sok1x imported first starts OpenBLAS's threads): the script runs in the guard's process."""
    returncode, lines, stderr = run_watch_harness("thread")
    assert returncode == 7, stderr
    assert [line.split()[:2] for line in lines] == [["watched", "False"]], (lines, stderr)


def take_controlling_terminal():
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_a_process_in_the_foreground_of_a_terminal_is_not_forked():
    """In a process group of its own the script would lose the terminal (reading it would stop
    the script): a process in the terminal's foreground runs the script itself."""
    terminal, terminal_end = os.openpty()
    try:
        returncode, lines, stderr = run_watch_harness(
            "plain", stdin=terminal_end, preexec_fn=take_controlling_terminal)
    finally:
        os.close(terminal_end)
        os.close(terminal)
    assert returncode == 7, stderr
    assert [line.split()[:2] for line in lines] == [["watched", "False"]], (lines, stderr)


@pytest.mark.parametrize("mode", ["signal-parent-after-fork", "signal-group-from-child"])
def test_a_stop_signal_in_the_moment_after_the_fork_is_not_lost_on_the_parent(mode):
    """A stop signal (SIGUSR1) that reaches the parent before fork_watched has its handlers in
    place waits for them (it neither runs the handler the parent had, nor its default action), and
    the script's process handles it exactly once: forwarded by the parent, though the child was
    still in the parent's process group when it was sent."""
    returncode, lines, stderr = run_watch_harness(mode)
    assert returncode == 7, stderr
    child_pids = [int(line.split()[2]) for line in lines if line.startswith("watched True ")]
    handled_in = [int(line.split()[2]) for line in lines if line.startswith("SIGUSR1 in ")]
    assert len(child_pids) == 1, (lines, stderr)
    assert handled_in == child_pids, (lines, stderr)
    assert "ended 7 seen [%d]" % signal.SIGUSR1 in lines, (lines, stderr)


def test_the_guard_alone_aborts_a_plain_mpiexec_job():
    mpiexec = mpi_launcher.find_mpiexec()
    finished = launch(["-np", "2", sys.executable, "-m", "sok1x.launch.rank_guard", FAIL_ONE_RANK,
                       "raise-in-barrier"], command=[mpiexec])
    assert finished.returncode != 0, explain(finished)
    assert finished.seconds < FAILED_JOB_LIMIT_S, explain(finished)
    assert "sok1x-run: rank 1 failed: ValueError" in finished.stderr, explain(finished)


def test_a_missing_launcher_is_a_clear_error():
    finished = launch(["-np", "2", REPORT_RANK],
                      env_changes={mpi_launcher.MPIEXEC_VARIABLE: "/nonexistent"})
    assert finished.returncode == runner.LAUNCH_ERROR_CODE, explain(finished)
    assert "SOK1X_MPIEXEC=/nonexistent" in finished.last_stderr_line
    assert "Traceback" not in finished.stderr


def test_dry_run_prints_the_command_and_starts_nothing():
    finished = launch(["-np", "2", "--dry-run", "--mpiexec-args=-hosts a,b", REPORT_RANK, "a b"])
    assert finished.returncode == 0, explain(finished)
    line = finished.stdout.strip()
    assert "NCCL_NVLS_ENABLE=0" in line
    assert re.search(r" -hosts a,b -np 2 \S*python\S* \S*rank_guard\.py ", line), line
    assert line.endswith("%s 'a b'" % REPORT_RANK)
    assert "REPORT" not in finished.stdout


def test_dry_run_with_open_mpi_adds_its_flags_and_exports(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 5.0.3'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    finished = launch(["-np", "512", "--dry-run", REPORT_RANK],
                      env_changes={mpi_launcher.MPIEXEC_VARIABLE: str(fake)})
    assert finished.returncode == 0, explain(finished)
    line = finished.stdout.strip()
    assert "--oversubscribe" in line
    assert "-x NCCL_NVLS_ENABLE" in line and "-x SOK1X_RUN_STATUS_DIR" in line
    assert ("--allow-run-as-root" in line) == (os.geteuid() == 0)


def test_mpich_needs_no_flags_even_as_root():
    assert mpi_launcher.launcher_flags(mpi_launcher.MPICH, 64, ["A"], True, 2) == []


def test_command_line_splits_at_the_script():
    assert runner.split_command_line(["-np", "4", "--dry-run", "train.py", "-np", "8"]) == (
        ["-np=4", "--dry-run"], None, "train.py", ["-np", "8"])
    assert runner.split_command_line(["-n", "2", "-m", "pkg.train", "--lr", "0.1"]) == (
        ["-n=2"], "pkg.train", None, ["--lr", "0.1"])
    assert runner.split_command_line(["-np=2", "--", "-odd-name.py"]) == (
        ["-np=2"], None, "-odd-name.py", [])


def _finished_job(returncode, output):
    return JobResult(returncode, "", output)


def test_open_mpi_signal_report_names_the_rank():
    output = ("prterun noticed that process rank 3 with PID 7349 on node gpu7 exited on\n"
              "signal 11 (Segmentation fault).\n")
    failure = failure_report.explain_failure(_finished_job(139, output), None)
    assert failure.exit_code == 1
    assert failure.message.startswith("rank 3 (PID 7349 on gpu7) was killed by signal 11")


def test_open_mpi_exit_report_names_the_rank():
    for name in ("[prterun-vm-7362@1,2]", "[[36262,1],2]"):
        output = ("prterun detected that one or more processes exited with non-zero status,\n"
                  "thus causing the job to be terminated. The first process to do so was:\n\n"
                  "   Process name: %s\n   Exit code:    7\n" % name)
        failure = failure_report.explain_failure(_finished_job(7, output), None)
        assert (failure.exit_code, failure.message) == (7, "rank 2 exited with code 7")


def test_hydra_report_maps_the_process_id_to_a_rank(tmp_path):
    job_status.record_start(str(tmp_path), 5, 4206, 4207)  # the guard's process, the script's
    output = ("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
              "=   PID 4206 RUNNING AT node3\n=   EXIT CODE: 9\n"
              "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n")
    failure = failure_report.explain_failure(_finished_job(9, output), str(tmp_path))
    assert failure.message == "rank 5 (PID 4206 on node3) was killed by signal 9 (SIGKILL)"


def test_the_first_recorded_failure_wins(tmp_path):
    job_status.record_failure(str(tmp_path), 1, 4, "ValueError: first")
    time.sleep(0.01)
    job_status.record_failure(str(tmp_path), 0, 1, "RuntimeError: second")
    failure = failure_report.explain_failure(_finished_job(4, ""), str(tmp_path))
    assert (failure.exit_code, failure.message) == (
        4, "rank 1 failed (exit code 4): ValueError: first")


HYDRA_NAMES_4206 = ("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
                    "=   PID 4206 RUNNING AT node3\n=   EXIT CODE: 9\n"
                    "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n")


def test_the_first_death_wins_over_later_failures_and_mpiexecs_report(tmp_path):
    job_status.record_start(str(tmp_path), 0, 4206, 4207)
    job_status.record_failure(str(tmp_path), 0, 1, "killed by signal 9 (SIGKILL)", when=100.2,
                              pid=4207, host="node3", signal_number=9)
    job_status.record_failure(str(tmp_path), 2, 1, "RuntimeError: peer gone", when=100.1)
    job_status.record_failure(str(tmp_path), 1, 1, "killed by signal 11 (SIGSEGV)", when=100.0,
                              pid=4301, host="node3", signal_number=11)
    failure = failure_report.explain_failure(_finished_job(9, HYDRA_NAMES_4206), str(tmp_path))
    assert failure.exit_code == 1
    assert failure.message.startswith(
        "rank 1 (PID 4301 on node3) was killed by signal 11 (SIGSEGV): a crash in native code")


def test_a_death_by_os_exit_keeps_its_exit_code(tmp_path):
    job_status.record_failure(str(tmp_path), 3, 5, "exited with code 5 without a Python "
                              "exception (os._exit, or exit() in native code)", pid=77, host="n1")
    failure = failure_report.explain_failure(_finished_job(5, ""), str(tmp_path))
    assert (failure.exit_code, failure.message) == (5, (
        "rank 3 (PID 77 on n1) exited with code 5 without a Python exception (os._exit, or "
        "exit() in native code)"))
