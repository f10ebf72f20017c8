"""An MPI job for test_low_frequency_filter: sok1x.lookup_sparse(..., use_low_frequency_filter=
True) over DynamicVariables of filter_ratio 1.0 (SOK's default), 0.0 and 0.5, executing eagerly,
checked against stock TensorFlow (tf.nn.embedding_lookup_sparse and the same optimizer on a
dense table) where the keys not admitted weigh nothing. Prints "ADMITTED <keys>" (the new keys
the 0.5 table admitted, which must not depend on the rank count) and "LOW FREQUENCY FILTER OK".

1. A step without the filter inserts the keys of batch A.
2. A step with it looks up batch B (keys of A and new ones): held keys always pass; new keys
   enter with the table's ratio (all, none, about half); the outputs (sum and mean pooled) and
   the trained rows are stock TensorFlow's with the refused keys' weights 0 (a mean still
   divides by every key of its sample), and refused keys are not in the table.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
import eager_job  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
KEYS, DIM, SAMPLES, HOTNESS, INITIAL = 400, 4, 64, 3, 0.5
COMBINERS = ["sum", "mean"]


def batch(seed, low, high):
    """ids [SAMPLES, HOTNESS] of the global batch, the same on every rank."""
    return np.random.default_rng(seed).integers(low, high, size=(SAMPLES, HOTNESS))


def local(ids):
    part = SAMPLES // SIZE
    return ids[RANK * part:(RANK + 1) * part]


def ragged(ids):
    return tf.RaggedTensor.from_tensor(tf.constant(ids, tf.int64))


def sok_step(variables, optimizer, ids_list, use_filter):
    with tf.GradientTape() as tape:
        outputs = sok.lookup_sparse(variables, [ragged(local(ids)) for ids in ids_list],
                                    combiners=COMBINERS, use_low_frequency_filter=use_filter)
        loss = tf.add_n([tf.reduce_sum(out * (1.0 + t)) for t, out in enumerate(outputs)])
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return [out.numpy() for out in outputs]


def stock_step(denses, optimizer, ids_list, admitted_list):
    """The global step on dense tables, keys outside admitted_list weighing 0."""
    outputs = []
    with tf.GradientTape() as tape:
        for dense, ids, admitted in zip(denses, ids_list, admitted_list):
            weights = np.isin(ids, admitted).astype(np.float32)
            pooled = tf.nn.embedding_lookup_sparse(
                dense, tf.RaggedTensor.from_tensor(tf.constant(ids, tf.int64)).to_sparse(),
                tf.RaggedTensor.from_tensor(tf.constant(weights)).to_sparse(), combiner="sum")
            outputs.append(pooled)
        outputs[1] = outputs[1] / HOTNESS  # mean: every key of the sample counts
        loss = tf.add_n([tf.reduce_sum(out * (1.0 + t)) for t, out in enumerate(outputs)])
    optimizer.apply_gradients(zip(tape.gradient(loss, denses), denses))
    return [local(out.numpy()) for out in outputs]


def run(ratio, seed):
    variables = [sok.DynamicVariable(dimension=DIM, var_type=var_type, initializer=str(INITIAL),
                                     filter_ratio=ratio) for var_type in ("hybrid", "hbm")]
    denses = [tf.Variable(np.full([KEYS, DIM], INITIAL, np.float32)) for _ in variables]
    optimizer = tf.keras.optimizers.SGD(0.1)  # legacy after sok.init()
    reference = tf.keras.optimizers.SGD(0.1)  # legacy after sok.init()
    first = [batch(seed + t, 0, KEYS // 2) for t in range(2)]
    sok_step(variables, optimizer, first, use_filter=False)
    stock_step(denses, reference, first, [np.unique(ids) for ids in first])
    second = [batch(seed + 10 + t, 0, KEYS) for t in range(2)]
    got = sok_step(variables, optimizer, second, use_filter=True)
    admitted_new = []
    for variable, before, after_ids in zip(variables, first, second):
        held = np.array(sorted(eager_job.gathered(variable)))
        new = np.setdiff1d(np.unique(after_ids), np.unique(before))
        assert set(np.unique(before)) <= set(held.tolist())
        admitted = np.intersect1d(held, new)
        assert set(held.tolist()) <= set(np.unique(before)) | set(new.tolist())
        if ratio == 1.0:
            np.testing.assert_array_equal(admitted, new)
        elif ratio == 0.0:
            assert admitted.size == 0, admitted
        else:
            assert 0.25 < admitted.size / new.size < 0.75, (admitted.size, new.size)
        admitted_new.append(admitted)
    want = stock_step(denses, reference, second,
                      [np.union1d(np.unique(b), a) for b, a in zip(first, admitted_new)])
    for out, ref in zip(got, want):
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    for variable, dense in zip(variables, denses):
        table = eager_job.gathered(variable)
        keys = np.array(sorted(table))
        np.testing.assert_allclose(np.stack([table[k] for k in keys]), dense.numpy()[keys],
                                   rtol=1e-5, atol=1e-6)
    return admitted_new


def main():
    sok.init(backend="cpu")
    for ratio in (1.0, 0.0):
        run(ratio, seed=1)
    admitted = run(0.5, seed=2)
    try:
        sok.DynamicVariable(dimension=DIM, filter_ratio=1.5)
    except ValueError as error:
        assert "filter_ratio" in str(error), error
    else:
        raise AssertionError("filter_ratio=1.5 was accepted")
    COMM.Barrier()
    if RANK == 0:
        print("ADMITTED %s" % ";".join(",".join(map(str, a.tolist())) for a in admitted))
        print("LOW FREQUENCY FILTER OK")


if __name__ == "__main__":
    eager_job.run(main)
