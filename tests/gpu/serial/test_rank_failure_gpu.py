"""One GPU rank fails mid-step while its peers wait in an NCCL all-to-all: the job ends within
the bound, with the failing rank's message (serial pytest that starts its own MPI jobs of 2 ranks,
and 4 for a stalled rank, one GPU each; jobs that need more GPUs than the machine has are skipped:
`python3 -m pytest tests/gpu/serial`, or tests/gpu/run_all.sh)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("pycuda")
JOBS = os.path.join(os.path.dirname(__file__), "jobs")
NCCL_TIMEOUT_S = 10
# Start-up (CUDA, NCCL) plus the failure: killed and raising ranks end the job within seconds;
# a stalled one after NCCL_TIMEOUT_S plus NCCL's abort (at most 10 s).
JOB_LIMIT_S = 60
HANG_TIMEOUT_S = 240


def visible_gpus():
    import pycuda.driver as driver
    driver.init()
    return driver.Device.count()


def needs_gpus(count):
    return pytest.mark.skipif(visible_gpus() < count, reason="needs %d GPUs" % count)


def run_job(mode, ranks=2):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               SOK1X_NCCL_TIMEOUT_S=str(NCCL_TIMEOUT_S))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    command = [shutil.which("mpiexec"), "-n", str(ranks), sys.executable,
               os.path.join(JOBS, "nccl_peer_fails.py"), mode]
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=HANG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail("the %s job hung for %d s:\n%s" % (mode, HANG_TIMEOUT_S, stderr[-4000:]))
    seconds = time.monotonic() - started
    explain = "%s: exit %s after %.1f s\nstdout:\n%s\nstderr:\n%s" % (
        mode, process.returncode, seconds, stdout.decode(errors="replace"),
        stderr.decode(errors="replace")[-6000:])
    return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace"), \
        seconds, explain


@needs_gpus(2)
def test_both_ranks_finish_when_nothing_fails():
    code, stdout, _, _, explain = run_job("clean")
    assert code == 0 and stdout.count("finished") == 2, explain


@needs_gpus(2)
def test_a_killed_rank_ends_the_job():
    code, stdout, _, seconds, explain = run_job("kill-9")
    assert code != 0 and seconds < JOB_LIMIT_S, explain
    assert "rank 0 finished" not in stdout, explain


@needs_gpus(2)
def test_a_raising_rank_ends_the_job_with_its_message():
    code, stdout, stderr, seconds, explain = run_job("raise")
    assert code != 0 and seconds < JOB_LIMIT_S, explain
    lines = re.findall(r"^sok1x: rank 1 failed: (.*)$", stderr, re.M)
    assert lines == ["RuntimeError: rank 1 broke mid-step"], explain


@pytest.mark.parametrize("ranks", [pytest.param(2, marks=needs_gpus(2)),
                                   pytest.param(4, marks=needs_gpus(4))])
def test_a_stalled_peer_times_the_waiting_rank_out(ranks):
    """The last rank stays alive and never joins; the others wait for the all-to-all's output
    (to_host, as a lookup waits for its counts). The first to give up names the timeout and
    aborts the job, which ends the rest: the stalled rank, if it reports at all, reports the
    SIGTERM that ended it, never a timeout of its own."""
    code, stdout, stderr, seconds, explain = run_job("stall", ranks)
    assert code != 0 and seconds < JOB_LIMIT_S + NCCL_TIMEOUT_S, explain
    lines = re.findall(r"^sok1x: rank (\d+) failed: (.*)$", stderr, re.M)
    waiting = [line for rank, line in lines if int(rank) < ranks - 1]
    stalled = [line for rank, line in lines if int(rank) == ranks - 1]
    assert waiting and all("CommError" in line and "timed out" in line for line in waiting), \
        explain
    assert all(line == "killed by SIGTERM" for line in stalled), explain
