"""What a TensorFlow checkpoint's index says of sok1x's shard files (DESIGN D8): the shard
generations it names (engine/checkpoint/generations.py), read before a save, so the save writes
beside them and removes only files no checkpoint names; and, after a save, a thread that removes
the replaced generation once TensorFlow's new index names the new one."""
import os
import threading
import time

from sok1x.engine.checkpoint import generations
from sok1x.engine.checkpoint import manifest as checkpoint_manifest
from sok1x.errors import CheckpointError
from sok1x.graph_ops import shared_checkpoint_dir
from sok1x.graph_ops.tf_compat import tf1

_POLL_S = 0.005


def named_generations(prefix, names):
    """The shard generations that the checkpoint at `prefix` names for tables `names`: a sorted
    list ([] where there is no checkpoint at `prefix`), or None where its index is there but
    cannot be read (nothing may then be removed)."""
    if not os.path.exists(prefix + ".index"):
        return []
    try:
        reader = tf1.train.NewCheckpointReader(prefix)
        manifests = [checkpoint_manifest.decode(reader.get_tensor("%s/sok1x_table" % name),
                                                prefix)
                     for name in names if reader.has_tensor("%s/sok1x_table" % name)]
    except (tf1.errors.OpError, CheckpointError, ValueError):
        return None
    return generations.live_generations(os.path.basename(prefix), manifests)


def remove_replaced_when_indexed(prefix, names, letter, seconds, then=None, temporary=None):
    """Starts a thread that waits for TensorFlow to merge this save's checkpoint at `prefix`
    (its index rewritten); then, where the index names generation `letter` for tables `names`,
    it removes the prefix's shards of every other generation (else the next save does). It calls
    `then()` (shared_checkpoint_dir's turn) once it read the index, or after `seconds`.
    temporary: the save's own temporary directory (a sharded Saver's;
    shared_checkpoint_dir.MergeWatch)."""
    merge = shared_checkpoint_dir.MergeWatch(prefix, temporary)

    def watch():
        deadline = time.monotonic() + seconds
        try:
            while not merge.merged():
                if time.monotonic() > deadline:
                    return
                time.sleep(_POLL_S)
            if named_generations(prefix, names) == [letter]:
                generations.remove_stale(os.path.dirname(os.path.abspath(prefix)),
                                         os.path.basename(prefix), {letter})
        finally:
            if then is not None:
                then()
    # a thread that hands a turn on keeps the interpreter until it did (a save right before
    # the program ends: the next rank waits for it)
    threading.Thread(target=watch, name="sok1x-saver-generations",
                     daemon=then is None).start()
