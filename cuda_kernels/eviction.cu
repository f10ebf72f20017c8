// Victims of a full DynamicVariable shard, chosen on the device per bucket by score
// (engine/tables/eviction.py states the policy; backend/cpu/eviction.py is its NumPy twin).
//
// A key's bucket is the top `bits` bits of scramble_key(key) (0 bits: one bucket, the whole
// shard). Because a key's home slot is fastrange(scramble_key(key), slot_count), the keys of
// bucket b have their home slots in one range [lo, hi] of the index, and sit between lo and the
// first empty slot after hi (linear probing): one warp scans that range and keeps the keys whose
// bucket is b. A held key may be evicted when its record's last step is below `step` (the
// engine stamps the rows the step looked up first). Its score is (last step, key) for LRU and
// (count, last step, key) for LFU; the lowest goes first. Keys are distinct, so the order is
// total and the choice is a function of keys, records and step, never of thread timing.
#include "common.cuh"

struct Score {
  int64 first, second, key, row;
};

__device__ __forceinline__ bool lower(const Score& a, const Score& b) {
  if (a.first != b.first) return a.first < b.first;
  if (a.second != b.second) return a.second < b.second;
  return a.key < b.key;
}

__device__ __forceinline__ uint64 bucket_of(int64 key, int64 bits) {
  return bits == 0 ? 0 : scramble_key((uint64)key) >> (64 - bits);
}

__device__ __forceinline__ Score shuffled(const Score& s, int from) {
  Score t;
  t.first = __shfl_xor_sync(FULL_WARP, s.first, from);
  t.second = __shfl_xor_sync(FULL_WARP, s.second, from);
  t.key = __shfl_xor_sync(FULL_WARP, s.key, from);
  t.row = __shfl_xor_sync(FULL_WARP, s.row, from);
  return t;
}

// One warp per segment [starts[s], starts[s + 1]) of the evicting keys (in hash order; a
// segment holds the keys of bucket buckets[s]): the k-th key of a segment gets the k-th lowest
// evictable key of its bucket, or -1 when the bucket has no more. rest != 0 (one segment, one
// warp): every key still without a victim (victim_rows[i] == -1), in order, gets the lowest
// evictable key of the whole shard; *left (zeroed by the caller) counts the first pass's keys
// without a victim, so the second pass returns at once when there are none. A chosen victim's
// record is written to victim_records[i] as it was, and its last step set to `step` (so it is
// chosen once).
extern "C" __global__ void evict_pick(const int64* slots, uint64 slot_count, int64* statistics,
                                      int64 step, int64 lfu, int64 bits, const int64* buckets,
                                      const int64* starts, int64 segments, int64 rest,
                                      uint64* left, int64* victim_keys, int64* victim_rows,
                                      int64* victim_records) {
  if (rest && *left == 0) return;  // every key found a victim in its bucket
  const int lane = (int)lane_id();
  const int64 warps = global_thread_count() / 32;
  const int64 INF = 0x7fffffffffffffffLL;
  for (int64 s = global_thread_id() / 32; s < segments; s += warps) {
    const int64 begin = starts[s], end = starts[s + 1];
    if (begin >= end) continue;
    const uint64 bucket = rest ? 0 : (uint64)buckets[s];
    uint64 lo = 0, hi = slot_count - 1;
    if (!rest && bits > 0) {
      const uint64 first_hash = bucket << (64 - bits);
      const uint64 last_hash = first_hash + ((~0ULL) >> bits);
      lo = __umul64hi(first_hash, slot_count);
      hi = __umul64hi(last_hash, slot_count);
    }
    uint64 length = hi - lo + 1;
    // past hi, up to the first empty slot: keys homed in [lo, hi] that probed on
    for (uint64 extra = 0; length < slot_count; extra += 32) {
      const uint64 at = extra + lane;
      const bool empty = length + at >= slot_count ||
                         slots[2 * ((lo + length + at) % slot_count)] == EMPTY_KEY;
      const unsigned found = __ballot_sync(FULL_WARP, empty);
      if (found != 0) {
        const uint64 more = extra + (uint64)(__ffs(found) - 1);
        length = length + more < slot_count ? length + more : slot_count;
        break;
      }
    }
    for (int64 chunk = begin; chunk < end; chunk += 32) {
      // rest: the keys still without a victim, 32 read at a time, taken in order
      const bool waiting = chunk + lane < end && (!rest || victim_rows[chunk + lane] == -1);
      for (unsigned todo = __ballot_sync(FULL_WARP, waiting); todo != 0; todo &= todo - 1) {
        const int64 i = chunk + __ffs(todo) - 1;
        Score best = {INF, INF, INF, -1};
        for (uint64 p = lane; p < length; p += 32) {
          const uint64 slot = (lo + p) % slot_count;
          const int64 key = slots[2 * slot];
          if (key < 0 || (!rest && bucket_of(key, bits) != bucket)) continue;
          const int64 row = slots[2 * slot + 1];
          const volatile int64* record = statistics + 2 * row;
          const int64 last = record[0];
          if (last >= step) continue;
          const int64 count = record[1];
          const Score mine = {lfu ? count : last, lfu ? last : 0, key, row};
          if (lower(mine, best)) best = mine;
        }
        for (int from = 16; from > 0; from >>= 1) {
          const Score other = shuffled(best, from);
          if (lower(other, best)) best = other;
        }
        if (lane == 0) {
          victim_keys[i] = best.row >= 0 ? best.key : -1;
          victim_rows[i] = best.row;
          if (best.row >= 0) {
            int64* record = statistics + 2 * best.row;
            victim_records[2 * i] = record[0];
            victim_records[2 * i + 1] = record[1];
            record[0] = step;
          } else if (!rest) {
            atomicAdd(left, 1ULL);
          }
        }
        __syncwarp();
      }
    }
  }
}

// statistics[row][0] = step for every row >= 0 of `rows` (the rows a step looked up: not
// evicted by it); the count is left as it is.
extern "C" __global__ void stamp_last_step(int64* statistics, const int64* rows, int64 n,
                                           int64 step) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    if (rows[i] >= 0) statistics[2 * rows[i]] = step;
  }
}
