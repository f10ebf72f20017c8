"""An MPI job for test_shared_checkpoint_dir: every rank runs a sharded
tf.compat.v1.train.Saver into one shared directory (two saves, global steps 1 and 2, each rank
its own Session), with sok1x's turn-taking watched: each rank prints one line per save,

    turn <rank> <the prefix take_turns read from its shard file name, or None> <waited s>

then "saved <rank> <the save's path>" per save and "done <rank>".

    shared_dir_job.py <dir>          two saves
    shared_dir_job.py <dir> exit     one save, right before the program ends, rank 0's read of
                                     its merged index a second late (a loaded host): rank 1
                                     waits for that rank's turn after rank 0's main thread ended
    shared_dir_job.py <dir> leftover two saves, temporary directories of the first's prefix
                                     left in <dir> by saves killed earlier: TF 1.15's name, and
                                     2.x's holding a shard file cut short (its '.tempstate')
    shared_dir_job.py <dir> devices  two saves, one more variable placed on /cpu:0 (a Saver of
                                     two shards); a save that fails prints "refused <rank>
                                     <its error's last line naming an Error>" and the job goes
                                     on to "done"
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("SOK1X_CHECKPOINT_TIMEOUT", "20")  # a rank whose turn never comes fails
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x  # noqa: E402
from sok1x.graph_ops import shared_checkpoint_dir  # noqa: E402

tf1 = tf.compat.v1
RANK = MPI.COMM_WORLD.Get_rank()


def say(line):
    """One line in one write: the ranks share the launcher's pipe."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def watched(take_turns):
    def take(runtime, sharded_filename, timeout):
        start = time.monotonic()
        handed = take_turns(runtime, sharded_filename, timeout)
        say("turn %d %s %.3f" % (RANK, shared_checkpoint_dir.final_prefix(sharded_filename),
                                 time.monotonic() - start))
        return handed
    return take


def late(named_generations):
    def read(*args):
        if sys._getframe(1).f_code.co_name == "watch":  # saver_index's watcher thread
            time.sleep(1.0)
        return named_generations(*args)
    return read


def main(root, mode="twice"):
    shared_checkpoint_dir.take_turns = watched(shared_checkpoint_dir.take_turns)
    if mode == "leftover" and RANK == 0:
        os.makedirs(os.path.join(root, "model-1_temp_0123456789abcdef0123456789abcdef"))
        os.makedirs(os.path.join(root, "model-1_temp"))
        with open(os.path.join(root, "model-1_temp", "part-00000-of-00001.data-00000-of-00001"
                               ".tempstate8264538276512"), "wb") as cut_short:
            cut_short.write(b"\0" * 64)
    MPI.COMM_WORLD.Barrier()
    if mode == "exit" and RANK == 0:
        from sok1x.graph_ops import saver_index
        saver_index.named_generations = late(saver_index.named_generations)
    tf1.disable_eager_execution()
    keys = tf1.placeholder(tf1.int64, [None, 1, 1])
    layer = sok1x.All2AllDenseEmbedding(40, 4, 1, 1, name="emb")
    out = tf1.reduce_sum(layer(keys))
    if mode == "devices":
        with tf1.device("/cpu:0"):
            tf1.Variable(1.0, name="placed")
    step = tf1.train.get_or_create_global_step()
    saver = tf1.train.Saver(sharded=True)
    init = tf1.group(sok1x.Init(global_batch_size=4, backend="cpu"),
                     tf1.global_variables_initializer())
    with tf1.Session(config=tf1.ConfigProto(inter_op_parallelism_threads=2,
                                            intra_op_parallelism_threads=1)) as sess:
        sess.run(init)
        sess.run(out, {keys: np.arange(2).reshape(2, 1, 1)})
        for global_step in (1,) if mode == "exit" else (1, 2):
            try:
                path = saver.save(sess, os.path.join(root, "model"), global_step=global_step)
            except tf1.errors.OpError as error:
                lines = [line for line in error.message.splitlines() if "Error" in line]
                say("refused %d %s" % (RANK, (lines or ["?"])[-1].strip()))
                continue
            say("saved %d %s" % (RANK, path))
        del step
    say("done %d" % RANK)


if __name__ == "__main__":
    main(*sys.argv[1:])
