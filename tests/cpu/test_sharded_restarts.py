"""Sharded dumps (D8, issue 18) as real MPI jobs (jobs/shard_job.py): a 4-rank dump of two
tables loads equal on 3 ranks (and on 1); a rank SIGKILLed inside a shard file, or between two
tables' shards, leaves the previous dump loadable, both tables as they were; and a 2-rank dump
of a 512 MB table grows no rank's peak resident memory by more than 128 MB."""
import re
import shutil

import pytest
from mpi_jobs import run_job

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


def test_a_dump_of_a_512_mb_table_adds_at_most_128_mb_per_rank(tmp_path):
    rows = (512 << 20) // (128 * 4)
    job = run_job(2, JOB, "rss", tmp_path / "big", rows, timeout=600)
    _ok(job)
    added = [int(kib) for kib in re.findall(r"dump added (\d+) KiB", job.stdout)]
    assert len(added) == 2, job.stdout
    assert max(added) <= 128 * 1024, job.stdout
