"""Trained tables survive restarts (D8): real MPI jobs (jobs/checkpoint_job.py) train in
MonitoredTrainingSession with checkpoint_dir, every rank pointing at one directory, for
sok1x.optimizers.Adam, sok1x.tf.keras.optimizers.LazyAdamOptimizer and OptimizerScope Adagrad and
Ftrl (hash table on and off); new jobs on 4 and 1 ranks restore and train on. Their losses must
equal an uninterrupted run's. The Horovod idiom (checkpoint_dir on rank 0 only) saves and
restores every rank's rows, at 2 and 4 ranks."""
import json
import os
import shutil

import numpy as np
import pytest
from mpi_jobs import lane_a_only, run_job

pytestmark = lane_a_only("Saver restarts over rank counts; lane B's MPI suites save and restore")


def _losses(path):
    with open(path) as handle:
        return json.load(handle)


def _ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def test_restore_on_2_4_and_1_ranks_continues_the_run(tmp_path):
    root = str(tmp_path / "shared")
    _ok(run_job(2, "checkpoint_job.py", "first", root, tmp_path / "first.json"))
    first = _losses(tmp_path / "first.json")
    assert set(os.listdir(os.path.join(root, "sok_adam"))) >= {"model.ckpt-10.index",
                                                              "checkpoint"}
    for ranks in (4, 1):  # the same code path restores on 2; these also redistribute
        copy = str(tmp_path / ("copy%d" % ranks))
        shutil.copytree(root, copy)
        out = tmp_path / ("resume%d.json" % ranks)
        _ok(run_job(ranks, "checkpoint_job.py", "resume", copy, out))
        resumed = _losses(out)
        assert sorted(resumed) == ["lazy_adam", "scope_adagrad", "scope_ftrl", "sok_adam"]
        for name, losses in resumed.items():
            whole = first[name + "/whole"]
            np.testing.assert_allclose(first[name], whole[:10], rtol=1e-6)
            np.testing.assert_allclose(losses, whole[10:], rtol=1e-6,
                                       err_msg="%s restored on %d ranks" % (name, ranks))


@pytest.mark.parametrize("ranks", [2, 4])
def test_checkpoint_dir_on_rank_0_only_saves_and_restores_every_rank(tmp_path, ranks):
    """The Horovod idiom: the other ranks take part in rank 0's saves (at its first step, every
    EVERY steps and when it closes) and restore; a job of the same size, rank 0 again holding
    the checkpoint_dir, continues the run."""
    root = str(tmp_path / "ckpt")
    _ok(run_job(ranks, "checkpoint_job.py", "horovod_first", root, tmp_path / "first.json"))
    first = _losses(tmp_path / "first.json")
    files = os.listdir(os.path.join(root, "sok_adam"))
    assert "model.ckpt-10.index" in files
    assert len([f for f in files if f.startswith("model.ckpt-10.data-t")]) == ranks
    _ok(run_job(ranks, "checkpoint_job.py", "horovod_resume", root, tmp_path / "resume.json"))
    resumed = _losses(tmp_path / "resume.json")
    assert sorted(resumed) == ["lazy_adam", "sok_adam"]
    for name, losses in resumed.items():
        whole = first[name + "/whole"]
        np.testing.assert_allclose(first[name], whole[:10], rtol=1e-6)
        np.testing.assert_allclose(losses, whole[10:], rtol=1e-6, err_msg=name)
