"""An MPI job for test_v1_eager: SOK's v1 layers (All2AllDenseEmbedding, DistributedEmbedding)
trained eagerly (TensorFlow 2) under tf.GradientTape, by a tf.function step as SOK's DenseDemo
does and by a step executed eagerly, against tf.nn.embedding_lookup(_sparse) on a plain
tf.Variable trained the same way in one process over the global batch (every rank's keys).
Prints "V1 EAGER OK" on success.

Checked: sok.Init() brings sok1x up at once; the handle's gradient is tf.IndexedSlices; per step
the loss summed over ranks equals the reference's; after training every row equals the
reference's (sok.optimizers.Adam against tf.compat.v1.train.AdamOptimizer, and a Keras SGD in
sok.OptimizerScope against the same SGD on the reference's gradient; with the argument
"new_keras", TF 2.11+ Keras SGD (with a constant rate and with a learning-rate schedule), SGD
with momentum, Adam and Adamax in sok.OptimizerScope against the same optimizers on the
reference); the layer and its optimizer made in a one-device
tf.distribute.MirroredStrategy and stepped by strategy.run train the same; with the argument
"multiworker", a TF 2.11+ Keras Adam under a tf.distribute.MultiWorkerMirroredStrategy of one
worker per rank trains the same (its embedding gradients are not all-reduced over workers).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
import eager_job  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
VOCAB, DIM, SLOTS, NNZ, LOCAL_BATCH, STEPS = 24, 4, 3, 2, 4, 5
# With the argument "new_keras" (TF 2.11+): TF 2.11+ Keras optimizers, which move every row
# (SGD with momentum, Adam, Adamax: state decays on rows a step does not touch), in place of
# SOK's Adam and the legacy Keras SGD.
NEW_KERAS = {
    "new_keras_sgd": lambda: tf.keras.optimizers.SGD(0.05),
    "new_keras_momentum": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9),
    "new_keras_adam": lambda: tf.keras.optimizers.Adam(0.05),
    "new_keras_adamax": lambda: tf.keras.optimizers.Adamax(0.05),
    # a learning-rate schedule, as SOK's DLRM tutorial sets on its embedding optimizer
    "new_keras_sgd_schedule": lambda: tf.keras.optimizers.SGD(
        tf.keras.optimizers.schedules.PiecewiseConstantDecay([1, 3], [0.05, 0.02, 0.01])),
}


def _optimizers(kind, strategy):
    """(apply(grads, vars) of sok1x's embedding optimizer, made in `strategy`'s scope, and the
    reference optimizer, made outside it)."""
    with strategy.scope():
        apply, _ = _mine_and_reference(kind)
    return apply, _mine_and_reference(kind)[1]


def _mine_and_reference(kind):
    """(apply(grads, vars) of sok1x's embedding optimizer, the reference optimizer)."""
    if kind == "plugin_adam":
        mine = sok.optimizers.Adam(learning_rate=0.05)

        def apply(grads, variables):
            mine.apply_gradients(zip(grads, variables), experimental_aggregate_gradients=False)
        return apply, tf.compat.v1.train.AdamOptimizer(0.05, epsilon=1e-7)
    if kind in NEW_KERAS:  # a TF 2.11+ Keras optimizer in sok.OptimizerScope, as DenseDemo's
        mine, theirs = NEW_KERAS[kind](), NEW_KERAS[kind]()

        def apply(grads, variables):
            with sok.OptimizerScope(variables):
                mine.apply_gradients(zip(grads, variables), experimental_aggregate_gradients=False)
        return apply, theirs
    # SOK v1's Keras SGD: TF 2.11+ keeps it as tf.keras.optimizers.legacy.SGD
    keras_sgd = getattr(getattr(tf.keras.optimizers, "legacy", None), "SGD",
                        tf.keras.optimizers.SGD)
    mine = keras_sgd(learning_rate=0.05)

    def apply(grads, variables):
        with sok.OptimizerScope(variables):
            mine.apply_gradients(zip(grads, variables), experimental_aggregate_gradients=False)
    return apply, keras_sgd(learning_rate=0.05)


def _global_keys(rng):
    """The global batch's keys int64 [SIZE * LOCAL_BATCH, SLOTS, NNZ], the same on every rank
    (rank r takes rows r * LOCAL_BATCH ...)."""
    return rng.integers(0, VOCAB, size=(SIZE * LOCAL_BATCH, SLOTS, NNZ)).astype(np.int64)


def _mine(array):
    return array[RANK * LOCAL_BATCH:(RANK + 1) * LOCAL_BATCH]


def _to_sparse(keys):
    """Dense keys [b, SLOTS, NNZ] as DistributedEmbedding's SparseTensor [b * SLOTS, NNZ], the
    last key of each odd row left out (rows of different lengths)."""
    flat = keys.reshape(-1, NNZ)
    indices = [[r, n] for r in range(flat.shape[0]) for n in range(NNZ - (r % 2))]
    values = [flat[r, n] for r, n in indices]
    return tf.SparseTensor(np.array(indices, np.int64), np.array(values, np.int64),
                           [flat.shape[0], NNZ])


def multi_worker_strategy():
    """A tf.distribute.MultiWorkerMirroredStrategy with one worker per rank (TF_CONFIG from the
    rank, as SOK's MultiWorker tutorial sets it; ports rank 0 found free). Made before any
    other TensorFlow work of the process, as TensorFlow requires."""
    import json
    import socket
    ports = []
    if RANK == 0:
        held = [socket.socket() for _ in range(SIZE)]
        for s in held:
            s.bind(("localhost", 0))
        ports = [s.getsockname()[1] for s in held]
        for s in held:
            s.close()
    ports = COMM.bcast(ports, root=0)
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": ["localhost:%d" % p for p in ports]},
        "task": {"type": "worker", "index": RANK}})
    return tf.distribute.MultiWorkerMirroredStrategy()


def train(layer_kind, optimizer_kind, compiled, mirrored=False, strategy=None):
    """Trains one layer (its step a tf.function when `compiled`, else executed eagerly; made and
    run in a one-device tf.distribute.MirroredStrategy when `mirrored`, as SOK's
    MirroredStrategy tutorials do, or in `strategy`) and the reference; raises AssertionError
    where they differ."""
    maybe_function = tf.function if compiled else (lambda f: f)
    if strategy is None:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"]) if mirrored \
            else tf.distribute.get_strategy()
    mirrored = mirrored or strategy is not tf.distribute.get_strategy()
    with strategy.scope():
        if layer_kind == "dense":
            layer = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=VOCAB,
                                              embedding_vec_size=DIM, slot_num=SLOTS,
                                              nnz_per_slot=NNZ, use_hashtable=False)
        else:
            layer = sok.DistributedEmbedding("mean", max_vocabulary_size_per_gpu=VOCAB,
                                             embedding_vec_size=DIM, slot_num=SLOTS,
                                             max_nnz=NNZ, use_hashtable=False)
    all_keys = np.arange(VOCAB, dtype=np.int64).reshape(-1, SLOTS, NNZ)

    @maybe_function
    def read_rows():
        if layer_kind == "dense":
            return tf.reshape(layer(all_keys, training=False), [VOCAB, DIM])
        one_per_row = tf.SparseTensor(np.stack([np.arange(VOCAB), np.zeros(VOCAB)], 1)
                                      .astype(np.int64), np.arange(VOCAB, dtype=np.int64),
                                      [VOCAB, NNZ])
        return tf.reshape(layer(one_per_row, training=False), [VOCAB, DIM])

    def rows():  # built (its handle made) in the strategy, as SOK's tutorials build theirs
        return strategy.experimental_local_results(strategy.run(read_rows))[0].numpy()

    reference = tf.Variable(rows())
    apply, reference_optimizer = _optimizers(optimizer_kind, strategy)
    seen = []

    def lookup(keys):
        if layer_kind == "dense":
            return tf.nn.embedding_lookup(reference, keys)
        pooled = tf.nn.embedding_lookup_sparse(reference, _to_sparse(keys), None,
                                               combiner="mean")
        return tf.reshape(pooled, [-1, SLOTS, DIM])

    @maybe_function
    def step(keys, targets):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(keys, training=True) - targets))
        # SOK's returns two lists (optimizers/utils.py), which SOK's DLRM tutorial adds to
        emb_vars, others = sok.split_embedding_variable_from_others(layer.trainable_variables)
        assert type(emb_vars) is list and type(others) is list, (emb_vars, others)
        grads = tape.gradient(loss, [] + emb_vars)
        seen.extend(type(g).__name__ for g in grads)
        apply(grads, [layer.embedding_variable])
        return loss

    rng = np.random.default_rng(11)
    for _ in range(STEPS):
        keys = _global_keys(rng)
        targets = rng.uniform(-1, 1, size=(SIZE * LOCAL_BATCH, SLOTS) +
                              ((NNZ,) if layer_kind == "dense" else ()) + (DIM,))
        targets = targets.astype(np.float32)
        local_keys = _mine(keys) if layer_kind == "dense" else _to_sparse(_mine(keys))
        replica_loss = strategy.run(step, args=(local_keys, _mine(targets)))
        loss = COMM.allreduce(float(strategy.experimental_local_results(replica_loss)[0]))
        with tf.GradientTape() as tape:
            want = tf.reduce_sum(tf.square(lookup(keys) - targets))
        reference_optimizer.apply_gradients(zip(tape.gradient(want, [reference]), [reference]))
        np.testing.assert_allclose(loss, float(want), rtol=1e-5, err_msg=layer_kind)
    # (traced again when the first trace made the optimizer's variables)
    if mirrored:
        assert type(layer.embedding_variable).__name__ == "MirroredVariable", \
            type(layer.embedding_variable)
    assert seen and set(seen) == {"IndexedSlices"}, "the handle's gradient: %s" % seen
    np.testing.assert_allclose(rows(), reference.numpy(), rtol=1e-5, atol=1e-6,
                               err_msg="%s, %s, %s: the trained rows" % (
                                   layer_kind, optimizer_kind, compiled))


def refuse_two_devices():
    """A v1 layer made in a MirroredStrategy over two devices of this process is refused,
    naming its table, before any table is made."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    assert sok.Init(global_batch_size=SIZE * LOCAL_BATCH) is None
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        try:
            sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=VOCAB, embedding_vec_size=DIM,
                                      slot_num=SLOTS, nnz_per_slot=NNZ, use_hashtable=False,
                                      name="two_device_table")
        except ValueError as error:
            assert "two_device_table" in str(error) and "over 2 devices" in str(error), error
        else:
            raise AssertionError("a layer in a two-device MirroredStrategy was not refused")
    layer = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=VOCAB, embedding_vec_size=DIM,
                                      slot_num=SLOTS, nnz_per_slot=NNZ, use_hashtable=False)
    keys = np.zeros((1, SLOTS, NNZ), np.int64)
    assert layer(keys, training=False).shape == (1, SLOTS, NNZ, DIM)


def main():
    if "two_devices" in sys.argv[1:]:
        refuse_two_devices()
        COMM.Barrier()
        if RANK == 0:
            print("V1 EAGER OK")
        return
    if "multiworker" in sys.argv[1:]:
        # TF 2.11+ Keras Adam in OptimizerScope under MultiWorkerMirroredStrategy, as SOK's
        # MultiWorker DenseDemo: the embedding gradients must not be all-reduced over workers
        strategy = multi_worker_strategy()
        with strategy.scope():
            assert sok.Init(global_batch_size=SIZE * LOCAL_BATCH) is None
        train("dense", "new_keras_adam", compiled=True, strategy=strategy)
        COMM.Barrier()
        if RANK == 0:
            print("V1 EAGER OK")
        return
    assert sok.Init(global_batch_size=SIZE * LOCAL_BATCH) is None
    assert sok.num_gpus() == SIZE  # up at once, as SOK's Init executing eagerly
    if "new_keras" in sys.argv[1:]:
        optimizer_kinds = sorted(NEW_KERAS)
    else:
        optimizer_kinds = ("plugin_adam", "keras_sgd")
    for layer_kind in ("dense", "sparse"):
        for optimizer_kind in optimizer_kinds:
            for compiled in (True, False):
                train(layer_kind, optimizer_kind, compiled)
    if "new_keras" not in sys.argv[1:]:
        for optimizer_kind in optimizer_kinds:
            train("dense", optimizer_kind, compiled=True, mirrored=True)
    COMM.Barrier()
    if RANK == 0:
        print("V1 EAGER OK")


if __name__ == "__main__":
    eager_job.run(main)
