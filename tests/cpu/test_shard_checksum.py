"""The checkpoint shards' crc32 on several threads (checkpoint/checksum.py) equals zlib.crc32,
bit for bit, for buffers cut into pieces of every shape (one piece, equal pieces, a short last
piece) and any running crc; zlib's own crc32 is the reference."""
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from sok1x.engine.checkpoint import checksum as shard_checksum


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


ONE_CORE_JOB = """
import logging, os, sys
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
from sok1x.engine.checkpoint import checksum as shard_checksum
assert shard_checksum.usable_cores() == 1
assert shard_checksum.crc_threads() == 0
shard_checksum.crc_threads()
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_one_core_is_said_once_with_advice():
    """A process bound to one core (Open MPI's default for a job of one or two ranks) gets no
    checksum threads and one warning naming the cause and the launcher option."""
    finished = subprocess.run([sys.executable, "-c", ONE_CORE_JOB], capture_output=True,
                              text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    lines = [line for line in finished.stdout.splitlines() if line.startswith("WARNING")]
    assert len(lines) == 1, finished.stdout
    assert "1 CPU core" in lines[0] and "--bind-to none" in lines[0], lines[0]
    assert "%%" not in lines[0], lines[0]
