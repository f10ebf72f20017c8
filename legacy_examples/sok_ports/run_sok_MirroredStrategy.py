"""Port of SOK's DenseDemo tutorial with tf.distribute.MirroredStrategy (HugeCTR commit
f31630a84, sparse_operation_kit/documents/tutorials/DenseDemo/run_sok_MirroredStrategy.py):
an All2AllDenseEmbedding model (models.SOKDenseDemo) trained in a tf.function by SOK's Adam
(plugin_adam, the default) or a Keras optimizer in sok.OptimizerScope, step by step through
strategy.run, eagerly (TensorFlow 2).
Changed: the imports (sparse_operation_kit -> sok1x; nvtx and its ranges dropped; models and
utility are the ports beside this file), the data (utility's synthetic batches with learnable
labels, in place of the data file; --iterations says how many), and the sizes (the arguments'
defaults, which SOK's requires on the command line).
Not the same: SOK runs one process over all GPUs, its MirroredStrategy splitting each batch
over them and mirroring the dense layers; sok1x runs one process per device (`mpiexec -n N`),
so each rank's MirroredStrategy has the one device of its rank and reads batches of
global_batch_size of its own; the embedding is model-parallel over the ranks as in SOK, and
the dense layers are trained by each rank on its own batches (nothing in this program
all-reduces them across processes; the MultiWorkerMirroredStrategy and Horovod tutorials do).
Runs as `mpiexec -n N python run_sok_MirroredStrategy.py`; each rank prints "Iteration: i,
loss=x".
"""
import argparse

import tensorflow as tf

from models import SOKDenseDemo
import utility
import sok1x as sok


def main(args):
    strategy = tf.distribute.MirroredStrategy()

    dataset = utility.TFDataset(
        filename=args.data_filename,
        batchsize=args.global_batch_size,
        as_sparse_tensor=False,
        repeat=1,
        iterations=args.iterations,
        vocabulary_size=args.max_vocabulary_size_per_gpu,
        slot_num=args.slot_num,
        nnz_per_slot=args.nnz_per_slot,
    )
    dataset = dataset.prefetch(tf.data.AUTOTUNE)

    dataset = strategy.experimental_distribute_dataset(dataset)

    with strategy.scope():
        sok.Init(global_batch_size=args.global_batch_size)

        model = SOKDenseDemo(
            max_vocabulary_size_per_gpu=args.max_vocabulary_size_per_gpu,
            embedding_vec_size=args.embedding_vec_size,
            slot_num=args.slot_num,
            nnz_per_slot=args.nnz_per_slot,
            num_dense_layers=args.num_dense_layers,
        )

        embedding_optimizer = utility.get_embedding_optimizer(args.optimizer)(learning_rate=0.1)
        dense_optimizer = utility.get_dense_optimizer(args.optimizer)(learning_rate=0.1)

    loss_fn = tf.keras.losses.BinaryCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    def _replica_loss(labels, logits):
        loss = loss_fn(labels, logits)
        return tf.nn.compute_average_loss(loss, global_batch_size=args.global_batch_size)

    @tf.function
    def _train_step(inputs, labels):
        with tf.GradientTape() as tape:
            logit = model(inputs, training=True)
            loss = _replica_loss(labels, logit)
        emb_variable, other_variable = sok.split_embedding_variable_from_others(
            model.trainable_variables
        )
        grads, emb_grads = tape.gradient(loss, [other_variable, emb_variable])
        if "plugin" not in args.optimizer:
            with sok.OptimizerScope(emb_variable):
                embedding_optimizer.apply_gradients(
                    zip(emb_grads, emb_variable), experimental_aggregate_gradients=False
                )
        else:
            embedding_optimizer.apply_gradients(
                zip(emb_grads, emb_variable), experimental_aggregate_gradients=False
            )
        dense_optimizer.apply_gradients(zip(grads, other_variable))
        return loss

    for i, (inputs, labels) in enumerate(dataset):
        if args.stop_at_iter > 0 and i >= args.stop_at_iter:
            break

        replica_loss = strategy.run(_train_step, args=(inputs, labels))
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, replica_loss, axis=None)

        print("[INFO]: Iteration: {}, loss={}".format(i, loss))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="run DNN model with SparseOperationKit")
    parser.add_argument("--data_filename", type=str, default="synthetic",
                        help="the name of the synthetic data (no file is read)")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--max_vocabulary_size_per_gpu", type=int, default=1024)
    parser.add_argument("--slot_num", type=int, default=10, help="the number of feature fields")
    parser.add_argument("--nnz_per_slot", type=int, default=4,
                        help="the number of keys in each slot")
    parser.add_argument("--num_dense_layers", type=int, default=1,
                        help="the number of fully connected layers in this DNN model")
    parser.add_argument("--embedding_vec_size", type=int, default=8,
                        help="the dimension of embedding vectors")
    parser.add_argument("--optimizer", type=str, help="use what optimizer", required=False,
                        default="plugin_adam", choices=["plugin_adam", "adam", "sgd"])
    parser.add_argument("--iterations", type=int, default=10,
                        help="how many batches the synthetic data has")
    parser.add_argument("--stop_at_iter", type=int, required=False, default=-1,
                        help="early stop the process if iteration reaches this setting.")

    args = parser.parse_args()

    main(args)
