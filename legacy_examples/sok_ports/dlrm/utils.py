# ruff: noqa  (SOK's code as SOK wrote it: its unused imports and long lines stay)
"""Port of SOK's DLRM tutorial's utils (HugeCTR commit f31630a84,
sparse_operation_kit/documents/tutorials/DLRM/utils.py): the learning-rate schedule, the
strategy helpers (all-reduce, all-gather, broadcast through tf.distribute or Horovod) and the
logs. Changed: the import (sparse_operation_kit -> sok1x), Keras' optimizers taken from
tf.keras.optimizers.legacy in TF 2.11+, where those of the TensorFlow SOK's tutorial is for are
now named, and the rank that show_logs prints on also read from MPICH's PMI_RANK where Open
MPI's OMPI_COMM_WORLD_RANK is not set; free_port_base, the multiworker strategy's ports in
place of SOK's fixed 12345.
SOK's code: Copyright (c) 2021, NVIDIA CORPORATION, under the Apache License 2.0.
"""

import tensorflow as tf
import sok1x as sok
from models import SOKEmbedding
import os, glob

# port: SOK's tutorial is for TensorFlow <= 2.10, whose tf.keras.optimizers are the OptimizerV2
# ones that TF 2.11+ names tf.keras.optimizers.legacy (get(..., use_legacy_optimizer=True)).
keras_optimizers = getattr(tf.keras.optimizers, "legacy", tf.keras.optimizers)


class EarlyStopper:
    def __init__(self):
        self._stop = False

    def set_stop(self, message):
        self._stop = True
        self._stop_reason = message

    @property
    def stop_reason(self):
        return self._stop_reason

    def should_stop(self):
        return self._stop


class WarmUpAndPolyDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Learning rate callable for the embeddings.
    Linear warmup on [0, warmup_steps] then
    Constant on [warmup_steps, decay_start_steps]
    And polynomial decay on [decay_start_steps, decay_start_steps + decay_steps].
    """

    def __init__(
        self,
        batch_size: int,
        decay_exp: float = 2.0,
        learning_rate: float = 40.0,
        warmup_steps: int = 8000,
        decay_steps: int = 12000,
        decay_start_steps: int = 10000,
    ):
        super(WarmUpAndPolyDecay, self).__init__()
        self.batch_size = batch_size
        self.decay_exp = decay_exp
        self.learning_rate = learning_rate
        self.warmup_steps = warmup_steps
        self.decay_steps = decay_steps
        self.decay_start_steps = decay_start_steps

    def __call__(self, step):
        decay_exp = self.decay_exp
        learning_rate = self.learning_rate
        warmup_steps = self.warmup_steps
        decay_steps = self.decay_steps
        decay_start_steps = self.decay_start_steps

        scal = self.batch_size / 2048

        adj_lr = learning_rate * scal
        if warmup_steps == 0:
            return adj_lr

        warmup_lr = step / warmup_steps * adj_lr
        global_step = tf.cast(step, tf.float32)
        decay_steps = tf.cast(decay_steps, tf.float32)
        decay_start_step = tf.cast(decay_start_steps, tf.float32)
        warmup_lr = tf.cast(warmup_lr, tf.float32)

        steps_since_decay_start = global_step - decay_start_step
        already_decayed_steps = tf.minimum(steps_since_decay_start, decay_steps)
        decay_lr = adj_lr * ((decay_steps - already_decayed_steps) / decay_steps) ** decay_exp
        decay_lr = tf.maximum(0.0001, decay_lr)

        lr = tf.where(
            global_step < warmup_steps,
            warmup_lr,
            tf.where(
                tf.logical_and(decay_steps > 0, global_step > decay_start_step), decay_lr, adj_lr
            ),
        )

        lr = tf.maximum(0.01, lr)
        return lr

    def get_config(self):
        return {
            "batch_size": self.batch_size,
            "decay_exp": self.decay_exp,
            "learning_rate": self.learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "decay_start_steps": self.decay_start_steps,
        }


def free_port_base(count):
    """port: the first of `count` consecutive TCP ports that no process held on this host when
    rank 0 looked (the OS picks the first; every rank gets rank 0's answer through mpi4py), in
    place of SOK's fixed 12345, so two jobs on one host never share a worker's port."""
    import socket

    from mpi4py import MPI

    base = None
    if MPI.COMM_WORLD.rank == 0:
        for _ in range(100):
            held = []
            try:
                for offset in range(count):
                    held.append(socket.socket())
                    held[-1].bind(("", 0 if offset == 0 else base + offset))
                    if offset == 0:
                        base = held[0].getsockname()[1]
                break
            except (OSError, OverflowError):
                base = None  # one of the next ports is taken: another first port
            finally:
                for sock in held:
                    sock.close()
    return MPI.COMM_WORLD.bcast(base)


def get_optimizer(optimizer=None):
    if not optimizer:
        return keras_optimizers.Adam()
    else:
        if keras_optimizers is not tf.keras.optimizers:  # port: TF 2.11+
            return tf.keras.optimizers.get(optimizer, use_legacy_optimizer=True)
        return tf.keras.optimizers.get(optimizer)


def get_lr_callable(
    global_batch_size, decay_exp, learning_rate, warmup_steps, decay_steps, decay_start_steps
):
    return WarmUpAndPolyDecay(
        batch_size=global_batch_size,
        decay_exp=decay_exp,
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=decay_steps,
        decay_start_steps=decay_start_steps,
    )


class NullScope(object):
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, exc_tb):
        return False


class NullStrategy(object):
    def scope(self):
        return NullScope()

    def run(self, func, *args, **kwargs):
        return func(*args, **kwargs)

    def gather(self, tensor, axis):
        import horovod.tensorflow as hvd

        return hvd.allgather(tensor)


def shard_filenames(file_pattern, num_pipelines, pipeline_id):
    matching_files = glob.glob(file_pattern)
    matching_files.sort()

    nums_per_shard = len(matching_files) // num_pipelines

    return matching_files[pipeline_id * nums_per_shard : (pipeline_id + 1) * nums_per_shard]


def get_distribute_dataset(dataset, strategy, distribute_dataset=True):
    if isinstance(strategy, NullStrategy) or not distribute_dataset:
        return dataset()
    else:
        return strategy.distribute_datasets_from_function(
            lambda input_context: dataset(input_context), options=tf.distribute.InputOptions()
        )


def split_embedding_variables_from_others(model):
    if isinstance(model.embedding_layer, SOKEmbedding):
        return sok.split_embedding_variable_from_others(model.trainable_variables)
    else:
        dense_vars = []
        for layer in model.layers:
            if layer != model.embedding_layer:
                dense_vars.extend(layer.trainable_variables)
        return model.embedding_layer.trainable_variables, dense_vars


def all_reduce(tensors, combiner="sum", comm_options=None):
    if tf.distribute.has_strategy():
        replica_ctx = tf.distribute.get_replica_context()
        return replica_ctx.all_reduce(combiner, tensors, options=comm_options)
    else:
        import horovod.tensorflow as hvd

        return [hvd.allreduce(tensor) for tensor in tensors]


def all_gather(tensors, axis=0, comm_options=None):
    if tf.distribute.has_strategy():
        replica_ctx = tf.distribute.get_replica_context()
        return replica_ctx.all_gather(tensors, axis=axis, options=comm_options)
    else:
        import horovod.tensorflow as hvd

        return [hvd.allgather(tensor) for tensor in tensors]


def apply_gradients(optimizer, variables, grads, using_sok, aggregate_gradients=False):
    if using_sok:
        with sok.OptimizerScope(variables):
            optimizer.apply_gradients(zip(grads, variables), experimental_aggregate_gradients=False)
    else:
        optimizer.apply_gradients(
            zip(grads, variables), experimental_aggregate_gradients=aggregate_gradients
        )


def broadcast_variables(variables):
    if tf.distribute.has_strategy():
        return
    else:
        import horovod.tensorflow as hvd

        hvd.broadcast_variables(variables, root_rank=0)


def show_logs(logs, strategy, elapsed_time, steps_sec, metrics_threshold, stopper):
    for key, value in logs.items():
        if hasattr(value, "values"):
            logs[key] = value.values[0]
        if hasattr(value, "numpy"):
            logs[key] = value.numpy()

    def no_print():
        return

    def print_logs():
        print("-" * 23, logs["global_step"], "-" * 23)
        del logs["global_step"]
        for key, value in logs.items():
            print(f"{key}: {logs[key]}")
        print("elapsed_time:", elapsed_time)
        print("steps/sec:", steps_sec)
        print("-" * 50)

    if isinstance(strategy, NullStrategy):
        import horovod.tensorflow as hvd

        if hvd.local_rank() != 0:
            no_print()
        else:
            print_logs()
    elif os.getenv("OMPI_COMM_WORLD_RANK", os.getenv("PMI_RANK")):  # port: or MPICH's
        rank = os.getenv("OMPI_COMM_WORLD_RANK", os.getenv("PMI_RANK"))
        if int(rank) != 0:
            no_print()
        else:
            print_logs()
    else:
        print_logs()

    for key, value in metrics_threshold.items():
        if logs[key] >= value:
            stopper.set_stop(
                f"Metric {key}: {logs[key]} meets its " f"threshold {value}, stop training."
            )
            break
