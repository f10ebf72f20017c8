// Victims of full DynamicVariable shards, chosen on the device per bucket by score, for every
// member of a table group in one pass (a table alone is a group of one). engine/tables/eviction.py
// states the policy; backend/cpu/eviction.py is its NumPy twin.
//
// A key's bucket is the top `bits` bits of scramble_key(key) (0 bits: one bucket, the whole
// shard). Because a key's home slot is fastrange(scramble_key(key), slot_count), the keys of
// bucket b have their home slots in one range [lo, hi] of the index, and sit between lo and the
// first empty slot after hi (linear probing): one block scans that range and keeps the keys whose
// bucket is b. A held key may be evicted when its record's last step is below `step` (the
// engine stamps the rows the step looked up first). Its score is (last step, key) for LRU and
// (count, last step, key) for LFU; the lowest goes first. Keys are distinct, so the order is
// total and the choice is a function of keys, records and step, never of thread timing.
//
// Which new keys evict: member t's first count distinct new keys in hash order, which orders
// them by bucket. The k-th of them in a bucket takes the k-th victim of that bucket, so the pick
// needs only how many distinct new keys each bucket has (a segment per bucket of each evicting
// member): no sort. Three passes count them: evict_bucket_counts, a scan, evict_bucket_scatter
// (each new key into its segment) and evict_bucket_distinct (a key counted at its first place
// in the segment, so a key from several ranks counts once); a scan of the distinct counts then
// gives each segment its evicting keys' place among the member's. The same passes, over
// segments of about 32 keys each, count a hash group's new keys per member
// (evict_member_totals) where the host must know whether its members fit.
#include "common.cuh"

// A member as the kernels take it: EVICT_MEMBER int64 entries each (backend/cuda/eviction.py).
#define EVICT_MEMBER 8

struct Evicting {
  const int64* slots;
  uint64 slot_count;
  int64 row_start;      // its rows among the group's flat rows (statistics, victim rows)
  int64 bits;           // bucket bits
  int64 count;          // keys it evicts (0: none, and no segments)
  int64 first_victim;   // its victims' place in the outputs
  int64 first_segment;  // its first bucket's segment
  int64 lfu;
};

__device__ __forceinline__ Evicting evicting_member(const int64* members, int64 t) {
  const int64* m = members + EVICT_MEMBER * t;
  const Evicting e = {(const int64*)m[0], (uint64)m[1], m[2], m[3], m[4], m[5], m[6], m[7]};
  return e;
}

__device__ __forceinline__ uint64 bucket_of(int64 key, int64 bits) {
  return bits == 0 ? 0 : scramble_key((uint64)key) >> (64 - bits);
}

// The segment of keys[i] when it is a new key (found[i] < 0) of a member that evicts, else -1;
// a per-peer capacity's padded slot (key and tag -1) is no key.
__device__ __forceinline__ int64 segment_of(const int64* members, const int64* keys,
                                            const int64* tags, const int64* found, int64 i) {
  if (found[i] >= 0 || tags[i] < 0) return -1;
  const Evicting m = evicting_member(members, tags[i]);
  if (m.count == 0) return -1;
  return m.first_segment + (int64)bucket_of(keys[i], m.bits);
}

// counts[s] (zeroed by the caller) += the new keys (repeats too) of segment s; arrivals (may be
// null, zeroed by the caller): arrivals[t] += every key of member t, one atomicAdd per member of
// a warp's keys (a group's keys come member after member: a few dozen counters would otherwise
// take every key's atomicAdd in turn).
extern "C" __global__ void evict_bucket_counts(const int64* members, const int64* keys,
                                               const int64* tags, const int64* found, int64 n,
                                               int64* counts, int64* arrivals) {
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + lane_id();
    if (i < n) {
      const int64 s = segment_of(members, keys, tags, found, i);
      if (s >= 0) atomicAdd((uint64*)(counts + s), 1ULL);
    }
    if (arrivals != nullptr) {
      const int64 tag = i < n ? tags[i] : -1;
      warp_count(arrivals, tag, tag >= 0);
    }
  }
}

// Each new key of an evicting member into its segment: entry_keys[starts[s] + k], in any order
// within it (fill zeroed by the caller), entry_segments alike.
extern "C" __global__ void evict_bucket_scatter(const int64* members, const int64* keys,
                                                const int64* tags, const int64* found, int64 n,
                                                const int64* starts, int64* fill,
                                                int64* entry_keys, int64* entry_segments) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 s = segment_of(members, keys, tags, found, i);
    if (s < 0) continue;
    const int64 at = starts[s] + (int64)atomicAdd((uint64*)(fill + s), 1ULL);
    entry_keys[at] = keys[i];
    entry_segments[at] = s;
  }
}

// distinct[s] (zeroed by the caller) += the distinct keys of segment s: an entry counts where
// no earlier entry of its segment holds its key (a segment holds about a bucket's new keys).
extern "C" __global__ void evict_bucket_distinct(const int64* starts, int64 segments,
                                                 const int64* entry_keys,
                                                 const int64* entry_segments, int64* distinct) {
  const int64 total = starts[segments];
  for (int64 e = global_thread_id(); e < total; e += global_thread_count()) {
    const int64 s = entry_segments[e], key = entry_keys[e];
    bool first = true;
    for (int64 f = starts[s]; f < e && first; ++f) first = entry_keys[f] != key;
    if (first) atomicAdd((uint64*)(distinct + s), 1ULL);
  }
}

// totals[t] = member t's distinct new keys (0 for a member with no segments).
extern "C" __global__ void evict_member_totals(const int64* members, int64 member_count,
                                               const int64* distinct_starts, int64* totals) {
  for (int64 t = global_thread_id(); t < member_count; t += global_thread_count()) {
    const Evicting m = evicting_member(members, t);
    totals[t] = m.count > 0 ? distinct_starts[m.first_segment + (1LL << m.bits)] -
                                  distinct_starts[m.first_segment]
                            : 0;
  }
}

// evictable[t] (zeroed by the caller) += member t's held rows whose last step is below `step`
// and whose flat row's bit in `looked` (the rows the lookup found, table_groups.cu's mark_rows)
// is clear: the keys it may evict. A warp's count takes one atomicAdd.
extern "C" __global__ void evict_count_evictable(const int64* members, int64 member_count,
                                                 const int64* statistics, int64 step,
                                                 const unsigned* looked, int64* evictable) {
  for (int64 t = 0; t < member_count; ++t) {
    const Evicting m = evicting_member(members, t);
    for (int64 base = first_of_warp(); base < (int64)m.slot_count;
         base += global_thread_count()) {
      const int64 s = base + (int64)lane_id();
      bool yes = false;
      if (s < (int64)m.slot_count && m.slots[2 * s] >= 0) {
        const int64 row = m.row_start + m.slots[2 * s + 1];
        yes = statistics[2 * row] < step && ((looked[row >> 5] >> (row & 31)) & 1u) == 0;
      }
      const unsigned votes = __ballot_sync(FULL_WARP, yes);
      if (lane_id() == 0 && votes != 0) atomicAdd((uint64*)(evictable + t), (uint64)__popc(votes));
    }
  }
}

// A signed int64 as an unsigned of the same order (its sign bit flipped), and back.
__device__ __forceinline__ uint64 ordered(int64 x) { return (uint64)x ^ (1ULL << 63); }
__device__ __forceinline__ int64 unordered(uint64 x) { return (int64)(x ^ (1ULL << 63)); }

struct Score {
  int64 first, second, key, row;
};

__device__ __forceinline__ bool lower(const Score& a, const Score& b) {
  if (a.first != b.first) return a.first < b.first;
  if (a.second != b.second) return a.second < b.second;
  return a.key < b.key;
}

// The warp's lowest of its lanes' scores, in every lane (every lane must call it). `second` takes
// no part where lfu is false (candidate_score's 0 in every candidate; an empty lane's score is
// above every candidate's by its first part): the winner's is handed out. On sm_80 and
// later by the warp's 32-bit min reductions, a half of a part at a time, most significant first,
// each among the lanes still tied: about 20 instructions, where a butterfly of 64-bit shuffles
// and comparisons took about 190 and its rounds a third of evict_pick's instructions (one
// H200, 2026-12-01: the pick 336 -> 286 us a step of growth_step's 26 full tables); before
// sm_80 by that butterfly.
__device__ __forceinline__ Score warp_lowest(const Score& mine, bool lfu) {
#if __CUDA_ARCH__ >= 800
  const uint64 parts[3] = {ordered(mine.first), ordered(mine.second),
                           ordered(mine.key)};
  uint64 lowest[3] = {parts[0], parts[1], parts[2]};
  bool tied = true;
#pragma unroll
  for (int p = 0; p < 3; ++p) {
    if (p == 1 && !lfu) continue;
    const unsigned high = __reduce_min_sync(FULL_WARP, tied ? (unsigned)(parts[p] >> 32) : ~0u);
    tied = tied && (unsigned)(parts[p] >> 32) == high;
    const unsigned low = __reduce_min_sync(FULL_WARP, tied ? (unsigned)parts[p] : ~0u);
    tied = tied && (unsigned)parts[p] == low;
    lowest[p] = ((uint64)high << 32) | low;
  }
  // keys are distinct, so one lane is tied, or every lane holds the same (an empty) score
  const int winner = __ffs(__ballot_sync(FULL_WARP, tied)) - 1;
  const Score best = {unordered(lowest[0]),
                      lfu ? unordered(lowest[1]) : __shfl_sync(FULL_WARP, mine.second, winner),
                      unordered(lowest[2]), __shfl_sync(FULL_WARP, mine.row, winner)};
  return best;
#else
  Score best = mine;
  for (int from = 16; from > 0; from >>= 1) {
    Score other;
    other.first = __shfl_xor_sync(FULL_WARP, best.first, from);
    other.second = __shfl_xor_sync(FULL_WARP, best.second, from);
    other.key = __shfl_xor_sync(FULL_WARP, best.key, from);
    other.row = __shfl_xor_sync(FULL_WARP, best.row, from);
    if (lower(other, best)) best = other;
  }
  return best;
#endif
}

// The member of segment s (members that evict own 2^bits segments each, in member order), asked
// by a whole warp: its lanes test 32 members at once.
__device__ __forceinline__ int64 member_of_segment(const int64* members, int64 member_count,
                                                   int64 s) {
  for (int64 base = 0; base < member_count; base += 32) {
    const int64 t = base + (int64)lane_id();
    bool mine = false;
    if (t < member_count) {
      const Evicting m = evicting_member(members, t);
      mine = m.count > 0 && s >= m.first_segment && s < m.first_segment + (1LL << m.bits);
    }
    const unsigned found = __ballot_sync(FULL_WARP, mine);
    if (found != 0) return base + __ffs(found) - 1;
  }
  return -1;
}

// Threads per block of evict_pick (backend/cuda/eviction.py launches PICK_THREADS) and warps of
// evict_pick_rest (16). A bucket holds 64 to 128 keys on average (eviction.py's bucket_bits), so
// PICK_CAP of its evictable keys ranked in shared memory leave the key-by-key path to a bucket far
// out in the tail: that path costs a warp about a microsecond a key, and the pass lasts as long as
// its slowest block. Where buckets meet many new keys a bucket is a block's, not a warp's: a
// full group's buckets are few (one H200, 2026-11-29: dlrm26_full's 1,664 buckets of about 97
// evictable keys and 84 new ones, one warp each, ran 85 us at 15% occupancy, each warp ranking
// its keys alone, an instruction every 8 cycles), and four warps rank a bucket's keys four times
// as fast. Where they meet a few each, a bucket is a warp's (pick_by_rank_warp).
#define PICK_THREADS 128  // evict_pick must be launched with exactly this many threads a block
#define PICK_WARPS (PICK_THREADS / 32)
#define REST_WARPS 16
#define PICK_CAP 256

// The score of candidate c of a pool of four columns `stride` apart (last step, count, key, flat
// row): evict_pick's in shared memory, evict_pick_rest's in global memory.
__device__ __forceinline__ Score candidate_score(const int64* pool, int64 stride, int64 c,
                                                 bool lfu) {
  const int64 last = pool[c], count = pool[stride + c];
  const Score s = {lfu ? count : last, lfu ? last : 0, pool[2 * stride + c],
                   pool[3 * stride + c]};
  return s;
}

// The places [begin, end) of member m's evicting keys that its buckets may leave without a
// victim: its distinct new keys may be fewer than it must evict.
__device__ __forceinline__ void rest_places(const Evicting& m, const int64* distinct_starts,
                                            int64* begin, int64* end) {
  const int64 all = distinct_starts[m.first_segment + (1LL << m.bits)] -
                    distinct_starts[m.first_segment];
  *begin = m.first_victim;
  *end = m.first_victim + (all < m.count ? all : m.count);
}

// The record a victim's row keeps: last step `step`, so that no other place chooses it, and
// count 0, what the row's next key counts from (one 16-byte store, in the sector the pick read).
__device__ __forceinline__ void clear_victim_record(int64* statistics, int64 row, int64 step) {
  *reinterpret_cast<longlong2*>(statistics + 2 * row) = make_longlong2(step, 0);
}

// Victim place i takes `key` at flat row `row`, its record (last step, count) as it was; the
// row's record becomes clear_victim_record's.
__device__ __forceinline__ void take_victim(int64 i, int64 key, int64 row, int64 last,
                                            int64 count, int64 step, int64* statistics,
                                            int64* victim_keys, int64* victim_rows,
                                            int64* victim_records) {
  victim_keys[i] = key;
  victim_rows[i] = row;
  victim_records[2 * i] = last;
  victim_records[2 * i + 1] = count;
  clear_victim_record(statistics, row, step);
}

// Victims by rank from a pool of n candidates (columns `cap` apart: last step, count, key, flat
// row): candidates first, first + stride, ... each count the candidates of lower score; the one
// of rank r < wanted (r lower scores) is the victim of place begin + r. n * n comparisons in
// all, each candidate's by one thread: evict_pick's block and its warps rank this way.
__device__ __forceinline__ void rank_victims(const int64* pool, int cap, int n, int first,
                                             int stride, bool lfu, int64 begin, int64 wanted,
                                             int64 step, int64* statistics, int64* victim_keys,
                                             int64* victim_rows, int64* victim_records) {
  for (int c = first; c < n; c += stride) {
    const Score mine = candidate_score(pool, cap, c, lfu);
    int64 rank = 0;
    for (int d = 0; d < n; ++d) {
      rank += lower(candidate_score(pool, cap, d, lfu), mine);
    }
    if (rank < wanted) {
      take_victim(begin + rank, mine.key, mine.row, pool[c], pool[cap + c], step, statistics,
                  victim_keys, victim_rows, victim_records);
    }
  }
}

// What a block of evict_pick shares while it picks one bucket: the whole block's pool, or while
// its warps pick a bucket each, a pool a warp (evictable keys past WARP_CAP leave the bucket to
// the block).
#define WARP_CAP 128
#define WARP_GATHER 4  // slots a lane reads at once in pick_by_rank_warp's gather
struct PickShared {
  union {
    int64 pool[4][PICK_CAP];                // per evictable key: last step, count, key, flat row
    int64 warp_pools[PICK_WARPS][4][WARP_CAP];  // the same, a warp's
  };
  int counts[PICK_WARPS];   // each warp's keys of the chunk being gathered
  Score best[PICK_WARPS];   // each warp's lowest score of a selection round
};

// The block's lowest of each thread's `mine` (every thread gets it).
__device__ Score block_lowest(Score mine, bool lfu, PickShared* shared) {
  mine = warp_lowest(mine, lfu);
  const int warp = (int)(threadIdx.x / 32);
  if (lane_id() == 0) shared->best[warp] = mine;
  __syncthreads();
  Score best = shared->best[0];
  for (int w = 1; w < PICK_WARPS; ++w) {
    if (lower(shared->best[w], best)) best = shared->best[w];
  }
  __syncthreads();  // read before a next round writes
  return best;
}

// A segment's pick by rank, by the whole block: it gathers its bucket's evictable keys (last step
// below `step`) from the slot range [lo, lo + length) into the pool; the one of rank r (r lower
// scores in the bucket) is the victim of the bucket's r-th evicting key, places [begin, end). The
// same choice as taking, key after key, the lowest score not taken yet, with one read of the
// bucket where that reads it once per key. Returns false (the same in every thread), having
// changed nothing, where the bucket has more than PICK_CAP evictable keys.
__device__ bool pick_by_rank(const Evicting& m, int64* statistics, int64 step, uint64 bucket,
                             int64 bits, uint64 lo, uint64 length, int64 begin, int64 end,
                             PickShared* shared, uint64* left, int64* victim_keys,
                             int64* victim_rows, int64* victim_records) {
  int64 (*pool)[PICK_CAP] = shared->pool;
  const int warp = (int)(threadIdx.x / 32);
  int n = 0;
  for (uint64 base = 0; base < length; base += PICK_THREADS) {
    const uint64 p = base + threadIdx.x;
    bool yes = false;
    int64 key = 0, row = 0, last = 0;
    if (p < length) {
      const uint64 slot = (lo + p) % m.slot_count;
      key = m.slots[2 * slot];
      if (key >= 0 && (bits == 0 || bucket_of(key, bits) == bucket)) {
        row = m.row_start + m.slots[2 * slot + 1];
        last = statistics[2 * row];
        yes = last < step;
      }
    }
    const unsigned votes = __ballot_sync(FULL_WARP, yes);
    if (lane_id() == 0) shared->counts[warp] = __popc(votes);
    __syncthreads();
    int at = n + __popc(votes & lanes_below());
    for (int w = 0; w < PICK_WARPS; ++w) {
      at += w < warp ? shared->counts[w] : 0;
      n += shared->counts[w];
    }
    __syncthreads();  // the counts read before the next chunk writes them
    if (n > PICK_CAP) return false;
    if (yes) {
      pool[0][at] = last;
      pool[1][at] = statistics[2 * row + 1];
      pool[2][at] = key;
      pool[3][at] = row;
    }
  }
  __syncthreads();
  const int64 wanted = end - begin;
  const int64 take = wanted < n ? wanted : n;
  if (take * (n + 320) < (int64)n * n) {
    // A few victims among many keys (a full shard's bucket of 64 to 128 evictable keys meets a
    // key or two a step): the lowest key not taken yet, `take` times, each a pass over the pool
    // and the block's minimum. Ranking every key costs n * n comparisons: at 2^26 rows that was
    // 6.4 of a call's 14.4 ms (bench/full_table_parts.py). The same choice: keys, so scores,
    // are distinct.
    const int64 INF = 0x7fffffffffffffffLL;
    for (int64 r = 0; r < take; ++r) {
      Score mine = {INF, INF, INF, -1};
      for (int c = threadIdx.x; c < n; c += PICK_THREADS) {
        if (pool[3][c] < 0) continue;  // taken
        const Score score = candidate_score(&pool[0][0], PICK_CAP, c, m.lfu != 0);
        if (lower(score, mine)) mine = score;
      }
      const Score best = block_lowest(mine, m.lfu != 0, shared);
      for (int c = threadIdx.x; c < n; c += PICK_THREADS) {
        if (pool[3][c] >= 0 && pool[2][c] == best.key) {  // the thread holding it writes it out
          take_victim(begin + r, best.key, best.row, pool[0][c], pool[1][c], step, statistics,
                      victim_keys, victim_rows, victim_records);
          pool[3][c] = -1;
        }
      }
      __syncthreads();
    }
  } else {
    rank_victims(&pool[0][0], PICK_CAP, n, (int)threadIdx.x, PICK_THREADS, m.lfu != 0, begin,
                 wanted, step, statistics, victim_keys, victim_rows, victim_records);
  }
  if (threadIdx.x == 0 && n < wanted) atomicAdd(left, (uint64)(wanted - n));  // stay -1
  __syncthreads();  // the pool read before the next bucket fills it
  return true;
}

// The lowest score of this lane's candidates not taken yet (c = lane + 32 k of a warp's pool of n),
// and its place in *held (-1 where none is left: the score is then above every other).
__device__ __forceinline__ Score lane_lowest(int64 (*pool)[WARP_CAP], int n, bool lfu,
                                             int* held) {
  const int64 INF = 0x7fffffffffffffffLL;
  Score mine = {INF, INF, INF, -1};
  *held = -1;
  for (int c = (int)lane_id(); c < n; c += 32) {
    if (pool[3][c] < 0) continue;  // taken
    const Score score = candidate_score(&pool[0][0], WARP_CAP, c, lfu);
    if (lower(score, mine)) {
      mine = score;
      *held = c;
    }
  }
  return mine;
}

// A segment's pick by rank, by one warp: pick_by_rank's choice, with the warp's pool (WARP_CAP
// evictable keys) and no barrier of the block, so that a block's warps pick four buckets at once.
// Where most buckets meet a few new keys (a group of 26 full shards whose every bucket meets
// about four a step: 106,496 buckets), a block a bucket spent most of its time in the block's
// barriers, with one warp busy at a time (one H200, 2026-11-30: 1,067 us of a 2.7 ms step).
// Returns false (the same in every lane), having changed nothing, where the bucket has more
// than WARP_CAP evictable keys.
__device__ bool pick_by_rank_warp(const Evicting& m, int64* statistics, int64 step, uint64 bucket,
                                  int64 bits, uint64 lo, uint64 length, int64 begin, int64 end,
                                  int64 (*pool)[WARP_CAP], uint64* left, int64* victim_keys,
                                  int64* victim_rows, int64* victim_records) {
  const int lane = (int)lane_id();
  int n = 0;
  // (slots and records are int64 pairs of whole allocations or their row views: 16-byte aligned)
  for (uint64 base = 0; base < length && n <= WARP_CAP; base += 32 * WARP_GATHER) {
    // WARP_GATHER slots a lane, their loads and then their records' all in flight at once: a
    // bucket's range (2 x 64 to 2 x 128 slots at the index's load of 1/2) in one or two rounds
    // of memory latency, where a load a round took one each
    // (the slot groups of 32 this round reaches, the same in every lane: a bucket's tail past
    // its 128 home slots leaves the second round one group, not four gone through predicated off)
    const uint64 groups = (length - base + 31) / 32;
    const int used = groups < WARP_GATHER ? (int)groups : WARP_GATHER;
    longlong2 held[WARP_GATHER], record[WARP_GATHER];
#pragma unroll
    for (int j = 0; j < WARP_GATHER; ++j) {
      const uint64 p = base + (uint64)(32 * j + lane);
      held[j] = make_longlong2(-1, 0);
      if (j < used && p < length) {
        uint64 slot = lo + p;
        if (slot >= m.slot_count) slot -= m.slot_count;
        held[j] = reinterpret_cast<const longlong2*>(m.slots)[slot];
      }
    }
#pragma unroll
    for (int j = 0; j < WARP_GATHER; ++j) {
      record[j] = make_longlong2(step, 0);  // not evictable
      if (j < used && held[j].x >= 0 && (bits == 0 || bucket_of(held[j].x, bits) == bucket)) {
        held[j].y += m.row_start;
        record[j] = reinterpret_cast<const longlong2*>(statistics)[held[j].y];
      }
    }
#pragma unroll
    for (int j = 0; j < WARP_GATHER; ++j) {
      if (j >= used) break;
      const bool yes = record[j].x < step;
      const unsigned votes = __ballot_sync(FULL_WARP, yes);
      const int at = n + __popc(votes & lanes_below());
      n += __popc(votes);
      if (yes && at < WARP_CAP) {
        pool[0][at] = record[j].x;
        pool[1][at] = record[j].y;
        pool[2][at] = held[j].x;
        pool[3][at] = held[j].y;
      }
    }
  }
  __syncwarp();  // the pool written before it is read, or written again by the next bucket
  if (n > WARP_CAP) return false;
  const int64 wanted = end - begin;
  const int64 take = wanted < n ? wanted : n;
  const int64 per_lane = (n + 31) / 32;
  const bool lfu = m.lfu != 0;
  if (per_lane * n < take * (per_lane + 5)) {
    // every candidate's rank among the bucket's (n * n / 32 comparisons a lane): where the
    // bucket's keys are few against its places
    rank_victims(&pool[0][0], WARP_CAP, n, lane, 32, lfu, begin, wanted, step, statistics,
                 victim_keys, victim_rows, victim_records);
  } else {
    // the lowest key not taken yet, `take` times (keys, so scores, are distinct). A lane reads
    // only its own candidates (c = lane + 32 k), so it keeps its lowest from round to round and
    // reads them again only when the warp takes that one.
    int held;
    Score mine = lane_lowest(pool, n, lfu, &held);
    for (int64 r = 0; r < take; ++r) {
      const Score best = warp_lowest(mine, lfu);
      if (held >= 0 && mine.key == best.key) {  // the lane holding it writes it out
        take_victim(begin + r, mine.key, mine.row, pool[0][held], pool[1][held], step,
                    statistics, victim_keys, victim_rows, victim_records);
        pool[3][held] = -1;
        mine = lane_lowest(pool, n, lfu, &held);
      }
    }
  }
  if (lane == 0 && n < wanted) atomicAdd(left, (uint64)(wanted - n));  // stay -1
  __syncwarp();  // the pool read before the warp's next bucket fills it
  return true;
}

// One warp, key after key: each place of [begin, end) still waiting (every one, or with rest those
// whose victim_rows is -1), in order, gets the lowest evictable key of the slot range [lo, lo +
// length) whose bucket is `bucket` (every key with bits 0), or -1 where none is left (counted in
// *left unless rest).
__device__ void pick_key_by_key(const Evicting& m, int64* statistics, int64 step, uint64 bucket,
                                int64 bits, uint64 lo, uint64 length, int64 begin, int64 end,
                                bool rest, uint64* left, int64* victim_keys, int64* victim_rows,
                                int64* victim_records) {
  const int lane = (int)lane_id();
  const int64 INF = 0x7fffffffffffffffLL;
  for (int64 chunk = begin; chunk < end; chunk += 32) {
    const bool waiting = chunk + lane < end && (!rest || victim_rows[chunk + lane] == -1);
    for (unsigned todo = __ballot_sync(FULL_WARP, waiting); todo != 0; todo &= todo - 1) {
      const int64 i = chunk + __ffs(todo) - 1;
      Score best = {INF, INF, INF, -1};
      for (uint64 p = lane; p < length; p += 32) {
        const uint64 slot = (lo + p) % m.slot_count;
        const int64 key = m.slots[2 * slot];
        if (key < 0 || (bits > 0 && bucket_of(key, bits) != bucket)) continue;
        const int64 row = m.row_start + m.slots[2 * slot + 1];
        const volatile int64* record = statistics + 2 * row;
        const int64 last = record[0];
        if (last >= step) continue;
        const int64 count = record[1];
        const Score mine = {m.lfu ? count : last, m.lfu ? last : 0, key, row};
        if (lower(mine, best)) best = mine;
      }
      best = warp_lowest(best, m.lfu != 0);
      if (lane == 0) {
        victim_keys[i] = best.row >= 0 ? best.key : -1;
        victim_rows[i] = best.row;
        if (best.row >= 0) {
          int64* record = statistics + 2 * best.row;
          victim_records[2 * i] = record[0];
          victim_records[2 * i + 1] = record[1];
          clear_victim_record(statistics, best.row, step);
        } else if (!rest) {
          atomicAdd(left, 1ULL);
        }
      }
      __syncwarp();
    }
  }
}

// A work item of evict_pick, as pick_item finds it: member m's places [begin, end) in the outputs,
// and the slot range [lo, lo + length) that holds the keys of its bucket.
struct PickItem {
  Evicting m;
  int64 bits, begin, end;
  uint64 bucket, lo, length;
};

// Work item `item` of evict_pick (a segment, or with rest a member): false where it has no place
// to fill. Every lane of a warp calls it and gets the same (a ballot finds the range's end).
__device__ bool pick_item(const int64* members, int64 member_count,
                          const int64* distinct_starts, int64 item, bool rest, PickItem* p) {
  const int64 t = rest ? item : member_of_segment(members, member_count, item);
  if (t < 0) return false;
  const Evicting m = evicting_member(members, t);
  if (m.count == 0) return false;
  const int64 bits = rest ? 0 : m.bits;
  const uint64 bucket = rest ? 0 : (uint64)(item - m.first_segment);
  const int64 held_end = m.first_victim + m.count;
  int64 begin, end;
  if (rest) {
    rest_places(m, distinct_starts, &begin, &end);
  } else {
    begin = m.first_victim + distinct_starts[item] - distinct_starts[m.first_segment];
    end = begin + distinct_starts[item + 1] - distinct_starts[item];
    if (end > held_end) end = held_end;
  }
  if (begin >= end) return false;
  const uint64 slot_count = m.slot_count;
  uint64 lo = 0, hi = slot_count - 1;
  if (bits > 0) {
    const uint64 first_hash = bucket << (64 - bits);
    const uint64 last_hash = first_hash + ((~0ULL) >> bits);
    lo = __umul64hi(first_hash, slot_count);
    hi = __umul64hi(last_hash, slot_count);
  }
  uint64 length = hi - lo + 1;
  // past hi, up to the first empty slot: keys homed in [lo, hi] that probed on (every warp finds
  // the same: nothing writes the slots during the pass)
  for (uint64 extra = 0; length < slot_count; extra += 32) {
    const uint64 at = extra + lane_id();
    const bool empty = length + at >= slot_count ||
                       m.slots[2 * ((lo + length + at) % slot_count)] == EMPTY_KEY;
    const unsigned found = __ballot_sync(FULL_WARP, empty);
    if (found != 0) {
      const uint64 more = extra + (uint64)(__ffs(found) - 1);
      length = length + more < slot_count ? length + more : slot_count;
      break;
    }
  }
  p->m = m;
  p->bits = bits;
  p->begin = begin;
  p->end = end;
  p->bucket = bucket;
  p->lo = lo;
  p->length = length;
  return true;
}

// A block (PICK_THREADS) works one item at a time. rest == 0: an item is a segment s (bucket s -
// first_segment of its member), whose evicting keys are the places [begin, end) of the outputs:
// the k-th gets the k-th lowest evictable key of its bucket, or -1 when the bucket has no more.
// rest != 0: an item is a member, and every one of its evicting keys still without a victim
// (victim_rows[i] == -1), in order, gets the lowest evictable key of the whole shard; *left
// (zeroed by the caller) counts the first pass's keys without a victim, so the second pass
// returns at once when there are none. A chosen victim's record is written to victim_records[i]
// as it was, and its record becomes (step, 0) (chosen once; the row's next key counts from 0);
// victim_rows holds flat rows.
// The key-by-key path (rest, or a bucket past PICK_CAP) is the block's first warp's.
// per_block (rest == 0; 1 to 32): each block takes that many consecutive segments, and works
// only those with places: its first warp reads their distinct_starts in one coalesced read. Of
// those, a segment of at most WARP_PLACES places and WARP_CAP evictable keys is a warp's
// (pick_by_rank_warp: the same choice, four buckets at once), the others the block's. With a
// block a bucket, a full table alone spent most of its pass on buckets no new key meets (one
// H200, 2026-11-29: 2^26 rows, 2^20 buckets of which about a third meet one of a call's 2^20
// keys, most of those one key; 2.1 ms for 2^20 blocks, most of them a few dependent reads and
// gone). pick_victims keeps a block a bucket where the buckets meet many keys each.
#define WARP_PLACES 32
extern "C" __global__ void __launch_bounds__(PICK_THREADS)
    evict_pick(const int64* members, int64 member_count, int64* statistics, int64 step,
               const int64* distinct_starts, int64 items, int64 rest, uint64* left,
               int64* victim_keys, int64* victim_rows, int64* victim_records,
               const double* step_at, int64 per_block) {
  if (rest && *left == 0) return;  // every key found a victim in its bucket
  if (step_at != nullptr) step = (int64)*step_at;  // a replayed step's (given_hyper.step_given)
  __shared__ PickShared shared;
  __shared__ unsigned chunk_items, block_items;
  const int lane = (int)lane_id();
  const int warp = (int)(threadIdx.x / 32);
  if (rest || per_block < 1) per_block = 1;
  if (per_block > 32) per_block = 32;
  for (int64 first = blockIdx.x * per_block; first < items; first += gridDim.x * per_block) {
    unsigned todo = 1u;  // bit k: item first + k is the block's (the same in every thread)
    if (per_block > 1) {
      if (threadIdx.x < 32) {
        const int64 item = first + lane;
        const bool places = lane < per_block && item < items &&
                            distinct_starts[item + 1] > distinct_starts[item];
        const unsigned found = __ballot_sync(FULL_WARP, places);
        if (lane == 0) {
          chunk_items = found;
          block_items = 0;
        }
      }
      __syncthreads();
      int k = 0;
      for (unsigned mine = chunk_items; mine != 0; mine &= mine - 1, ++k) {
        if (k % PICK_WARPS != warp) continue;
        const int at = __ffs(mine) - 1;
        PickItem p;
        if (!pick_item(members, member_count, distinct_starts, first + at, false, &p)) continue;
        if (p.end - p.begin > WARP_PLACES ||
            !pick_by_rank_warp(p.m, statistics, step, p.bucket, p.bits, p.lo, p.length, p.begin,
                               p.end, shared.warp_pools[warp], left, victim_keys, victim_rows,
                               victim_records)) {
          if (lane == 0) atomicOr(&block_items, 1u << at);
        }
      }
      __syncthreads();
      todo = block_items;
      __syncthreads();  // read by every thread before the next chunk writes it
    }
    for (; todo != 0; todo &= todo - 1) {
      PickItem p;
      if (!pick_item(members, member_count, distinct_starts, first + __ffs(todo) - 1, rest != 0,
                     &p)) {
        continue;
      }
      if (!rest && pick_by_rank(p.m, statistics, step, p.bucket, p.bits, p.lo, p.length, p.begin,
                                p.end, &shared, left, victim_keys, victim_rows, victim_records)) {
        continue;
      }
      if (threadIdx.x < 32) {
        pick_key_by_key(p.m, statistics, step, p.bucket, p.bits, p.lo, p.length, p.begin, p.end,
                        rest != 0, left, victim_keys, victim_rows, victim_records);
      }
      __syncthreads();
    }
  }
}

#define REST_CAP 32768  // a member's evictable keys left after its buckets, gathered by one block
#define RANK_CAP 1024   // of them, ranked at once in shared memory

// Part c (0, 1, 2) of the score of candidate e of a pool of four columns REST_CAP apart (last
// step, count, key, flat row) as an unsigned in the same order: the score is (last step, key)
// for LRU, (count, last step, key) for LFU, part 1 being 0 for LRU.
__device__ __forceinline__ uint64 score_part(const int64* pool, int64 e, int c, bool lfu) {
  if (c == 0) return ordered(lfu ? pool[REST_CAP + e] : pool[e]);
  if (c == 1) return ordered(lfu ? pool[e] : 0);
  return ordered(pool[2 * REST_CAP + e]);
}

// Whether candidate e is still in the pool (its row not yet given to a place) and its score's
// parts before c equal threshold's, and part c's bits of `decided` too.
__device__ __forceinline__ bool in_range(const int64* pool, int64 e, int c, uint64 decided,
                                         const uint64* threshold, bool lfu) {
  if (pool[3 * REST_CAP + e] < 0) return false;
  for (int b = 0; b < c; ++b) {
    if (score_part(pool, e, b, lfu) != threshold[b]) return false;
  }
  return (score_part(pool, e, c, lfu) & decided) == (threshold[c] & decided);
}

// Block-wide: the least and greatest part c among the pool's candidates in range (parts before
// c equal threshold's) into extremes[0] and [1]; reduce holds 2 * (blockDim.x / 32) values.
__device__ void part_extremes(const int64* pool, int64 n, int c, const uint64* threshold,
                              bool lfu, uint64* reduce, uint64* extremes) {
  uint64 lo = ~0ULL, hi = 0;
  for (int64 e = threadIdx.x; e < n; e += blockDim.x) {
    if (!in_range(pool, e, c, 0, threshold, lfu)) continue;
    const uint64 v = score_part(pool, e, c, lfu);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  for (int from = 16; from > 0; from >>= 1) {
    const uint64 l = __shfl_xor_sync(FULL_WARP, lo, from), h = __shfl_xor_sync(FULL_WARP, hi, from);
    lo = l < lo ? l : lo;
    hi = h > hi ? h : hi;
  }
  const int warp = (int)(threadIdx.x / 32), warps = (int)(blockDim.x / 32);
  if (lane_id() == 0) {
    reduce[warp] = lo;
    reduce[warps + warp] = hi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < warps; ++w) {
      lo = reduce[w] < lo ? reduce[w] : lo;
      hi = reduce[warps + w] > hi ? reduce[warps + w] : hi;
    }
    extremes[0] = lo;
    extremes[1] = hi;
  }
  __syncthreads();
}

// Block-wide: threshold[0..2] = the score of the candidate of rank k (k lower ones) among the
// pool's n still in it, by parts, most significant byte first: a histogram of the next byte of
// the candidates still in range, the byte where the count below reaches k taken. The bytes of a
// part above its highest bit of difference (between its least and greatest in range) come
// whole from its least, so a part of few distinct values (last steps) takes a pass or two.
__device__ void select_rank(const int64* pool, int64 n, int64 k, bool lfu, uint64* threshold,
                            unsigned* histogram, uint64* reduce, uint64* extremes,
                            int64* below) {
  if (threadIdx.x == 0) *below = 0;
  for (int c = 0; c < 3; ++c) {
    part_extremes(pool, n, c, threshold, lfu, reduce, extremes);
    const uint64 lo = extremes[0], diff = lo ^ extremes[1];
    if (diff == 0) {
      if (threadIdx.x == 0) threshold[c] = lo;
      __syncthreads();
      continue;
    }
    int shift = ((63 - __clzll((long long)diff)) / 8) * 8;
    uint64 decided = shift == 56 ? 0 : ~((1ULL << (shift + 8)) - 1);
    if (threadIdx.x == 0) threshold[c] = lo & decided;
    __syncthreads();
    for (; shift >= 0; shift -= 8) {
      for (int d = threadIdx.x; d < 256; d += blockDim.x) histogram[d] = 0;
      __syncthreads();
      for (int64 e = threadIdx.x; e < n; e += blockDim.x) {
        if (in_range(pool, e, c, decided, threshold, lfu)) {
          atomicAdd(&histogram[(score_part(pool, e, c, lfu) >> shift) & 255], 1u);
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int64 at = *below;
        int d = 0;
        for (; d < 255 && at + (int64)histogram[d] <= k; ++d) at += histogram[d];
        *below = at;
        threshold[c] |= (uint64)d << shift;
      }
      decided |= 255ULL << shift;
      __syncthreads();
    }
  }
}

// Whether candidate e's score is at most threshold's (all three parts).
__device__ __forceinline__ bool at_most(const int64* pool, int64 e, const uint64* threshold,
                                        bool lfu) {
  for (int c = 0; c < 3; ++c) {
    const uint64 v = score_part(pool, e, c, lfu);
    if (v != threshold[c]) return v < threshold[c];
  }
  return true;
}

// The second pass by rank, one block (REST_WARPS warps) per member, between evict_pick's passes:
// the member's places still without a victim are listed in order (waiting, from its first
// victim's place), its evictable keys left (last step below `step`: the first pass stamped its
// victims) gathered into its REST_CAP entries of `candidates` (last step, count, key, row, each a
// column of REST_CAP), and the key of rank r among them is the victim of the r-th waiting place:
// what evict_pick's second pass, key after key, chooses, with one read of the shard where that
// reads it once per waiting key. The places are served RANK_CAP at a time: select_rank finds
// the score of the last victim of the lot among the candidates left, the candidates at most
// that score (exactly the lot) move into shared memory, and each one's rank among them is its
// place. A member with more evictable keys left than REST_CAP is counted in *again and left to
// evict_pick's key-by-key pass (which returns at once where *again is 0). Returns at once where
// *left (the first pass's keys without a victim) is 0.
extern "C" __global__ void evict_pick_rest(const int64* members, int64 member_count,
                                           int64* statistics, int64 step,
                                           const int64* distinct_starts, const uint64* left,
                                           uint64* again, int64* waiting, int64* candidates,
                                           int64* victim_keys, int64* victim_rows,
                                           int64* victim_records, const double* step_at) {
  if (*left == 0) return;
  if (step_at != nullptr) step = (int64)*step_at;
  __shared__ int64 warp_counts[REST_WARPS];
  __shared__ uint64 listed, gathered, lot_size;
  __shared__ int64 lot[4][RANK_CAP];  // last step, count, key, row of the lot being ranked
  __shared__ unsigned histogram[256];
  __shared__ uint64 reduce[2 * REST_WARPS], threshold[3], extremes[2];
  __shared__ int64 below;
  const int warp = (int)(threadIdx.x / 32);
  for (int64 t = blockIdx.x; t < member_count; t += gridDim.x) {
    const Evicting m = evicting_member(members, t);
    if (m.count == 0) continue;
    int64 begin, end;
    rest_places(m, distinct_starts, &begin, &end);
    if (begin >= end) continue;
    if (threadIdx.x == 0) listed = gathered = 0;
    __syncthreads();
    for (int64 first = begin; first < end; first += blockDim.x) {  // the waiting places, in order
      const int64 p = first + threadIdx.x;
      const bool yes = p < end && victim_rows[p] == -1;
      const unsigned votes = __ballot_sync(FULL_WARP, yes);
      if (lane_id() == 0) warp_counts[warp] = __popc(votes);
      __syncthreads();
      int64 at = (int64)listed + __popc(votes & lanes_below());
      for (int w = 0; w < warp; ++w) at += warp_counts[w];
      if (yes) waiting[m.first_victim + at] = p;
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 0; w < REST_WARPS; ++w) listed += warp_counts[w];
      }
      __syncthreads();
    }
    const int64 wanted = (int64)listed;
    int64* pool = candidates + 4 * REST_CAP * t;
    for (int64 s = threadIdx.x; wanted > 0 && s < (int64)m.slot_count; s += blockDim.x) {
      const int64 key = m.slots[2 * s];
      if (key < 0) continue;
      const int64 row = m.row_start + m.slots[2 * s + 1];
      const int64 last = statistics[2 * row];
      if (last >= step) continue;
      const uint64 at = atomicAdd(&gathered, 1ULL);
      if (at < REST_CAP) {
        pool[at] = last;
        pool[REST_CAP + at] = statistics[2 * row + 1];
        pool[2 * REST_CAP + at] = key;
        pool[3 * REST_CAP + at] = row;
      }
    }
    __syncthreads();
    const int64 n = (int64)gathered;
    __syncthreads();  // every thread has read listed and gathered before the next member's reset
    if (wanted == 0) continue;
    if (n > REST_CAP) {
      if (threadIdx.x == 0) atomicAdd(again, 1ULL);
      continue;
    }
    const bool lfu = m.lfu != 0;
    const int64 served = wanted < n ? wanted : n;  // the places after them keep no victim
    for (int64 done = 0; done < served; done += RANK_CAP) {
      const int64 take = served - done < RANK_CAP ? served - done : RANK_CAP;
      const bool all = n - done <= RANK_CAP;  // the candidates left fit the lot: no selection
      if (!all) select_rank(pool, n, take - 1, lfu, threshold, histogram, reduce, extremes, &below);
      if (threadIdx.x == 0) lot_size = 0;
      __syncthreads();
      for (int64 e = threadIdx.x; e < n; e += blockDim.x) {
        if (pool[3 * REST_CAP + e] < 0 || (!all && !at_most(pool, e, threshold, lfu))) continue;
        const uint64 at = atomicAdd(&lot_size, 1ULL);
        lot[0][at] = pool[e];
        lot[1][at] = pool[REST_CAP + e];
        lot[2][at] = pool[2 * REST_CAP + e];
        lot[3][at] = pool[3 * REST_CAP + e];
        pool[3 * REST_CAP + e] = -1;  // out of the pool
      }
      __syncthreads();
      const int64 size = (int64)lot_size;
      for (int64 c = threadIdx.x; c < size; c += blockDim.x) {
        const Score mine = candidate_score(&lot[0][0], RANK_CAP, c, lfu);
        int64 rank = 0;
        for (int64 d = 0; d < size; ++d) {
          rank += lower(candidate_score(&lot[0][0], RANK_CAP, d, lfu), mine);
        }
        if (rank < take) {
          const int64 i = waiting[m.first_victim + done + rank];
          victim_keys[i] = mine.key;
          victim_rows[i] = mine.row;
          victim_records[2 * i] = lot[0][c];
          victim_records[2 * i + 1] = lot[1][c];
          clear_victim_record(statistics, mine.row, step);
        }
      }
      __syncthreads();
    }
  }
}

// After the pick of a padded eviction (each member's count a bound on its new keys, so every
// distinct new key evicts): totals[t] = member t's places (its distinct new keys, at most its
// count), unserved[t] = those that got no victim (a shard with fewer evictable keys than new
// ones: the engine fails the step) and served[t] = its victims, the others. One block of up to
// 1,024 threads a member, UNSERVED_LOADS loads in flight a thread (a member's 16,384 places a
// block of 256 threads, a load at a time: 27 us for 26 members, one H200).
#define UNSERVED_LOADS 4
extern "C" __global__ void evict_unserved(const int64* members, int64 member_count,
                                          const int64* distinct_starts, const int64* victim_rows,
                                          int64* totals, int64* unserved, int64* served) {
  __shared__ int64 warp_missing[32];
  const int warp = (int)(threadIdx.x / 32), warps = (int)((blockDim.x + 31) / 32);
  for (int64 t = blockIdx.x; t < member_count; t += gridDim.x) {
    const Evicting m = evicting_member(members, t);
    int64 begin = 0, end = 0;
    if (m.count > 0) rest_places(m, distinct_starts, &begin, &end);
    int64 missing = 0;
    for (int64 p = begin + threadIdx.x; p < end; p += UNSERVED_LOADS * (int64)blockDim.x) {
      int64 rows[UNSERVED_LOADS];
#pragma unroll
      for (int k = 0; k < UNSERVED_LOADS; ++k) {
        const int64 q = p + k * (int64)blockDim.x;
        rows[k] = q < end ? victim_rows[q] : 0;
      }
#pragma unroll
      for (int k = 0; k < UNSERVED_LOADS; ++k) missing += rows[k] < 0;
    }
    for (int from = 16; from > 0; from >>= 1) missing += __shfl_xor_sync(FULL_WARP, missing, from);
    if (lane_id() == 0) warp_missing[warp] = missing;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < warps; ++w) missing += warp_missing[w];
      totals[t] = end - begin;
      unserved[t] = missing;
      served[t] = end - begin - missing;
    }
    __syncthreads();
  }
}

// statistics[row][0] = step for every row >= 0 of `rows` (the rows a step looked up: not
// evicted by it); the count is left as it is. step_at: null, or where a replayed step's number
// is read from when the kernel runs (given_hyper.step_given), instead of `step`.
extern "C" __global__ void stamp_last_step(int64* statistics, const int64* rows, int64 n,
                                           int64 step, const double* step_at) {
  if (step_at != nullptr) step = (int64)*step_at;
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    if (rows[i] >= 0) statistics[2 * rows[i]] = step;
  }
}
