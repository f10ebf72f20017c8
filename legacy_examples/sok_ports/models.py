"""Port of SOK's DenseDemo model (HugeCTR commit f31630a84, sparse_operation_kit/documents/
tutorials/DenseDemo/models.py): SOKDenseDemo, an All2AllDenseEmbedding followed by dense layers,
which SOK's DenseDemo and MixedPrecision tutorials import. Changed: the import
(sparse_operation_kit -> sok1x); the file's other models (HashtableEmbedding, TfDenseDemo, used
by the plain-TensorFlow tutorial run_tf.py) are left out.
"""
import tensorflow as tf

import sok1x as sok


class SOKDenseDemo(tf.keras.models.Model):
    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, nnz_per_slot,
                 num_dense_layers, **kwargs):
        super(SOKDenseDemo, self).__init__(**kwargs)

        self.max_vocabulary_size_per_gpu = max_vocabulary_size_per_gpu
        self.slot_num = slot_num
        self.nnz_per_slot = nnz_per_slot
        self.num_dense_layers = num_dense_layers
        self.embedding_vec_size = embedding_vec_size

        self.embedding_layer = sok.All2AllDenseEmbedding(
            max_vocabulary_size_per_gpu=self.max_vocabulary_size_per_gpu,
            embedding_vec_size=self.embedding_vec_size,
            slot_num=self.slot_num,
            nnz_per_slot=self.nnz_per_slot,
        )

        self.dense_layers = []
        for _ in range(self.num_dense_layers):
            self.layer = tf.keras.layers.Dense(units=1024, activation="relu")
            self.dense_layers.append(self.layer)

        self.out_layer = tf.keras.layers.Dense(
            units=1, activation=None, kernel_initializer="ones", bias_initializer="zeros"
        )

    def call(self, inputs, training=True):
        # [batchsize, slot_num, nnz_per_slot, embedding_vec_size]
        embedding_vector = self.embedding_layer(inputs, training=training)
        # [batchsize, slot_num * nnz_per_slot * embedding_vec_size]
        embedding_vector = tf.reshape(
            embedding_vector,
            shape=[-1, self.slot_num * self.nnz_per_slot * self.embedding_vec_size],
        )

        hidden = embedding_vector
        for layer in self.dense_layers:
            hidden = layer(hidden)

        logit = self.out_layer(hidden)
        return logit
