"""Port of SOK's DenseDemo tutorial with Horovod (documents/tutorials/DenseDemo/
run_sok_horovod.py with the SOKDenseDemo model of models.py and the optimizers of the tutorials'
utility): an All2AllDenseEmbedding model trained in a tf.function by SOK's Adam (plugin_adam,
the default) or a Keras optimizer in sok.OptimizerScope, the dense gradients through
hvd.DistributedGradientTape, eagerly (TensorFlow 2). Changed: the imports (sparse_operation_kit
-> sok1x; nvtx, a profiler, and its ranges dropped), the data (synthetic, learnable labels, in
place of the tutorial's data files) and the sizes. Runs as `mpiexec -n N python
dense_demo_horovod.py`; prints "Iteration: i, loss=x".
"""
import argparse

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sok1x as sok


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


def get_embedding_optimizer(optimizer_type):
    return {"plugin_adam": sok.optimizers.Adam, "adam": tf.keras.optimizers.Adam,
            "sgd": tf.keras.optimizers.SGD}[optimizer_type]


def get_dense_optimizer(optimizer_type):
    return {"plugin_adam": tf.keras.optimizers.Adam, "adam": tf.keras.optimizers.Adam,
            "sgd": tf.keras.optimizers.SGD}[optimizer_type]


def local_dataset(batch_size, slot_num, nnz_per_slot, vocabulary_size, iterations, distinct=2):
    """This rank's batches (keys [b, slot_num, nnz_per_slot], labels [b, 1]), cycling over
    `distinct`; a label is 1 where its keys' hidden scores sum above zero."""
    rng = np.random.RandomState(hvd.rank())
    scores = np.random.RandomState(7).uniform(-1, 1, size=vocabulary_size)
    keys = rng.randint(0, vocabulary_size, size=(distinct * batch_size, slot_num, nnz_per_slot))
    labels = (scores[keys].sum(axis=(1, 2)) > 0).astype(np.float32).reshape(-1, 1)
    dataset = tf.data.Dataset.from_tensor_slices((keys.astype(np.int64), labels))
    return dataset.batch(batch_size).repeat(iterations // distinct)


def main(args):
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    assert args.global_batch_size % hvd.size() == 0
    local_batch_size = args.global_batch_size // hvd.size()
    dataset = local_dataset(local_batch_size, args.slot_num, args.nnz_per_slot,
                            args.max_vocabulary_size_per_gpu, args.iterations)
    sok.Init(global_batch_size=args.global_batch_size)
    model = SOKDenseDemo(max_vocabulary_size_per_gpu=args.max_vocabulary_size_per_gpu,
                         embedding_vec_size=args.embedding_vec_size, slot_num=args.slot_num,
                         nnz_per_slot=args.nnz_per_slot,
                         num_dense_layers=args.num_dense_layers)
    embedding_optimizer = get_embedding_optimizer(args.optimizer)(learning_rate=0.1)
    dense_optimizer = get_dense_optimizer(args.optimizer)(learning_rate=0.1)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True,
                                                 reduction=tf.keras.losses.Reduction.NONE)

    def _replica_loss(labels, logits):
        loss = loss_fn(labels, logits)
        return tf.nn.compute_average_loss(loss, global_batch_size=args.global_batch_size)

    @tf.function
    def _train_step(inputs, labels, first_batch):
        with tf.GradientTape() as tape, tf.GradientTape() as emb_tape:
            logit = model(inputs, training=True)
            replica_loss = _replica_loss(labels, logit)
        tape = hvd.DistributedGradientTape(tape)
        emb_variable, other_variable = sok.split_embedding_variable_from_others(
            model.trainable_variables)
        emb_grads = emb_tape.gradient(replica_loss, emb_variable)
        grads = tape.gradient(replica_loss, other_variable)
        if "plugin" not in args.optimizer:
            with sok.OptimizerScope(emb_variable):
                embedding_optimizer.apply_gradients(zip(emb_grads, emb_variable),
                                                    experimental_aggregate_gradients=False)
        else:
            embedding_optimizer.apply_gradients(zip(emb_grads, emb_variable),
                                                experimental_aggregate_gradients=False)
        dense_optimizer.apply_gradients(zip(grads, other_variable))
        if first_batch:
            hvd.broadcast_variables(other_variable, root_rank=0)
            hvd.broadcast_variables(dense_optimizer.variables(), root_rank=0)
        return replica_loss

    for i, (inputs, labels) in enumerate(dataset):
        if args.stop_at_iter > 0 and i >= args.stop_at_iter:
            break
        total_loss = _train_step(inputs, labels, i == 0)
        print("[INFO]: Iteration: {}, loss={}".format(i, total_loss))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="run DNN model with SparseOperationKit")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--max_vocabulary_size_per_gpu", type=int, default=1024)
    parser.add_argument("--slot_num", type=int, default=10)
    parser.add_argument("--nnz_per_slot", type=int, default=4)
    parser.add_argument("--num_dense_layers", type=int, default=1)
    parser.add_argument("--embedding_vec_size", type=int, default=8)
    parser.add_argument("--optimizer", type=str, default="plugin_adam",
                        choices=["plugin_adam", "adam", "sgd"])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--stop_at_iter", type=int, default=-1)
    main(parser.parse_args())
