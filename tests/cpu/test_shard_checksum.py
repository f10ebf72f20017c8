"""The checkpoint shards' crc32 on several threads (engine/shard_checksum.py) equals zlib.crc32,
bit for bit, for buffers cut into pieces of every shape (one piece, equal pieces, a short last
piece) and any running crc; zlib's own crc32 is the reference."""
import zlib

import numpy as np
import pytest

from sok1x.engine import shard_checksum


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize("size", [0, 1, 1999, 2000, 2001, 6000, 12347, 100003])
def test_equals_zlib(monkeypatch, threads, size):
    monkeypatch.setattr(shard_checksum, "PIECE_BYTES", 1000)
    monkeypatch.setenv(shard_checksum.THREADS_ENV, str(threads))
    data = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    for running in (0, 0xDEADBEEF):
        assert shard_checksum.crc32(data, running) == zlib.crc32(data, running)
    assert shard_checksum.crc32(data.tobytes()) == zlib.crc32(data.tobytes())


def test_combine_joins_two_crcs():
    rng = np.random.default_rng(3)
    first, second = (rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in (77, 5001))
    assert shard_checksum.combine(zlib.crc32(first), zlib.crc32(second), len(second)) == \
        zlib.crc32(first + second)
