// What a pooled lookup needs besides row moves and row sums (the bounds of index arrays are in
// table_groups.cu): one column of an index matrix, ids per segment, and rows
// scaled by a factor each (weights, and the mean's division).
#include "common.cuh"

extern "C" __global__ void column_int64(const int64* matrix, int64 n, int64 columns, int64 index,
                                        int64* out) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    out[i] = matrix[i * columns + index];
  }
}

// counts: [segments] zeroed by the caller.
extern "C" __global__ void segment_counts_float32(const int64* segment_ids, int64 n,
                                                  float* counts) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    atomicAdd(counts + segment_ids[i], 1.0f);
  }
}

// out[i, :] = values[i, :] * factors[i], or / factors[i] with 0 where factors[i] == 0.
extern "C" __global__ void scale_rows_float32(const float* values, const float* factors, int64 n,
                                              int64 width, int divide, float* out) {
  const int64 total = n * width;
  for (int64 e = global_thread_id(); e < total; e += global_thread_count()) {
    const float factor = factors[e / width];
    if (divide) {
      out[e] = factor == 0.0f ? 0.0f : values[e] / factor;
    } else {
      out[e] = values[e] * factor;
    }
  }
}

// dst[rows[i]] = value (*value_at where given: a replayed stamp's time, written before each
// replay) for every i < n, or i < min(n, *count) when count is given (a float64 per row, e.g.
// the time a row was last updated); a negative row is skipped.
extern "C" __global__ void fill_rows_float64(double* dst, const int64* rows, int64 n,
                                             const uint64* count, double value,
                                             const double* value_at) {
  if (count != nullptr && (int64)*count < n) n = (int64)*count;
  if (value_at != nullptr) value = *value_at;
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    const int64 row = rows[i];
    if (row >= 0) dst[row] = value;
  }
}
