"""SOK v1's TFDistributedEmbedding: a whole [vocabulary_size, embedding_vec_size] table in one
TensorFlow variable, looked up with tf.nn.embedding_lookup. SOK's spreads the lookup over the
replicas of a tf.distribute strategy and gathers the vectors back; every replica then holds the
vectors of its own keys, which is what this layer returns on each rank (the variable is each
rank's whole copy, data parallel: average its gradients as any dense one, e.g. sok1x.allreduce)."""
import numpy as np

from sok1x.graph_ops.tf_compat import tf1


class TFDistributedEmbedding(tf1.keras.layers.Layer):
    """TFDistributedEmbedding(vocabulary_size, embedding_vec_size, initializer="GlorotNormal",
    comm_options=None): call(keys) -> float32 [*keys.shape, embedding_vec_size]. initializer: a
    Keras initializer name or an array of shape [vocabulary_size, embedding_vec_size] (else
    ValueError). comm_options is accepted for SOK's signature."""

    def __init__(self, vocabulary_size, embedding_vec_size, initializer="GlorotNormal",
                 comm_options=None, **kwargs):
        super(TFDistributedEmbedding, self).__init__(**kwargs)
        self._vocabulary_size = int(vocabulary_size)
        self._embedding_vec_size = int(embedding_vec_size)
        self._comm_options = comm_options
        shape = (self._vocabulary_size, self._embedding_vec_size)
        if isinstance(initializer, str):
            initial_value = tf1.keras.initializers.get(initializer)(shape=shape)
        else:
            if tuple(np.shape(initializer)) != shape:
                raise ValueError("%s: the initial value must have shape [vocabulary_size, "
                                 "embedding_vec_size] = %s, got %s"
                                 % (self.name, list(shape), list(np.shape(initializer))))
            initial_value = initializer
        self._embedding_weights = tf1.Variable(initial_value=initial_value, dtype=tf1.float32,
                                               name="EmbeddingWeights")

    @property
    def embedding_weights(self):
        """The table's variable [vocabulary_size, embedding_vec_size]."""
        return self._embedding_weights

    def call(self, inputs):
        """inputs: int32 or int64 keys of any shape; returns their vectors."""
        return tf1.nn.embedding_lookup(self._embedding_weights, inputs)
