"""sok.dump and sok.load in SOK's file format (their default for SOK v2's tables) hold no table in
memory (DESIGN D8), as a real 2-rank MPI job (jobs/sok_dump_memory_job.py): with chunks of
1 MiB, a 64 MiB sok.Variable (32 MiB a rank) dumps and loads adding at most 4 chunks of peak
resident memory to a rank, and a DynamicVariable of half as many keys (its keys sorted as SOK
writes them) at most 4 chunks and a tenth of the rank's shard."""
import re

import pytest
from mpi_jobs import run_job, skip_before_tensorflow

ROWS = (64 << 20) // (128 * 4)
CHUNK_MB = 1


@pytest.fixture(scope="module")
def added(tmp_path_factory, request):
    skip_before_tensorflow((2, 0), "eager execution (the job calls SOK's v2 API at once)")
    mp = pytest.MonkeyPatch()
    mp.setenv("SOK1X_CHECKPOINT_CHUNK_MB", str(CHUNK_MB))
    request.addfinalizer(mp.undo)
    job = run_job(2, "sok_dump_memory_job.py", tmp_path_factory.mktemp("sok_memory"), ROWS,
                  timeout=600)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]
    found = re.findall(r"(dense|hash) shard (\d+) KiB, chunk (\d+) KiB, dump added (-?\d+) KiB, "
                       r"load added (-?\d+) KiB", job.stdout)
    assert len(found) == 4, job.stdout
    return [(kind, int(shard), int(chunk), int(dump), int(load))
            for kind, shard, chunk, dump, load in found], job.stdout


def test_a_variable_several_times_the_chunk_dumps_and_loads_in_chunks(added):
    rows, out = added
    for kind, shard, chunk, dump, load in rows:
        if kind == "dense":
            assert shard >= 16 * chunk, out  # the table is many chunks
            assert max(dump, load) <= 4 * chunk, out


def test_a_dynamic_variable_adds_its_keys_and_chunks(added):
    rows, out = added
    for kind, shard, chunk, dump, load in rows:
        if kind == "hash":
            assert max(dump, load) <= 4 * chunk + shard // 10, out
