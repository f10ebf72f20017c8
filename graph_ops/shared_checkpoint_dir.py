"""Ranks that save TensorFlow checkpoints into one directory take turns (DESIGN D8).

Every rank runs the Saver (a save of sok1x tables is collective). TensorFlow 2.x's sharded Saver
writes through a fixed temporary directory "<prefix>_temp/" that its merge step deletes, so two
ranks saving into one directory at once break each other's save; TensorFlow 1.15's names its
directory "<prefix>_temp_<uuid>/", but its merge rewrites the index file in place, and a rank
reading the index then (saver_index's watcher) crashes TensorFlow's checkpoint reader. The
table's saveable knows the shard file name it is written to; from it, the ranks that see one
directory find each other (each drops a marker file there) and save one after the other: a rank
starts only once the rank before it has merged its checkpoint (its index file renewed, its
temporary directory gone) and read it, which that rank's watcher reports. Every rank writes the
same bytes, so the last write leaves the same checkpoint as the first.
"""
import os
import re
import time
import uuid

from sok1x.errors import CheckpointError

_TURN_TAG = 0x5C0D
_SHARD_IN_TEMP = re.compile(r"^(?P<prefix>.+)_temp(?P<uuid>_[0-9a-f]+)?%s"
                            r"part-\d+-of-(?P<shards>\d+)$" % re.escape(os.sep))


def _shard_name(sharded_filename):
    """The match of a sharded Saver's shard file name (groups prefix, uuid, shards), or None."""
    return _SHARD_IN_TEMP.match(os.fsdecode(sharded_filename))


def final_prefix(sharded_filename):
    """A sharded Saver's shard file name -> its checkpoint's prefix: '<prefix>_temp/part-00000-
    of-00001' (TensorFlow 2.x) or '<prefix>_temp_<uuid>/part-...' (1.15) -> '<prefix>'; None for
    other names (a Saver that is not sharded)."""
    match = _shard_name(sharded_filename)
    return None if match is None else match.group("prefix")


def _sharing_ranks(host, directory):
    """Collective: the ranks that see `directory` as this rank does (marker files)."""
    token = host.broadcast_object(uuid.uuid4().hex if host.rank == 0 else None)
    mine = os.path.join(directory, ".sok1x-saving-%s-%d" % (token, host.rank))
    try:
        os.makedirs(directory, exist_ok=True)
        with open(mine, "w"):
            pass
    except OSError:
        mine = None
    host.barrier()
    seen = [r for r in range(host.size) if os.path.exists(
        os.path.join(directory, ".sok1x-saving-%s-%d" % (token, r)))]
    host.barrier()
    if mine is not None:
        os.remove(mine)
    return seen


def index_stamp(prefix):
    """The mtime (ns) of checkpoint `prefix`'s index file, or None where there is none."""
    try:
        return os.stat(prefix + ".index").st_mtime_ns
    except OSError:
        return None


class MergeWatch:
    """Whether TensorFlow has merged a save's checkpoint at `prefix` since the watch began
    (merged(), asked again and again): its index changed and the save's temporary files are
    gone (the merge removes them last; reading the index while TensorFlow 1.15 still merges
    crashed its checkpoint reader). temporary: the save's own temporary directory
    (temporary_directory()), where known: the merge is over once it holds no shard part of the
    save (holds_parts), and where its parts were seen and are gone, even if the index's mtime
    did not move (a file system's coarse clock, a rewrite within one of its ticks); else any
    temporary directory of the prefix counts (one a killed save left behind, too)."""

    def __init__(self, prefix, temporary=None):
        self.prefix, self.temporary = prefix, temporary
        self.stamp, self.seen = index_stamp(prefix), False

    def merged(self):
        if self.temporary is None:
            return index_stamp(self.prefix) != self.stamp and not _merging(self.prefix)
        if holds_parts(self.temporary):
            self.seen = True
            return False
        return self.seen or index_stamp(self.prefix) != self.stamp


_PART = re.compile(r"^part-\d+-of-\d+\.(index|data-\d+-of-\d+)$")


def holds_parts(directory):
    """Whether a save's temporary `directory` holds a shard part written whole (its index or
    data file; not the '.tempstate' files of a write cut short, which TensorFlow leaves, and
    which keep the directory from being removed): TensorFlow's merge moves or deletes them all
    before it removes the directory."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(_PART.match(name) for name in names)


def temporary_directory(sharded_filename):
    """The temporary directory a sharded Saver's save writes shard `sharded_filename` into,
    or None for a Saver that is not sharded."""
    if final_prefix(sharded_filename) is None:
        return None
    return os.path.dirname(os.fsdecode(sharded_filename))


def _merging(prefix):
    """Whether a save's temporary directory of `prefix` is there: '<prefix>_temp' (TF 2.x)
    or '<prefix>_temp_<uuid>' (TF 1.15)."""
    directory, base = os.path.split(os.path.abspath(prefix))
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(name == base + "_temp" or name.startswith(base + "_temp_") for name in names)


def _check_one_temporary_directory(sharing, shard):
    """Raises CheckpointError (on every rank of `sharing`, with nothing written yet by this
    module) where ranks sharing a directory save with a Saver of several shards through one
    fixed temporary directory ('<prefix>_temp', TensorFlow 2.x's): only the shard holding
    sok1x's tables can wait for its turn, the others' files meet there and each rank's merge
    takes the others' (TensorFlow 1.15's directory is the save's own: no meeting). shard: the
    _shard_name match of this rank's shard file."""
    if len(sharing) < 2 or shard.group("uuid") or int(shard.group("shards")) < 2:
        return
    prefix = shard.group("prefix")
    raise CheckpointError(
        "ranks %s save %s into one directory with a sharded Saver of %s shards (its variables "
        "placed on several devices), whose files all pass through '%s_temp': only sok1x's "
        "shard can take turns, so the ranks' other shards would meet there. Give each rank "
        "a directory of its own, save on rank 0 only (checkpoint_dir on rank 0, as Horovod "
        "programs do), or leave the variables' device unset (one shard)"
        % (sharing, prefix, shard.group("shards"), os.path.basename(prefix)))


def take_turns(runtime, sharded_filename, timeout):
    """Collective (every rank saving): returns when this rank may write its checkpoint shard
    `sharded_filename`, with a function to call once its checkpoint is merged and read (it
    hands the turn on), or None where no rank waits on this one. Raises CheckpointError if the
    rank before it never finished."""
    host = runtime.host
    shard = _shard_name(sharded_filename) if host.size > 1 else None
    if host.all_gather_object(shard is None).count(True):
        return None  # a non-sharded Saver: each file is renamed into place whole
    prefix = shard.group("prefix")
    sharing = _sharing_ranks(host, os.path.dirname(os.path.abspath(prefix)))
    _check_one_temporary_directory(sharing, shard)
    before = [r for r in sharing if r < host.rank]
    after = [r for r in sharing if r > host.rank]
    if before:
        request = host.comm.irecv(source=before[-1], tag=_TURN_TAG)
        deadline = time.monotonic() + timeout
        while not request.test()[0]:
            if time.monotonic() > deadline:
                raise CheckpointError(
                    "rank %d waited %.0f s for rank %d to finish saving %s into the directory "
                    "they share" % (host.rank, timeout, before[-1], prefix))
            time.sleep(0.002)
    if not after:
        return None
    return lambda: host.comm.send(True, dest=after[0], tag=_TURN_TAG)
