// floor_divide: keys // divisor, rounded toward minus infinity as in NumPy.
//
// bucket_by_owner: a stable counting sort of key positions by owner. The owner rule (as
// sok1x.backend's OWNER_*): 0 key % world_size, 1 the fixed rank, 2 scramble_key(key) % world_size.
//
// The keys are cut into tiles of keys_per_tile consecutive positions, one warp per tile, walked
// 32 keys at a time in order. __match_any_sync groups the lanes whose keys share an owner; the
// lowest lane of a group updates that owner's count for the tile, and a key's rank inside its
// group is the number of group lanes below it. So:
//   1. owner_tile_counts: tile_counts[owner][tile] = keys of the tile with that owner;
//   2. an exclusive scan of tile_counts (owner-major) gives where each (owner, tile) run starts;
//   3. owner_counts_from_offsets reads the per-owner totals off the scan;
//   4. owner_scatter writes each position to its run, in tile order, so equal owners keep their
//      input order (stable).
// valid (may be null): a device count of the leading keys to bucket; the keys after it are
// ignored (unique's padded output, whose size the host has not read). A key's owner under rule 0
// is taken unsigned, so any key (even a negative one, which the step then rejects) has an owner
// in [0, world_size) and no kernel writes out of place.
#include "common.cuh"

struct OwnerRule {
  int64 world_size;
  int64 rule;
  int64 fixed_rank;
};

__device__ __forceinline__ int owner_of(const int64* keys, int64 i, int64 end, OwnerRule owner) {
  if (i >= end) return -1;
  if (owner.rule == 1) return (int)owner.fixed_rank;
  if (owner.rule == 2) return (int)(scramble_key((uint64)keys[i]) % (uint64)owner.world_size);
  return (int)((uint64)keys[i] % (uint64)owner.world_size);
}

extern "C" __global__ void owners_of_keys(const int64* keys, int64 n, int64 world_size,
                                          int64 rule, int64 fixed_rank, int64* owners) {
  const OwnerRule owner = {world_size, rule, fixed_rank};
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    owners[i] = owner_of(keys, i, n, owner);
  }
}

// tile_counts: [world_size * num_tiles], zeroed by the caller.
extern "C" __global__ void owner_tile_counts(const int64* keys, int64 n, int64 world_size,
                                             int64 rule, int64 fixed_rank, int64 keys_per_tile,
                                             int64 num_tiles, const int64* valid,
                                             int64* tile_counts) {
  const OwnerRule owner_rule = {world_size, rule, fixed_rank};
  if (valid != nullptr) n = min(n, *valid);
  const unsigned lane = lane_id();
  const int64 warp = global_thread_id() >> 5;
  const int64 warp_count = global_thread_count() >> 5;
  for (int64 tile = warp; tile < num_tiles; tile += warp_count) {
    const int64 begin = tile * keys_per_tile;
    const int64 end = min(begin + keys_per_tile, n);
    for (int64 chunk = begin; chunk < end; chunk += 32) {
      const int owner = owner_of(keys, chunk + lane, end, owner_rule);
      const unsigned peers = __match_any_sync(FULL_WARP, owner);
      if (owner >= 0 && lane == (unsigned)(__ffs(peers) - 1)) {
        tile_counts[owner * num_tiles + tile] += __popc(peers);
      }
      __syncwarp();
    }
  }
}

// offsets: the exclusive scan of tile_counts, [world_size * num_tiles + 1].
extern "C" __global__ void owner_counts_from_offsets(const int64* offsets, int64 world_size,
                                                     int64 num_tiles, int64* counts) {
  for (int64 owner = global_thread_id(); owner < world_size; owner += global_thread_count()) {
    counts[owner] = offsets[(owner + 1) * num_tiles] - offsets[owner * num_tiles];
  }
}

// Writes perm; advances offsets as it goes (they are used up).
extern "C" __global__ void owner_scatter(const int64* keys, int64 n, int64 world_size,
                                         int64 rule, int64 fixed_rank, int64 keys_per_tile,
                                         int64 num_tiles, const int64* valid, int64* offsets,
                                         int64* perm) {
  const OwnerRule owner_rule = {world_size, rule, fixed_rank};
  if (valid != nullptr) n = min(n, *valid);
  const unsigned lane = lane_id();
  const int64 warp = global_thread_id() >> 5;
  const int64 warp_count = global_thread_count() >> 5;
  for (int64 tile = warp; tile < num_tiles; tile += warp_count) {
    const int64 begin = tile * keys_per_tile;
    const int64 end = min(begin + keys_per_tile, n);
    for (int64 chunk = begin; chunk < end; chunk += 32) {
      const int64 i = chunk + lane;
      const int owner = owner_of(keys, i, end, owner_rule);
      const unsigned peers = __match_any_sync(FULL_WARP, owner);
      int64* run = owner >= 0 ? offsets + owner * num_tiles + tile : nullptr;
      if (owner >= 0) perm[*run + __popc(peers & lanes_below())] = i;
      __syncwarp();
      if (owner >= 0 && lane == (unsigned)(__ffs(peers) - 1)) *run += __popc(peers);
      __syncwarp();
    }
  }
}

extern "C" __global__ void floor_divide_int64(const int64* keys, int64 n, int64 divisor,
                                              int64* quotients) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 key = keys[i];
    int64 quotient = key / divisor;
    if (quotient * divisor != key && ((key < 0) != (divisor < 0))) quotient -= 1;
    quotients[i] = quotient;
  }
}

// Per-peer capacity slots (sok1x/engine/lookup/peer_capacity.py). For the tables t < tables, laid
// end to end (table t's bucketed positions are [starts[t], starts[t + 1]) of `slots`), with
// caps[t * world_size + o] slots for owner o, owner o's block after those of the owners below it:
// slots[starts[t] + j] = (the caps of t's owners below o) + i for the i-th key bucketed to owner
// o when i < its cap, else -1 (past the cap, or past the table's bucketed keys: counts[t, :] sum
// to at most its positions). Any counts[t, o] > caps[t, o] sets `bit` in *flag_out, which also
// takes *flag_in.
extern "C" __global__ void peer_slots(const int64* counts, const int64* caps,
                                      const int64* starts, int64 tables, int64 world_size,
                                      const int64* flag_in, int64 bit, int64* slots,
                                      unsigned long long* flag_out) {
  const int64 total = starts[tables];
  const int64 checks = tables * world_size;
  const int64 work = total > checks ? total : checks;
  for (int64 g = global_thread_id(); g < work; g += global_thread_count()) {
    if (g < checks && counts[g] > caps[g]) atomicOr(flag_out, (unsigned long long)bit);
    if (g == 0 && flag_in != nullptr) atomicOr(flag_out, (unsigned long long)*flag_in);
    if (g >= total) continue;
    const int64 t = part_of(starts, tables, g);
    const int64 j = g - starts[t];
    const int64* own = counts + t * world_size;
    const int64* cap = caps + t * world_size;
    int64 slot = -1, below = 0, base = 0;
    for (int64 o = 0; o < world_size; ++o) {
      if (j < below + own[o]) {
        const int64 i = j - below;
        if (i < cap[o]) slot = base + i;
        break;
      }
      below += own[o];
      base += cap[o];
    }
    slots[g] = slot;
  }
}
