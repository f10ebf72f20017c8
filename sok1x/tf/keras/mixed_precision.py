"""sok1x.tf.keras.mixed_precision: SOK v1's AMP spelling. LossScaleOptimizer(optimizer,
initial_scale) scales the loss by a fixed factor and unscales the gradients (dense tensors and
IndexedSlices alike, so embedding gradients keep their rows) before its optimizer applies them."""
from sok1x.graph_ops.tf_compat import tf1


class LossScaleOptimizer(object):
    """A fixed loss scale around any optimizer (sok1x's or TensorFlow's), as SOK v1 programs
    use it: get_scaled_loss, get_unscaled_gradients, then apply_gradients."""

    def __init__(self, optimizer, initial_scale=2.0 ** 15, **kwargs):
        del kwargs
        self.optimizer = optimizer
        self.loss_scale = float(initial_scale)

    def get_scaled_loss(self, loss):
        """Returns loss * scale in the loss's dtype."""
        return loss * tf1.cast(self.loss_scale, loss.dtype)

    def get_unscaled_gradients(self, grads):
        """Returns each gradient (None, a tensor or IndexedSlices) divided by the scale."""
        return [None if g is None else self._unscale(g) for g in grads]

    def _unscale(self, grad):
        if isinstance(grad, tf1.IndexedSlices):
            return tf1.IndexedSlices(grad.values / tf1.cast(self.loss_scale, grad.values.dtype),
                                     grad.indices, grad.dense_shape)
        return grad / tf1.cast(self.loss_scale, grad.dtype)

    def __getattr__(self, name):
        # apply_gradients, initializer, minimize... are the wrapped optimizer's.
        return getattr(self.optimizer, name)

# SOK v1's module of this package: sok.tf.keras.mixed_precision.loss_scale_optimizer.
from sok1x.common import alias_modules  # noqa: E402

alias_modules.install(__name__, {"loss_scale_optimizer": {
    "LossScaleOptimizer": LossScaleOptimizer}})
