"""sok1x's dumps in SOK's file format (sok.dump's default for SOK v2's tables) keep DESIGN D8's
guarantees, as real MPI jobs (jobs/sok_files_job.py): a 2-rank dump loads equal on 1 and 2
ranks; a rank SIGKILLed while writing its rows, while the previous files are kept, or between
two renames over SOK's names leaves the previous dump loadable (never the new rows of one file
beside the old of another), and the next dump into the folder gives SOK's own readers the
previous files back; a changed byte, a cut file, a missing one or a slot file the dump did not
write is refused naming it."""
import shutil

import pytest
from mpi_jobs import lane_a_only, run_job

pytestmark = lane_a_only()

JOB = "sok_files_job.py"


def _ok(job):
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("sok_files")
    _ok(run_job(2, JOB, "save", root / "dump", root / "ref.npz"))
    return root


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_2_rank_dump_loads_equal_and_sok_reads_it(saved, ranks):
    job = run_job(ranks, JOB, "load", saved / "dump", saved / "ref.npz", "sok")
    _ok(job)
    assert job.stdout.count("loaded equal") == ranks


@pytest.mark.parametrize("where", ["write", "keep", "publish"])
def test_a_rank_killed_mid_dump_leaves_the_previous_dump(saved, tmp_path, where):
    copy = tmp_path / "dump"
    shutil.copytree(str(saved / "dump"), str(copy))
    job = run_job(2, JOB, "kill", copy, where)
    assert job.returncode != 0
    assert "the dump was to be killed" not in job.stderr  # it died in the dump
    # sok1x reads the previous dump; SOK's readers too once a later dump tidied the folder
    _ok(run_job(2, JOB, "load", copy, saved / "ref.npz", "sok1x"))
    _ok(run_job(1, JOB, "other", copy))
    _ok(run_job(2, JOB, "load", copy, saved / "ref.npz", "sok"))


def test_a_damaged_file_is_refused_naming_it(saved, tmp_path):
    copy = tmp_path / "dump"
    shutil.copytree(str(saved / "dump"), str(copy))
    job = run_job(2, JOB, "corrupt", copy)
    _ok(job)
    assert job.stdout.count("every damage refused") == 2
