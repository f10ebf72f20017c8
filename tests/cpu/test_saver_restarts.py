"""tf.compat.v1.train.Saver carries sok1x tables across jobs (DESIGN D8), as real MPI jobs: a
2-rank job saves at step 5 and dies by SIGKILL in the middle of its save at step 10; new jobs on
4 ranks and on 1 rank restore the step-5 checkpoint (the interrupted save left it the latest) and
train steps 6-10, whose losses must equal an uninterrupted 10-step run's, for LazyAdam (hash
table) and Keras Adam (no hash table), both sok1x's, updating rows and engine slots. One byte
changed in the table's entry of the checkpoint fails the restore with an error naming it."""
import json
import os
import shutil

import numpy as np
import pytest
from mpi_jobs import lane_a_only, run_job, tensorflow_version

pytestmark = lane_a_only("Saver restarts over rank counts; lane B's MPI suites save and restore")

JOB = "saver_restart_job.py"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saver-restarts")
    out = root / "save.json"
    job = run_job(2, JOB, "save", root, out)
    assert job.returncode != 0, "rank 0 was to die by SIGKILL in its second save"
    assert out.exists(), job.stdout + job.stderr
    with open(out) as handle:
        return root, json.load(handle)


@pytest.mark.parametrize("ranks", [4, 1])
def test_restore_on_other_rank_counts_continues_the_uninterrupted_run(saved, ranks):
    root, first = saved
    out = os.path.join(str(root), "restore-%d.json" % ranks)
    job = run_job(ranks, JOB, "restore", root, out)
    assert job.returncode == 0, job.stdout + job.stderr
    with open(out) as handle:
        resumed = json.load(handle)
    for name in ("lazy_adam", "keras_adam"):
        whole = first[name + "/whole"]
        assert len(whole) == 10 and len(resumed[name]) == 5
        np.testing.assert_allclose(resumed[name], whole[5:], rtol=1e-6, err_msg=name)


def test_one_changed_byte_in_a_table_entry_fails_the_restore_naming_the_checkpoint(saved):
    root, _ = saved
    copy = os.path.join(str(root), "corrupt")
    for name in ("lazy_adam", "keras_adam"):
        source, target = os.path.join(str(root), name, "rank0"), os.path.join(copy, name, "rank0")
        shutil.copytree(source, target)
        with open(os.path.join(target, "checkpoint"), "w") as state:  # relative: this copy
            state.write('model_checkpoint_path: "model-5"\n')
    data_file = os.path.join(copy, "lazy_adam", "rank0", "model-5.data-00000-of-00001")
    with open(data_file, "rb") as handle:
        data = bytearray(handle.read())
    table_entry = data.find(b"sok1x-checkpoint")  # the table's entry in the TF checkpoint
    assert table_entry >= 0
    data[table_entry + 20] ^= 0x01
    with open(data_file, "wb") as handle:
        handle.write(bytes(data))
    job = run_job(1, JOB, "restore", copy, os.path.join(copy, "out.json"))
    assert job.returncode != 0
    assert "DataLossError" in job.stderr, job.stderr[-3000:]
    if tensorflow_version() >= (2, 0):  # 1.15's RestoreV2 error does not name the file; 2.x's does
        assert os.path.join(copy, "lazy_adam", "rank0", "model-5") in job.stderr, job.stderr[-3000:]
