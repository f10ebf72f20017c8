// HashIndex on the GPU: 64-bit keys -> shard rows, open addressing with linear probing.
//
// slots: [slot_count][2] int64, (key, row) side by side so one probe reads one 16-byte pair; a
// free slot has key EMPTY_KEY, an erased key's slot TOMBSTONE_KEY (probes walk past it and inserts
// leave it alone, since the key they place may sit further along; the owner rebuilds the index to
// clear tombstones). Keys are placed with atomicCAS (common.cuh). A new key's row is
// first_new_row + k, with k taken from a counter by one warp-aggregated atomicAdd per warp, so the
// fresh rows handed out by one call are consecutive. A thread that finds a key placed by another thread
// of the same call waits for that thread's row write (hash_find_or_insert).
#include "common.cuh"

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

// find_or_insert in one pass: rows[i] gets keys[i]'s row, placing the keys not held yet.
// new_keys / new_rows get, at k, the k-th key placed by this call and its row: row_pool[k] for
// k < pool_count (a table reusing freed rows), then first_new_row + k - pool_count; *placed
// (zeroed by the caller) ends as the number placed. Keys placed at k >= limit (more new keys than rows
// left) get OVERFLOW_ROW, and the caller, seeing *placed > limit, erases new_keys[0, *placed).
// A key met again in the same call, whose row another thread is still writing, reads
// PENDING_ROW from its slot: that thread has claimed the slot and writes the row right after its
// warp's count, so the reader waits for it (after its own warp's writes, never holding back a
// writer).
extern "C" __global__ void hash_find_or_insert(int64* slots, uint64 slot_count, const int64* keys,
                                               int64 n, int64 first_new_row, int64 limit,
                                               uint64* placed, int64* new_keys, int64* new_rows,
                                               const int64* row_pool, int64 pool_count,
                                               int64* rows) {
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + lane_id();
    bool claimed = false;
    int64 slot = -1;
    if (i < n) slot = find_or_claim_slot(slots, 2, slot_count, keys[i], &claimed);
    const unsigned new_here = __ballot_sync(FULL_WARP, claimed);
    if (new_here != 0) {
      const int leader = __ffs(new_here) - 1;
      uint64 base = 0;
      if ((int)lane_id() == leader) base = atomicAdd(placed, (uint64)__popc(new_here));
      base = __shfl_sync(FULL_WARP, base, leader);
      if (claimed) {
        const int64 k = (int64)base + __popc(new_here & lanes_below());
        int64 row = OVERFLOW_ROW;
        if (k < limit) row = k < pool_count ? row_pool[k] : first_new_row + k - pool_count;
        // Volatile, so a reader spinning on this slot sees it; no fence: the spinner reads
        // nothing else this thread wrote.
        *(volatile int64*)(slots + 2 * slot + 1) = row;
        new_keys[k] = keys[i];
        new_rows[k] = row;
        rows[i] = row;
      }
    }
    __syncwarp();
    if (i < n && !claimed) {
      int64 row = -1;
      if (slot >= 0) {
        const volatile int64* where = slots + 2 * slot + 1;
        while ((row = *where) == PENDING_ROW) {
        }
      }
      rows[i] = row;
    }
  }
}

// Places distinct keys that are not held yet with the given rows (HashIndex.assign).
extern "C" __global__ void hash_assign(int64* slots, uint64 slot_count, const int64* keys,
                                       const int64* rows, int64 n) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    bool claimed;
    const int64 slot = find_or_claim_slot(slots, 2, slot_count, keys[i], &claimed);
    if (slot >= 0) slots[2 * slot + 1] = rows[i];
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
