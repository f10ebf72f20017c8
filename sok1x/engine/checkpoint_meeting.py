"""The meeting that opens a checkpoint save (DESIGN D8): every rank arrives, within a deadline,
naming the same tables in the same order.

A save is collective, so a save only some ranks run (checkpoint_dir given on rank 0 alone, say)
must fail with advice instead of waiting forever in the first collective, and two ranks saving
different tables at once (TensorFlow ran their save ops in another order) must fail instead of
mixing rows. The meeting is point-to-point with a tag of its own, so it never pairs with a
collective of the communicator.
"""
import time

from sok1x.engine import runtime as _runtime
from sok1x.errors import CheckpointError

_MEET_TAG = 0x5C0C
ABORT_GRACE_SECONDS = 10.0


def _wait_all(pending, deadline):
    """Waits for the requests {peer: request}; returns {peer: payload} and the peers that never
    answered by `deadline` (time.monotonic())."""
    got = {}
    while pending and time.monotonic() < deadline:
        for peer, request in list(pending.items()):
            done, payload = request.test()
            if done:
                got[peer] = payload
                del pending[peer]
        if pending:
            time.sleep(0.002)
    return got, sorted(pending)


def meet(what, timeout, table_names=()):
    """Collective with a deadline: returns once every rank has called meet() with the same
    `table_names`; raises CheckpointError on every rank that got here if they differ, or
    (naming the ranks that never came, and aborting the job soon: they wait in a collective
    that cannot be called off) if some rank has not come within `timeout` seconds."""
    names = list(table_names)
    with _runtime.entered() as rt:
        comm, size = rt.host.comm, rt.size
        if size == 1:
            return
        deadline = time.monotonic() + float(timeout)
        if rt.rank == 0:
            pending = {peer: comm.irecv(source=peer, tag=_MEET_TAG) for peer in range(1, size)}
        else:
            sent = comm.isend((rt.rank, names), dest=0, tag=_MEET_TAG)
            pending = {0: comm.irecv(source=0, tag=_MEET_TAG)}
        got, missing = _wait_all(pending, deadline)
        if missing:
            error = CheckpointError(
                "%s: rank %d waited %.0f s for rank(s) %s to join it, and they did not. A save "
                "of sok1x tables is collective: every rank must run it at the same step. With "
                "MonitoredTrainingSession give checkpoint_dir (and the same "
                "save_checkpoint_steps; not save_checkpoint_secs, whose timers differ per rank) "
                "on EVERY rank: each rank writes its own shard of every table. The wait is "
                "SOK1X_CHECKPOINT_TIMEOUT seconds." % (what, rt.rank, float(timeout), missing))
            _abort_soon(comm, error)
            raise error
        if rt.rank == 0:
            differ = ["rank %d: %s" % (peer, payload[1]) for peer, payload in sorted(got.items())
                      if payload[1] != names]
            verdict = None if not differ else (
                "%s: ranks save different tables at once (rank 0: %s; %s): their save ops ran "
                "in another order. Save the same tables, with one Saver, on every rank"
                % (what, names, "; ".join(differ)))
            for request in [comm.isend(verdict, dest=peer, tag=_MEET_TAG)
                            for peer in range(1, size)]:
                request.wait()
        else:
            sent.wait()
            verdict = got[0]
        if verdict is not None:
            raise CheckpointError(verdict)


def _abort_soon(comm, error):
    """The ranks that did not come to a save wait inside a collective for this one, and MPI
    cannot call them back: the job cannot go on. The error is raised here; the job is aborted
    when this process exits (before MPI_Finalize, which would wait for them forever), or
    ABORT_GRACE_SECONDS later if it is still running, so it never hangs."""
    import atexit
    import sys
    import threading

    def abort():
        sys.stderr.write("sok1x: aborting the MPI job: %s\n" % error)
        sys.stderr.flush()
        comm.Abort(1)

    def abort_later():
        time.sleep(ABORT_GRACE_SECONDS)
        abort()
    atexit.register(abort)
    threading.Thread(target=abort_later, name="sok1x-abort", daemon=True).start()
