"""sok1x.tf.keras.optimizers.Adam (SOK's sok.tf.keras.optimizers.Adam): Keras' Adam, with the
arguments of tf.keras.optimizers.Adam (OptimizerV2), for dense and sok1x embedding variables alike.

Embedding variables get Keras Adam's sparse update through the engine (every row's moments decay);
dense variables keep Keras' own update, with repeated IndexedSlices indices summed by sok1x.unique
and sok1x.unsorted_segment_sum (GPU kernels on cuda) instead of TensorFlow's.
"""
from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.graph_ops import sparse_math_ops
from sok1x.graph_ops.tf_compat import tf1
from sok1x.optimizers.initializer import InitializerMixin
from sok1x.optimizers import embedding_update, native_rules


class Adam(InitializerMixin, tf1.keras.optimizers.Adam):
    """tf.keras.optimizers.Adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
    amsgrad=False, name="Adam", **kwargs) that also updates sok1x embedding variables."""

    _sok1x_updates_embeddings = True

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
        if is_embedding_variable(handle):
            return embedding_update.update_op(self, handle, grad, indices,
                                              native_rules.keras_adam(self))
        summed, distinct = sparse_math_ops.deduplicate(grad, indices)
        return self._resource_apply_sparse(summed, handle, distinct, **kwargs)

    def _resource_apply_dense(self, grad, var, *args, **kwargs):
        if is_embedding_variable(var):
            raise embedding_update.dense_gradient_error(var)
        return super(Adam, self)._resource_apply_dense(grad, var, *args, **kwargs)
