"""Jobs that dump into, or load from, one folder take turns (DESIGN D8): a dump reads the
folder's manifest, writes its shards and a manifest that keeps every other table, then removes
the shards it replaced. Two jobs doing that at once would each write a manifest without the
other's tables (and remove shards the other's manifest names), so rank 0 of each job holds an
flock on the folder's lock file ('.sok1x-dump.lock') while its job dumps (exclusive) or loads
(shared). The kernel lets a lock go when its process dies, so a killed job never leaves one."""
import contextlib
import fcntl
import os

from sok1x.errors import CheckpointError

LOCK_NAME = ".sok1x-dump.lock"


def _take(path, exclusive):
    """Opens and flocks `path`/LOCK_NAME; returns (file or None, CheckpointError or None)."""
    handle = None
    try:
        if exclusive:
            os.makedirs(path, exist_ok=True)
        elif not os.path.isdir(path):
            return None, None  # nothing there to load: the load names what is missing
        handle = open(os.path.join(path, LOCK_NAME), "a")
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        return handle, None
    except OSError as exc:
        if handle is not None:
            handle.close()
        if not exclusive:
            return None, None  # a read-only folder: a load goes on without the lock
        return None, CheckpointError("rank 0 cannot lock folder %s for sok1x.dump (%s): it "
                                     "must be writable" % (path, exc))


@contextlib.contextmanager
def folder_locked(host, path, exclusive):
    """Collective: runs the block on every rank while rank 0 holds the lock of folder `path`
    (exclusive: a dump; else shared: a load). Ranks enter once rank 0 holds it; rank 0 lets
    it go once every rank left the block. Raises CheckpointError on every rank if rank 0
    cannot take it for a dump."""
    handle, error = _take(path, exclusive) if host.rank == 0 else (None, None)
    try:
        host.raise_together(error, "locking %s" % path)
        yield
        host.barrier()  # every rank's manifest written and replaced shards removed
    finally:
        if handle is not None:
            handle.close()
