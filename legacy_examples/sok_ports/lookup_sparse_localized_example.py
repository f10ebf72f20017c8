"""Port of SOK's lookup_sparse example over localized variables (sparse_operation_kit/
experiment/examples/lookup_sparse_localized_example.py): two sok.Variables held whole on rank 0
and on the last rank, looked up together by sok.lookup_sparse, their gradients applied by Keras
SGD, eagerly (TensorFlow 2). Changed: the import (sparse_operation_kit.experiment ->
sok1x.experiment). Prints the variables, the embeddings and the gradients.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from sok1x import experiment as sok

if __name__ == "__main__":
    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    sok.init()

    v1 = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32, mode="localized:0")
    v2 = sok.Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32,
                      mode="localized:%d" % (hvd.size() - 1))
    print("v1:\n", v1)
    print("v2:\n", v2)

    indices1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]],
                               values=[1, 1, 3, 4, 5], dense_shape=[2, 3])
    print("indices1:\n", indices1)
    indices2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]], values=[1, 2, 3],
                               dense_shape=[2, 2])
    print("indices2:\n", indices2)

    with tf.GradientTape() as tape:
        embeddings = sok.lookup_sparse([v1, v2], [indices1, indices2], combiners=["sum", "sum"])
        loss = 0.0
        for i, embedding in enumerate(embeddings):
            loss += tf.reduce_sum(embedding)
            print("embedding%d:\n" % (i + 1), embedding)
    grads = tape.gradient(loss, [v1, v2])
    for i, grad in enumerate(grads):
        print("grad%d:\n" % (i + 1), grad)

    optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)
    optimizer.apply_gradients(zip(grads, [v1, v2]))
    print("v1 after:\n", v1)
    print("v2 after:\n", v2)
