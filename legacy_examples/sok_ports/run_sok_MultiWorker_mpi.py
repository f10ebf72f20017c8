"""Port of SOK's DenseDemo tutorial with tf.distribute.MultiWorkerMirroredStrategy over MPI
(HugeCTR commit f31630a84, sparse_operation_kit/documents/tutorials/DenseDemo/
run_sok_MultiWorker_mpi.py): one worker per MPI rank, TF_CONFIG made from the rank; an
All2AllDenseEmbedding model (models.SOKDenseDemo) trained in a tf.function by SOK's Adam
(plugin_adam, the default) or a Keras optimizer in sok.OptimizerScope, the dense gradients and
the loss all-reduced by the strategy's replica context, eagerly (TensorFlow 2).
Changed: the imports (sparse_operation_kit -> sok1x; nvtx and its ranges dropped; models and
utility are the ports beside this file), the data (utility's synthetic batches with learnable
labels, in place of the data files; --iterations says how many), the sizes (the arguments'
defaults, which SOK's requires on the command line), the rank and size also read from MPICH's
PMI_RANK / PMI_SIZE where Open MPI's OMPI_COMM_WORLD_* are not set, and the workers' ports:
TensorFlow's own gRPC on localhost, on consecutive ports from one that no process held when
rank 0 looked (utility.free_port_base), where SOK's use 12345 and up, which two jobs on one
host would both take.
The same as SOK: one process per device, so this program's strategy code is SOK's as it is
(on CPU ranks TensorFlow runs its collectives without NCCL by itself).
Runs as `mpiexec -n N python run_sok_MultiWorker_mpi.py`; rank 0 prints "Iteration: i, loss=x".
"""
import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

from models import SOKDenseDemo
import utility
import sok1x as sok


def main(args, task_id):
    print(task_id)
    comm_options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=0,
        timeout_seconds=None,
        implementation=tf.distribute.experimental.CommunicationImplementation.NCCL,
    )

    if args.total_gpu_num == 1:
        strategy = tf.distribute.MirroredStrategy()
    else:
        port = utility.free_port_base(args.worker_num)  # port: SOK's is 12345
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {
                    "worker": ["localhost" + ":" + str(port + i) for i in range(args.worker_num)]
                },
                "task": {"type": "worker", "index": task_id},
            }
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm_options)

    if args.data_splited:
        filename = args.data_filename + str(task_id) + ".file"
    else:
        filename = args.data_filename

    replica_batch_size = args.global_batch_size // (args.worker_num * 1)

    dataset = utility.TFDataset(
        filename=filename,
        batchsize=replica_batch_size,
        as_sparse_tensor=False,
        repeat=1,
        iterations=args.iterations,
        vocabulary_size=args.max_vocabulary_size_per_gpu,
        slot_num=args.slot_num,
        nnz_per_slot=args.nnz_per_slot,
    )
    dataset = dataset.prefetch(tf.data.AUTOTUNE)

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

        # manually all-reduce dense gradients
        replica_context = tf.distribute.get_replica_context()
        grads = replica_context.all_reduce("sum", grads, options=comm_options)
        dense_optimizer.apply_gradients(
            zip(grads, other_variable), experimental_aggregate_gradients=False
        )

        # manually all-reduce loss, it is ok, because replica_loss has already been used to
        # update local variables.
        loss = replica_context.all_reduce(tf.distribute.ReduceOp.SUM, loss, options=comm_options)
        return loss

    time_arr = []
    for i, (inputs, labels) in enumerate(dataset):
        if args.stop_at_iter > 0 and i >= args.stop_at_iter:
            break

        start_time = time.time()
        total_loss = strategy.run(_train_step, args=(inputs, labels))
        time_arr.append(time.time() - start_time)

        if task_id == "0":
            print("[INFO]: Iteration: {}, loss={}".format(i, total_loss))

    if task_id == "0":
        print("Average iteration time (except 1st iteration): ", np.mean(time_arr[1:]))


def set_affinity(rank):
    affinity_map = {
        0: list(range(48, 64)) + list(range(176, 192)),
        1: list(range(48, 64)) + list(range(176, 192)),
        2: list(range(16, 32)) + list(range(144, 160)),
        3: list(range(16, 32)) + list(range(144, 160)),
        4: list(range(112, 128)) + list(range(240, 256)),
        5: list(range(112, 128)) + list(range(240, 256)),
        6: list(range(80, 96)) + list(range(208, 224)),
        7: list(range(80, 96)) + list(range(208, 224)),
    }

    my_affinity = affinity_map[rank]
    import os

    os.sched_setaffinity(0, my_affinity)


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
    parser.add_argument("--data_splited", type=int, required=False, default=0, choices=[0, 1],
                        help="it is a flag used to denotes whether the data is already split."
                        + "by default, it is set to 0, which means the data is not split.")
    parser.add_argument("--dgx_a100", action="store_true",
                        help="Set if a DGX A100 is being used. In this case, CPU affinity will "
                        "be set for optimal performance.")

    args = parser.parse_args()

    size = int(os.getenv("OMPI_COMM_WORLD_SIZE", os.getenv("PMI_SIZE", "1")))
    args.worker_num = size
    args.total_gpu_num = size

    task_id = os.getenv("OMPI_COMM_WORLD_RANK", os.getenv("PMI_RANK", "0"))

    if args.dgx_a100 == True:  # noqa: E712  (SOK's)
        print(
            "Setting CPU affinity for DGX A100. This will likely fail on a non DGX A100 machine..."
        )
        set_affinity(task_id)

    os.environ["CUDA_VISIBLE_DEVICES"] = str(task_id)
    main(args, task_id)
