"""Running mpiexec for sok1x-run: output passed through, ranks watched, a failed job stopped.

mpiexec's stdout and stderr are copied to ours byte for byte as they come (the last part of each is
kept, since Open MPI and MPICH say there which process died). Meanwhile the job's status folder is
polled: once a rank has recorded a failure, the job gets `grace_s` to end by itself (the failing
rank calls MPI_Abort, or mpiexec sees it die); after that mpiexec is sent SIGTERM, which makes it
stop every rank, and SIGKILL if it is still running `stop_timeout_s` later. SIGTERM and SIGHUP
sent to sok1x-run are passed on to mpiexec; Ctrl-C stops the job the same way a failure does.
"""
import os
import signal
import subprocess
import sys
import threading
import time

from sok1x.launch import job_status

FAILURE_GRACE_S = 3.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.1
_KEPT_OUTPUT_BYTES = 64 * 1024
_FORWARDED_SIGNALS = ("SIGTERM", "SIGHUP")


class JobResult:
    """How mpiexec ended: returncode, the last part of its stdout and stderr (text), whether
    sok1x-run stopped the job, and the signal (SIGINT, SIGTERM, SIGHUP) that interrupted sok1x-run,
    if one did."""

    def __init__(self, returncode, stdout_tail, stderr_tail, stopped=False, interrupted_by=None):
        self.returncode = returncode
        self.stdout_tail = stdout_tail
        self.stderr_tail = stderr_tail
        self.stopped = stopped
        self.interrupted_by = interrupted_by

    @property
    def output_tail(self):
        """Both kept tails, stdout first: where mpiexec's own report of a dead process is."""
        return self.stdout_tail + "\n" + self.stderr_tail


class _OutputPump(threading.Thread):
    """Copies one of mpiexec's output pipes to our stream and keeps the last bytes for reading."""

    def __init__(self, pipe, sink):
        super().__init__(daemon=True)
        self._pipe = pipe
        self._sink = sink
        self._sink_broken = False
        self.tail = bytearray()

    def run(self):
        descriptor = self._pipe.fileno()
        while True:
            chunk = os.read(descriptor, 65536)
            if not chunk:
                break
            self.tail += chunk
            del self.tail[:-_KEPT_OUTPUT_BYTES]
            if not self._sink_broken:
                try:
                    self._sink.write(chunk)
                    self._sink.flush()
                except (OSError, ValueError):  # our reader went away; keep draining mpiexec
                    self._sink_broken = True
        self._pipe.close()


def _binary_stream(stream):
    return getattr(stream, "buffer", stream)


def stop_job(process, stop_timeout_s=STOP_TIMEOUT_S):
    """Asks mpiexec to stop every rank (SIGTERM), then kills it if it has not exited in time."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=stop_timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _forward_signals(process, received):
    """Passes SIGTERM and SIGHUP on to mpiexec, noting each in `received`; returns the handlers to
    restore afterwards."""
    def forward(signum, _frame):
        received.append(signum)
        if process.poll() is None:
            process.send_signal(signum)

    previous = {}
    for name in _FORWARDED_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is None:
            continue
        try:
            previous[signum] = signal.signal(signum, forward)
        except ValueError:  # not the main thread: leave signals alone
            break
    return previous


def _watch(process, status_dir, grace_s, stop_timeout_s):
    """Waits for mpiexec, stopping the job `grace_s` after a rank records a failure.

    Returns True when sok1x-run stopped the job.
    """
    failure_seen_at = None
    while True:
        try:
            process.wait(timeout=POLL_INTERVAL_S)
            return False
        except subprocess.TimeoutExpired:
            pass
        if failure_seen_at is None:
            if status_dir is not None and job_status.any_failure(status_dir):
                failure_seen_at = time.monotonic()
        elif time.monotonic() - failure_seen_at > grace_s:
            stop_job(process, stop_timeout_s)
            return True


def run_job(command, env, status_dir, grace_s=FAILURE_GRACE_S, stop_timeout_s=STOP_TIMEOUT_S):
    """Runs the mpiexec command to its end, stopping the job if a rank fails; returns a JobResult.

    Raises OSError when mpiexec cannot be started.
    """
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pumps = [_OutputPump(process.stdout, _binary_stream(sys.stdout)),
             _OutputPump(process.stderr, _binary_stream(sys.stderr))]
    for pump in pumps:
        pump.start()
    received = []
    previous_handlers = _forward_signals(process, received)
    try:
        stopped = _watch(process, status_dir, grace_s, stop_timeout_s)
    except KeyboardInterrupt:
        received.append(signal.SIGINT)
        stopped = True
        stop_job(process, stop_timeout_s)
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
    for pump in pumps:
        # A rank that outlived a killed mpiexec may hold the pipe open; do not wait on it forever.
        pump.join(timeout=stop_timeout_s)
    stdout_tail, stderr_tail = (bytes(pump.tail).decode("utf-8", "replace") for pump in pumps)
    return JobResult(process.returncode, stdout_tail, stderr_tail, stopped,
                     received[0] if received else None)
