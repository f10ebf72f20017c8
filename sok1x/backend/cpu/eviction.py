"""The victims of a full DynamicVariable shard on NumPy: the twin of cuda_kernels/eviction.cu
(engine/tables/eviction.py states the policy). Both choose the same victims for the same index,
records, keys and step."""
import numpy as np

from sok1x.backend.cpu.hash import scramble


def bucket_of(keys, bits):
    """Each key's bucket (int64): the top `bits` bits of scramble(key); 0 bits: bucket 0."""
    keys = np.asarray(keys, dtype=np.int64)
    if bits == 0:
        return np.zeros(keys.shape, dtype=np.int64)
    return (scramble(keys) >> np.uint64(64 - int(bits))).astype(np.int64)


def stamp_last_step(statistics, rows, step):
    """statistics[row, 0] = step for every row >= 0 of `rows` (the count is left as it is)."""
    rows = np.asarray(rows, dtype=np.int64)
    statistics[rows[rows >= 0], 0] = step


def pick_victims(index, statistics, buckets, starts, bits, step, lfu):
    """Victims for m evicting keys in runs by bucket (host int64 starts [s + 1]: the runs'
    offsets, m = starts[-1]; buckets [s]: each run's bucket) in the shard of HashIndex `index`
    and records `statistics` (int64 [capacity, 2]: last step, count). Returns (victim_keys,
    victim_rows, victim_records [m, 2]): key i's victim is the k-th lowest-score evictable key
    of its bucket when it is the k-th key of its run, else (its bucket used up) the lowest one
    of the shard left over, taken in the keys' order; -1 (and records 0) where none is left.
    The victims' records are returned as they were and their last step set to `step`."""
    starts = np.asarray(starts, dtype=np.int64)
    m = int(starts[-1])
    victim_keys = np.full(m, -1, dtype=np.int64)
    victim_rows = np.full(m, -1, dtype=np.int64)
    victim_records = np.zeros((m, 2), dtype=np.int64)
    if m == 0:
        return victim_keys, victim_rows, victim_records
    held_keys, held_rows = index.export()
    records = statistics[held_rows]
    evictable = records[:, 0] < step
    cand_keys, cand_rows, cand_records = (held_keys[evictable], held_rows[evictable],
                                          records[evictable])
    score = [cand_keys, cand_records[:, 0]] + ([cand_records[:, 1]] if lfu else [])
    cand_buckets = bucket_of(cand_keys, bits)
    by_bucket = np.lexsort(score + [cand_buckets])  # (bucket, score), lowest first
    buckets = np.repeat(np.asarray(buckets, dtype=np.int64), np.diff(starts))
    sorted_buckets = cand_buckets[by_bucket]
    first = np.searchsorted(sorted_buckets, buckets, "left")
    end = np.searchsorted(sorted_buckets, buckets, "right")
    rank = np.arange(m) - np.searchsorted(buckets, buckets, "left")
    served = first + rank < end
    picked = by_bucket[(first + rank)[served]]
    taken = np.zeros(cand_keys.shape[0], dtype=bool)
    taken[picked] = True
    chosen = np.full(m, -1, dtype=np.int64)
    chosen[served] = picked
    left = np.flatnonzero(~served)
    if left.size:  # buckets used up: the shard's lowest left over, in the keys' order
        rest = np.flatnonzero(~taken)
        rest = rest[np.lexsort([s[rest] for s in score])][:left.size]
        chosen[left[:rest.size]] = rest
    has = chosen >= 0
    victim_keys[has] = cand_keys[chosen[has]]
    victim_rows[has] = cand_rows[chosen[has]]
    victim_records[has] = cand_records[chosen[has]]
    stamp_last_step(statistics, victim_rows, step)
    return victim_keys, victim_rows, victim_records
