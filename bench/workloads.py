"""The two benchmark models and their input batches.

seed: SOK's demo (legacy_examples/demo_tf1.py), All2AllDenseEmbedding(slot_num=10,
    nnz_per_slot=5, dim=16) at a global batch of 65536 split over the ranks (strong scaling);
    keys uniform over 2^22.
dlrm: 26 categorical features of one key each, dim 128, 16384 samples per rank (weak scaling);
    feature t's keys follow a power law (p(k) ~ (k + 1)^-1.05 over 2^20 values) and live in the
    key range [t * 2^20, (t + 1) * 2^20) of one table, as SOK programs put several features in
    one embedding layer; a feature's popular keys are spread over the range (and so over the
    owners) by a fixed odd multiplier.

dlrm26: dlrm's keys in 26 tables (feature t's keys relative to its own table of 2^20 rows), one
    lookup of all 26 (one key per sample and table: each key its own output row, which sum
    pooling of one key per sample equals), LazyAdam.
dlrm_hash, dlrm26_hash: dlrm and dlrm26 with hash tables (use_hashtable=True, SOK's v1 default):
    rows are placed as keys arrive; PyTorch's peer holds each key's initial value at its dense
    row (framework_step.hashed_shard_weight).
dlrm26_dynamic: dlrm26 on 26 sok1x.DynamicVariables of var_type "hbm" (one hash group that may
    grow: max_capacity twice the rows a shard needs), the same PyTorch peer as dlrm26_hash.
dlrm26_hybrid: the same on var_type "hybrid" (rows all in GPU memory; one hash group that counts
    its lookups and may evict), the same peer.
dlrm26_split: dlrm26_hybrid with half of each shard's rows' vectors in host memory
    (max_hbm_for_vectors: the GiB of half the rows a shard starts with; one hash group whose rows
    split per member, tables/hybrid_rows.py's GroupedRows), the same peer.
dlrm26_full: dlrm26 on hybrid DynamicVariables that are full (issue 38): a shard's max_capacity
    is FULL_ROOM x the most distinct keys one batch brings it (full_rows), less than the three
    batches' union, so once the first steps filled it every step evicts (LRU); the same peer,
    whose table holds every key.
mlperf26: the embedding of MLPerf's DLRM-DCNv2 benchmark: 26 tables with the Criteo 1TB
    cardinalities and multi-hot sizes below (keys uniform within a table), dim 128, sum pooling,
    Adagrad, global batch 55296 split over the ranks (strong scaling). Its rows and accumulators
    take about 209 GB (MLPERF_BYTES): four H200s.

Both frameworks shard rows the same way: global key k lives on rank k % size at row k // size.
`scale` divides batch and vocabulary for quick runs on the cpu backend.
"""
import collections

import numpy as np

Workload = collections.namedtuple(
    "Workload", "name slots nnz dim vocab batch_per_rank global_batch weak alpha tables hotness "
    "optimizer hashed", defaults=(None, None, "lazy_adam", False))
Workload.__doc__ = """tables: per table its number of keys (None: one table, keys below vocab);
hotness: per table keys per sample; optimizer: the engine rule of the step; hashed: the tables
are hash tables (True: v1's; "hbm": DynamicVariables of that var_type)."""

MLPERF_CARDINALITIES = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000,
                        3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000,
                        40000000, 590152, 12973, 108, 36)
MLPERF_HOTNESS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1,
                  1)
MLPERF_BYTES = sum(MLPERF_CARDINALITIES) * 128 * 4 * 2  # rows and Adagrad accumulators

SPREAD = 0x9E3779B1  # odd: k -> k * SPREAD mod 2^m is a bijection of [0, 2^m)


def workload(name, size, scale=1):
    """Returns the Workload `name` ("seed" or "dlrm") for a job of `size` ranks."""
    if name == "seed":
        global_batch = 65536 // scale
        return Workload("seed", 10, 5, 16, (1 << 22) // scale, global_batch // size,
                        global_batch, False, None)
    if name == "dlrm":
        per_rank = 16384 // scale
        return Workload("dlrm", 26, 1, 128, (1 << 20) // scale, per_rank, per_rank * size, True,
                        1.05)
    if name == "dlrm26":
        dlrm = workload("dlrm", size, scale)
        return dlrm._replace(name="dlrm26", tables=(dlrm.vocab,) * dlrm.slots,
                             hotness=(1,) * dlrm.slots)
    if name == "dlrm_hash":
        return workload("dlrm", size, scale)._replace(name="dlrm_hash", hashed=True)
    if name == "dlrm26_hash":
        return workload("dlrm26", size, scale)._replace(name="dlrm26_hash", hashed=True)
    if name == "dlrm26_dynamic":
        return workload("dlrm26", size, scale)._replace(name="dlrm26_dynamic", hashed="hbm")
    if name == "dlrm26_hybrid":
        return workload("dlrm26", size, scale)._replace(name="dlrm26_hybrid", hashed="hybrid")
    if name == "dlrm26_split":
        return workload("dlrm26", size, scale)._replace(name="dlrm26_split", hashed="hybrid")
    if name == "dlrm26_full":
        return workload("dlrm26", size, scale)._replace(name="dlrm26_full", hashed="hybrid")
    if name == "mlperf26":
        global_batch = 55296 // scale
        vocabs = tuple(max(1, c // scale) for c in MLPERF_CARDINALITIES)
        return Workload("mlperf26", 26, None, 128, None, global_batch // size, global_batch,
                        False, None, vocabs, MLPERF_HOTNESS, "adagrad")
    raise ValueError("unknown workload %r" % (name,))


def table_batches(w, rank, size, count=3, seed=99):
    """For a workload of several tables: `count` batches, each per table its int64 keys
    [batch_per_rank * hotness_t] (sample-major, relative to the table). dlrm26 takes dlrm's
    keys; mlperf26 draws keys uniformly within each table."""
    if w.name in ("dlrm26", "dlrm26_hash", "dlrm26_dynamic", "dlrm26_hybrid", "dlrm26_split",
                  "dlrm26_full"):
        out = []
        for keys in Batches(w, rank, size, count).keys:  # dlrm's keys
            keys = keys - np.arange(w.slots).reshape(1, -1, 1) * w.vocab
            out.append([np.ascontiguousarray(keys[:, t, 0]) for t in range(w.slots)])
        return out
    rng = np.random.default_rng([seed, rank])
    return [[rng.integers(0, vocab, size=w.batch_per_rank * hot, dtype=np.int64)
             for vocab, hot in zip(w.tables, w.hotness)] for _ in range(count)]


FULL_ROOM = 1.1


def full_rows(w, size):
    """dlrm26_full's max_capacity of a shard: FULL_ROOM x the most distinct keys of one table
    that one global batch brings, over the size ranks (an even share each). Each rank's batches
    are drawn once (drawing them per step and table took minutes: the framework pass's
    dlrm26_full did not finish its repeats in 170 s on one H100, 2026-11-27)."""
    ranks = [table_batches(w, r, size) for r in range(size)]
    most = 0
    for step in range(3):
        for t in range(w.slots):
            keys = np.concatenate([batches[step][t] for batches in ranks])
            most = max(most, np.unique(keys).shape[0])
    return int(FULL_ROOM * most / size) + 1


def total_vocabulary(w):
    """Keys of the whole model: vocab per feature times features for dlrm."""
    return w.vocab * (w.slots if w.alpha is not None else 1)


class Batches:
    """A few input batches of keys [batch_per_rank, slots, nnz] (int64) for one rank, reused in
    turn; the same global batches on any number of ranks for strong-scaling workloads."""

    def __init__(self, w, rank, size, count=3, seed=1234):
        self.w = w
        self.keys = [self._make(w, rank, size, seed + i) for i in range(count)]

    @staticmethod
    def _make(w, rank, size, seed):
        if w.alpha is None:
            rng = np.random.default_rng(seed)
            everyone = rng.integers(0, w.vocab, size=(w.global_batch, w.slots, w.nnz))
            part = w.batch_per_rank
            return np.ascontiguousarray(everyone[rank * part:(rank + 1) * part])
        rng = np.random.default_rng(seed * 1000 + rank)
        cdf = np.cumsum(np.arange(1, w.vocab + 1, dtype=np.float64) ** -w.alpha)
        draws = rng.random((w.batch_per_rank, w.slots, w.nnz)) * cdf[-1]
        popularity = np.searchsorted(cdf, draws, side="right").astype(np.int64)
        feature = np.arange(w.slots, dtype=np.int64).reshape(1, -1, 1)
        spread = (popularity * SPREAD + feature * 7919) % w.vocab
        return feature * w.vocab + spread

    def __call__(self, step):
        return self.keys[step % len(self.keys)]


SparseParts = collections.namedtuple("SparseParts", "indices values dense_shape segment_ids")


def sparse_parts(keys):
    """The SparseTensor [batch * slots, nnz] of `keys` [batch, slots, nnz] (every entry present)
    and each key's segment id (its (sample, slot) row)."""
    batch, slots, nnz = keys.shape
    count = keys.size
    position = np.arange(count, dtype=np.int64)
    segment_ids = position // nnz
    indices = np.stack([segment_ids, position % nnz], axis=1)
    return SparseParts(indices, keys.reshape(-1), np.array([batch * slots, nnz], np.int64),
                       segment_ids)
