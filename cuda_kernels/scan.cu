// Device-wide exclusive prefix sums of int64 values in one launch, used by bucket_by_owner,
// unique, export, the counting sorts and the bitmaps of distinct rows.
//
// sums[i] = values[0] + ... + values[i - 1] for i in 0..n, so sums[n] is the total. Each block
// takes the next tile of SCAN_TILE positions in the order blocks start (a ticket), scans it in
// shared memory, and learns the sum of all tiles before it by looking back at their published
// states (a single-pass scan with decoupled look-back, as Merrill and Garland's): a tile publishes
// its own total as soon as it has it, and its inclusive prefix once it knows it, so a tile waits
// only on tiles that started before it. One launch replaced three (a pass over the tiles, a scan of
// their totals, a pass adding them back), whose middle launch ran alone on a few blocks.
//
// The scratch (scan_scratch_words(tiles) int64, zeros before the launch; kernel_launch.py zeroes
// it or takes memory its caller zeroed anyway) holds the ticket, then per tile a flag and the two
// values it publishes: the flag is written after its value, behind a fence, and read before it,
// so a value is never read before it was written. Values and sums are any int64 (they wrap as
// int64 addition does).
#include "common.cuh"

#define SCAN_THREADS 256
#define SCAN_ITEMS 8
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

#define TILE_NONE 0
#define TILE_TOTAL 1   // the tile's own total is published
#define TILE_PREFIX 2  // its inclusive prefix (every tile up to it) is published

// Exclusive scan of one value per thread over the block; *block_total gets the sum of all.
__device__ int64 block_exclusive_scan(int64 value, int64* block_total) {
  __shared__ int64 warp_offsets[32];
  __shared__ int64 total;
  const unsigned lane = lane_id();
  const unsigned warp = threadIdx.x >> 5;
  int64 inclusive = value;
  for (unsigned offset = 1; offset < 32; offset <<= 1) {
    int64 below = __shfl_up_sync(FULL_WARP, inclusive, offset);
    if (lane >= offset) inclusive += below;
  }
  if (lane == 31) warp_offsets[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const unsigned warps = blockDim.x >> 5;
    int64 warp_sum = lane < warps ? warp_offsets[lane] : 0;
    int64 warp_inclusive = warp_sum;
    for (unsigned offset = 1; offset < 32; offset <<= 1) {
      int64 below = __shfl_up_sync(FULL_WARP, warp_inclusive, offset);
      if (lane >= offset) warp_inclusive += below;
    }
    if (lane < warps) warp_offsets[lane] = warp_inclusive - warp_sum;
    if (lane == 31) total = warp_inclusive;
  }
  __syncthreads();
  *block_total = total;
  return warp_offsets[warp] + inclusive - value;
}

// A tile's position j in shared memory: one spare slot every 16, so that the threads reading
// their SCAN_ITEMS neighbours (8 apart) fall in different banks.
__device__ __forceinline__ int padded(int j) { return j + (j >> 4); }

// The scratch's parts: [ticket | flags (tiles) | totals (tiles) | prefixes (tiles)].
struct TileStates {
  int64* flags;
  int64* totals;
  int64* prefixes;
  __device__ TileStates(int64* scratch, int64 tiles)
      : flags(scratch + 1), totals(scratch + 1 + tiles), prefixes(scratch + 1 + 2 * tiles) {}
  __device__ void publish(int64 tile, int flag, int64 value) const {
    volatile int64* to = flag == TILE_PREFIX ? prefixes : totals;
    to[tile] = value;
    __threadfence();
    reinterpret_cast<volatile int64*>(flags)[tile] = flag;
  }
};

// The sum of every tile before `tile`, by warp 0 of its block (all 32 lanes call it): 32 tiles'
// states at a time, nearest first; a window that holds a published prefix ends the walk there,
// else its 32 totals are added and the walk moves 32 tiles back. A lane spins only on a tile whose
// block has started (it took an earlier ticket), so every wait ends.
__device__ int64 sum_before(const TileStates& states, int64 tile) {
  const unsigned lane = lane_id();
  const volatile int64* flags = states.flags;
  int64 before = 0;
  for (int64 window = tile - 1; window >= 0; window -= 32) {
    const int64 at = window - (int64)lane;
    int64 flag = TILE_PREFIX;  // past tile 0: a prefix of zero
    if (at >= 0) {
      do {
        flag = flags[at];
      } while (flag == TILE_NONE);
    }
    __threadfence();  // the flag before the value it vouches for
    int64 value = 0;
    if (at >= 0) {
      value = flag == TILE_PREFIX ? reinterpret_cast<const volatile int64*>(states.prefixes)[at]
                                  : reinterpret_cast<const volatile int64*>(states.totals)[at];
    }
    const unsigned prefixed = __ballot_sync(FULL_WARP, flag == TILE_PREFIX);
    // lanes up to the nearest published prefix count (that lane's prefix covers all before it)
    const int stop = prefixed ? __ffs((int)prefixed) - 1 : 31;
    if ((int)lane > stop) value = 0;
    for (int offset = 16; offset > 0; offset >>= 1) {
      value += __shfl_down_sync(FULL_WARP, value, offset);
    }
    before += __shfl_sync(FULL_WARP, value, 0);
    if (prefixed) break;
  }
  return before;
}

// Launch with SCAN_THREADS threads and ceil((n + 1) / SCAN_TILE) blocks; scratch zeroed, of
// scan_scratch_words(tiles) int64 (it may be null for one block). WORD_BITS: values are int64
// (0), or the popcounts of 32-bit words read from `values` (32: a bitmap's ranks, with no array
// of counts between). The tile goes through shared memory both ways, so that global memory is
// read and written a warp's 32 neighbours at a time.
template <int WORD_BITS>
__device__ __forceinline__ void scan_tiles(const void* values, int64 n, int64* sums,
                                           int64* scratch) {
  __shared__ int64 tile_values[SCAN_TILE + SCAN_TILE / 16];
  __shared__ int64 tile_number;
  __shared__ int64 tile_before;
  const int64 tiles = gridDim.x;
  if (threadIdx.x == 0) {
    tile_number = scratch == nullptr ? (int64)blockIdx.x
                                     : (int64)atomicAdd(reinterpret_cast<uint64*>(scratch), 1ULL);
  }
  __syncthreads();
  const int64 tile = tile_number;
  const int64 base = tile * SCAN_TILE;
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    const int j = k * SCAN_THREADS + (int)threadIdx.x;
    int64 value = 0;
    if (base + j < n) {
      value = WORD_BITS == 32 ? (int64)__popc(static_cast<const unsigned*>(values)[base + j])
                              : static_cast<const int64*>(values)[base + j];
    }
    tile_values[padded(j)] = value;
  }
  __syncthreads();
  const int own = (int)threadIdx.x * SCAN_ITEMS;
  int64 before[SCAN_ITEMS];
  int64 thread_sum = 0;
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    before[k] = thread_sum;
    thread_sum += tile_values[padded(own + k)];
  }
  int64 tile_sum;
  const int64 thread_offset = block_exclusive_scan(thread_sum, &tile_sum);  // (its barriers)
  if (tiles > 1 && threadIdx.x < 32) {
    const TileStates states(scratch, tiles);
    int64 prior = 0;
    if (tile == 0) {
      if (threadIdx.x == 0) states.publish(0, TILE_PREFIX, tile_sum);
    } else {
      if (threadIdx.x == 0) states.publish(tile, TILE_TOTAL, tile_sum);
      prior = sum_before(states, tile);
      if (threadIdx.x == 0) states.publish(tile, TILE_PREFIX, prior + tile_sum);
    }
    if (threadIdx.x == 0) tile_before = prior;
  } else if (threadIdx.x == 0) {
    tile_before = 0;
  }
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) tile_values[padded(own + k)] = thread_offset + before[k];
  __syncthreads();
  const int64 offset = tile_before;
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    const int j = k * SCAN_THREADS + (int)threadIdx.x;
    if (base + j <= n) sums[base + j] = offset + tile_values[padded(j)];
  }
}

extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_int64(const int64* values, int64 n, int64* sums, int64* scratch) {
  scan_tiles<0>(values, n, sums, scratch);
}

// sums = the exclusive scan of the set bits of each 32-bit word of `words` [n].
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_word_popcounts(const unsigned* words, int64 n, int64* sums, int64* scratch) {
  scan_tiles<32>(words, n, sums, scratch);
}
