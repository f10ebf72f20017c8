"""A Saver save under the prefix of the previous one (no global_step), killed in the middle,
leaves the previous checkpoint loadable (DESIGN D8), as real MPI jobs: a 2-rank job of six sok1x
tables saves, trains on, and rank 1 dies by SIGKILL after writing its third shard of the next
save into the same prefix. New jobs on 2 and 1 ranks restore the prefix and must evaluate
exactly as the first job did right after its save (and not as after its later steps); their own
save under that prefix then leaves only its own shard files and restores."""
import json
import os
import shutil

import pytest
from mpi_jobs import lane_a_only, run_job

pytestmark = lane_a_only("a killed Saver save; lane B's MPI suites save and restore on 2.15")

JOB = "same_prefix_save_job.py"
TABLES = 6


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    root = tmp_path_factory.mktemp("same-prefix")
    out = root / "save.json"
    job = run_job(2, JOB, "save", root / "ckpt", out)
    assert job.returncode != 0, "rank 1 was to die by SIGKILL in its second save"
    assert out.exists(), job.stdout + job.stderr
    with open(str(out)) as handle:
        return root, json.load(handle)


@pytest.mark.parametrize("ranks", [2, 1])
def test_a_killed_save_under_the_same_prefix_leaves_the_previous_checkpoint(killed, ranks):
    root, first = killed
    copy = os.path.join(str(root), "restore-%d" % ranks)
    shutil.copytree(os.path.join(str(root), "ckpt"), copy)
    out = os.path.join(str(root), "restore-%d.json" % ranks)
    job = run_job(ranks, JOB, "restore", copy, out)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
    with open(out) as handle:
        resumed = json.load(handle)
    assert first["saved"] != pytest.approx(first["trained_on"], rel=1e-3)
    assert resumed["restored"] == pytest.approx(first["saved"], rel=1e-6)
    # The job's own save under the prefix: the killed save's files and the replaced ones go.
    letters = {name.split(".data-")[1][0] for name in resumed["files"]}
    assert len(resumed["files"]) == TABLES * ranks and len(letters) == 1, resumed["files"]
    assert resumed["restored_again"] == pytest.approx(resumed["trained_on"], rel=1e-6)
