// unique: distinct keys in first-occurrence order (like tf.unique) and each key's position in them.
//
// A scratch open-addressing table (see common.cuh) has, per slot, the key and the first position
// it occurs at (atomicMin). Then:
//   1. unique_claim:    slot_of[i] = slot of keys[i]; slot_first[slot] = min position;
//   2. unique_flags:    is_first[i] = (slot_first[slot_of[i]] == i);
//   3. exclusive scan of is_first gives each first occurrence its output position;
//   4. unique_emit:     unique_keys[pos[i]] = keys[i] for first occurrences, and the slot now
//                       remembers that output position in slot_first;
//   5. unique_inverse:  inverse[i] = slot_first[slot_of[i]].
#include "common.cuh"

// slot_keys: [slot_count] filled with EMPTY_KEY; slot_first: [slot_count] filled with a value
// larger than any position (the caller sets every byte to 0x7f).
extern "C" __global__ void unique_claim(const int64* keys, int64 n, int64* slot_keys,
                                        int64* slot_first, uint64 slot_count, int64* slot_of) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    bool claimed;
    const int64 slot = find_or_claim_slot(slot_keys, 1, slot_count, keys[i], &claimed);
    atomicMin((uint64*)(slot_first + slot), (uint64)i);
    slot_of[i] = slot;
  }
}

// unique_claim over (tag, key) pairs (a hash group's keys, engine/lookup/table_group.py): here a slot
// holds the position of the first key to claim it (slot_keys filled with EMPTY_KEY), and a key
// matches a slot when its key and tag both equal those of that position, so equal keys of two
// tags never meet. The steps after step 1 run as for plain keys.
__device__ __forceinline__ int64 claim_pair_slot(int64* slot_positions, uint64 slot_count,
                                                 const int64* keys, const int64* tags, int64 i) {
  const int64 key = keys[i], tag = tags[i];
  uint64 slot = home_slot((int64)(scramble_key((uint64)tag) ^ (uint64)key), slot_count);
  for (uint64 probes = 0; probes < slot_count; ++probes) {
    int64 held = *(volatile int64*)(slot_positions + slot);
    if (held == EMPTY_KEY) {
      held = (int64)atomicCAS((uint64*)(slot_positions + slot), (uint64)EMPTY_KEY, (uint64)i);
      if (held == EMPTY_KEY) return (int64)slot;
    }
    if (keys[held] == key && tags[held] == tag) return (int64)slot;
    slot = next_slot(slot, slot_count);
  }
  return -1;
}

extern "C" __global__ void unique_claim_tagged(const int64* keys, const int64* tags, int64 n,
                                               int64* slot_positions, int64* slot_first,
                                               uint64 slot_count, int64* slot_of) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 slot = claim_pair_slot(slot_positions, slot_count, keys, tags, i);
    atomicMin((uint64*)(slot_first + slot), (uint64)i);
    slot_of[i] = slot;
  }
}

extern "C" __global__ void unique_flags(const int64* slot_of, const int64* slot_first, int64 n,
                                        int64* is_first) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    is_first[i] = slot_first[slot_of[i]] == i ? 1 : 0;
  }
}

extern "C" __global__ void unique_emit(const int64* keys, const int64* slot_of,
                                       const int64* is_first, const int64* positions, int64 n,
                                       int64* unique_keys, int64* slot_first) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    if (is_first[i]) {
      const int64 position = positions[i];
      unique_keys[position] = keys[i];
      slot_first[slot_of[i]] = position;
    }
  }
}

extern "C" __global__ void unique_inverse(const int64* slot_of, const int64* slot_first, int64 n,
                                          int64* inverse) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    inverse[i] = slot_first[slot_of[i]];
  }
}
