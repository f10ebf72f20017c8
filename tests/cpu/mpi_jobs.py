"""Runs a script as a real MPI job from a serial test, with a time limit so a hang fails."""
import os
import shutil
import signal
import subprocess
import sys
import time

JOBS = os.path.join(os.path.dirname(__file__), "jobs")


def lane_a_only(why="no TensorFlow in it"):
    """A pytest mark for a test CI needs in one lane only: scripts/test.sh runs the serial tests
    in two lanes that differ by TensorFlow, and with SOK1X_TEST_LANE=B (lane B) such a test is
    left to lane A. `why`: what makes one lane enough (by default: it runs no TensorFlow). Run
    alone, it runs."""
    import pytest
    return pytest.mark.skipif(os.environ.get("SOK1X_TEST_LANE") == "B",
                              reason="%s: CI runs it in lane A" % why)


def mpiexec():
    """Returns the mpiexec next to this Python (the mpich wheel's) or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def tensorflow_version():
    """(major, minor) of the TensorFlow installed here."""
    from sok1x.graph_ops import tf_compat
    return tf_compat.VERSION


def skip_before_tensorflow(version, what):
    """Skips the calling test, saying why, on a TensorFlow older than `version` ((major,
    minor)), which lacks `what` (e.g. TensorFlow 2's eager API, which TensorFlow 1.15 lacks)."""
    if tensorflow_version() < tuple(version):
        import pytest
        from sok1x.graph_ops import tf_compat
        pytest.skip("TensorFlow %s has no %s (%d.%d+)" % (tf_compat.tf.__version__, what,
                                                         version[0], version[1]))


def skip_where_the_seam_cannot_run(seam):
    """Skips the calling test, saying why, when `seam` (a SOK1X_SEAM value or None) cannot run on
    the TensorFlow installed here: "dlpack", the zero-copy seam, needs TensorFlow >= 2.2's
    tf.experimental.dlpack, which TensorFlow 1.15 lacks (its ops cross by host staging, which
    the same tests run with seam "host")."""
    if seam != "dlpack":
        return
    import pytest
    from sok1x.graph_ops import tf_compat
    if not tf_compat.HAS_DLPACK:
        pytest.skip("TensorFlow %s has no DLPack (tf.experimental.dlpack, 2.2+): the zero-copy "
                    "seam cannot run; the host-staging cases run instead"
                    % tf_compat.tf.__version__)


def run_job(ranks, script, *args, timeout=240, seam=None):
    """Runs jobs/<script> on `ranks` ranks (seam: None, or the SOK1X_SEAM to force); returns
    the CompletedProcess (text output). Skips the test where `seam` cannot run here."""
    skip_where_the_seam_cannot_run(seam)
    command = [mpiexec(), "-n", str(ranks), sys.executable, os.path.join(JOBS, script)]
    command += [str(a) for a in args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if seam is not None:
        env["SOK1X_SEAM"] = seam
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def run_passing_job(ranks, seam, script, done_line, *args, timeout=600):
    """Runs jobs/<script> on `ranks` ranks through `seam`, asserts that it exited 0 and printed
    `done_line` (its last check's mark); returns the CompletedProcess."""
    result = run_job(ranks, script, *args, timeout=timeout, seam=seam)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert done_line in result.stdout
    return result


class JobHung(AssertionError):
    """A job outlived its time limit (it was stopped)."""


class Finished:
    """How a job ended: returncode, stdout, stderr (text), seconds (wall time), ended (its
    time.time() at the end, to set against times the job printed)."""

    def __init__(self, returncode, stdout, stderr, seconds):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.seconds = seconds
        self.ended = time.time()

    @property
    def last_stderr_line(self):
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def explain(self):
        return "exit %s after %.1f s\nstdout:\n%s\nstderr:\n%s" % (
            self.returncode, self.seconds, self.stdout, self.stderr[-8000:])


def run_stoppable(command, env, timeout):
    """Runs `command` (a launcher and its ranks) in a session of its own; returns Finished.
    A job still running after `timeout` s is stopped (SIGTERM to the session, so mpiexec stops
    its ranks, then SIGKILL) and JobHung is raised."""
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        tail = stderr.decode("utf-8", "replace")[-4000:]
        raise JobHung("%s hung for %d s:\n%s" % (" ".join(command), timeout, tail)) from None
    return Finished(process.returncode, stdout.decode("utf-8", "replace"),
                    stderr.decode("utf-8", "replace"), time.monotonic() - started)
