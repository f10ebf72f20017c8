"""Port of SOK's MixedPrecision tutorial for TensorFlow 2 (HugeCTR commit f31630a84,
sparse_operation_kit/documents/tutorials/MixedPrecision/amp_tf2.py): an All2AllDenseEmbedding
model (utility.SOKDenseDemo) under Keras' mixed_float16 policy, in a
tf.distribute.MirroredStrategy, trained by Keras Adam wrapped in Keras' LossScaleOptimizer (a
dynamic loss scale), eagerly (TensorFlow 2).
Changed: the imports (sparse_operation_kit -> sok1x; utility is the port beside this file,
models.py and utility.py), the data (utility's synthetic batches with learnable labels), the
sizes (global_batch_size 64), and Keras' Adam taken from tf.keras.optimizers.legacy in TF 2.11+,
where the one of the TensorFlow SOK's tutorial is for is now named.
Not the same: SOK runs one process over all GPUs, its MirroredStrategy splitting each batch
over them and mirroring the dense layers; sok1x runs one process per device (`mpiexec -n N`),
so each rank's MirroredStrategy has the one device of its rank and reads batches of
global_batch_size of its own; the embedding is model-parallel over the ranks as in SOK, and
the dense layers are trained by each rank on its own batches (nothing in this program
all-reduces them across processes; the MultiWorkerMirroredStrategy and Horovod tutorials do).
Runs as `mpiexec -n N python amp_tf2.py`; each rank prints "step i, loss x".
"""
import tensorflow as tf

import sok1x as sok
import utility

# SOK's tutorial is for TensorFlow <= 2.10, whose tf.keras.optimizers.Adam is the OptimizerV2 that
# one LossScaleOptimizer applies to two sets of variables; in TF 2.11+ that one is
# tf.keras.optimizers.legacy.Adam (the new one refuses variables it was not built with).
keras_optimizers = getattr(tf.keras.optimizers, "legacy", tf.keras.optimizers)


def main():
    global_batch_size = 64
    slot_num = 10
    nnz_per_slot = 5

    policy = tf.keras.mixed_precision.Policy("mixed_float16")
    tf.keras.mixed_precision.set_global_policy(policy)

    strategy = tf.distribute.MirroredStrategy()

    dataset = utility.get_dataset(global_batch_size, read_batchsize=global_batch_size)
    dataset = strategy.experimental_distribute_dataset(dataset)

    with strategy.scope():
        sok.Init(global_batch_size=global_batch_size)

        model = utility.SOKDenseDemo(
            max_vocabulary_size_per_gpu=1024,
            embedding_vec_size=8,
            slot_num=slot_num,
            nnz_per_slot=nnz_per_slot,
            num_dense_layers=0,
        )

        optimizer = keras_optimizers.Adam(learning_rate=0.1)
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)

    loss_fn = tf.keras.losses.BinaryCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    def _replica_loss(labels, logits):
        labels = tf.cast(labels, logits.dtype)
        loss = loss_fn(labels, logits)
        dtype = loss.dtype
        loss = tf.cast(loss, tf.float32)
        loss = tf.nn.compute_average_loss(loss, global_batch_size=global_batch_size)
        return tf.cast(loss, dtype)

    @tf.function
    def train_step(inputs, labels):
        with tf.GradientTape() as tape:
            logit = model(inputs, training=True)
            loss = _replica_loss(labels, logit)
            scaled_loss = optimizer.get_scaled_loss(loss)
        emb_vars, other_vars = sok.split_embedding_variable_from_others(model.trainable_variables)
        scaled_emb_grads, scaled_other_grads = tape.gradient(scaled_loss, [emb_vars, other_vars])
        emb_grads = optimizer.get_unscaled_gradients(scaled_emb_grads)
        other_grads = optimizer.get_unscaled_gradients(scaled_other_grads)
        with sok.OptimizerScope(emb_vars):
            optimizer.apply_gradients(
                zip(emb_grads, emb_vars), experimental_aggregate_gradients=False
            )
        optimizer.apply_gradients(zip(other_grads, other_vars))
        return loss

    for step, (inputs, labels) in enumerate(dataset):
        replica_loss = strategy.run(train_step, args=(inputs, labels))
        total_loss = strategy.reduce("sum", replica_loss, axis=None)
        print("[INFO]: step {}, loss {}".format(step, total_loss))


if __name__ == "__main__":
    main()
