"""Storage of checkpoint files in a folder (DESIGN D8): a streaming writer and reader of shard
files, each checksummed as it goes, and the atomic write of small files (the manifest).

A file is written by one writer thread, in order, while the caller prepares what comes next, and
read by several I/O threads at once (checkpoint/checksum.py): on Linux a file's writes queue at
its inode lock, its reads do not. Checksums are zlib's crc32, taken block by block on checksum
threads while the writer or reader moves the next blocks (or on that thread itself where there
is one core). A file is written under a temporary name and renamed into place once complete and
on disk (fsync), so a crash leaves either the whole file or none. The reader checks the size the
manifest promises before it reads a byte, and the checksum once it has read the last.
"""
import collections
import concurrent.futures
import os
import queue
import threading
import uuid

import numpy as np

from sok1x.engine.checkpoint import checksum as shard_checksum
from sok1x.errors import CheckpointError

# Bytes an I/O thread (the writer, or a reader) moves at a time: the checksum threads take each
# block's crc32 while it moves the next (and the block is still in the cache), so a save or load
# moves its bytes at a plain write's or read's rate even where zlib.crc32 is slower than the copy
# (the first 1-GPU figures, 2026-11-23, fit about 1 GB/s a thread there).
BLOCK_BYTES = 4 << 20
READ_AHEAD = 2  # file chunks a reader reads ahead of the caller


def _temporary_name(path):
    return "%s.tmp-%s" % (path, uuid.uuid4().hex[:12])


def _joined(running, block_crcs):
    """The crc32 of running's bytes followed by blocks [(Future of a block's crc32, length)]."""
    return shard_checksum.joined(running, [(future.result(), length)
                                           for future, length in block_crcs])


def _write_buffer(descriptor, view, offset):
    """Writes uint8 memoryview `view` at `offset`, block by block, and returns [(Future of a
    block's zlib.crc32, length)] without waiting for them: each block's crc32 is taken on the
    checksum threads while this thread writes the next (on this thread when there are none)."""
    crcs = []
    for start in range(0, view.nbytes, BLOCK_BYTES):
        block, at = view[start:start + BLOCK_BYTES], offset + start
        crcs.append((shard_checksum.submit_crc(block), block.nbytes))
        while block.nbytes:
            written = os.pwrite(descriptor, block, at)
            block, at = block[written:], at + written
    return crcs


def _read_piece(descriptor, piece, offset, verify):
    """Fills uint8 memoryview `piece` from `offset`, block by block, each block's crc32 taken on
    the checksum threads while the next is read; returns (bytes read, [(Future of a block's
    crc32, length)], empty when not `verify`) without waiting for the checksums. Fewer bytes
    only at the end of the file."""
    got, crcs = 0, []
    while got < piece.nbytes:
        block = piece[got:got + BLOCK_BYTES]
        filled = 0
        while filled < block.nbytes:
            count = os.preadv(descriptor, [block[filled:]], offset + got + filled)
            if not count:
                break
            filled += count
        if verify and filled:
            crcs.append((shard_checksum.submit_crc(block[:filled]), filled))
        got += filled
        if filled < block.nbytes:
            break
    return got, crcs


class ShardWriter:
    """Appends buffers to `path` through a temporary file; commit() makes it appear whole.
    The buffers are written in order by one writer thread (engine/checkpoint/checksum.py: a file's
    writes take its inode lock on Linux, so several threads only queue at it) while the caller
    prepares the next, and checksummed block by block on the checksum threads meanwhile.
    in_flight_bytes: how many bytes of earlier buffers may still be in flight when a write
    returns (0: none but the buffer just handed over), so a caller that prepares a chunk while
    earlier ones are written holds at most that many bytes plus what it prepares."""

    def __init__(self, path, in_flight_bytes=0):
        self.path = path
        self._temporary = _temporary_name(path)
        self._handle = open(self._temporary, "wb", buffering=0)
        self._limit = int(in_flight_bytes)
        self._pending = collections.deque()  # (Future of a buffer's block crcs, length)
        self._pending_bytes = 0
        self.size = 0
        self.crc32 = 0

    def write(self, data):
        """Appends `data` (bytes or a NumPy array, written without a copy; it must not change
        until commit returns)."""
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        view = memoryview(data).cast("B")
        self._wait(self._limit - view.nbytes)
        offset = self.size
        self.size += view.nbytes
        self._pending.append((shard_checksum.submit_write(
            _write_buffer, self._handle.fileno(), view, offset), view.nbytes))
        self._pending_bytes += view.nbytes

    def _wait(self, keep=0):
        """Waits for the oldest buffers until at most `keep` bytes are in flight."""
        while self._pending and self._pending_bytes > keep:
            future, length = self._pending.popleft()
            self._pending_bytes -= length
            self.crc32 = _joined(self.crc32, future.result())  # OSError

    def commit(self):
        """Flushes to disk and renames the file into place; returns (size, crc32)."""
        self._wait()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self._temporary, self.path)
        return self.size, self.crc32 & 0xFFFFFFFF

    def _discard_pending(self):
        # Every write is waited for, whatever it raised: the writer thread uses the descriptor.
        for future, _ in self._pending:
            try:
                for crc, _ in future.result():
                    crc.result()
            except Exception:  # the failure being handled is the caller's to report
                pass
        self._pending.clear()

    def discard(self):
        """Drops the temporary file (after a failure)."""
        try:
            self._wait()
        except Exception:  # any write's error: the caller reports its own
            self._discard_pending()
        if not self._handle.closed:
            self._handle.close()
        if os.path.exists(self._temporary):
            os.remove(self._temporary)


class ShardReader:
    """Reads `path` front to back, checksumming what it reads (unless verify=False: a second
    read of a file checked already). Raises CheckpointError naming the file if it is missing or
    not `size` bytes (at open) or fails crc32 `crc32` (at finish())."""

    def __init__(self, path, size, crc32, verify=True):
        self.path = path
        self._expected = (int(size), int(crc32))
        self._verify = verify
        try:
            actual = os.stat(path).st_size
        except OSError as exc:
            raise CheckpointError("checkpoint shard %s is missing or unreadable (%s): the "
                                  "checkpoint is incomplete; restore another one" % (path, exc)
                                  ) from None
        if actual != int(size):
            raise CheckpointError("checkpoint shard %s is %d bytes; the manifest says %d: the "
                                  "file is truncated or was replaced" % (path, actual, size))
        self._handle = open(path, "rb")
        self._crc32 = 0
        self._read = 0
        # Blocks read into buffers whose crc32s the checksum threads may still be taking, in
        # file order: (Future of a block's crc32, length). The I/O threads go on to the next
        # chunk meanwhile; a buffer is filled again only once its own blocks' checksums are
        # taken (_pending_by_buffer), and the finished front is joined into _crc32 then, so
        # the list holds about the blocks of the buffers in flight, whatever the file's size.
        self._pending = collections.deque()
        self._pending_by_buffer = {}
        self._filling = None  # (stop, free, thread) of an open chunks() generator

    def read(self, count):
        """Returns the next `count` bytes (fewer only at the end of the file). Not while a
        chunks() generator is open (its thread joins checksums into the same total)."""
        data = os.pread(self._handle.fileno(), int(count), self._read)
        if self._verify:
            self._settle()
            self._crc32 = shard_checksum.crc32(data, self._crc32)
        self._read += len(data)
        return data

    def read_into(self, buffer):
        """Fills `buffer` (a uint8 NumPy array) with the next bytes, in pieces on the shard I/O
        threads; raises CheckpointError if the file ends first. Returns once the bytes are in:
        their checksums may still be being taken (joined by finish()); a buffer filled here
        before is first waited for."""
        view = memoryview(buffer).cast("B")
        address = buffer.__array_interface__["data"][0]
        for future, _ in self._pending_by_buffer.pop(address, ()):
            future.result()  # its bytes are about to be replaced
        self._settle(finished_only=True)
        descriptor, offset = self._handle.fileno(), self._read
        parts = shard_checksum.pieces(view)
        futures = [shard_checksum.submit(_read_piece, descriptor, piece, offset + start,
                                         self._verify) for start, piece in parts]
        concurrent.futures.wait(futures)  # every piece ends before an error closes the file
        results = [future.result() for future in futures]
        got = sum(count for count, _ in results)
        if got != view.nbytes:
            raise CheckpointError("checkpoint shard %s ended early: the file is truncated"
                                  % self.path)
        if self._verify:
            blocks = [block for _, crcs in results for block in crcs]
            self._pending.extend(blocks)
            self._pending_by_buffer[address] = blocks
        self._read += got

    def _settle(self, finished_only=False):
        """Joins the checksums of the blocks read so far into the running crc32, in file order
        (finished_only: those at the front whose checksums are done, waiting for none)."""
        pending = self._pending
        while pending and (not finished_only or pending[0][0].done()):
            future, length = pending.popleft()
            self._crc32 = shard_checksum.combine(self._crc32, future.result(), length)
        if not pending:
            self._pending_by_buffer = {}

    def chunks(self, sizes, allocate=None, before_refill=None, depth=READ_AHEAD, room=None):
        """Yields the file's next pieces of `sizes` bytes, as uint8 arrays, each valid until the
        next is asked for. A thread reads (and checksums) up to `depth` pieces ahead while the
        caller works on this one, so the I/O threads never wait for the caller: depth + 1
        buffers of the largest size, from allocate(nbytes) (default np.empty). room: None, or
        the bytes the buffers may take, each counted as the power of two a page-locked block
        rounds it to: the depth shrinks to fit (to 1 at least), so the files of a checkpoint
        written with larger chunks (an older one, another SOK1X_CHECKPOINT_CHUNK_MB) load
        within the same memory. before_refill(), if given, is called before a buffer the
        caller had is filled again (to wait for copies the caller queued from it)."""
        if not sizes:
            return
        if room is not None:
            block = 1 << max(0, int(max(sizes)) - 1).bit_length()
            depth = max(1, min(depth, int(room) // block - 1))
        allocate = allocate or (lambda nbytes: np.empty(nbytes, np.uint8))
        buffers = [allocate(max(sizes)) for _ in range(min(len(sizes), depth + 1))]
        free, ready, stop = queue.Queue(), queue.Queue(), threading.Event()
        for index in range(len(buffers)):
            free.put(index)

        def fill_all():
            for size in sizes:
                index = free.get()
                if stop.is_set():
                    return
                try:
                    self.read_into(buffers[index][:size])
                except Exception as exc:  # raised on the caller's thread
                    ready.put((None, exc))
                    return
                ready.put((index, None))
        reader = threading.Thread(target=fill_all, daemon=True, name="sok1x-shard-read")
        try:
            reader.start()
            self._filling = (stop, free, reader)
        except RuntimeError:  # no new threads at interpreter exit: each piece read when asked
            reader = None
        try:
            for position, size in enumerate(sizes):
                if reader is None:
                    index = free.get()
                    self.read_into(buffers[index][:size])
                else:
                    index, error = ready.get()
                    if error is not None:
                        raise error
                yield buffers[index][:size]
                if before_refill is not None and position + len(buffers) < len(sizes):
                    before_refill()
                free.put(index)
        finally:
            if reader is not None:
                self._stop_filling()

    def finish(self):
        """Checks that the whole file was read and its checksum; closes it."""
        self._handle.close()
        if self._verify:
            self._settle()
        size, crc32 = self._expected
        if self._read != size:
            raise CheckpointError("checkpoint shard %s holds %d bytes past its rows: the file is "
                                  "corrupt" % (self.path, size - self._read))
        if self._verify and self._crc32 & 0xFFFFFFFF != crc32:
            raise CheckpointError("checkpoint shard %s fails its checksum: the file is corrupt "
                                  "(changed after it was written); restore an older checkpoint"
                                  % self.path)

    def _stop_filling(self):
        """Stops and joins the thread of an open chunks() generator, if any."""
        if self._filling is not None:
            stop, free, reader = self._filling
            self._filling = None
            stop.set()
            free.put(None)  # wakes the thread if it waits for a buffer
            reader.join()

    def close(self):
        """Closes the file (after a failure, maybe inside a chunks() loop: its thread is
        stopped first), once the checksums still running are done: they hold the read buffers,
        which a page-locked pool hands out again only when let go."""
        self._stop_filling()
        concurrent.futures.wait([future for future, _ in self._pending])
        self._pending.clear()
        self._pending_by_buffer = {}
        self._handle.close()


def write_atomically(path, data):
    """Writes bytes `data` to `path` through a temporary file renamed over it once on disk."""
    writer = ShardWriter(path)
    try:
        writer.write(data)
        writer.commit()
    finally:
        writer.discard()


def remove_quietly(path):
    """Removes file `path` if it is there."""
    try:
        os.remove(path)
    except OSError:
        pass
