// Device-wide exclusive prefix sums of int64 values, used by bucket_by_owner, unique and export.
//
// sums[i] = values[0] + ... + values[i - 1] for i in 0..n, so sums[n] is the total. Each block
// scans one tile of SCAN_TILE positions and writes its tile's total; the caller scans the tile
// totals the same way (recursively) and adds them back with scan_add_tile_offsets_int64.
#include "common.cuh"

#define SCAN_THREADS 256
#define SCAN_ITEMS 8
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

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

// Launch with SCAN_THREADS threads and ceil((n + 1) / SCAN_TILE) blocks. tile_totals may be null
// when there is one block. The tile goes through shared memory both ways, so that global memory
// is read and written a warp's 32 neighbours at a time: each thread reading its SCAN_ITEMS
// neighbours itself made the first pass over dlrm's 852,000 bitmap words take 14.3 us on one
// H200 (0.48 TB/s, 2026-11-28).
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_tiles_int64(const int64* values, int64 n, int64* sums, int64* tile_totals) {
  __shared__ int64 tile[SCAN_TILE + SCAN_TILE / 16];
  const int64 base = (int64)blockIdx.x * SCAN_TILE;
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    const int j = k * SCAN_THREADS + (int)threadIdx.x;
    tile[padded(j)] = base + j < n ? values[base + j] : 0;
  }
  __syncthreads();
  const int own = (int)threadIdx.x * SCAN_ITEMS;
  int64 before[SCAN_ITEMS];
  int64 thread_sum = 0;
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    before[k] = thread_sum;
    thread_sum += tile[padded(own + k)];
  }
  int64 tile_sum;
  const int64 thread_offset = block_exclusive_scan(thread_sum, &tile_sum);  // (its barriers)
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) tile[padded(own + k)] = thread_offset + before[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    const int j = k * SCAN_THREADS + (int)threadIdx.x;
    if (base + j <= n) sums[base + j] = tile[padded(j)];
  }
  if (threadIdx.x == 0 && tile_totals != nullptr) tile_totals[blockIdx.x] = tile_sum;
}

// sums[i] += tile_offsets[i / SCAN_TILE] for i < count.
extern "C" __global__ void scan_add_tile_offsets_int64(int64* sums, int64 count,
                                                       const int64* tile_offsets) {
  for (int64 i = global_thread_id(); i < count; i += global_thread_count()) {
    sums[i] += tile_offsets[i / SCAN_TILE];
  }
}
