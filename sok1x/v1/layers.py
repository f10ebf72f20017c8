"""SOK's v1 embedding layers, as Keras layers usable in graph mode (seeds 000, 001, 004)."""
from sok1x.common.handle_variable import create_handle
from sok1x.graph_ops.embedding_tag import table_of
from sok1x.graph_ops import embedding_ops
from sok1x.graph_ops.table_names import claim_table_name
from sok1x.graph_ops.tf_compat import keras, keras_dtype, layer_compute_dtype, tf1
from sok1x.common.initializers import spec_from_initializer
from sok1x.v1 import sok_files

_KEY_DTYPES = (tf1.int64, tf1.int32, tf1.uint32)
_OUTPUT_DTYPES = (tf1.float32, tf1.float16, tf1.bfloat16)


def _check_key_dtype(layer, key_dtype):
    """Returns the layer's key dtype (None: int64); raises ValueError for one SOK lacks."""
    if key_dtype is None:
        return tf1.int64
    if key_dtype not in _KEY_DTYPES:
        raise ValueError("%s: key_dtype must be tf.int64, tf.int32 or tf.uint32, got %r"
                         % (layer, key_dtype))
    return tf1.as_dtype(key_dtype)


def _engine_keys(layer, keys):
    """The layer's int keys as the engine takes them (uint32 widened to int64); raises
    ValueError naming the layer for another dtype."""
    if keys.dtype not in _KEY_DTYPES:
        raise ValueError("%s: keys must be int64, int32 or uint32, got %s" % (layer.name,
                                                                             keys.dtype))
    return tf1.cast(keys, tf1.int64) if keys.dtype == tf1.uint32 else keys


def _check_positive(layer, **values):
    for name, value in values.items():
        if int(value) <= 0:
            raise ValueError("%s: %s must be a positive integer, got %r" % (layer, name, value))


def _set_up_table(layer, max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable,
                  key_dtype, embedding_initializer):
    """Checks and stores the settings both layers share and creates the layer's handle variable
    (layer.var) over a table of its own (layer.table_name, graph_ops/table_names.py); raises
    ValueError naming the layer."""
    _check_positive(layer.name, max_vocabulary_size_per_gpu=max_vocabulary_size_per_gpu,
                    embedding_vec_size=embedding_vec_size)
    key_dtype = _check_key_dtype(layer.name, key_dtype)
    layer.max_vocabulary_size_per_gpu = int(max_vocabulary_size_per_gpu)
    layer.embedding_vec_size = int(embedding_vec_size)
    layer.use_hashtable = bool(use_hashtable)
    layer.key_dtype = key_dtype
    compute_dtype = layer_compute_dtype(layer)
    if compute_dtype not in _OUTPUT_DTYPES:
        raise ValueError("%s: embedding outputs can be float32, float16 or bfloat16, not %s "
                         "(from dtype=/the Keras dtype policy)" % (layer.name, compute_dtype.name))
    layer.init_spec = spec_from_initializer(embedding_initializer, layer.name)
    layer.table_name = claim_table_name(layer.name, "EmbeddingVariable")
    layer.var = create_handle(layer, layer.table_name, layer.embedding_vec_size,
                              layer.max_vocabulary_size_per_gpu, layer.use_hashtable,
                              layer.init_spec)
    layer.var.m_var_name = sok_files.m_var_name(layer.var)  # SOK v1's name (its dump files')
    layer.var.sok1x_key_dtype = key_dtype.name


def _in_compute_dtype(layer, outputs):
    """Mixed precision: the lookup's float32 outputs cast to the layer's compute dtype (float16
    with dtype="mixed_float16", or under Keras' mixed_float16 policy). The table and its
    optimizer state stay float32 in the engine; the cast's gradient turns the model's float16
    gradient back into float32 before it reaches the engine."""
    dtype = layer_compute_dtype(layer)
    return outputs if dtype == tf1.float32 else tf1.cast(outputs, dtype)


def _training(training):
    """A layer call's training flag as a Python bool: None (not told) is the default, True."""
    return True if training is None else bool(training)


class _TableLayer(keras.layers.Layer):
    """What SOK's v1 layers share: one table, whose handle variable is `var`."""

    def __init__(self, **kwargs):
        if "dtype" in kwargs:  # dtype="mixed_float16" on TensorFlow 1.15 too
            kwargs["dtype"] = keras_dtype(kwargs["dtype"])
        super(_TableLayer, self).__init__(**kwargs)

    @property
    def embedding_variable(self):
        """SOK v1's name for the layer's embedding variable (the same as layer.var)."""
        return self.var


class All2AllDenseEmbedding(_TableLayer):
    """Model-parallel equivalent of tf.nn.embedding_lookup over one table spread on all ranks.

    Keys (owner rank = key % world_size) are sent to their owners all-to-all, looked up (inserted
    on first sight when training with use_hashtable) and the vectors sent back in input order.
    Input: int keys [batch, slot_num, nnz_per_slot] (any shape when dynamic_input=True).
    Output: float32 [batch, slot_num, nnz_per_slot, embedding_vec_size] (or [*input, dim]);
    float16 with dtype="mixed_float16" or under Keras' mixed_float16 policy (the table stays
    float32).
    """

    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, nnz_per_slot,
                 dynamic_input=False, use_hashtable=True, key_dtype=tf1.int64,
                 embedding_initializer=None, **kwargs):
        super(All2AllDenseEmbedding, self).__init__(**kwargs)
        _check_positive(self.name, slot_num=slot_num, nnz_per_slot=nnz_per_slot)
        self.slot_num = int(slot_num)
        self.nnz_per_slot = int(nnz_per_slot)
        self.dynamic_input = bool(dynamic_input)
        _set_up_table(self, max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable,
                      key_dtype, embedding_initializer)

    def call(self, inputs, training=True):
        """inputs: int keys; training: Python bool (False: unknown keys give zero vectors; None,
        which TensorFlow 1.15's Keras models pass when not told, is the default, True)."""
        keys = _engine_keys(self, tf1.convert_to_tensor(inputs))
        row_shape = None
        if not self.dynamic_input:
            expected = [self.slot_num, self.nnz_per_slot]
            if keys.shape.ndims is not None and (
                    keys.shape.ndims != 3 or not keys.shape[1:].is_compatible_with(expected)):
                raise ValueError("%s: keys must have shape [batch, %d, %d], got %s"
                                 % (self.name, self.slot_num, self.nnz_per_slot, keys.shape))
            row_shape = (self.slot_num, self.nnz_per_slot)
        return _in_compute_dtype(self, embedding_ops.dense_lookup(
            table_of(self.var), self.var.read_value(), keys, _training(training), row_shape,
            self.name + "_lookup"))


class DistributedEmbedding(_TableLayer):
    """Model-parallel equivalent of tf.nn.embedding_lookup_sparse over one table on all ranks.

    Input: a SparseTensor of int keys with dense shape [batch * slot_num, max_nnz].
    Output: float32 [batch, slot_num, embedding_vec_size], each (sample, slot) the sum or mean of
    its keys' vectors (zeros for one with no keys); float16 with dtype="mixed_float16" or under
    Keras' mixed_float16 policy (the table stays float32).
    """

    def __init__(self, combiner, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num,
                 max_nnz, max_feature_num=1, use_hashtable=True, key_dtype=tf1.int64,
                 embedding_initializer=None, **kwargs):
        super(DistributedEmbedding, self).__init__(**kwargs)
        if combiner not in ("sum", "mean"):
            raise ValueError("%s: combiner must be 'sum' or 'mean', got %r" % (self.name, combiner))
        _check_positive(self.name, slot_num=slot_num, max_nnz=max_nnz,
                        max_feature_num=max_feature_num)
        self.combiner = combiner
        self.slot_num = int(slot_num)
        self.max_nnz = int(max_nnz)
        self.max_feature_num = int(max_feature_num)
        _set_up_table(self, max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable,
                      key_dtype, embedding_initializer)

    def call(self, inputs, training=True):
        """inputs: tf.SparseTensor of int keys; training: Python bool (None: True, as above)."""
        if not isinstance(inputs, tf1.SparseTensor):
            raise ValueError("%s: input must be a tf.SparseTensor of keys, got %r"
                             % (self.name, type(inputs).__name__))
        # Keras marks its symbolic sparse input (a functional model's keras.Input) on the
        # SparseTensor itself, not on its parts: tell the lookup before taking it apart.
        symbolic = embedding_ops.is_symbolic(inputs)
        inputs = tf1.SparseTensor(inputs.indices, _engine_keys(self, inputs.values),
                                  inputs.dense_shape)
        return _in_compute_dtype(self, embedding_ops.sparse_lookup(
            table_of(self.var), self.var.read_value(), inputs, self.slot_num, self.max_nnz,
            self.combiner, _training(training), self.name + "_lookup", symbolic_input=symbolic))

