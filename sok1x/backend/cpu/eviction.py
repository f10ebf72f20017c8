"""The victims of full DynamicVariable shards on NumPy: the twin of cuda_kernels/eviction.cu
(engine/tables/eviction.py states the policy). Both choose the same victims for the same indexes,
records, keys and step."""
import numpy as np

from sok1x.backend import given_hyper
from sok1x.backend.cpu.hash import scramble


def bucket_of(keys, bits):
    """Each key's bucket (int64): the top `bits` bits of scramble(key); 0 bits: bucket 0."""
    keys = np.asarray(keys, dtype=np.int64)
    if bits == 0:
        return np.zeros(keys.shape, dtype=np.int64)
    return (scramble(keys) >> np.uint64(64 - int(bits))).astype(np.int64)


def given(step):
    """`step`, or inside given_hyper.step_given the step its clock holds now (cuda's kernels read
    it when they run; the cpu twin runs when called)."""
    clock = given_hyper.given_step()
    return step if clock is None else int(clock[1])


def stamp_last_step(statistics, rows, step):
    """statistics[row, 0] = step for every row >= 0 of `rows` (the count is left as it is)."""
    rows = np.asarray(rows, dtype=np.int64)
    statistics[rows[rows >= 0], 0] = given(step)


def evicting_runs(new_keys, count, bits):
    """The first `count` distinct keys of host int64 `new_keys` in hash order (by bucket, then
    hash; the hash is a bijection, so equal hashes are equal keys); returns (the bucket of each
    run of them, int64 starts [runs + 1] of the runs)."""
    hashes = np.sort(scramble(np.asarray(new_keys, dtype=np.int64)))
    if not hashes.shape[0]:  # (a padded eviction's member may have no new key)
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    hashes = hashes[np.concatenate([[True], hashes[1:] != hashes[:-1]])][:int(count)]
    buckets = (hashes >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(
        hashes.shape, np.int64)
    cuts = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
    starts = np.concatenate([[0], cuts, [hashes.shape[0]]]).astype(np.int64)
    return buckets[starts[:-1]], starts


def count_new_keys(parts, keys, tags, found):
    """A hash group's count of a training lookup's owned keys (keys[i] of member tags[i] <
    parts, found[i] its flat row, -1 for a new key): int64 [2, parts], row 0 each member's
    distinct new keys, row 1 all its keys (repeats too). The tags' stable order (a radix sort
    of small ints), then one sort of each member's new keys."""
    keys, tags, found = (np.asarray(a, dtype=np.int64) for a in (keys, tags, found))
    out = np.zeros((2, parts), dtype=np.int64)
    out[1] = np.bincount(tags, minlength=parts)[:parts]
    new = found < 0
    keys, tags = keys[new], tags[new]
    order = np.argsort(tags, kind="stable")
    bounds = np.searchsorted(tags[order], np.arange(parts + 1))
    keys = keys[order]
    for t in np.flatnonzero(np.diff(bounds)).tolist():
        mine = np.sort(keys[bounds[t]:bounds[t + 1]])
        out[0, t] = 1 + np.count_nonzero(mine[1:] != mine[:-1])
    return out


def count_new_keys_segmented(parts, keys, tags, found, bits=None):
    """(count_new_keys(parts, keys, tags, found), None): cuda also returns the segments it
    counted in, for its pick_victims; this twin's pick counts by sorting, and takes none."""
    return count_new_keys(parts, keys, tags, found), None


def count_evictable(indexes, statistics, row_starts, found, step):
    """int64 [T]: per member of a table group, its held keys that a training lookup may evict:
    their record's last step below `step` and their flat row not among `found` (the rows the
    lookup's keys have, -1 for new ones)."""
    found = np.asarray(found, dtype=np.int64)
    looked = np.zeros(int(statistics.shape[0]), dtype=bool)
    looked[found[found >= 0]] = True
    out = np.zeros(len(indexes), dtype=np.int64)
    for t, index in enumerate(indexes):
        rows = index.export()[1] + int(row_starts[t])
        out[t] = np.count_nonzero((statistics[rows, 0] < step) & ~looked[rows])
    return out


def pick_victims(indexes, statistics, row_starts, keys, tags, found, counts, bits, step, lfu,
                 segments=None, padded=False, out=None):
    """Victims for the full shards of a table group (one table: a group of one).

    indexes: the members' HashIndexes; statistics: int64 [rows, 2] records (last step, count)
    of the group's flat rows, member t's at row_starts[t] + its row; keys, tags, found: a
    training lookup's owned keys, each key's member, and its flat row (-1: a new key);
    counts[t]: keys member t evicts (host; 0: none); bits[t]: its bucket bits; step; lfu[t]:
    its evict_strategy is "lfu". Member t's evicting keys are its first counts[t] distinct new
    keys in hash order; the k-th of them in a bucket gets the k-th lowest-score evictable key of
    that bucket, and those whose bucket ran out the member's lowest left over, in order.
    Returns (victim_keys, victim_rows, victim_records [m, 2]), m = sum(counts), member t's at
    [sum(counts[:t]), sum(counts[:t + 1])): each victim's key, flat row and record as it was
    (-1, -1 and 0 where none is left). Each victim's record becomes (step, 0): no other
    place chooses it, and its row's next key counts from 0.
    padded: counts[t] is a bound on member t's new keys (0: it evicts none), so that all of them
    evict with no count read first; three more arrays come back, int64 [T]: totals, each
    member's places (one per distinct new key, the front of its part, -1 after them), unserved,
    those of its places left without a victim (-1: a shard that cannot make room), and served,
    its victims (totals - unserved). out: None, or the three victims' arrays to write (cuda's
    replayed step keeps them from one run to the next)."""
    keys, tags, found = (np.asarray(a, dtype=np.int64) for a in (keys, tags, found))
    counts, step = np.asarray(counts, dtype=np.int64), given(step)
    m = int(counts.sum())
    if out is None:
        out = (np.empty(m, np.int64), np.empty(m, np.int64), np.empty((m, 2), np.int64))
    victim_keys, victim_rows, victim_records = out
    victim_keys[...], victim_rows[...], victim_records[...] = -1, -1, 0
    totals = np.zeros(len(indexes), dtype=np.int64)
    at = 0
    for t, index in enumerate(indexes):
        count = int(counts[t])
        if count == 0:
            continue
        start = int(row_starts[t])
        buckets, starts = evicting_runs(keys[(tags == t) & (found < 0)], count, int(bits[t]))
        picked = _pick_in_shard(index, statistics[start:start + index.capacity], buckets,
                                starts, int(bits[t]), step, bool(lfu[t]))
        end = at + int(starts[-1])
        victim_keys[at:end], victim_records[at:end] = picked[0], picked[2]
        victim_rows[at:end] = np.where(picked[1] >= 0, picked[1] + start, -1)
        totals[t] = int(starts[-1])
        at += count
    if not padded:
        return victim_keys, victim_rows, victim_records
    firsts = np.cumsum(counts) - counts
    unserved = np.array([np.count_nonzero(victim_rows[first:first + total] < 0)
                         for first, total in zip(firsts, totals)], dtype=np.int64)
    return victim_keys, victim_rows, victim_records, totals, unserved, totals - unserved


def _pick_in_shard(index, statistics, buckets, starts, bits, step, lfu):
    """pick_victims in one shard (its records `statistics`, rows its own) for evicting keys in
    runs by bucket (starts [s + 1]: the runs' offsets; buckets [s]: each run's bucket)."""
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
    statistics[victim_rows[has]] = (step, 0)  # chosen once; the row's next key counts from 0
    return victim_keys, victim_rows, victim_records
