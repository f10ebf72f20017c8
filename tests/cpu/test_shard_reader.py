"""A shard file read in chunks (engine/shard_storage.ShardReader.chunks) yields its bytes in order
whatever the read-ahead, and with a memory room its buffers fit it: a file written with larger
chunks than the room was made for (an older checkpoint, another SOK1X_CHECKPOINT_CHUNK_MB) reads
fewer chunks ahead instead of taking more memory."""
import zlib

import numpy as np
import pytest

from sok1x.engine.shard_storage import ShardReader


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
