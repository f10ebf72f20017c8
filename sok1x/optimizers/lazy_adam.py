"""sok1x.tf.keras.optimizers.LazyAdamOptimizer (SOK's name): tf.contrib.opt.LazyAdamOptimizer,
for dense and sok1x embedding variables alike, with its arguments (learning_rate=0.001, beta1=0.9,
beta2=0.999, epsilon=1e-8, use_locking=False, name="Adam").

Only rows with a gradient this step move, with their moments:
    m = beta1 * m + (1 - beta1) * g; v = beta2 * v + (1 - beta2) * g^2;
    var -= lr_t * m / (sqrt(v) + epsilon), lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t).
Embedding variables update in the engine; dense variables with TensorFlow ops. Repeated indices
are summed first with sok1x.unique and sok1x.unsorted_segment_sum. Dense gradients get Adam's
dense update, as in tf.contrib.
"""
from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.graph_ops import sparse_math_ops
from sok1x.graph_ops.tf_compat import tf1
from sok1x.optimizers.initializer import InitializerMixin
from sok1x.optimizers import embedding_update, native_rules


class LazyAdamOptimizer(InitializerMixin, tf1.train.AdamOptimizer):
    """tf.contrib.opt.LazyAdamOptimizer that also updates sok1x embedding variables."""

    _sok1x_updates_embeddings = True

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices):
        if is_embedding_variable(handle):
            return embedding_update.update_op(self, handle, grad, indices,
                                              native_rules.v1_lazy_adam(self))
        summed, distinct = sparse_math_ops.deduplicate(grad, indices)
        return self._resource_apply_sparse(summed, handle, distinct)

    def _resource_apply_dense(self, grad, var):
        if is_embedding_variable(var):
            raise embedding_update.dense_gradient_error(var)
        return super(LazyAdamOptimizer, self)._resource_apply_dense(grad, var)

    def _apply_sparse_duplicate_indices(self, grad, var):
        summed, distinct = sparse_math_ops.deduplicate(grad.values, grad.indices)
        return self._apply_sparse(tf1.IndexedSlices(summed, distinct, grad.dense_shape), var)

    def _apply_sparse(self, grad, var):
        return self._lazy_update(grad.values, var, grad.indices)

    def _resource_apply_sparse(self, grad, var, indices):
        return self._lazy_update(grad, var, indices)

    def _lazy_update(self, values, var, indices):
        """The lazy step on a dense variable (ref or resource) with distinct `indices`. The new
        moment rows are used as computed, never read back from the slots, so no read can see a
        slot before its update."""
        dtype = var.dtype.base_dtype
        hyper = {key: tf1.cast(value, dtype)
                 for key, value in native_rules.v1_adam_hyper(self).items()}
        beta1, beta2 = hyper["beta1"], hyper["beta2"]
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        new_m = beta1 * tf1.gather(m, indices) + (1 - beta1) * values
        new_v = beta2 * tf1.gather(v, indices) + (1 - beta2) * tf1.square(values)
        step = hyper["lr_t"] * new_m / (tf1.sqrt(new_v) + hyper["epsilon"])
        return tf1.group(
            tf1.scatter_update(m, indices, new_m, use_locking=self._use_locking),
            tf1.scatter_update(v, indices, new_v, use_locking=self._use_locking),
            tf1.scatter_sub(var, indices, step, use_locking=self._use_locking))
