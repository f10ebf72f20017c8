"""Port of SOK's dynamic_variable example (sparse_operation_kit/experiment/examples/
dynamic_variable_example.py): a sok.DynamicVariable read by tf.nn.embedding_lookup under
tf.GradientTape, trained one step by Keras SGD through sok.OptimizerWrapper, eagerly
(TensorFlow 2). As SOK's, it calls neither hvd.init() nor sok.init(). Changed: the import
(sparse_operation_kit.experiment -> sok1x.experiment). Prints the embeddings before and after.
"""
import horovod.tensorflow as hvd  # noqa: F401  (imported, as SOK's example does)
import tensorflow as tf

from sok1x import experiment as sok

if __name__ == "__main__":
    v = sok.DynamicVariable(dimension=3, initializer="13")
    print("v.shape:", v.shape)
    print("v.size:", v.size)

    indices = tf.convert_to_tensor([0, 1, 2 ** 40], dtype=tf.int64)
    with tf.GradientTape() as tape:
        embedding = tf.nn.embedding_lookup(v, indices)
        print("embedding:\n", embedding)
        loss = tf.reduce_sum(embedding)

    grads = tape.gradient(loss, [v])
    print("grad:\n", grads[0])

    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))
    optimizer.apply_gradients(zip(grads, [v]))
    embedding = tf.nn.embedding_lookup(v, indices)
    print("embedding after:\n", embedding)
