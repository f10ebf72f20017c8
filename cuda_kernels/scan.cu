// Device-wide exclusive prefix sums of int64 values in one launch, used by bucket_by_owner,
// unique, export, the counting sorts and the bitmaps of distinct rows.
//
// sums[i] = values[0] + ... + values[i - 1] for i in 0..n, so sums[n] is the total. Each block
// takes the next tile of SCAN_TILE positions in the order blocks start (a ticket), scans it in
// shared memory, and learns the sum of all tiles before it by looking back at their published
// states (a single-pass scan with decoupled look-back, as Merrill and Garland's): a tile publishes
// its own total as soon as it has it, and its inclusive prefix once it knows it, so a tile waits
// only on tiles that started before it. The whole block looks back, SCAN_THREADS tiles at a time:
// when every tile starts at once (dlrm's 417), a warp's 32 at a time walked 13 windows one after
// the other for the last tile (13.1 us for the scan, 2026-11-28). One launch replaced three (a
// pass over the tiles, a scan of their totals, a pass adding them back).
//
// The scratch (scan_scratch_words(n) int64, zeros before the launch; kernel_launch.py zeroes it
// or takes memory its caller zeroed anyway) holds the ticket, then a state word per tile: its
// flag in the top two bits and a value in the other 62, written and read as one word, so a value
// is never seen without its flag. Partial sums must lie in [-2^61, 2^61) (the counts scanned
// here are far below).
#include "common.cuh"

#define SCAN_THREADS 256
#define SCAN_ITEMS 8
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

#define TILE_TOTAL 1ULL   // the tile's own total is published
#define TILE_PREFIX 2ULL  // its inclusive prefix (every tile up to it) is published
#define STATE_VALUE_BITS 62

__device__ __forceinline__ uint64 tile_state(uint64 flag, int64 value) {
  return (flag << STATE_VALUE_BITS) | ((uint64)value & ((1ULL << STATE_VALUE_BITS) - 1));
}

__device__ __forceinline__ int64 state_value(uint64 state) {
  return (int64)(state << 2) >> 2;  // the 62 bits, sign-extended
}

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

// The sum of every tile before `tile`, by the whole block (every thread calls it): the states
// of SCAN_THREADS tiles at a time, nearest first; a window holding a published prefix ends the
// walk at the nearest one, else its totals are added and the walk moves a window back. A thread
// spins only on a tile whose block has started (it took an earlier ticket) and publishes its
// total before it looks back itself, so every wait ends.
__device__ int64 sum_before(const uint64* states, int64 tile) {
  __shared__ int nearest;
  __shared__ int64 warp_sums[SCAN_THREADS / 32];
  __shared__ int64 window_sum;
  const unsigned lane = lane_id();
  const unsigned warp = threadIdx.x >> 5;
  int64 before = 0;
  for (int64 window = tile - 1; window >= 0; window -= SCAN_THREADS) {
    const int64 at = window - (int64)threadIdx.x;
    uint64 state = tile_state(TILE_PREFIX, 0);  // before tile 0: a prefix of zero
    if (at >= 0) {
      do {
        state = reinterpret_cast<const volatile uint64*>(states)[at];
      } while (state == 0);
    }
    if (threadIdx.x == 0) nearest = SCAN_THREADS;
    __syncthreads();
    if ((state >> STATE_VALUE_BITS) == TILE_PREFIX) atomicMin(&nearest, (int)threadIdx.x);
    __syncthreads();
    int64 value = (int)threadIdx.x <= nearest ? state_value(state) : 0;
    for (int offset = 16; offset > 0; offset >>= 1) {
      value += __shfl_down_sync(FULL_WARP, value, offset);
    }
    if (lane == 0) warp_sums[warp] = value;
    __syncthreads();
    if (threadIdx.x == 0) {
      int64 sum = 0;
      for (int w = 0; w < SCAN_THREADS / 32; ++w) sum += warp_sums[w];
      window_sum = sum;
    }
    __syncthreads();
    before += window_sum;
    if (nearest < SCAN_THREADS) break;  // the same in every thread
    __syncthreads();  // nearest and the sums are written again
  }
  return before;
}

// Launch with SCAN_THREADS threads and ceil((n + 1) / SCAN_TILE) blocks; scratch zeroed, of
// scan_scratch_words(n) int64 (it may be null for one block). WORD_BITS: values are int64
// (0), or the popcounts of 32-bit words read from `values` (32: a bitmap's ranks, with no array
// of counts between). The tile goes through shared memory both ways, so that global memory is
// read and written a warp's 32 neighbours at a time.
template <int WORD_BITS>
__device__ __forceinline__ void scan_tiles(const void* values, int64 n, int64* sums,
                                           int64* scratch) {
  __shared__ int64 tile_values[SCAN_TILE + SCAN_TILE / 16];
  __shared__ int64 tile_number;
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
  int64 offset = 0;
  if (tiles > 1) {
    uint64* states = reinterpret_cast<uint64*>(scratch) + 1;
    if (tile == 0) {
      if (threadIdx.x == 0) {
        reinterpret_cast<volatile uint64*>(states)[0] = tile_state(TILE_PREFIX, tile_sum);
      }
    } else {
      if (threadIdx.x == 0) {
        reinterpret_cast<volatile uint64*>(states)[tile] = tile_state(TILE_TOTAL, tile_sum);
      }
      offset = sum_before(states, tile);
      if (threadIdx.x == 0) {
        reinterpret_cast<volatile uint64*>(states)[tile] = tile_state(TILE_PREFIX,
                                                                      offset + tile_sum);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) tile_values[padded(own + k)] = thread_offset + before[k];
  __syncthreads();
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
