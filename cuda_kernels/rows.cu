// Row movement and row sums: take_rows / gather_rows, put_rows, scatter_add_rows / segment_sum,
// and widening int32 indices to int64.
//
// Row copies work on any dtype: a row is words_per_row words of 1, 4, 8 or 16 bytes (the caller
// picks the widest word that divides the row size and every base address). One thread moves one
// word. The table side (take's src, put's dst) is a SplitRows (common.cuh), split in words: a
// hybrid table's rows are read and written in place in whichever part holds them.
#include "common.cuh"

// order (may be null): the positions in the order to walk them (host_order.cu); thread w moves
// word `column` of position order[w / words_per_row].
__device__ __forceinline__ int64 ordered(const int64* order, int64 t) {
  return order != nullptr ? order[t] : t;
}

// index < 0: by zero_negative, counted from the end (0: NumPy's rule), a zero row (1), or no
// write at all (2: a place no one reads, an eviction's padded ones); with 1 or 2 an index past
// the end is taken as negative (gather_rows of keys checked later).
template <typename Word>
__device__ __forceinline__ void take_rows(SplitRows<Word> src, int64 src_rows, const int64* index,
                                          int64 n, int64 words_per_row, int zero_negative,
                                          Word* dst, const int64* order) {
  const int64 total = n * words_per_row;
  for (int64 w = global_thread_id(); w < total; w += global_thread_count()) {
    const int64 t = w / words_per_row;
    const int64 column = w - t * words_per_row;
    const int64 i = ordered(order, t);
    const int64 out = i * words_per_row + column;
    int64 row = index[i];
    if (zero_negative && (row < 0 || row >= src_rows)) {
      if (zero_negative == 2) continue;
      Word zero;
      memset(&zero, 0, sizeof(Word));
      dst[out] = zero;
      continue;
    }
    if (row < 0) row += src_rows;
    dst[out] = src[row * words_per_row + column];
  }
}

template <typename Word>
__device__ __forceinline__ void put_rows(SplitRows<Word> dst, int64 dst_rows, const int64* index, int64 n,
                                         int64 words_per_row, const Word* src,
                                         const int64* order) {
  const int64 total = n * words_per_row;
  for (int64 w = global_thread_id(); w < total; w += global_thread_count()) {
    const int64 t = w / words_per_row;
    const int64 column = w - t * words_per_row;
    const int64 i = ordered(order, t);
    int64 row = index[i];
    if (row < 0) row += dst_rows;
    dst[row * words_per_row + column] = src[i * words_per_row + column];
  }
}

// dst[dst_index[i]] = src[src_index[i]] for i < n where both indices are >= 0: a position with
// either index negative (a padded slot of a per-peer buffer, a key past the count) moves nothing.
template <typename Word>
__device__ __forceinline__ void move_rows(const Word* src, const int64* src_index, Word* dst,
                                          const int64* dst_index, int64 n, int64 words_per_row) {
  const int64 total = n * words_per_row;
  for (int64 w = global_thread_id(); w < total; w += global_thread_count()) {
    const int64 i = w / words_per_row;
    const int64 column = w - i * words_per_row;
    const int64 from = src_index[i], to = dst_index[i];
    if (from >= 0 && to >= 0) dst[to * words_per_row + column] = src[from * words_per_row + column];
  }
}

#define ROW_COPY_KERNELS(SUFFIX, WORD)                                                        \
  extern "C" __global__ void take_rows_##SUFFIX(SplitRows<WORD> src, int64 src_rows,          \
                                                const int64* index, int64 n,                  \
                                                int64 words_per_row, int zero_negative,       \
                                                WORD* dst, const int64* order) {              \
    take_rows<WORD>(src, src_rows, index, n, words_per_row, zero_negative, dst, order);       \
  }                                                                                           \
  extern "C" __global__ void put_rows_##SUFFIX(SplitRows<WORD> dst, int64 dst_rows,            \
                                               const int64* index,                             \
                                               int64 n, int64 words_per_row,                   \
                                               const WORD* src, const int64* order) {          \
    put_rows<WORD>(dst, dst_rows, index, n, words_per_row, src, order);                       \
  }                                                                                           \
  extern "C" __global__ void move_rows_##SUFFIX(const WORD* src, const int64* src_index,       \
                                                WORD* dst, const int64* dst_index, int64 n,   \
                                                int64 words_per_row) {                        \
    move_rows<WORD>(src, src_index, dst, dst_index, n, words_per_row);                        \
  }

// gather_rows of up to GATHER_MANY device arrays of one row size by the same index, in one
// launch (an eviction's victims: their vectors and every slot): tables[k] and outs[k] for k <
// count, rows of words_per_row 16-byte words. A thread moves one word of each array, its index
// read and its position divided once, the count loads in flight together. An index outside
// [0, src_rows): a zero row (zero_negative 1) or no write (2), as take_rows'.
#define GATHER_MANY 4
extern "C" __global__ void gather_rows_many_w16(const uint4* t0, const uint4* t1,
                                                const uint4* t2, const uint4* t3, uint4* o0,
                                                uint4* o1, uint4* o2, uint4* o3, int count,
                                                int64 src_rows, const int64* index, int64 n,
                                                int64 words_per_row, int zero_negative) {
  const uint4* tables[GATHER_MANY] = {t0, t1, t2, t3};
  uint4* outs[GATHER_MANY] = {o0, o1, o2, o3};
  const int64 total = n * words_per_row;
  for (int64 w = global_thread_id(); w < total; w += global_thread_count()) {
    const int64 i = w / words_per_row;
    const int64 column = w - i * words_per_row;
    const int64 row = index[i];
    if (row < 0 || row >= src_rows) {
      if (zero_negative == 2) continue;
#pragma unroll
      for (int k = 0; k < GATHER_MANY; ++k) {
        if (k < count) outs[k][w] = make_uint4(0, 0, 0, 0);
      }
      continue;
    }
    const int64 at = row * words_per_row + column;
    uint4 words[GATHER_MANY];
#pragma unroll
    for (int k = 0; k < GATHER_MANY; ++k) {
      if (k < count) words[k] = tables[k][at];
    }
#pragma unroll
    for (int k = 0; k < GATHER_MANY; ++k) {
      if (k < count) outs[k][w] = words[k];
    }
  }
}

ROW_COPY_KERNELS(w1, unsigned char)
ROW_COPY_KERNELS(w4, unsigned int)
ROW_COPY_KERNELS(w8, unsigned long long)
ROW_COPY_KERNELS(w16, uint4)

// table[rows[i]] += values[i] elementwise over `width` columns; repeated rows add up (atomicAdd,
// so the order of the additions is not fixed); a negative row adds nothing (a padded slot).
template <typename Real>
__device__ __forceinline__ void add_rows(Real* table, const int64* rows, int64 n, int64 width,
                                         const Real* values) {
  const int64 total = n * width;
  for (int64 e = global_thread_id(); e < total; e += global_thread_count()) {
    const int64 i = e / width;
    if (rows[i] >= 0) atomicAdd(table + rows[i] * width + (e - i * width), values[e]);
  }
}

extern "C" __global__ void add_rows_float32(float* table, const int64* rows, int64 n, int64 width,
                                            const float* values) {
  add_rows<float>(table, rows, n, width, values);
}

// add_rows four columns a thread, for float32 rows whose width is a multiple of 4 and whose table
// and values are 16-byte aligned: one 16-byte reduction where add_rows makes four
// (common.cuh's add_four), and a quarter of the index work.

extern "C" __global__ void add_rows_float32_x4(float* table, const int64* rows, int64 n,
                                               int64 width, const float* values) {
  const int64 quads = width / 4;
  const int64 total = n * quads;
  const float4* fours = reinterpret_cast<const float4*>(values);
  for (int64 q = global_thread_id(); q < total; q += global_thread_count()) {
    const int64 i = q / quads;
    const int64 row = rows[i];
    if (row >= 0) add_four(table + row * width + 4 * (q - i * quads), fours[q]);
  }
}

extern "C" __global__ void add_rows_float64(double* table, const int64* rows, int64 n,
                                            int64 width, const double* values) {
  add_rows<double>(table, rows, n, width, values);
}

extern "C" __global__ void widen_int32(const int* src, int64 n, int64* dst) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) dst[i] = src[i];
}

// Positions below 2^31 (a batch's indices into its distinct rows) as int32, for a seam that
// crosses the host: half the bytes of int64.
extern "C" __global__ void narrow_int64(const int64* src, int64 n, int* dst) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) dst[i] = (int)src[i];
}

// A replayed update predicated on its step's checks (engine/lookup/replayed_step.py): every row
// of rows[0, n) becomes -1, which an update and its stamp skip, where the step failed: its key
// checks' flag[0] is not 0, or some parts[t], t < count, is above 0 (a member's new keys left
// without a victim). Each thread decides it from the same few words, read after the step's
// forward and backward wrote them.
extern "C" __global__ void drop_rows_if_failed(int64* rows, int64 n, const int64* flag,
                                               const int64* parts, int64 count) {
  bool failed = flag[0] != 0;
  for (int64 t = 0; t < count && !failed; ++t) failed = parts[t] > 0;
  if (!failed) return;
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) rows[i] = -1;
}
