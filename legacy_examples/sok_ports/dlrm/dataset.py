"""Port of SOK's DLRM tutorial's input reader (HugeCTR commit f31630a84,
sparse_operation_kit/documents/tutorials/DLRM/dataset.py). Changed: the data. CriteoTsvReader
keeps its signature and what its dataset yields (features {"dense_features": float32
[b, num_dense_features], "sparse_features": {"0": int32 [b], ...}}, labels int32 [b, 1]), but
makes synthetic samples in place of reading the preprocessed Criteo files of file_pattern: keys
uniform over each feature's vocabulary, dense features uniform in [0, 1), and a learnable label,
1 where the sample's keys' hidden scores and its dense features sum above zero. Each file
pattern (train, test) and each MPI rank gets samples of its own.
SOK's code: Copyright (c) 2021, NVIDIA CORPORATION, under the Apache License 2.0.
"""
import os
import zlib
from typing import List

import numpy as np
import tensorflow as tf


class CriteoTsvReader:
    """
    Input reader for pre-processed Criteo data (here: synthetic samples shaped as that data).
    """

    def __init__(
        self,
        file_pattern: str,
        num_dense_features: int,
        vocab_sizes: List[int],
        batch_size: int,
        sharding: bool = False,
        num_batches: int = 64,
    ):
        self._file_pattern = file_pattern
        self._num_dense_features = num_dense_features
        self._vocab_sizes = vocab_sizes
        self._batch_size = batch_size
        self._sharding = sharding
        self._num_batches = num_batches

    def __call__(self, input_ctx: tf.distribute.InputContext = None) -> tf.data.Dataset:
        batch_size = (
            input_ctx.get_per_replica_batch_size(self._batch_size)
            if input_ctx
            else self._batch_size
        )
        rank = int(os.getenv("OMPI_COMM_WORLD_RANK", os.getenv("PMI_RANK", "0")))
        rng = np.random.RandomState(zlib.crc32(str(self._file_pattern).encode()) + rank)
        hidden = np.random.RandomState(7)  # the same scores on every rank and in every file
        samples = self._num_batches * batch_size
        sparse, score = {}, np.zeros(samples)
        for idx, vocab_size in enumerate(self._vocab_sizes):
            keys = rng.randint(0, vocab_size, size=samples)
            score += hidden.uniform(-1, 1, size=vocab_size)[keys]
            sparse[str(idx)] = keys.astype(np.int32)
        dense = rng.uniform(0, 1, size=(samples, self._num_dense_features)).astype(np.float32)
        score += dense @ hidden.uniform(-1, 1, size=self._num_dense_features)
        labels = (score > np.median(score)).astype(np.int32).reshape(-1, 1)
        features = {"dense_features": dense, "sparse_features": sparse}
        dataset = tf.data.Dataset.from_tensor_slices((features, labels))
        dataset = dataset.batch(batch_size, drop_remainder=True)
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
        return dataset
