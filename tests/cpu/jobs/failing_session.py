"""An MPI job for test_failing_rank: a MonitoredTrainingSession training loop (sok1x brought up by
InitHook, inside sess.run on one of TensorFlow's threads); the last rank fails at step FAIL_STEP
in the way argv[1] names while the others go on into the step's lookup and wait for it.

Modes: hook-error (a SessionRunHook's after_run raises), sigterm (the rank sends itself SIGTERM
from the main thread between steps: the signal handlers were set in the main thread after the
init ran elsewhere), clean (nothing fails; every rank prints "rank R finished"), soak STEPS
(nothing fails; every rank prints its resident memory every STEPS//20 steps as "RSS rank step kib").
"""
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok1x  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_memory import resident_kib  # noqa: E402

tf1 = tf.compat.v1
FAIL_STEP, BATCH, KEYS = 5, 128, 300


class FailingHook(tf1.train.SessionRunHook):
    """Raises in after_run of step FAIL_STEP on the failing rank."""

    def __init__(self):
        self.step = 0

    def after_run(self, run_context, run_values):
        self.step += 1
        if self.step == FAIL_STEP and sok1x.rank() == sok1x.num_gpus() - 1:
            raise RuntimeError("a session hook of rank %d broke" % sok1x.rank())


def main(mode, steps):
    tf1.disable_eager_execution()
    size = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    keys = tf1.placeholder(tf1.int64, [BATCH, 2, 1])
    layer = sok1x.All2AllDenseEmbedding(400, 4, 2, 1)
    loss = tf1.reduce_sum(layer(keys))
    step = tf1.train.get_or_create_global_step()
    grads = tf1.gradients(loss, [layer.trainable_weights[0]])
    train = sok1x.optimizers.Adam(0.1).apply_gradients(zip(grads, layer.trainable_weights),
                                                      global_step=step)
    hooks = [sok1x.InitHook(global_batch_size=BATCH * size, backend="cpu")]
    if mode == "hook-error":
        hooks.append(FailingHook())
    rng = np.random.default_rng(0)
    with tf1.train.MonitoredTrainingSession(hooks=hooks, checkpoint_dir=None) as sess:
        rank = sok1x.rank()
        print("rank %d up at %.3f" % (rank, time.time()), flush=True)
        for number in range(steps):
            if mode == "sigterm" and number == FAIL_STEP and rank == size - 1:
                os.kill(os.getpid(), signal.SIGTERM)
            sess.run(train, {keys: rng.integers(0, KEYS, size=(BATCH, 2, 1))})
            if mode == "soak" and number % max(1, steps // 20) == 0:
                print("RSS %d %d %d" % (rank, number, resident_kib()), flush=True)
    print("rank %d finished" % rank, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12)
