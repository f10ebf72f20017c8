"""Port of SOK's all2all_dense_embedding example (sparse_operation_kit/experiment/examples/
all2all_dense_embedding_example.py): each rank looks up its slice of a sok.Variable's rows with
sok.all2all_dense_embedding, takes the gradient and applies Keras SGD, eagerly (TensorFlow 2).
Changed: the import (sparse_operation_kit.experiment -> sok1x.experiment). Prints the rows, the
embeddings and the gradients.
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

    rows, cols = 32, 4
    param = sok.Variable(np.arange(rows * cols).reshape(rows, cols), dtype=tf.float32)
    print("param:\n", param)

    every_index = tf.convert_to_tensor(np.arange(rows), dtype=tf.int64)
    left = rows // hvd.size() * hvd.rank()
    right = rows // hvd.size() * (hvd.rank() + 1)
    indices = every_index[left:right]
    print("indices:\n", indices)

    with tf.GradientTape() as tape:
        embedding = sok.all2all_dense_embedding(param, indices)
        loss = tf.reduce_sum(embedding)
        print("embedding:\n", embedding)
    grads = tape.gradient(loss, [param])
    print("grads:\n", grads[0])

    optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)
    optimizer.apply_gradients(zip(grads, [param]))
    print("param after:\n", param)
