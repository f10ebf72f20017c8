"""SOK's own v2 check, shared by the graph-mode test (test_v2_api.py) and the eager job
(tests/cpu/jobs/v2_eager_job.py): SGD (lr 1, loss = sum of the embeddings) on a distributed, a
localized and a dynamic variable, two variables per lookup with different dims and hotness,
SparseTensor and RaggedTensor ids, with and without weights, against a single-process NumPy model
of tf.nn.embedding_lookup_sparse + SGD on the global batch (float64).

Each rank looks up its share of the global batch; the losses summed over ranks and each rank's
final shard must equal the reference (relative squared error below 1e-6).
"""
import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
GLOBAL_BATCH = 8
# name: (rows / keys, dim)
TABLES = {"distributed": (37, 4), "localized": (23, 6), "dynamic": (50, 5)}
# Two lookups of two variables each: (variable, ids kind, combiner, weighted, hotness).
LOOKUPS = (
    (("distributed", "sparse", "sum", False, 3), ("localized", "sparse", "mean", True, 5)),
    (("dynamic", "ragged", "mean", True, 4), ("localized", "ragged", "sum", False, 2)),
)


def initial_tables():
    """The global initial values of each table, the same on every rank."""
    rng = np.random.default_rng(11)
    return {name: rng.uniform(-1, 1, size=shape).astype(np.float32)
            for name, shape in TABLES.items()}


def step_batch(step):
    """Per lookup, per variable: (keys per sample (list of arrays), weights per sample or None)
    of the global batch of `step`; some samples have no keys."""
    rng = np.random.default_rng([step, 3])
    batch = []
    for lookup in LOOKUPS:
        parts = []
        for name, _, _, weighted, hotness in lookup:
            lengths = rng.integers(0, hotness + 1, size=GLOBAL_BATCH)
            keys = [rng.integers(0, TABLES[name][0], size=n) for n in lengths]
            weights = [rng.uniform(0.5, 2.0, size=n) for n in lengths] if weighted else None
            parts.append((keys, weights))
        batch.append(parts)
    return batch


def local_rows():
    per = GLOBAL_BATCH // SIZE
    return slice(RANK * per, (RANK + 1) * per)


def reference_run(steps):
    """Returns (losses [steps], final tables) of the single-process model."""
    tables = {name: value.astype(np.float64) for name, value in initial_tables().items()}
    losses = []
    for step in range(steps):
        loss, grads = 0.0, {name: np.zeros_like(value) for name, value in tables.items()}
        for lookup, parts in zip(LOOKUPS, step_batch(step)):
            for (name, _, combiner, _, _), (keys, weights) in zip(lookup, parts):
                for s, sample_keys in enumerate(keys):
                    w = np.ones(len(sample_keys)) if weights is None else weights[s]
                    if not len(sample_keys) or (combiner == "mean" and w.sum() == 0):
                        continue
                    factor = w / w.sum() if combiner == "mean" else w
                    loss += float((tables[name][sample_keys] * factor[:, None]).sum())
                    np.add.at(grads[name], sample_keys, np.repeat(factor[:, None],
                                                                  TABLES[name][1], axis=1))
        for name in tables:
            tables[name] -= grads[name]
        losses.append(loss)
    return np.array(losses), tables


def relative_squared_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sum((got - want) ** 2) / max(np.sum(want ** 2), 1e-30))


def owned_dynamic_keys():
    """The keys of the dynamic table this rank holds (owner = hash(key) % world_size)."""
    from sok1x.backend.cpu.hash import scramble
    keys = np.arange(TABLES["dynamic"][0], dtype=np.int64)
    return keys[(scramble(keys) % np.uint64(SIZE)).astype(np.int64) == RANK]


def make_variables(sok, tf):
    """Creates the three variables (the dynamic one starts at zero; assign_dynamic gives it the
    reference's initial rows)."""
    init = initial_tables()
    return {
        "distributed": sok.Variable(init["distributed"], dtype=tf.float32, name="v2_distributed"),
        "localized": sok.Variable(init["localized"], mode="localized:%d" % (SIZE - 1),
                                  name="v2_localized"),
        "dynamic": sok.DynamicVariable(dimension=TABLES["dynamic"][1], initializer="zeros",
                                       var_type="hbm", init_capacity=64, max_capacity=64,
                                       name="v2_dynamic"),
    }


def assign_dynamic(sok, variables):
    """Every rank passes every key; each writes those it holds."""
    keys = np.arange(TABLES["dynamic"][0], dtype=np.int64)
    return sok.assign(variables["dynamic"], keys, initial_tables()["dynamic"])


def _local_parts(keys, weights):
    """This rank's share as flat arrays: (keys int64, weights float32 or None, row lengths,
    SparseTensor indices [nnz, 2], dense shape)."""
    keys, weights = keys[local_rows()], None if weights is None else weights[local_rows()]
    lengths = np.array([len(k) for k in keys], np.int64)
    flat = np.concatenate(keys).astype(np.int64)
    flat_w = None if weights is None else np.concatenate(weights).astype(np.float32)
    rows = np.repeat(np.arange(len(keys)), lengths)
    columns = np.concatenate([np.arange(n) for n in lengths])
    indices = np.stack([rows, columns], axis=1).astype(np.int64).reshape(-1, 2)
    shape = np.array([len(keys), max(1, int(lengths.max()))], np.int64)
    return flat, flat_w, lengths, indices, shape


def eager_inputs(tf, batch):
    """Per lookup, per variable (ids, weights or None) tensors of this rank's share."""
    inputs = []
    for lookup, parts in zip(LOOKUPS, batch):
        row = []
        for (_, kind, _, _, _), (keys, weights) in zip(lookup, parts):
            flat, flat_w, lengths, indices, shape = _local_parts(keys, weights)
            if kind == "ragged":
                ids = tf.RaggedTensor.from_row_lengths(flat, lengths)
                w = None if flat_w is None else tf.RaggedTensor.from_row_lengths(flat_w, lengths)
            else:
                ids = tf.SparseTensor(indices, flat, shape)
                w = None if flat_w is None else tf.SparseTensor(indices, flat_w, shape)
            row.append((ids, w))
        inputs.append(row)
    return inputs


def graph_inputs(tf1):
    """Placeholders shaped as eager_inputs' tensors; returns (inputs, feed(batch) -> dict)."""
    inputs, slots = [], []
    for lookup in LOOKUPS:
        row = []
        for _, kind, _, weighted, _ in lookup:
            if kind == "ragged":
                keys = tf1.placeholder(tf1.int64, [None])
                lengths = tf1.placeholder(tf1.int64, [None])
                weights = tf1.placeholder(tf1.float32, [None]) if weighted else None
                ids = tf1.RaggedTensor.from_row_lengths(keys, lengths)
                w = None if weights is None else tf1.RaggedTensor.from_row_lengths(weights,
                                                                                  lengths)
                slots.append(("ragged", keys, lengths, weights))
            else:
                ids = tf1.sparse_placeholder(tf1.int64)
                w = tf1.sparse_placeholder(tf1.float32) if weighted else None
                slots.append(("sparse", ids, w, None))
            row.append((ids, w))
        inputs.append(row)

    def feed(batch):
        values, position = {}, 0
        for lookup, parts in zip(LOOKUPS, batch):
            for _, (keys, weights) in zip(lookup, parts):
                flat, flat_w, lengths, indices, shape = _local_parts(keys, weights)
                kind, a, b, c = slots[position]
                position += 1
                if kind == "ragged":
                    values[a], values[b] = flat, lengths
                    if c is not None:
                        values[c] = flat_w
                else:
                    values[a] = tf1.SparseTensorValue(indices, flat, shape)
                    if b is not None:
                        values[b] = tf1.SparseTensorValue(indices, flat_w, shape)
        return values
    return inputs, feed


def lookups(sok, tf, variables, inputs):
    """The step's two fused lookups of `inputs` (eager_inputs / graph_inputs); returns the local
    loss, the sum of every embedding."""
    loss = 0.0
    for lookup, row in zip(LOOKUPS, inputs):
        params = [variables[name] for name, _, _, _, _ in lookup]
        combiners = [combiner for _, _, combiner, _, _ in lookup]
        ids = [ids for ids, _ in row]
        weights = [w for _, w in row]
        for embedding in sok.lookup_sparse(params, ids, weights, combiners):
            loss += tf.reduce_sum(embedding)
    return loss


def graph_model(sok, tf1):
    """Builds the check in the default graph: returns (variables, feed(batch) -> dict, the local
    loss, the handles, their gradients)."""
    variables = make_variables(sok, tf1)
    inputs, feed = graph_inputs(tf1)
    loss = lookups(sok, tf1, variables, inputs)
    handles = list(variables.values())
    return variables, feed, loss, handles, tf1.gradients(loss, handles)


def check_results(losses, shards, steps):
    """Compares the losses (summed over ranks) and this rank's shards (name -> (keys, values))
    with the reference; raises AssertionError."""
    total = COMM.allreduce(np.asarray(losses, np.float64), op=MPI.SUM)
    want_losses, want_tables = reference_run(steps)
    error = relative_squared_error(total, want_losses)
    assert error < 1e-6, "losses %s, reference %s (error %g)" % (total, want_losses, error)
    for name, (keys, values) in shards.items():
        keys = np.asarray(keys)
        expected_keys = {"distributed": np.arange(RANK, TABLES[name][0], SIZE),
                         "localized": np.arange(TABLES[name][0]) if RANK == SIZE - 1 else
                         np.zeros([0], np.int64),
                         "dynamic": owned_dynamic_keys()}[name]
        assert sorted(keys.tolist()) == sorted(expected_keys.tolist()), (name, keys)
        if keys.size:
            error = relative_squared_error(values, want_tables[name][keys])
            assert error < 1e-6, "%s on rank %d: error %g" % (name, RANK, error)
