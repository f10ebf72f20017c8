"""Port of SOK's lookup_sparse example over DynamicVariables (sparse_operation_kit/experiment/
examples/lookup_sparse_dynamic_example.py): two sok.DynamicVariables with constant initializers
looked up together by sok.lookup_sparse from SparseTensors, and their gradients, eagerly
(TensorFlow 2). Changed: the import (sparse_operation_kit.experiment -> sok1x.experiment).
Prints the embeddings and the gradients.
"""
import horovod.tensorflow as hvd
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

    v1 = sok.DynamicVariable(dimension=3, initializer="3", dtype=tf.float32)
    v2 = sok.DynamicVariable(dimension=5, initializer="5", dtype=tf.float32)
    indices1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]],
                               values=[1, 1, 3, 4, 5], dense_shape=[2, 3])
    indices2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]], values=[1, 2, 3],
                               dense_shape=[2, 2])

    with tf.GradientTape() as tape:
        embeddings = sok.lookup_sparse([v1, v2], [indices1, indices2], combiners=["sum", "sum"])
        loss = 0
        for embedding in embeddings:
            print("embedding:\n", embedding)
            loss += tf.reduce_sum(embedding)
    grads = tape.gradient(loss, [v1, v2])
    for grad in grads:
        print("grad:\n", grad)
