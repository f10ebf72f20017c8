"""Which keys a full DynamicVariable shard evicts (issue 38, D14): per bucket, by score, on the
device (cuda_kernels/eviction.cu; backend/cpu/eviction.py its twin), as HierarchicalKV does.

What the policy guarantees. A shard at max_capacity that must take n new keys in a step evicts
exactly n held keys, chosen as follows:
- A key's bucket is the top bits of its 64-bit hash (MurmurHash3's finaliser), with
  2**bits the largest power of two that is at most max_capacity / 64: a bucket holds about 64
  keys on average (at least 1 bucket: a shard below 128 rows is one bucket, the whole shard).
- A held key may be evicted when no lookup of the current training step used it (its last
  step is older) and it is not among the keys of the lookup making room.
- Its score is, for evict_strategy "lru", (the last training step that looked it up, key); for
  "lfu", (its count of training lookups, that last step, key). Lowest goes first. So "least
  recently used" means: least recently used among the evictable keys of the new key's bucket,
  at the granularity of steps, ties broken by the smaller key, not of the whole shard.
- The new keys that evict are the step's new keys in the order of their hashes, which orders
  them by bucket (all of them once the shard is full; at the step that fills it, the first n).
  The k-th of them in a bucket takes the k-th lowest-score evictable key of that bucket; one
  whose bucket has no evictable key left takes the lowest-score evictable key left in the
  whole shard (new keys in the same order).
The choice is a function of the keys, their records and the step, never of thread timing, so
the cpu and cuda backends evict the same keys and a run repeats exactly. A step that cannot make
room (fewer evictable keys than new ones) fails on every rank before evicting (TableFullError).
"""
import numpy as np

from sok1x.backend.cpu.hash import scramble

KEYS_PER_BUCKET = 64


def bucket_bits(capacity):
    """log2 of the bucket count of a shard of `capacity` rows: the largest power of two that is
    at most capacity / KEYS_PER_BUCKET (0: one bucket)."""
    buckets = max(1, int(capacity) // KEYS_PER_BUCKET)
    return buckets.bit_length() - 1


def evicting_keys(keys, found, count, bits):
    """The first `count` distinct keys of host int64 `keys` whose `found` row is -1 (new ones),
    in hash order (one sort of their hashes: by bucket, then hash); returns (the bucket of each
    run of them, int64 starts [runs + 1] of the runs), what pick_victims takes."""
    hashes = np.sort(scramble(np.asarray(keys)[np.asarray(found) < 0]))  # not np.unique: NumPy
    hashes = hashes[np.concatenate([[True], hashes[1:] != hashes[:-1]])][:int(count)]  # 2 hashes
    buckets = (hashes >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(
        hashes.shape, np.int64)
    cuts = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
    starts = np.concatenate([[0], cuts, [hashes.shape[0]]]).astype(np.int64)
    return buckets[starts[:-1]], starts
