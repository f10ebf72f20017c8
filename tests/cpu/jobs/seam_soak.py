"""An MPI job for test_memory_soak: STEPS training steps of one sok1x layer (lookup, gradient,
Adam update) in a tf.compat.v1 Session, on the seam SOK1X_SEAM names; every rank prints its
resident memory every STEPS//40 steps as "RSS rank step kib", then "rank R finished".

    mpiexec -n 2 python seam_soak.py STEPS
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok1x  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_memory import resident_kib  # noqa: E402

tf1 = tf.compat.v1
BATCH, SLOTS, KEYS = 16, 2, 200


def main(steps):
    tf1.disable_eager_execution()
    keys = tf1.placeholder(tf1.int64, [BATCH, SLOTS, 1])
    layer = sok1x.All2AllDenseEmbedding(KEYS, 4, SLOTS, 1)
    loss = tf1.reduce_sum(layer(keys))
    grads = tf1.gradients(loss, layer.trainable_weights)
    train = sok1x.optimizers.Adam(0.01).apply_gradients(zip(grads, layer.trainable_weights))
    with tf1.Session() as sess:
        sess.run(sok1x.Init(backend="cpu"))
        sess.run(tf1.global_variables_initializer())
        rank = sok1x.rank()
        rng = np.random.default_rng(rank)
        feeds = [rng.integers(0, KEYS, size=(BATCH, SLOTS, 1)) for _ in range(64)]
        every = max(1, steps // 40)
        for number in range(steps):
            sess.run(train, {keys: feeds[number % len(feeds)]})
            if number % every == 0 or number == steps - 1:
                print("RSS %d %d %d" % (rank, number, resident_kib()), flush=True)
    print("rank %d finished" % rank, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
