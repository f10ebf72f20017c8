"""Port of SOK's MixedPrecision tutorial for TensorFlow 1 (documents/tutorials/MixedPrecision/
amp_tf1.py, with the SOKDenseDemo model of DenseDemo/models.py): an All2AllDenseEmbedding model
under Keras' mixed_float16 policy, trained by Keras Adam wrapped in SOK's
sok.tf.keras.mixed_precision.LossScaleOptimizer (a fixed loss scale of 1024), the dense
gradients all-reduced by Horovod. Changed: the imports (sparse_operation_kit -> sok1x,
tensorflow -> tensorflow.compat.v1; the policy set under TensorFlow 2's name where 1.15's
experimental one is gone), the data (synthetic, learnable labels, in place of utility's random
samples) and the sizes. Runs as `mpiexec -n N python amp_tf1.py`; prints "step i, loss x".
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow.compat.v1 as tf

import sok1x as sok

tf.disable_v2_behavior()


class SOKDenseDemo(tf.keras.models.Model):
    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, nnz_per_slot,
                 num_dense_layers, **kwargs):
        super(SOKDenseDemo, self).__init__(**kwargs)
        self.slot_num, self.nnz_per_slot = slot_num, nnz_per_slot
        self.embedding_vec_size = embedding_vec_size
        self.embedding_layer = sok.All2AllDenseEmbedding(
            max_vocabulary_size_per_gpu=max_vocabulary_size_per_gpu,
            embedding_vec_size=embedding_vec_size, slot_num=slot_num,
            nnz_per_slot=nnz_per_slot)
        self.dense_layers = [tf.keras.layers.Dense(units=1024, activation="relu")
                             for _ in range(num_dense_layers)]
        self.out_layer = tf.keras.layers.Dense(units=1, activation=None,
                                               kernel_initializer="ones",
                                               bias_initializer="zeros")

    def call(self, inputs, training=True):
        vectors = self.embedding_layer(inputs, training=training)
        hidden = tf.reshape(vectors, [-1, self.slot_num * self.nnz_per_slot *
                                      self.embedding_vec_size])
        for layer in self.dense_layers:
            hidden = layer(hidden)
        return self.out_layer(hidden)


def set_mixed_float16():
    if hasattr(tf.keras.mixed_precision, "experimental"):  # TensorFlow 1.15, as SOK's has it
        from tensorflow.python.keras.engine import base_layer_utils
        base_layer_utils.enable_v2_dtype_behavior()
        policy = tf.keras.mixed_precision.experimental.Policy("mixed_float16")
        tf.keras.mixed_precision.experimental.set_policy(policy)
    else:  # TensorFlow 2: the same policy under its stable name
        tf.keras.layers.enable_v2_dtype_behavior()
        import tensorflow as tf2
        tf2.keras.mixed_precision.set_global_policy("mixed_float16")


def get_dataset(batch_size, iter_num=10, vocabulary_size=1024, slot_num=10, max_nnz=5,
                distinct=2):
    """`iter_num` batches (keys [b, slot_num, max_nnz], labels [b, 1]) cycling over `distinct`
    ones; a label is 1 where its keys' hidden scores sum above zero. Seeded by the rank."""
    rng = np.random.RandomState(hvd.rank())
    scores = np.random.RandomState(7).uniform(-1, 1, size=vocabulary_size)
    keys = rng.randint(0, vocabulary_size, size=(distinct * batch_size, slot_num, max_nnz))
    labels = (scores[keys].sum(axis=(1, 2)) > 0).astype(np.float32).reshape(-1, 1)
    dataset = tf.data.Dataset.from_tensor_slices((keys.astype(np.int64), labels))
    return dataset.batch(batch_size).repeat(iter_num // distinct)


def main():
    global_batch_size = 64
    slot_num = 10
    nnz_per_slot = 5
    set_mixed_float16()
    dataset = get_dataset(global_batch_size // hvd.size(), slot_num=slot_num,
                          max_nnz=nnz_per_slot)
    sok_init_op = sok.Init(global_batch_size=global_batch_size)
    model = SOKDenseDemo(max_vocabulary_size_per_gpu=1024, embedding_vec_size=8,
                         slot_num=slot_num, nnz_per_slot=nnz_per_slot, num_dense_layers=0)
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.1)
    optimizer = sok.tf.keras.mixed_precision.LossScaleOptimizer(optimizer, 1024)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")

    def _replica_loss(labels, logits):
        loss = loss_fn(labels, logits)
        dtype = loss.dtype
        loss = tf.cast(loss, tf.float32)
        loss = tf.nn.compute_average_loss(loss, global_batch_size=global_batch_size)
        return tf.cast(loss, dtype)

    def train_step(inputs, labels):
        logit = model(inputs, training=True)
        loss = _replica_loss(labels, logit)
        scaled_loss = optimizer.get_scaled_loss(loss)
        scaled_gradients = tf.gradients(scaled_loss, model.trainable_variables)
        emb_vars, other_vars = sok.split_embedding_variable_from_others(
            model.trainable_variables)
        scaled_emb_grads = scaled_gradients[:len(emb_vars)]
        scaled_other_grads = scaled_gradients[len(emb_vars):]
        emb_grads = optimizer.get_unscaled_gradients(scaled_emb_grads)
        other_grads = optimizer.get_unscaled_gradients(scaled_other_grads)
        other_grads = [hvd.allreduce(grad) for grad in other_grads]
        with sok.OptimizerScope(emb_vars):
            emb_train_op = optimizer.apply_gradients(zip(emb_grads, emb_vars))
        other_train_op = optimizer.apply_gradients(zip(other_grads, other_vars))
        total_loss = hvd.allreduce(loss)
        with tf.control_dependencies([emb_train_op, other_train_op]):
            return tf.identity(total_loss)

    train_iterator = tf.data.make_initializable_iterator(dataset)
    iterator_init = train_iterator.initializer
    inputs, labels = train_iterator.get_next()
    loss = train_step(inputs, labels)
    init_op = tf.group(tf.global_variables_initializer(), tf.local_variables_initializer())
    with tf.Session() as sess:
        sess.run(sok_init_op)
        sess.run([init_op, iterator_init])
        for step in range(10):
            loss_v = sess.run(loss)
            if hvd.local_rank() == 0:
                print("[INFO]: step {}, loss {}".format(step, loss_v))


if __name__ == "__main__":
    hvd.init()
    main()
