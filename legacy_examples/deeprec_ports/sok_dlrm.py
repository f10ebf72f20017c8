"""Port of DeepRec's modelzoo SOK DLRM (modelzoo/features/sparse_operation_kit/dlrm:
train_stand.py with model/models.py, model/utils.py and model/strategy_wrapper.py, in one file):
DLRM whose 26 categorical features share one sok.All2AllDenseEmbedding (keys offset per feature,
de-duplicated with sok.tf.unique), trained by Keras SGD inside sok.OptimizerScope, the dense
layers' gradients summed over the ranks by Horovod. Changed: the import (sparse_operation_kit ->
sok1x, tensorflow -> tensorflow.compat.v1), the data (synthetic, from a seed, in place of Criteo's
binary files), the sizes (vocabularies, layers, steps) and a constant learning rate in place of
the warm-up and poly-decay schedule (which stays constant over these steps anyway).
Runs as `mpiexec -n N python sok_dlrm.py`; prints "Iteration:i loss:x" per step.
"""
import argparse
import math
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow.compat.v1 as tf

import sok1x as sok

tf.disable_v2_behavior()


class SOKEmbedding(tf.keras.layers.Layer):
    def __init__(self, vocab_sizes, embedding_vec_size, num_gpus=1, **kwargs):
        super(SOKEmbedding, self).__init__(**kwargs)
        self._vocab_sizes = vocab_sizes
        self._embedding_vec_size = embedding_vec_size
        offsets = np.cumsum([0] + list(vocab_sizes[:-1])).astype(np.int64).reshape(1, -1)
        self._vocab_prefix_sum = tf.constant(offsets)
        self._sok_embedding = sok.All2AllDenseEmbedding(
            max_vocabulary_size_per_gpu=int(sum(vocab_sizes) / num_gpus) + 1,
            embedding_vec_size=self._embedding_vec_size,
            slot_num=len(self._vocab_sizes),
            nnz_per_slot=1,
            dynamic_input=True,
            use_hashtable=False,
        )

    def call(self, inputs, training=True):
        """inputs: [batch, 26] category ids -> [batch, 26, embedding_vec_size]."""
        keys = tf.reshape(tf.add(tf.cast(inputs, tf.int64), self._vocab_prefix_sum), [-1])
        keys, idx = sok.tf.unique(keys)
        vectors = tf.gather(self._sok_embedding(keys, training=training), idx)
        return tf.reshape(vectors, [-1, len(self._vocab_sizes), self._embedding_vec_size])


class MLP(tf.keras.layers.Layer):
    def __init__(self, units, activation="relu", final_activation=None, **kwargs):
        super(MLP, self).__init__(**kwargs)
        self._sublayers = [
            tf.keras.layers.Dense(n, activation=activation if i < len(units) - 1
                                  else final_activation)
            for i, n in enumerate(units)]

    def call(self, x):
        for layer in self._sublayers:
            x = layer(x)
        return x


class DotInteraction(tf.keras.layers.Layer):
    """All pairwise dot products of the features (DLRM's interaction), upper triangle zeroed
    (skip_gather=True, as the model uses it)."""

    def call(self, inputs):
        num_features = len(inputs)
        batch_size, feature_dim = tf.shape(inputs[0])[0], tf.shape(inputs[0])[1]
        features = tf.reshape(tf.concat(inputs, axis=-1), [batch_size, -1, feature_dim])
        xactions = tf.matmul(features, features, transpose_b=True)
        upper = tf.linalg.band_part(tf.ones_like(xactions), 0, -1)
        activations = tf.where(tf.cast(upper, tf.bool), tf.zeros_like(xactions), xactions)
        return tf.reshape(activations, (batch_size, num_features * num_features))


class DLRM(tf.keras.models.Model):
    def __init__(self, vocab_size, embedding_vec_size, bottom_stack_units, top_stack_units,
                 num_gpus=1, **kwargs):
        super(DLRM, self).__init__(**kwargs)
        self._vocab_size = vocab_size
        self._embedding_layer = SOKEmbedding(vocab_size, embedding_vec_size, num_gpus)
        self._bottom_stack = MLP(units=bottom_stack_units, final_activation="relu")
        self._feature_interaction = DotInteraction()
        self._top_stack = MLP(units=top_stack_units, final_activation=None)

    @property
    def embedding_layer(self):
        return self._embedding_layer

    def call(self, dense_features, sparse_features, training=True):
        dense_vec = self._bottom_stack(dense_features)
        sparse = self._embedding_layer(sparse_features, training=training)
        sparse = tf.split(sparse, num_or_size_splits=len(self._vocab_size), axis=1)
        sparse_vecs = [tf.squeeze(vec, axis=1) for vec in sparse]
        interaction = self._feature_interaction(sparse_vecs + [dense_vec])
        prediction = self._top_stack(tf.concat([dense_vec, interaction], axis=1))
        if not training:
            prediction = tf.nn.sigmoid(prediction)
        return prediction


class HorovodStrategy(object):
    def run(self, fn, *args):
        return fn(*args)

    def reduce(self, combiner, tensors):
        return [hvd.allreduce(t, op=hvd.Sum) for t in tensors]

    def broadcast_variables(self, variables):
        return hvd.broadcast_variables(variables, root_rank=0)


def apply_gradients(optimizer, variables, grads, using_sok):
    if using_sok:
        with sok.OptimizerScope(variables):
            return optimizer.apply_gradients(zip(grads, variables))
    return optimizer.apply_gradients(zip(grads, variables))


def synthetic_data(steps, global_batch_size, vocab_sizes, seed, distinct=2):
    """`steps` Criteo-shaped batches (label [b, 1], dense [b, 13], category [b, 26]), cycling
    over `distinct` ones, whose label depends on the features; the same on every rank."""
    rng = np.random.RandomState(seed)
    weights = [rng.uniform(-1, 1, size=v) for v in vocab_sizes]
    batches = []
    for _ in range(distinct):
        dense = rng.uniform(size=(global_batch_size, 13)).astype(np.float32)
        category = np.stack([rng.randint(0, v, size=global_batch_size) for v in vocab_sizes], 1)
        score = dense[:, 0] - dense[:, 1] + sum(w[category[:, i]] for i, w in enumerate(weights))
        labels = (score > np.median(score)).astype(np.int32).reshape(-1, 1)
        batches.append((dense, category.astype(np.float32), labels))
    return [batches[i % distinct] for i in range(steps)]


def main(args):
    hvd.init()
    strategy = HorovodStrategy()
    sok_init_op = sok.Init(global_batch_size=args.global_batch_size)
    model = DLRM(args.vocab_size_list, args.embedding_vec_size, args.bottom_stack,
                 args.top_stack, num_gpus=hvd.size())
    embedding_optimizer = tf.keras.optimizers.get(args.embedding_optimizer)
    embedding_optimizer.learning_rate = args.learning_rate
    dense_optimizer = tf.keras.optimizers.get("SGD")
    dense_optimizer.learning_rate = args.learning_rate
    batch_size = args.global_batch_size // hvd.size()
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")

    def _replica_loss(labels, logits):
        return tf.nn.compute_average_loss(loss_fn(labels, logits),
                                          global_batch_size=args.global_batch_size)

    def _train_step(dense, category, labels, first_batch=False):
        def _step_fn(dense, category, labels):
            logits = model(dense, category, training=True)
            loss = _replica_loss(labels, logits)
            emb_vars, other_vars = sok.split_embedding_variable_from_others(
                model.trainable_variables)
            emb_vars, other_vars = list(emb_vars), list(other_vars)
            grads = tf.gradients(loss, emb_vars + other_vars, colocate_gradients_with_ops=True,
                                 unconnected_gradients=tf.UnconnectedGradients.NONE)
            emb_grads, other_grads = grads[:len(emb_vars)], grads[len(emb_vars):]
            with tf.control_dependencies(emb_grads):
                emb_train_op = apply_gradients(embedding_optimizer, emb_vars, emb_grads, True)
            with tf.control_dependencies(other_grads):
                other_grads = strategy.reduce("sum", other_grads)
                other_train_op = apply_gradients(dense_optimizer, other_vars, other_grads, False)
            if first_batch:
                strategy.broadcast_variables(other_vars)
            with tf.control_dependencies([emb_train_op, other_train_op]):
                return hvd.allreduce(tf.identity(loss), op=hvd.Sum)
        return strategy.run(_step_fn, dense, category, labels)

    dense = tf.placeholder(tf.float32, shape=[batch_size, 13])
    category = tf.placeholder(tf.float32, shape=[batch_size, 26])
    labels = tf.placeholder(tf.int32, shape=[batch_size, 1])
    total_loss_first = _train_step(dense, category, labels, True)
    total_loss = _train_step(dense, category, labels, False)
    init_op = tf.group(tf.global_variables_initializer(), tf.local_variables_initializer())
    data = synthetic_data(args.steps, args.global_batch_size, args.vocab_size_list, args.seed)
    mine = slice(hvd.rank() * batch_size, (hvd.rank() + 1) * batch_size)
    with tf.Session() as sess:
        sess.run(sok_init_op)
        sess.run([init_op])
        t = time.time()
        for step, (dense_, category_, labels_) in enumerate(data):
            feed = {dense: dense_[mine], category: category_[mine], labels: labels_[mine]}
            loss_v = sess.run([total_loss_first if step == 0 else total_loss], feed_dict=feed)
            print("Iteration:%d\tloss:%.6f\ttime:%.2fs" % (step, loss_v[0], time.time() - t))
        print("Training time: %.2fs" % (time.time() - t))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--embedding_vec_size", type=int, default=8)
    parser.add_argument("--embedding_optimizer", type=str, default="SGD")
    parser.add_argument("--bottom_stack", type=int, nargs="+", default=[16, 8])
    parser.add_argument("--top_stack", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--learning_rate", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    args.vocab_size_list = [int(math.ceil(v)) for v in (
        40, 39, 17, 7, 20, 3, 7, 15, 6, 38, 29, 40, 10, 22, 11, 15, 4, 9, 14, 39, 25, 39, 5, 12,
        10, 36)]
    main(args)
