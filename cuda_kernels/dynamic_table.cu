// Access statistics of a growing, evicting table's rows (engine/tables/dynamic_table.py): for each row
// >= 0 of a lookup, its 16-byte record statistics[row] = (step, count + 1) (touch_row; a repeated
// row counts each time). With `times` given, the same launch stamps the lookup's new rows as
// pooling.cu's fill_rows_float64 does: times[new_rows[i]] = now for every i < new_n, or
// i < min(new_n, *count) when count is given, a negative row skipped.
#include "common.cuh"

extern "C" __global__ void touch_rows(int64* statistics, const int64* rows, int64 n, int64 step,
                                      double* times, const int64* new_rows, int64 new_n,
                                      const uint64* count, double now) {
  if (times == nullptr) new_n = 0;
  if (count != nullptr && (int64)*count < new_n) new_n = (int64)*count;
  const int64 end = n > new_n ? n : new_n;
  for (int64 i = global_thread_id(); i < end; i += global_thread_count()) {
    if (i < n) touch_row(statistics, rows[i], step);
    if (i < new_n) {
      const int64 row = new_rows[i];
      if (row >= 0) times[row] = now;
    }
  }
}
