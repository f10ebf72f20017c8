"""A shard file read in chunks (engine/shard_storage.ShardReader.chunks) yields its bytes in order
whatever the read-ahead, and with a memory room its buffers fit it: a file written with larger
chunks than the room was made for (an older checkpoint, another SOK1X_CHECKPOINT_CHUNK_MB) reads
fewer chunks ahead instead of taking more memory."""
import zlib

import numpy as np
import pytest

from sok1x.engine.checkpoint.storage import ShardReader


def written(tmp_path, nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, size=nbytes, dtype=np.uint8)
    path = tmp_path / "shard"
    path.write_bytes(data.tobytes())
    return str(path), data


@pytest.mark.parametrize("chunk, room, buffers", [
    (100, None, 3),     # no room given: READ_AHEAD (2) ahead, 3 buffers
    (100, 384, 3),      # 100-byte chunks count as 128-byte blocks: 3 fit in 384
    (200, 384, 2),      # 256-byte blocks: one ahead only, 2 buffers (512: the floor)
    (100, 100, 2),      # never fewer than one ahead
])
def test_chunks_read_the_file_in_order_within_the_room(tmp_path, chunk, room, buffers):
    path, data = written(tmp_path, 1000)
    sizes = [chunk] * (len(data) // chunk)
    made = []

    def allocate(nbytes):
        made.append(nbytes)
        return np.empty(nbytes, np.uint8)
    reader = ShardReader(path, len(data), zlib.crc32(data.tobytes()))
    try:
        got = [piece.copy() for piece in reader.chunks(sizes, allocate, room=room)]
        reader.finish()
    finally:
        reader.close()
    np.testing.assert_array_equal(np.concatenate(got), data[:sum(sizes)])
    assert made == [chunk] * buffers, made


def test_a_large_file_checks_its_checksum_with_few_blocks_pending(tmp_path, monkeypatch):
    """Many 4 MiB blocks, read 3 chunks at a time: the checksum is right, a changed byte fails
    it, and the blocks whose checksums are not yet joined stay about those of the buffers in
    flight, not the file's."""
    from sok1x.engine.checkpoint import storage as shard_storage
    monkeypatch.setattr(shard_storage, "BLOCK_BYTES", 1 << 12)
    path, data = written(tmp_path, 1 << 20)  # 256 blocks of 4 KiB
    sizes = [1 << 14] * 64  # 4 blocks a chunk
    reader = ShardReader(path, data.size, zlib.crc32(data.tobytes()))
    most = 0
    try:
        for _ in reader.chunks(sizes):
            most = max(most, len(reader._pending))
        reader.finish()
    finally:
        reader.close()
    assert most <= 4 * 4, most  # the chunks in flight (3) and the one being read
    changed = data.copy()
    changed[12345] ^= 1
    reader = ShardReader(path, data.size, zlib.crc32(changed.tobytes()))
    try:
        for _ in reader.chunks(sizes):
            pass
        with pytest.raises(Exception, match="fails its checksum"):
            reader.finish()
    finally:
        reader.close()


def test_close_inside_a_chunks_loop_stops_its_thread(tmp_path):
    """A failure while the caller holds a chunk (a bad key, say) closes the reader with its
    read-ahead thread still running: close() stops and joins it, and lets every buffer go."""
    import threading
    path, data = written(tmp_path, 1 << 16)
    reader = ShardReader(path, data.size, zlib.crc32(data.tobytes()))
    pieces = reader.chunks([1 << 12] * 16)
    next(pieces)
    reader.close()
    assert not [t for t in threading.enumerate() if t.name == "sok1x-shard-read"]
    assert not reader._pending
    pieces.close()  # the generator's own cleanup after close() does nothing more
