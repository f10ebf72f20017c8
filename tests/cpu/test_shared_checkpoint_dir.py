"""Ranks that share a checkpoint directory take turns only if sok1x reads the checkpoint's prefix
out of the shard file name TensorFlow's sharded Saver hands its saveables. The names come from a
real Saver of this lane's TensorFlow ('<prefix>_temp/part-...' on 2.x, '<prefix>_temp_<uuid>/
part-...' on 1.15), evaluated in a Session: each must give back the prefix the Saver was fed.
And in a real 2-rank job (jobs/shared_dir_job.py), the op that saves the tables is one that
knows its shard file (TensorFlow 1.15 builds one more before it that does not), so every rank
takes its turn by the save's prefix; a rank whose last save comes right before its program
ends still hands its turn on."""
import os
import re

import pytest
from mpi_jobs import run_job, tensorflow_version

from sok1x.graph_ops.shared_checkpoint_dir import final_prefix
from sok1x.graph_ops.tf_compat import tf1


def _sharded_filenames(prefix):
    """The shard file names a sharded tf1 Saver writes through when it saves to `prefix`."""
    graph = tf1.Graph()
    with graph.as_default():
        with tf1.device("/cpu:0"):
            tf1.Variable([1.0, 2.0], name="kept")
        saver = tf1.train.Saver(sharded=True)
        names = [op.outputs[0] for op in graph.get_operations()
                 if op.type == "ShardedFilename"]
        with tf1.Session(graph=graph) as session:
            return session.run(names, {saver.saver_def.filename_tensor_name: prefix})


@pytest.mark.parametrize("prefix", ["/data/ckpt/model.ckpt-30", "relative/model.ckpt",
                                    "/data/a_temp_dir/model_temp.ckpt-7"])
def test_the_prefix_comes_back_from_this_lanes_saver(prefix):
    names = _sharded_filenames(prefix)
    assert names, "the sharded Saver made no ShardedFilename op"
    for name in names:
        assert final_prefix(name) == prefix, name


@pytest.mark.parametrize("name", [
    "/data/model.ckpt-3",                                   # a Saver that is not sharded
    "/data/model.ckpt-3_temp/other-00000-of-00001",
    "/data/model.ckpt-3_temp_XYZ/part-00000-of-00001",      # not TensorFlow's uuid
    "/data/model.ckpt-3_temp/part-00000",
])
def test_other_names_have_no_prefix(name):
    assert final_prefix(name.replace("/", os.sep)) is None


@pytest.mark.parametrize("mode", ["twice", "leftover"])
def test_ranks_sharing_a_directory_take_turns_by_the_saves_prefix(tmp_path, mode):
    """leftover: a temporary directory a killed save left under the first save's prefix does
    not hold the turn (the watcher waits for its own save's directory only)."""
    job = run_job(2, "shared_dir_job.py", tmp_path, mode)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
    turns = re.findall(r"^turn (\d) (\S+) ([0-9.]+)$", job.stdout, re.M)
    saved = re.findall(r"^saved (\d) (\S+)$", job.stdout, re.M)
    assert len(turns) == len(saved) == 4, job.stdout
    for rank in "01":
        mine = [prefix for r, prefix, _ in turns if r == rank]
        assert mine == [path for r, path in saved if r == rank], job.stdout
    assert all(prefix.endswith("model-%d" % n) for n, prefix in
               zip((1, 2), [p for r, p, _ in turns if r == "0"]))


def test_a_save_right_before_the_end_still_hands_its_turn_on(tmp_path):
    job = run_job(2, "shared_dir_job.py", tmp_path, "exit")
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
    assert sorted(re.findall(r"^done (\d)$", job.stdout, re.M)) == ["0", "1"], job.stdout


def test_a_saver_of_several_shards_through_one_temporary_directory_is_refused(tmp_path):
    """TensorFlow 2.x's sharded Saver writes every shard through '<prefix>_temp': ranks sharing
    a directory with a Saver of two shards (a variable placed on /cpu:0) would meet there, so
    every rank's save is refused with advice, and the job goes on; TensorFlow 1.15's Saver
    writes through a directory of each save's own, and saves."""
    job = run_job(2, "shared_dir_job.py", tmp_path, "devices")
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
    refused = re.findall(r"^refused (\d) (.*)$", job.stdout, re.M)
    saved = re.findall(r"^saved (\d) ", job.stdout, re.M)
    if tensorflow_version() < (2,):
        assert not refused and len(saved) == 4, job.stdout
    else:
        assert not saved and sorted(r for r, _ in refused) == ["0", "0", "1", "1"], job.stdout
        assert all("2 shards" in line and "own" in line for _, line in refused), refused
