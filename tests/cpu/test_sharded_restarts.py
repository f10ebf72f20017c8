"""Sharded dumps (D8, issue 18) as real MPI jobs (jobs/shard_job.py): a 4-rank dump of two
tables loads equal on 3 ranks (and on 1); a rank SIGKILLed inside a shard file, or between two
tables' shards, leaves the previous dump loadable, both tables as they were; a 2-rank dump
of a 512 MB table grows no rank's peak resident memory by more than 128 MB, and its load (in
chunks of 8 MB), or a hash table's, by more than a chunk and a tenth of the rank's shard."""
import re
import shutil

import pytest
from mpi_jobs import lane_a_only, run_job

pytestmark = lane_a_only()

JOB = "shard_job.py"


def _ok(job):
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    _ok(run_job(4, JOB, "save", root / "ckpt", root / "ref.npz"))
    return root


@pytest.mark.parametrize("ranks", [3, 1])
def test_a_4_rank_dump_loads_on_other_rank_counts(saved, ranks):
    job = run_job(ranks, JOB, "load", saved / "ckpt", saved / "ref.npz")
    _ok(job)
    assert job.stdout.count("loaded equal") == ranks


@pytest.mark.parametrize("where", ["inside", "between"])
def test_a_rank_killed_mid_dump_leaves_the_previous_dump(saved, tmp_path, where):
    copy = tmp_path / "ckpt"
    shutil.copytree(saved / "ckpt", copy)
    job = run_job(2, JOB, "kill", copy, where)
    assert job.returncode != 0
    assert "the dump was to be killed" not in job.stderr  # it died in the dump
    _ok(run_job(2, JOB, "load", copy, saved / "ref.npz"))


@pytest.fixture(scope="module")
def memory_job(tmp_path_factory):
    """A 2-rank dump of a 512 MB table, then a load of it in chunks of 8 MB; then a load of a
    256 MB hash table."""
    rows = (512 << 20) // (128 * 4)
    job = run_job(2, JOB, "rss", tmp_path_factory.mktemp("big"), rows, 8, timeout=600)
    _ok(job)
    found = re.findall(r"shard (\d+) KiB, chunk (\d+) KiB, dump added (-?\d+) KiB, "
                       r"load added (-?\d+) KiB", job.stdout)
    hashed = re.findall(r"hash shard (\d+) KiB, chunk (\d+) KiB, load added (-?\d+) KiB",
                        job.stdout)
    assert len(found) == 2 and len(hashed) == 2, job.stdout
    return ([[int(kib) for kib in rank] for rank in found],
            [[int(kib) for kib in rank] for rank in hashed], job.stdout)


def test_a_dump_of_a_512_mb_table_adds_at_most_128_mb_per_rank(memory_job):
    per_rank, _, out = memory_job
    assert max(dump for _, _, dump, _ in per_rank) <= 128 * 1024, out


def test_a_load_adds_at_most_a_chunk_and_a_tenth_of_the_shard(memory_job):
    per_rank, hashed, out = memory_job
    for shard, chunk, _, load in per_rank:
        assert load <= chunk + shard // 10, out
    for shard, chunk, load in hashed:  # the old shard goes before the new one comes
        assert load <= chunk + shard // 10, out
