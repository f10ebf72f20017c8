// What a group of tables needs to be looked up in one pass (as FBGEMM's table-batched embedding):
// many small arrays made one in one launch, and the distinct rows of a bounded index in
// ascending order, counted per table.
//
// A "part list" describes `count` arrays in one int64 device array, built once per set of
// arrays: parts[0 .. count) their device addresses, parts[count .. 2 count] their start positions
// in the joined array (the last one is the total), parts[2 count + 1 .. 3 count + 1) a value
// added to every element of part t (the table's key or row offset in the group's id space).
//
// Distinct rows of [0, bound): a bitmap of `bound` bits marks the rows present, its words'
// popcounts scanned (one pass, scan.cu) give each word's first rank, and a row's rank (its place
// among the distinct rows, ascending) is its word's rank plus the marked bits below it. Ascending
// means table-major when rows are offset by table, so the number of distinct rows of table t is
// the rank at its end minus the rank at its start: read with the total, in the same single wait.
#include "common.cuh"

// out[i] = part_t[i - starts[t]] + offsets[t] for the int64 parts (a negative element, a padded
// row -1 or a key its checks reject, stays as it is).
extern "C" __global__ void join_int64_parts(const int64* parts, int64 count, int64* out) {
  const int64* starts = parts + count;
  const int64* offsets = parts + 2 * count + 1;
  const int64 total = starts[count];
  for (int64 i = global_thread_id(); i < total; i += global_thread_count()) {
    const int64 t = part_of(starts, count, i);
    const int64* source = (const int64*)parts[t];
    const int64 value = source[i - starts[t]];
    out[i] = value < 0 ? value : value + offsets[t];  // a padded row -1 stays -1
  }
}

// Each part t of a list cut at starts [count + 1] (its length n_t) after its first k rows were
// handed out and k rows came back, k = counts[t] clamped to [0, n_t]: out = part t of `before`
// from row k on, then the first k rows of part t of `back` (cut at back_starts): a free list of
// fixed length, rotated on the device by a count the host does not read.
extern "C" __global__ void rotate_parts(const int64* before, const int64* starts, int64 count,
                                        const int64* back, const int64* back_starts,
                                        const int64* counts, int64* out) {
  const int64 total = starts[count];
  for (int64 i = global_thread_id(); i < total; i += global_thread_count()) {
    const int64 t = part_of(starts, count, i);
    const int64 length = starts[t + 1] - starts[t], k = i - starts[t];
    int64 taken = counts[t];
    taken = taken < 0 ? 0 : (taken > length ? length : taken);
    out[i] = k < length - taken ? before[i + taken]
                                : back[back_starts[t] + k - (length - taken)];
  }
}

// out[i] = first + i: rows [first, first + n) as a list, written on the device.
extern "C" __global__ void row_sequence(int64 first, int64 n, int64* out) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    out[i] = first + i;
  }
}

// tags[i] = the part holding position i (starts: [count + 1], the last one the total): a hash
// group's member of each of its keys.
extern "C" __global__ void part_tags(const int64* starts, int64 count, int64* tags) {
  const int64 total = starts[count];
  for (int64 i = global_thread_id(); i < total; i += global_thread_count()) {
    tags[i] = part_of(starts, count, i);
  }
}

// Rows of `width` words of type Word: out row i = row (i - starts[t]) of part t (offsets unused).
// 2^lane_shift threads copy a row, each every 2^lane_shift-th word, its part found once a row:
// a thread a word found its row by a 64-bit division and its part by a search, per word (one
// H200, 2026-12-01: 403 us for 26 x 16,384 rows of 128 floats, about a third of the copy rate).
template <typename Word>
__device__ __forceinline__ void join_rows_of(const int64* parts, int64 count, int64 width,
                                             Word* out, int lane_shift) {
  const int64* starts = parts + count;
  const int64 rows = starts[count];
  const int64 lanes = 1LL << lane_shift;
  const int64 lane = global_thread_id() & (lanes - 1);
  const int64 stride = global_thread_count() >> lane_shift;
  for (int64 i = global_thread_id() >> lane_shift; i < rows; i += stride) {
    const int64 t = part_of(starts, count, i);
    const Word* source = (const Word*)parts[t] + (i - starts[t]) * width;
    Word* target = out + i * width;
    for (int64 w = lane; w < width; w += lanes) target[w] = source[w];
  }
}

// Rows of `width` 4-byte words joined (join_rows_of); vector 4: every part and out 16-byte
// aligned and width a multiple of 4, copied 16 bytes a load.
extern "C" __global__ void join_word_rows(const int64* parts, int64 count, int64 width,
                                          unsigned* out, int lane_shift, int vector) {
  if (vector == 4) {
    join_rows_of<uint4>(parts, count, width / 4, reinterpret_cast<uint4*>(out), lane_shift);
  } else {
    join_rows_of<unsigned>(parts, count, width, out, lane_shift);
  }
}

// bits: [ceil(bound / 32)] zeroed by the caller; rows in [0, bound), or negative: a padded slot
// of a per-peer buffer, which is no row (its inverse is -1).
extern "C" __global__ void mark_rows(const int64* rows, int64 n, unsigned* bits) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 row = rows[i];
    if (row < 0) continue;
    atomicOr(bits + (row >> 5), 1u << (row & 31));
  }
}

// word_ranks: the exclusive scan of the words' popcounts, [words + 1] (scan.cu's
// scan_word_popcounts, which counts the bits as it reads them).
__device__ __forceinline__ int64 rank_of(const unsigned* bits, const int64* word_ranks,
                                         int64 words, int64 row) {
  const int64 word = row >> 5;
  if (word >= words) return word_ranks[words];
  return word_ranks[word] + __popc(bits[word] & ((1u << (row & 31)) - 1u));
}

// inverse[i] = rank of rows[i], -1 for a negative row.
extern "C" __global__ void emit_inverse(const int64* rows, int64 n, const unsigned* bits,
                                        const int64* word_ranks, int64 words, int64* inverse) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 row = rows[i];
    inverse[i] = row < 0 ? -1 : rank_of(bits, word_ranks, words, row);
  }
}

// The distinct rows, and their padded places below, are written from the bitmap, each marked row
// once, where writing them per key wrote a row once for every key that holds it, 8 bytes
// scattered each time. A warp reads 32 words, one a lane. A word with few marked rows (a sparse
// bitmap, a large table's) is walked by its own lane, the 32 side by side; the warp takes each
// other word in turn, lane b its bit b, so a dense word's rows go to consecutive places in one
// store.
#define FEW_MARKED 4
template <class Emit>
__device__ __forceinline__ void for_each_marked_row(const unsigned* bits, int64 words,
                                                    const Emit& emit) {
  const unsigned lane = lane_id();
  for (int64 first = first_of_warp(); first < words; first += global_thread_count()) {
    const unsigned own = first + lane < words ? bits[first + lane] : 0u;
    const bool few = __popc(own) <= FEW_MARKED;
    for (unsigned marked = few ? own : 0u; marked; marked &= marked - 1u) {
      emit(((first + lane) << 5) + __ffs(marked) - 1);
    }
    for (unsigned dense = __ballot_sync(FULL_WARP, !few); dense; dense &= dense - 1u) {
      const int j = __ffs(dense) - 1;
      if (__shfl_sync(FULL_WARP, own, j) >> lane & 1u) emit(((first + j) << 5) + lane);
    }
  }
}

// distinct[rank] = row for every marked row.
extern "C" __global__ void emit_distinct_rows(const unsigned* bits, const int64* word_ranks,
                                              int64 words, int64* distinct) {
  for_each_marked_row(bits, words, [&](int64 row) {
    distinct[rank_of(bits, word_ranks, words, row)] = row;
  });
}

// mark_rows for rows that may lie anywhere (a step whose key checks are read later): a row
// outside [0, bound) marks nothing.
extern "C" __global__ void mark_rows_below(const int64* rows, int64 n, int64 bound,
                                           unsigned* bits) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 row = rows[i];
    if (row < 0 || row >= bound) continue;
    atomicOr(bits + (row >> 5), 1u << (row & 31));
  }
}

// The distinct rows laid out in pieces sized before the step (engine/lookup/bounded_step.py):
// the rows of range t ([row_starts[t], row_starts[t + 1])) fill piece t, from piece_starts[t]
// on, ascending; first_ranks[t] is the rank of row_starts[t]. A row's place is
// piece_starts[t] + its rank - first_ranks[t]; one past its piece's end (only input the step
// rejects can do that) has none.
__device__ __forceinline__ int64 padded_place(const int64* row_starts, const int64* piece_starts,
                                              int64 count, const int64* first_ranks, int64 row,
                                              int64 rank, int64* t) {
  *t = part_of(row_starts, count, row);
  const int64 place = piece_starts[*t] + rank - first_ranks[*t];
  return place < piece_starts[*t + 1] ? place : -1;
}

// inverse[i] = the place of rows[i], -1 for a row outside [0, bound) or with no place; where
// counts is given (zeros), counts[p] = how many rows have place p (segment_rows.cu's
// count_segments of the inverse, counted here where each place is found: one pass, not two;
// a warp's atomic for each place its lanes share). Launched with whole warps.
extern "C" __global__ void emit_padded_inverse(const int64* rows, int64 n, int64 bound,
                                               const unsigned* bits, const int64* word_ranks,
                                               int64 words, const int64* row_starts,
                                               const int64* piece_starts, int64 count,
                                               const int64* first_ranks, int64* inverse,
                                               int64* counts) {
  for (int64 first = first_of_warp(); first < n; first += global_thread_count()) {
    const int64 i = first + (int64)lane_id();
    const int64 row = i < n ? rows[i] : -1;
    int64 t;
    const int64 place = row < 0 || row >= bound || row >= row_starts[count]
                            ? -1
                            : padded_place(row_starts, piece_starts, count, first_ranks, row,
                                           rank_of(bits, word_ranks, words, row), &t);
    if (i < n) inverse[i] = place;
    if (counts != nullptr) warp_count(counts, place, place >= 0);
  }
}

// flat[p] = the row placed at p, local[p] = the row less row_starts[t], for every marked row
// with a place (from the bitmap, its words walked as for_each_marked_row walks them); places no
// row fills keep what the caller put there (-1). The members' bounds are read from shared memory
// (up to SHARED_PARTS members) and each word's rank once, by its lane: a full group's bitmap is
// dense, few warps walk it a word at a time, and each row's binary search and rank read from
// global memory, one after the other, were what it waited on (21.9 us of dlrm26_full's step on
// one H200 against 8.8 for dlrm's one table, 2026-11-28).
#define SHARED_PARTS 256
extern "C" __global__ void emit_padded_rows(const unsigned* bits, const int64* word_ranks,
                                            int64 words, const int64* row_starts,
                                            const int64* piece_starts, int64 count,
                                            const int64* first_ranks, int64* flat,
                                            int64* local) {
  __shared__ int64 bounds[3 * SHARED_PARTS + 2];
  if (count <= SHARED_PARTS) {  // the same for the whole block: every thread meets the barrier
    for (int64 i = threadIdx.x; i <= count; i += blockDim.x) {
      bounds[i] = row_starts[i];
      bounds[SHARED_PARTS + 1 + i] = piece_starts[i];
      if (i < count) bounds[2 * SHARED_PARTS + 2 + i] = first_ranks[i];
    }
    __syncthreads();
    row_starts = bounds;
    piece_starts = bounds + SHARED_PARTS + 1;
    first_ranks = bounds + 2 * SHARED_PARTS + 2;
  }
  const int64 end = row_starts[count];
  const auto emit = [&](int64 row, int64 rank) {
    if (row >= end) return;
    int64 t;
    const int64 place = padded_place(row_starts, piece_starts, count, first_ranks, row, rank, &t);
    if (place >= 0) {
      flat[place] = row;
      local[place] = row - row_starts[t];
    }
  };
  const unsigned lane = lane_id();
  for (int64 first = first_of_warp(); first < words; first += global_thread_count()) {
    const bool mine = first + lane < words;
    const unsigned own = mine ? bits[first + lane] : 0u;
    const int64 own_rank = mine ? word_ranks[first + lane] : 0;
    const bool few = __popc(own) <= FEW_MARKED;
    for (unsigned marked = few ? own : 0u; marked; marked &= marked - 1u) {
      const int bit = __ffs(marked) - 1;
      emit(((first + lane) << 5) + bit, own_rank + __popc(own & ((1u << bit) - 1u)));
    }
    for (unsigned dense = __ballot_sync(FULL_WARP, !few); dense; dense &= dense - 1u) {
      const int j = __ffs(dense) - 1;
      const unsigned word = __shfl_sync(FULL_WARP, own, j);
      const int64 base = __shfl_sync(FULL_WARP, own_rank, j);
      if (word >> lane & 1u) {
        emit(((first + j) << 5) + lane, base + __popc(word & ((1u << lane) - 1u)));
      }
    }
  }
}

// ranks[j] = how many distinct rows lie below bounds[j] (j < count); bounds ascending.
extern "C" __global__ void ranks_at(const unsigned* bits, const int64* word_ranks, int64 words,
                                    const int64* bounds, int64 count, int64* ranks) {
  for (int64 j = global_thread_id(); j < count; j += global_thread_count()) {
    ranks[j] = rank_of(bits, word_ranks, words, bounds[j]);
  }
}

// For distinct rows ascending (rows[i] is the i-th): local[i + moves[t]] = rows[i] - row_starts[t]
// for the table t whose range [row_starts[t], row_starts[t+1]) holds rows[i] (row_starts:
// [count + 1], ascending; moves[t]: where table t's piece starts in `local` less where its rows
// start in `rows`, so that every piece can start at an aligned place).
extern "C" __global__ void local_rows(const int64* rows, int64 n, const int64* row_starts,
                                      int64 count, const int64* moves, int64* local) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 t = part_of(row_starts, count, rows[i]);
    local[i + moves[t]] = rows[i] - row_starts[t];
  }
}

// bounds[2 t], bounds[2 t + 1] = min, max of int64 part t; set to (INT64_MAX, INT64_MIN) first.
// blocks_per_part blocks share each part (block b: part b / blocks_per_part, every
// blocks_per_part-th slice of it from b % blocks_per_part), each reducing its slice in
// registers, then over its warps, then over the block through shared memory, and making two
// atomics: a few per part, where a block walking every part in turn (26 tables of a keyed lookup)
// or an atomic per warp made the kernel wait on them.
#define BOUNDS_WARPS 32  // warps of the largest block
extern "C" __global__ void part_bounds(const int64* parts, int64 count, int64 blocks_per_part,
                                       int64* bounds) {
  __shared__ int64 warp_low[BOUNDS_WARPS], warp_high[BOUNDS_WARPS];
  const int64 t = blockIdx.x / blocks_per_part;
  if (t >= count) return;  // the whole block leaves: no barrier is left waiting
  const int64* starts = parts + count;
  const int64* values = (const int64*)parts[t];
  const int64 n = starts[t + 1] - starts[t];
  const int64 stride = blocks_per_part * blockDim.x;
  int64 low = 0x7fffffffffffffffLL, high = (-0x7fffffffffffffffLL - 1);
  for (int64 i = (blockIdx.x % blocks_per_part) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64 v = values[i];
    low = v < low ? v : low;
    high = v > high ? v : high;
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const int64 other_low = __shfl_down_sync(FULL_WARP, low, offset);
    const int64 other_high = __shfl_down_sync(FULL_WARP, high, offset);
    low = other_low < low ? other_low : low;
    high = other_high > high ? other_high : high;
  }
  const int warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  if (lane_id() == 0) {
    warp_low[warp] = low;
    warp_high[warp] = high;
  }
  __syncthreads();
  if (threadIdx.x == 0 && n > 0) {
    for (int w = 1; w < warps; ++w) {
      low = warp_low[w] < low ? warp_low[w] : low;
      high = warp_high[w] > high ? warp_high[w] : high;
    }
    atomicMin(bounds + 2 * t, low);
    atomicMax(bounds + 2 * t + 1, high);
  }
}
