"""Saves and restores that only rank 0 runs (the Horovod idiom, DESIGN D8): the other ranks meet
them at their next op header and take part.

A rank that saves or restores sok1x tables opens with a marker: an op header whose op is
CHECKPOINT (exchange_header.exchange_marker), on the same channel and of the same shape as every
op's header. Ranks in an op see it in that op's header (exchange_header calls join_if_asked):
  - every rank sent CHECKPOINT: every rank saves (or restores) as it was asked to, its own way
    (its own folder, its own manifest);
  - rank 0 sent CHECKPOINT and some ranks are in an op (or at their farewell, see below): rank 0
    broadcasts what it does, those ranks do it with it (write their shards beside rank 0's
    checkpoint, or read rank 0's manifest), then go back to their op's header;
  - a rank other than 0 sent CHECKPOINT but rank 0 did not: every rank raises CheckpointError
    with advice at once (the idiom is rank 0's).
Ranks that joined a save of rank 0 know rank 0 checkpoints alone, so at exit they say farewell:
one more marker, so a save rank 0 makes after the last step (MonitoredTrainingSession saves when
it closes) still finds them. A marker that nobody answers (the other ranks never reach a sok1x op
again) fails with advice after SOK1X_CHECKPOINT_TIMEOUT seconds (the job is aborted: the others
cannot be called back out of what they wait in).
"""
import atexit
import os
import sys
import threading

import numpy as np

from sok1x.engine import checkpoint, runtime
from sok1x.engine.checkpoint import generations
from sok1x.engine.lookup import bounded_step, exchange_header
from sok1x.engine.tables import shard_rows
from sok1x.engine.op_keys import name_key
from sok1x.errors import CheckpointError

CHECKPOINT_KEY = name_key("sok1x checkpoint marker")
FAREWELL_KEY = name_key("sok1x farewell marker")
TIMEOUT_ENV = "SOK1X_CHECKPOINT_TIMEOUT"
_farewell = {"registered": False}


def timeout():
    """Seconds a marker waits for the other ranks (SOK1X_CHECKPOINT_TIMEOUT, default 60)."""
    return float(os.environ.get(TIMEOUT_ENV, 60.0))


class _Deadline:
    """Aborts the job with `advice` if the block has not ended within `seconds`."""

    def __init__(self, rt, seconds, advice):
        self._done = threading.Event()
        self._rt, self._seconds, self._advice = rt, seconds, advice

    def __enter__(self):
        def watch():
            if not self._done.wait(self._seconds):
                sys.stderr.write("sok1x: aborting the MPI job: rank %d waited %.0f s: %s\n"
                                 % (self._rt.rank, self._seconds, self._advice))
                sys.stderr.flush()
                self._rt.host.comm.Abort(1)
        threading.Thread(target=watch, name="sok1x-checkpoint-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._done.set()


_ADVICE = (
    "CheckpointError: a sok1x save or restore on rank %d waits for ranks %s, which never reached "
    "a sok1x op again. Either run the save on EVERY rank (checkpoint_dir / saver.save on every "
    "rank, the same save_checkpoint_steps; not save_checkpoint_secs), or on rank 0 only while "
    "the other ranks go on training or leave through sok1x's farewell at exit (not blocked in "
    "another collective). The wait is SOK1X_CHECKPOINT_TIMEOUT seconds.")


def _lone_savers_error(keys):
    savers = [r for r, key in enumerate(keys) if key == CHECKPOINT_KEY]
    return CheckpointError(
        "rank(s) %s save or restore sok1x tables while rank 0 does not. A save of sok1x tables "
        "is collective: run it on every rank, or on rank 0 alone (checkpoint_dir / saver.save "
        "on rank 0 only, the Horovod idiom): the other ranks then take part at their next "
        "step." % savers)


def open_checkpoint(rt, description):
    """Collective opening of a save or restore that this rank runs. description: dict with
    "kind" ("save" or "restore"), "names" and what perform() needs. Returns (description to
    perform here, whether every rank runs it itself). Raises CheckpointError on every rank that
    got here if rank 0 does not run it, or if ranks name other tables."""
    if rt.size == 1:
        return description, True
    bounded_step.read_left(rt)  # as an op header does first: its peers may be in one
    with _Deadline(rt, timeout(), _ADVICE % (rt.rank, "that did not come")):
        keys = exchange_header.exchange_marker(rt, CHECKPOINT_KEY)
    if keys[0] != CHECKPOINT_KEY:
        raise _lone_savers_error(keys)
    everyone = bool(np.all(keys == CHECKPOINT_KEY))
    if not everyone:
        rt.host.broadcast_object(description if rt.rank == 0 else None)
        _register_farewell(rt)
    seen = rt.host.all_gather_object((description["kind"], description["names"]))
    savers = [(r, s) for r, s in enumerate(seen) if keys[r] == CHECKPOINT_KEY]
    if any(s != savers[0][1] for _, s in savers):
        raise CheckpointError(
            "ranks %s at once: %s. Save and restore the same tables, with one Saver, on every "
            "rank" % ("disagree on the sok1x tables they checkpoint", "; ".join(
                "rank %d: %s %s" % (r, kind, names) for r, (kind, names) in savers)))
    return description, everyone


def join_if_asked(rt, keys, own_key):
    """Called by every op header with the op keys it received: if rank 0 opened a save or
    restore that this rank does not run, takes part in it and returns True (the caller then
    repeats its header); returns False otherwise. Raises CheckpointError if a rank other than 0
    checkpoints alone."""
    if own_key == CHECKPOINT_KEY:
        return False
    if keys[0] != CHECKPOINT_KEY:
        if np.any(keys == CHECKPOINT_KEY):
            raise _lone_savers_error(keys)
        return False
    description = rt.host.broadcast_object(None)
    _register_farewell(rt)
    rt.host.all_gather_object((description["kind"], description["names"]))
    perform(description)
    return True


def perform(description):
    """Runs the save or restore `description` on this rank (collective with the other ranks
    running it). Returns the manifest of a save, None for a restore. A save's description may
    name, under "gather", [table name, number of keys] pairs of tables (without hash table)
    whose every row the saving ranks need (to write them back into the TensorFlow variables
    those tables stand for): every rank sends its rows inside the save, which rank 0 may run
    alone, and the manifest gains "gathered": {name: float32 [keys, dim]}, and "generation":
    the letter of its shard files. A save's "live" is the letters of the shards the prefix's
    TensorFlow index names ([] for none, None where it could not be read)."""
    if description["kind"] == "save":
        stem, directory = description["stem"], description["directory"]
        # Never over the live checkpoint's files: a save killed before TensorFlow's index
        # leaves the previous checkpoint whole (engine/checkpoint/generations.py).
        letter = generations.open_generation(runtime.get().host, directory, stem,
                                             description.get("live"))
        manifest = checkpoint.save_shards(
            directory, stem, description["names"],
            name_file=lambda index, rank: checkpoint.saver_shard_name(stem, index, rank,
                                                                      letter))
        gathered = {name: shard_rows.gather_all(name, keys)
                    for name, keys in description.get("gather", ())}
        return dict(manifest, gathered=gathered, generation=letter)
    checkpoint.load_shards(description["directory"], description["manifests"],
                           description["where"], description["names"])
    return None


exchange_header.handle_markers_with(join_if_asked)


def _register_farewell(rt):
    """Once this job checkpoints on rank 0 alone: at exit, meet rank 0 once more (a last save
    of rank 0 finds this rank there), unless this rank is failing."""
    if _farewell["registered"]:
        return
    _farewell["registered"] = True
    rank_process = os.getpid()

    def farewell():
        from sok1x.engine import failure_guard
        if os.getpid() != rank_process:  # a process forked from the rank: no rank of the job
            return
        state = failure_guard._state
        if state["failing_thread"] is not None or state["exit_code"] not in (None, 0, False):
            return
        if not runtime.is_initialized():
            return
        with runtime.entered() as current:
            with _Deadline(current, timeout(), _ADVICE % (current.rank, "at their farewell")):
                bounded_step.read_left(current)  # as an op header does first
                while True:
                    keys = exchange_header.exchange_marker(current, FAREWELL_KEY)
                    if not join_if_asked(current, keys, FAREWELL_KEY):
                        break
    atexit.register(farewell)
