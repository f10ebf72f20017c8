"""Port of what SOK's tutorials import from their utility (HugeCTR commit f31630a84,
sparse_operation_kit/documents/tutorials/utility.py, and get_embedding_optimizer /
get_dense_optimizer of sparse_operation_kit/unit_test/test_scripts/tf2/utils.py, which it
re-exports). Changed: the import (sparse_operation_kit -> sok1x); the data: TFDataset and
get_dataset make synthetic batches with learnable labels (a label is 1 where its keys' hidden
scores sum above zero) in place of SOK's data files and random labels, each process its own
samples (seeded by its MPI rank) in batches of the size asked for; free_port_base, the
MultiWorker tutorial's ports in place of SOK's fixed 12345.
"""
import os

import numpy as np
import tensorflow as tf

import sok1x as sok
from models import SOKDenseDemo  # noqa: F401  (SOK's utility re-exports it)


def mpi_rank():
    """This process's rank from the MPI launcher's environment (MPICH's or Open MPI's), else 0."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def synthetic_dataset(batchsize, iterations, vocabulary_size, slot_num, nnz_per_slot,
                      distinct=2):
    """`iterations` batches of `batchsize` (keys int64 [b, slot_num, nnz_per_slot], labels
    float32 [b, 1]) cycling over `distinct`, seeded by the rank."""
    rng = np.random.RandomState(mpi_rank())
    scores = np.random.RandomState(7).uniform(-1, 1, size=vocabulary_size)
    keys = rng.randint(0, vocabulary_size, size=(distinct * batchsize, slot_num, nnz_per_slot))
    labels = (scores[keys].sum(axis=(1, 2)) > 0).astype(np.float32).reshape(-1, 1)
    dataset = tf.data.Dataset.from_tensor_slices((keys.astype(np.int64), labels))
    return dataset.batch(batchsize).repeat(max(1, iterations // distinct))


def TFDataset(filename, batchsize, as_sparse_tensor, repeat=1, iterations=10,
              vocabulary_size=1024, slot_num=10, nnz_per_slot=4):
    """Synthetic batches in place of SOK's file `filename` (unread): `iterations` * `repeat`
    batches of `batchsize`. as_sparse_tensor=True is not ported (no tutorial here uses it)."""
    if as_sparse_tensor:
        raise ValueError("utility.TFDataset: as_sparse_tensor=True is not ported")
    return synthetic_dataset(batchsize, iterations * repeat, vocabulary_size, slot_num,
                             nnz_per_slot)


def get_dataset(global_batch_size, read_batchsize, iter_num=10, vocabulary_size=1024,
                slot_num=10, max_nnz=5, use_sparse_mask=False, repeat=1):
    """Synthetic batches of `read_batchsize`, `iter_num` * `repeat` of them, as SOK's
    (use_sparse_mask=True is not ported)."""
    if use_sparse_mask:
        raise ValueError("utility.get_dataset: use_sparse_mask=True is not ported")
    return synthetic_dataset(read_batchsize, iter_num * repeat, vocabulary_size, slot_num,
                             max_nnz)


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


def get_embedding_optimizer(optimizer_type):
    if not isinstance(optimizer_type, str):
        raise ValueError("optimizer_type must be str type, but got ", type(optimizer_type))
    if optimizer_type == "plugin_adam":
        return sok.optimizers.Adam
    elif optimizer_type == "adam":
        return tf.keras.optimizers.Adam
    elif optimizer_type == "sgd":
        return tf.keras.optimizers.SGD
    else:
        raise ValueError("Not supported optimizer_type: %s" % optimizer_type)


def get_dense_optimizer(optimizer_type):
    if not isinstance(optimizer_type, str):
        raise ValueError("optimizer_type must be str type, but got ", type(optimizer_type))
    if optimizer_type == "plugin_adam":
        return tf.keras.optimizers.Adam
    elif optimizer_type == "adam":
        return tf.keras.optimizers.Adam
    elif optimizer_type == "sgd":
        return tf.keras.optimizers.SGD
    else:
        raise ValueError("Not supported optimizer_type: %s" % optimizer_type)
