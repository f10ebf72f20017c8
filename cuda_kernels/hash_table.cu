// HashIndex on the GPU: 64-bit keys -> shard rows, open addressing with linear probing.
//
// slots: [slot_count][2] int64, (key, row) side by side so one probe reads one 16-byte pair; a
// free slot has key EMPTY_KEY, an erased key's slot TOMBSTONE_KEY (probes walk past it and inserts
// leave it alone, since the key they place may sit further along; the owner rebuilds the index to
// clear tombstones). Keys are placed with atomicCAS (common.cuh). A new key's row is
// first_new_row + k, with k taken from a counter by one warp-aggregated atomicAdd per warp, so the
// fresh rows handed out by one call are consecutive. A thread that finds a key placed by another thread
// of the same call waits for that thread's row write (hash_find_or_insert).
#include "random_init.cuh"

extern "C" __global__ void hash_find(const int64* slots, uint64 slot_count, const int64* keys,
                                     int64 n, int64* rows) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 slot = find_slot(slots, 2, slot_count, keys[i]);
    rows[i] = slot < 0 ? -1 : slots[2 * slot + 1];
  }
}

// *missing += number of distinct keys not in slots. seen_keys: a scratch key set of seen_count
// slots filled with EMPTY_KEY, where each missing key is claimed once.
extern "C" __global__ void hash_count_missing(const int64* slots, uint64 slot_count,
                                              const int64* keys, int64 n, int64* seen_keys,
                                              uint64 seen_count, uint64* missing) {
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + lane_id();
    bool claimed = false;
    if (i < n && find_slot(slots, 2, slot_count, keys[i]) < 0) {
      find_or_claim_slot(seen_keys, 1, seen_count, keys[i], &claimed);
    }
    const unsigned new_here = __ballot_sync(FULL_WARP, claimed);
    if (new_here != 0 && lane_id() == 0) atomicAdd(missing, (uint64)__popc(new_here));
  }
}

#define PENDING_ROW (-1LL)   // a slot's row until its placing thread writes it
#define OVERFLOW_ROW (-3LL)  // a key placed past `limit`: the caller erases the call's keys

// Where the keys placed by one find_or_insert call go: new_keys / new_rows get, at k, the k-th
// key placed and its row, row_pool[k] for k < pool_count (a table reusing freed rows), then
// first_new_row + k - pool_count; *placed (zeroed by the caller) counts them. Keys placed at
// k >= limit (more new keys than rows left) get OVERFLOW_ROW, and the caller, seeing
// *placed > limit, erases new_keys[0, *placed).
struct Placing {
  int64 first_new_row, limit, pool_count;
  uint64* placed;
  int64* new_keys;
  int64* new_rows;
  const int64* row_pool;
};

// One warp's step of find_or_insert: lane i < n finds or claims keys[i]'s slot (*slot; -1 when
// every slot holds another key) and, when it claimed it, numbers the key with one atomicAdd per
// warp and records it in new_keys / new_rows. Returns the lanes that claimed; *row is a
// claimer's row (its slot's row is still PENDING_ROW: publish_row writes it).
__device__ __forceinline__ unsigned claim_keys(int64* slots, uint64 slot_count, const int64* keys,
                                               int64 i, int64 n, const Placing& p, int64* slot,
                                               int64* row) {
  bool claimed = false;
  *slot = -1;
  *row = -1;
  if (i < n) *slot = find_or_claim_slot(slots, 2, slot_count, keys[i], &claimed);
  const unsigned new_here = __ballot_sync(FULL_WARP, claimed);
  if (new_here != 0) {
    const int leader = __ffs(new_here) - 1;
    uint64 base = 0;
    if ((int)lane_id() == leader) base = atomicAdd(p.placed, (uint64)__popc(new_here));
    base = __shfl_sync(FULL_WARP, base, leader);
    if (claimed) {
      const int64 k = (int64)base + __popc(new_here & lanes_below());
      *row = OVERFLOW_ROW;
      if (k < p.limit) *row = k < p.pool_count ? p.row_pool[k] : p.first_new_row + k - p.pool_count;
      p.new_keys[k] = keys[i];
      p.new_rows[k] = *row;
    }
  }
  return new_here;
}

// Volatile, so a reader spinning on this slot (found_row) sees it.
__device__ __forceinline__ void publish_row(int64* slots, int64 slot, int64 row) {
  *(volatile int64*)(slots + 2 * slot + 1) = row;
}

// The row of a key this lane found (slot >= 0) or -1 (slot -1). A key placed by another thread
// of the same call reads PENDING_ROW until that thread publishes its row; the caller spins only
// after publishing its own warp's rows, so it never holds back a writer.
__device__ __forceinline__ int64 found_row(const int64* slots, int64 slot) {
  int64 row = -1;
  if (slot >= 0) {
    const volatile int64* where = slots + 2 * slot + 1;
    while ((row = *where) == PENDING_ROW) {
    }
  }
  return row;
}

// find_or_insert in one pass: rows[i] gets keys[i]'s row, placing the keys not held yet
// (Placing says where their rows come from and where they are recorded).
extern "C" __global__ void hash_find_or_insert(int64* slots, uint64 slot_count, const int64* keys,
                                               int64 n, int64 first_new_row, int64 limit,
                                               uint64* placed, int64* new_keys, int64* new_rows,
                                               const int64* row_pool, int64 pool_count,
                                               int64* rows) {
  const Placing p = {first_new_row, limit, pool_count, placed, new_keys, new_rows, row_pool};
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + lane_id();
    int64 slot, row;
    const unsigned new_here = claim_keys(slots, slot_count, keys, i, n, p, &slot, &row);
    const bool claimed = (new_here >> lane_id()) & 1u;
    if (claimed) {
      // No fence: the spinning reader reads nothing else this thread wrote.
      publish_row(slots, slot, row);
      rows[i] = row;
    }
    __syncwarp();
    if (i < n && !claimed) rows[i] = found_row(slots, slot);
  }
}

// A hash group's members (engine/lookup/table_group.py) in one launch: keys[i] is a key of member
// tags[i], whose index members[MEMBER * t ...] describes: its slots' address, slot count, first
// new row, rows left (limit), the start of its rows among the group's flat rows, and its pool of
// freed rows (address and count; 0, 0 for none): as Placing's for one index, the k-th key a
// member places gets pool[k] for k < pool_count, then first_new_row + k - pool_count.
#define MEMBER 7

struct Member {
  int64* slots;
  uint64 slot_count;
  int64 first_new_row, limit, row_start;
  const int64* pool;
  int64 pool_count;
};

__device__ __forceinline__ Member member_of(const int64* members, int64 tag) {
  const int64* m = members + MEMBER * tag;
  const Member member = {(int64*)m[0], (uint64)m[1], m[2], m[3], m[4], (const int64*)m[5], m[6]};
  return member;
}

// A pool's entry below 0 (a padded eviction's place that got no victim) is no row either.
__device__ __forceinline__ int64 placed_row(const Member& member, int64 k) {
  if (k >= member.limit) return OVERFLOW_ROW;
  if (k >= member.pool_count) return member.first_new_row + k - member.pool_count;
  const int64 row = member.pool[k];
  return row < 0 ? OVERFLOW_ROW : row;
}

__device__ __forceinline__ int64 flat_row(const Member& member, int64 row) {
  return row < 0 ? row : member.row_start + row;
}

// rows[i] = keys[i]'s flat row in its member, -1 where the member does not hold it; a negative
// key (a per-peer capacity's padded slot, whose tag is -1 too) is no key: row -1, its tag unread.
extern "C" __global__ void hash_find_tagged(const int64* members, const int64* keys,
                                            const int64* tags, int64 n, int64* rows) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    if (keys[i] < 0) {
      rows[i] = -1;
      continue;
    }
    const Member member = member_of(members, tags[i]);
    const int64 slot = find_slot(member.slots, 2, member.slot_count, keys[i]);
    rows[i] = slot < 0 ? -1 : flat_row(member, member.slots[2 * slot + 1]);
  }
}

// find_or_insert over a group's members (as hash_find_or_insert for one index): rows[i] gets
// keys[i]'s flat row; a negative key (bad input a replayed step's checks report after this
// kernel ran: it must not be taken for EMPTY_KEY or TOMBSTONE_KEY) is passed by, row -1.
// A key placed takes its member's next row (placed_row): placed[t] (zeroed
// by the caller) counts member t's placed keys, also past its limit, where they get OVERFLOW_ROW
// and the caller, seeing placed[t] > limit, erases the call's keys; the placed keys are recorded
// at [0, *total) of new_keys, new_rows (flat) and new_tags. The counters take one atomicAdd per
// warp (*total) and per member of a warp's placed keys (placed[t]).
extern "C" __global__ void hash_find_or_insert_tagged(const int64* members, const int64* keys,
                                                      const int64* tags, int64 n, int64* placed,
                                                      uint64* total, int64* new_keys,
                                                      int64* new_rows, int64* new_tags,
                                                      int64* rows) {
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + lane_id();
    const int lane = (int)lane_id();
    Member member = {nullptr, 0, 0, 0, 0, nullptr, 0};
    int64 slot = -1;
    bool claimed = false;
    if (i < n && keys[i] >= 0) {
      member = member_of(members, tags[i]);
      slot = find_or_claim_slot(member.slots, 2, member.slot_count, keys[i], &claimed);
    }
    const unsigned claimers = __ballot_sync(FULL_WARP, claimed);
    uint64 base = 0;
    if (claimers != 0 && lane == __ffs(claimers) - 1) {
      base = atomicAdd(total, (uint64)__popc(claimers));
    }
    base = __shfl_sync(FULL_WARP, base, claimers != 0 ? __ffs(claimers) - 1 : 0);
    const unsigned same = __match_any_sync(FULL_WARP, claimed ? tags[i] : -1LL);
    if (claimed) {  // `same`: this lane and the others placing a key of its member
      const int head = __ffs(same) - 1;
      uint64 member_base = 0;
      if (lane == head) {
        member_base = atomicAdd((uint64*)(placed + tags[i]), (uint64)__popc(same));
      }
      member_base = __shfl_sync(same, member_base, head);
      const int64 k = (int64)member_base + __popc(same & lanes_below());
      const int64 row = placed_row(member, k);
      const int64 at = (int64)base + __popc(claimers & lanes_below());
      new_keys[at] = keys[i];
      new_rows[at] = flat_row(member, row);
      new_tags[at] = tags[i];
      publish_row(member.slots, slot, row);  // no fence: as in hash_find_or_insert
      rows[i] = flat_row(member, row);
    }
    __syncwarp();
    if (i < n && !claimed) rows[i] = flat_row(member, found_row(member.slots, slot));
  }
}

// After hash_find_or_insert_tagged on `members` (no pools): each member's first new row and
// rows left moved past its placed[t] keys, so that the list holds what the host would write for
// the next call (a replayed insert's list stays on the device while the host's sizes agree).
extern "C" __global__ void hash_members_advance(int64* members, const int64* placed,
                                                int64 parts) {
  for (int64 t = global_thread_id(); t < parts; t += global_thread_count()) {
    members[MEMBER * t + 2] += placed[t];
    members[MEMBER * t + 3] -= placed[t];
  }
}

// hash_erase over a group's members, in one launch: keys[i], a key member tags[i] holds (an
// eviction's victims), leaves its index (its slot a tombstone); a key -1 is passed by.
extern "C" __global__ void hash_erase_tagged(const int64* members, const int64* keys,
                                             const int64* tags, int64 n) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    if (keys[i] < 0) continue;  // a padded eviction's place without a victim
    const Member member = member_of(members, tags[i]);
    const int64 slot = find_slot(member.slots, 2, member.slot_count, keys[i]);
    if (slot < 0) continue;
    member.slots[2 * slot + 1] = -1;
    member.slots[2 * slot] = TOMBSTONE_KEY;
  }
}

#define GROUP 8  // keys whose row copies one warp keeps in flight together

// The first row of a split table's host part, or -1 when fresh is null (every row is the first
// pass's).
__device__ __forceinline__ int64 first_deferred_row(const unsigned* fresh,
                                                    const SplitRows<float>& values, int64 dim) {
  return fresh != nullptr ? values.split / dim : -1;
}

__device__ __forceinline__ bool deferred(int64 row, int64 first_host) {
  return first_host >= 0 && row >= first_host;
}

// find_or_insert (as hash_find_or_insert) that also initialises the placed keys' rows of
// `values` ([*, dim] float32, maybe split) with random_init.cuh's recipe and writes every key's
// vector to out[i] ([n, dim]; zeros for a key without a row), and, where statistics is given,
// counts the lookup in the rows' 16-byte records (touch_row), HierarchicalKV's find_or_insert:
// one pass over the keys, a new row's vector computed once and stored twice, no reread. The warp
// shares each key's row, a lane per column. A new row's values are stored before its row is
// published (a fence between), and found rows are read through L2 (__ldcg), so a thread meeting
// a key another warp placed in this call reads the vector that warp wrote.
// fresh (may be null): a zeroed bit per host row of a split table. Then the rows in host memory
// are left to hash_settle_host_rows, which walks them in host_order's order: this pass only
// sets the bit of each host row it places.
extern "C" __global__ void hash_find_or_insert_values(
    int64* slots, uint64 slot_count, const int64* keys, int64 n, int64 first_new_row, int64 limit,
    uint64* placed, int64* new_keys, int64* new_rows, const int64* row_pool, int64 pool_count,
    int64* rows, SplitRows<float> values, int64 dim, int64 kind, uint64 seed, uint64 table_id,
    double a, double b, float* __restrict__ out, int64* statistics, int64 step,
    unsigned* fresh) {
  const Placing p = {first_new_row, limit, pool_count, placed, new_keys, new_rows, row_pool};
  const uint64 streams = table_stream(seed, table_id);
  const int lane = (int)lane_id();
  const int64 first_host = first_deferred_row(fresh, values, dim);
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + lane;
    const int64 key = i < n ? keys[i] : 0;
    int64 slot, row;
    const unsigned new_here = claim_keys(slots, slot_count, keys, i, n, p, &slot, &row);
    const bool claimed = (new_here >> lane) & 1u;
    if (claimed && deferred(row, first_host)) {
      const int64 h = row - first_host;
      atomicOr(fresh + (h >> 5), 1u << (h & 31));
    }
    for (unsigned left = new_here; left != 0; left &= left - 1) {
      const int j = __ffs(left) - 1;
      const int64 new_row = __shfl_sync(FULL_WARP, row, j);
      if (deferred(new_row, first_host)) continue;
      const uint64 stream = key_stream(streams, __shfl_sync(FULL_WARP, key, j));
      float* to = out + (first + j) * dim;
      for (int64 column = lane; column < dim; column += 32) {
        const float value = initial_value((int)kind, stream, (uint64)column, a, b);
        if (new_row >= 0) values[new_row * dim + column] = value;
        to[column] = value;
      }
    }
    if (new_here != 0) __threadfence();
    if (claimed) {
      publish_row(slots, slot, row);
      rows[i] = row;
    }
    __syncwarp();
    if (i < n && !claimed) {
      row = found_row(slots, slot);
      rows[i] = row;
    }
    if (statistics != nullptr) touch_row(statistics, row, step);
    const int64 in_warp = n - first < 32 ? n - first : 32;
    const unsigned found_here = ~new_here & (in_warp == 32 ? FULL_WARP : (1u << in_warp) - 1u);
    for (int j0 = 0; j0 < 32; j0 += GROUP) {
      if (((found_here >> j0) & ((1u << GROUP) - 1u)) == 0) continue;
      int64 from[GROUP];
#pragma unroll
      for (int u = 0; u < GROUP; ++u) {
        from[u] = __shfl_sync(FULL_WARP, row, j0 + u);
        if (!((found_here >> (j0 + u)) & 1u) || deferred(from[u], first_host)) {
          from[u] = -2;  // not copied here
        }
      }
      for (int64 column = lane; column < dim; column += 32) {
        float got[GROUP];
#pragma unroll
        for (int u = 0; u < GROUP; ++u) {
          got[u] = from[u] >= 0 ? __ldcg(&values[from[u] * dim + column]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GROUP; ++u) {
          if (from[u] != -2) out[(first + j0 + u) * dim + column] = got[u];
        }
      }
    }
  }
}

// find_or_insert_values' second pass (with `fresh`), over the keys in host_order's order from
// *host_start (the first key whose row lies in host memory; the device rows were the first
// pass's): a key whose row this call placed (its bit in `fresh`) gets the row's initial vector,
// written to the table and to out[i] (by every key of the call that has the row: the same
// values), any other key its row copied to out[i]. A thread moves W floats of a row (W = 4 when
// dim allows: 16-byte host accesses, as take_rows' widest words).
template <typename Word>
__device__ __forceinline__ void settle_host_rows(const int64* keys, const int64* rows, int64 n,
                                                 const int64* order, const int64* host_start,
                                                 const unsigned* fresh, SplitRows<float> values,
                                                 int64 dim, int64 kind, uint64 seed,
                                                 uint64 table_id, double a, double b,
                                                 float* __restrict__ out) {
  const int W = sizeof(Word) / sizeof(float);
  const uint64 streams = table_stream(seed, table_id);
  const int64 first_host = values.split / dim;
  const int64 words = dim / W;
  const int64 start = *host_start;
  const int64 total = (n - start) * words;
  for (int64 e = global_thread_id(); e < total; e += global_thread_count()) {
    const int64 t = e / words;
    const int64 column = (e - t * words) * W;
    const int64 i = order[start + t];
    const int64 row = rows[i];
    if (row < first_host) continue;  // never from *host_start on (host_order puts them first)
    const int64 h = row - first_host;
    Word* host = reinterpret_cast<Word*>(values.host + h * dim + column);
    Word* to = reinterpret_cast<Word*>(out + i * dim + column);
    if ((fresh[h >> 5] >> (h & 31)) & 1u) {
      const uint64 stream = key_stream(streams, keys[i]);
      Word word;
      float* value = reinterpret_cast<float*>(&word);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        value[k] = initial_value((int)kind, stream, (uint64)(column + k), a, b);
      }
      *host = word;
      *to = word;
    } else {
      *to = *host;
    }
  }
}

#define SETTLE_HOST_ROWS(SUFFIX, WORD)                                                          \
  extern "C" __global__ void hash_settle_host_rows_##SUFFIX(                                   \
      const int64* keys, const int64* rows, int64 n, const int64* order,                       \
      const int64* host_start, const unsigned* fresh, SplitRows<float> values, int64 dim,      \
      int64 kind, uint64 seed, uint64 table_id, double a, double b, float* __restrict__ out) { \
    settle_host_rows<WORD>(keys, rows, n, order, host_start, fresh, values, dim, kind, seed,   \
                        table_id, a, b, out);                                                  \
  }

SETTLE_HOST_ROWS(w4, float)
SETTLE_HOST_ROWS(w16, float4)

// Places distinct keys that are not held yet with the given rows (HashIndex.assign).
extern "C" __global__ void hash_assign(int64* slots, uint64 slot_count, const int64* keys,
                                       const int64* rows, int64 n) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    bool claimed;
    const int64 slot = find_or_claim_slot(slots, 2, slot_count, keys[i], &claimed);
    if (slot >= 0) slots[2 * slot + 1] = rows[i];
  }
}

// Every held key of `old` (its slots) placed with its row in `slots`, an empty index of room
// enough (HashIndex.rehashed): tombstones and empty slots are left behind.
extern "C" __global__ void hash_reinsert(const int64* old, uint64 old_count, int64* slots,
                                         uint64 slot_count) {
  for (int64 s = global_thread_id(); s < (int64)old_count; s += global_thread_count()) {
    const int64 key = old[2 * s];
    if (key < 0) continue;  // EMPTY_KEY or TOMBSTONE_KEY
    bool claimed;
    const int64 slot = find_or_claim_slot(slots, 2, slot_count, key, &claimed);
    if (slot >= 0) slots[2 * slot + 1] = old[2 * s + 1];
  }
}

// Rehashing several indexes in place (hash_groups.py's hash_rehash_many), step 1: listing holds
// per index t its first slot among all of them (starts[t], ascending), its slots' address and its
// slot count, as [starts | addresses | counts]; every slot s of them is copied to held[s] (16
// bytes) and emptied (key and row -1). Step 2 (hash_reinsert_many) puts the held keys back.
extern "C" __global__ void hash_take_slots_many(const int64* listing, int64 parts, int64 total,
                                                int64* held, const int64* rebuild) {
  for (int64 s = global_thread_id(); s < total; s += global_thread_count()) {
    const int64 t = part_of(listing, parts, s);
    if (rebuild != nullptr && rebuild[t] == 0) {  // an index left as it is: nothing to put back
      held[2 * s] = EMPTY_KEY;
      continue;
    }
    int64* slot = (int64*)listing[parts + t] + 2 * (s - listing[t]);
    held[2 * s] = slot[0];
    held[2 * s + 1] = slot[1];
    slot[0] = EMPTY_KEY;
    slot[1] = -1;
  }
}

// Step 2: every key held[s] (not free, not a tombstone) back into the index it came from, at its
// row.
extern "C" __global__ void hash_reinsert_many(const int64* listing, int64 parts, int64 total,
                                              const int64* held) {
  for (int64 s = global_thread_id(); s < total; s += global_thread_count()) {
    const int64 key = held[2 * s];
    if (key < 0) continue;  // EMPTY_KEY or TOMBSTONE_KEY (or an index step 1 left as it is)
    const int64 t = part_of(listing, parts, s);
    int64* slots = (int64*)listing[parts + t];
    bool claimed;
    const int64 slot = find_or_claim_slot(slots, 2, (uint64)listing[2 * parts + t], key,
                                          &claimed);
    if (slot >= 0) slots[2 * slot + 1] = held[2 * s + 1];
  }
}

// Growing several indexes at once (hash_groups.py's hash_rehash_many with capacities): listing
// holds per index t its first slot among all the old ones (starts[t], ascending), its old slots'
// address, its new (empty) slots' address and their count, as [starts | old | new | counts];
// every key of an old slot s (not free, not a tombstone) goes into its index's new slots at its
// row. The old slots are only read.
extern "C" __global__ void hash_reinsert_into_many(const int64* listing, int64 parts, int64 total) {
  for (int64 s = global_thread_id(); s < total; s += global_thread_count()) {
    const int64 t = part_of(listing, parts, s);
    const int64* old = (const int64*)listing[parts + t] + 2 * (s - listing[t]);
    const int64 key = old[0];
    if (key < 0) continue;  // EMPTY_KEY or TOMBSTONE_KEY
    int64* slots = (int64*)listing[2 * parts + t];
    bool claimed;
    const int64 slot = find_or_claim_slot(slots, 2, (uint64)listing[3 * parts + t], key, &claimed);
    if (slot >= 0) slots[2 * slot + 1] = old[1];
  }
}

// Erases distinct keys: a held key's slot becomes TOMBSTONE_KEY; rows[i] gets its row, or -1
// where keys[i] was not held; *erased counts the keys erased.
extern "C" __global__ void hash_erase(int64* slots, uint64 slot_count, const int64* keys, int64 n,
                                      int64* rows, uint64* erased) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 slot = find_slot(slots, 2, slot_count, keys[i]);
    if (slot < 0) {
      rows[i] = -1;
      continue;
    }
    rows[i] = slots[2 * slot + 1];
    slots[2 * slot + 1] = -1;
    slots[2 * slot] = TOMBSTONE_KEY;
    atomicAdd(erased, 1ULL);
  }
}

// export, step 1: key_of_row[row] = key for every held key (key_of_row filled with EMPTY_KEY),
// is_held[row] = 1; rows outside [0, row_count) are counted in *bad_rows.
extern "C" __global__ void hash_keys_by_row(const int64* slots, uint64 slot_count,
                                            int64 row_count, int64* key_of_row, int64* is_held,
                                            uint64* bad_rows) {
  for (int64 s = global_thread_id(); s < (int64)slot_count; s += global_thread_count()) {
    const int64 key = slots[2 * s];
    if (key < 0) continue;  // EMPTY_KEY or TOMBSTONE_KEY
    const int64 row = slots[2 * s + 1];
    if (row < 0 || row >= row_count) {
      atomicAdd(bad_rows, 1ULL);
    } else {
      key_of_row[row] = key;
      is_held[row] = 1;
    }
  }
}

// export, step 2: (keys, rows) of the held rows in row order; positions = exclusive scan of
// is_held.
extern "C" __global__ void hash_compact_rows(const int64* key_of_row, const int64* is_held,
                                             const int64* positions, int64 row_count,
                                             int64* keys, int64* rows) {
  for (int64 row = global_thread_id(); row < row_count; row += global_thread_count()) {
    if (is_held[row]) {
      const int64 position = positions[row];
      keys[position] = key_of_row[row];
      rows[position] = row;
    }
  }
}

// flags[t] = 1 where more keys are to be placed in index t (wanted[t]) than it has empty slots
// (room[t], as the host counted them before the step), or where it erased more keys
// (erased[t]) than the tombstones it takes before it is worn (room[parts + t]: half its
// capacity less its tombstones before the step), else 0: which indexes a replayed evicting step
// rebuilds (hash_take_slots_many's `rebuild`) between its erase and its insert.
extern "C" __global__ void hash_rebuild_flags(const int64* wanted, const int64* erased,
                                              const int64* room, int64 parts, int64* flags) {
  const int64 t = global_thread_id();
  if (t < parts) flags[t] = wanted[t] > room[t] || erased[t] > room[parts + t] ? 1 : 0;
}
