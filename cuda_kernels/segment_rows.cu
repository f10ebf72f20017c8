// segment_sum of float32 rows written once per segment, for many ids
// (backend/cuda/segment_rows.py). Where add_rows sums into zeroed rows with an atomic reduction
// per id (a fill of the whole output first, then each addend read back and written again), the
// ids here are sorted by segment (a counting sort) and each run of one segment summed in
// registers and stored once.
//
//   count_segments      counts[s] = how many ids are s (ids outside [0, segments) are skipped),
//                       unless the caller counted them
//   (scan.cu)           starts = exclusive scan of counts: segment s's positions in the order
//   place_by_segment    order[starts[s] ..] = the positions of s's ids (in no fixed order), and
//                       order_ids beside it their segment
//   zero_unsummed_rows  zeros in each segment's row that no chunk stores whole: an empty segment,
//                       or one whose positions cross a chunk's end (its chunks add to it); with
//                       `dirty` (a replayed backward's fixed sums, backend/kept_sums.py), an empty
//                       segment's row only where an earlier run may have stored a sum there
//   sum_segment_chunks  a group of lanes per chunk of CHUNK positions of the order: each run of one
//                       segment summed in registers, stored, or added (red.v4) where it crosses
//
// The additions' order within a segment is not fixed, as add_rows' is not. A hot segment is spread
// over as many chunks as it fills, so no group walks more than CHUNK rows.
#include "common.cuh"

#define CHUNK 32
#define LANES_PER_BLOCK 256
#define MIN_LANES 8  // lanes a chunk at least: the shared arrays leave a full SM's blocks room

// The counts' atomics are a warp's for each segment its lanes share (common.cuh's warp_count),
// as place_by_segment's are: the ids of a popular row's segment fall in many lanes of a warp.
// Launched with whole warps. (A bounded backward's counts come from table_groups.cu's
// emit_padded_inverse instead: backend/cuda/segment_rows.py.)
extern "C" __global__ void count_segments(const int64* ids, int64 n, int64 segments,
                                          int64* counts) {
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + (int64)lane_id();
    const int64 s = i < n ? ids[i] : -1;
    warp_count(counts, s, s >= 0 && s < segments);
  }
}

// counts come back down to zero: each id takes the place its decrement gives it, and its segment
// is written beside it (order_ids), so the sums read both in order, not each id through order.
// Launched with whole warps (warp_take_one).
extern "C" __global__ void place_by_segment(const int64* ids, int64 n, int64 segments,
                                            const int64* starts, int64* counts, int64* order,
                                            int64* order_ids) {
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + (int64)lane_id();
    const int64 s = i < n ? ids[i] : -1;
    const bool valid = s >= 0 && s < segments;
    const int64 left = warp_take_one(counts, s, valid);
    if (!valid) continue;
    const int64 at = starts[s] + left - 1;
    order[at] = i;
    order_ids[at] = s;
  }
}

// True when segment s's positions [first, end) lie in more than one chunk.
__device__ __forceinline__ bool crosses(int64 first, int64 end) {
  return first / CHUNK != (end - 1) / CHUNK;
}

// A thread a segment for the test (its bounds and mark read coalesced), then each warp zeros the
// rows its lanes found together, a row's float4s by its lanes: a warp a segment spent its time
// waiting on each padded place's bounds, not writing (2026-11-28, bench/NOTES.md).
// dirty (may be null): per row, -1 where it may hold a sum of an earlier run, 0 where it holds
// zeros; an empty segment's row is zeroed only where dirty is not 0, and dirty is kept (-1 for
// every row this run stores a sum in, 0 for the empty ones). Launched with whole warps.
extern "C" __global__ void zero_unsummed_rows(const int64* starts, int64 segments, int64 quads,
                                              float* out, signed char* dirty) {
  const int64 threads = global_thread_count();
  const int lane = (int)lane_id();
  const int64 warps_end = (segments + 31) & ~31LL;  // every lane of a warp loops as often
  float4* fours = reinterpret_cast<float4*>(out);
  for (int64 s = global_thread_id(); s < warps_end; s += threads) {
    bool zero = false;
    if (s < segments) {
      const int64 first = starts[s], end = starts[s + 1];
      const bool empty = first == end;
      if (dirty != nullptr) {
        zero = empty ? dirty[s] != 0 : crosses(first, end);
        dirty[s] = empty ? 0 : -1;
      } else {
        zero = empty || crosses(first, end);
      }
    }
    unsigned found = __ballot_sync(0xffffffffu, zero);
    const int64 base = s - lane;
    while (found != 0u) {
      const int k = __ffs(found) - 1;
      found &= found - 1u;
      float4* row = fours + (base + k) * quads;
      for (int64 c = lane; c < quads; c += 32) row[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

__device__ __forceinline__ void plus(float4& acc, const float4& v) {
  acc.x += v.x;
  acc.y += v.y;
  acc.z += v.z;
  acc.w += v.w;
}

// One run of segment s ends: store its sum, or add it where other chunks add to the row too.
__device__ __forceinline__ void flush(int64 s, bool shared_row, int64 quads, int64 column,
                                      const float4& acc, float4* out) {
  float4* to = out + s * quads + column;
  if (shared_row) {
    add_four(reinterpret_cast<float*>(to), acc);
  } else {
    *to = acc;
  }
}

// lanes: lanes a chunk (a power of two from MIN_LANES to 32, quads or more below 32); launched
// with exactly ceil(n / CHUNK) groups of `lanes` threads in blocks of LANES_PER_BLOCK (every lane
// reaches the warp barrier). n: an upper bound of the positions placed; starts[segments] is
// their number. A chunk's first run shares its row where the position before the chunk is of the
// same segment, its last run where the position after it is: that is where crosses() holds, so
// zero_unsummed_rows zeroed exactly those rows.
extern "C" __global__ void sum_segment_chunks(const int64* order, const int64* order_ids,
                                              const int64* starts, int64 segments, int64 n,
                                              int64 quads, int64 lanes, const float* values,
                                              float* out) {
  __shared__ int64 chunk_rows[LANES_PER_BLOCK / MIN_LANES][CHUNK];  // 16 KB with the other
  __shared__ int64 chunk_segments[LANES_PER_BLOCK / MIN_LANES][CHUNK];
  const int64 thread = (int64)blockIdx.x * blockDim.x + threadIdx.x;
  const int64 group = thread / lanes;
  const int lane = (int)(thread % lanes);
  const int slot = (int)(threadIdx.x / lanes);
  const int64 placed = starts[segments];
  const int64 base = group * CHUNK;
  const int64 count = base < placed ? min((int64)CHUNK, placed - base) : 0;
  for (int64 k = lane; k < count; k += lanes) {
    chunk_rows[slot][k] = order[base + k];
    chunk_segments[slot][k] = order_ids[base + k];
  }
  __syncwarp();
  if (count == 0) return;
  const int64 before = base > 0 ? order_ids[base - 1] : -1;
  const int64 after = base + count < placed ? order_ids[base + count] : -1;
  const float4* fours = reinterpret_cast<const float4*>(values);
  float4* sums = reinterpret_cast<float4*>(out);
  for (int64 column = lane; column < quads; column += lanes) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    int64 run = chunk_segments[slot][0];
    bool first = true;
    for (int64 k = 0; k < count; k += 4) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (k + u < count) v[u] = __ldg(fours + chunk_rows[slot][k + u] * quads + column);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (k + u >= count) break;
        const int64 s = chunk_segments[slot][k + u];
        if (s != run) {
          flush(run, first && run == before, quads, column, acc, sums);
          acc = make_float4(0.f, 0.f, 0.f, 0.f);
          run = s;
          first = false;
        }
        plus(acc, v[u]);
      }
    }
    flush(run, (first && run == before) || run == after, quads, column, acc, sums);
  }
}
