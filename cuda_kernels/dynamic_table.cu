// Access statistics of a growing, evicting table's rows (engine/dynamic_table.py): for each row
// >= 0 of a lookup, its 16-byte record statistics[row] = (step, count + 1) (touch_row; a repeated
// row counts each time).
#include "common.cuh"

extern "C" __global__ void touch_rows(int64* statistics, const int64* rows, int64 n, int64 step) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    touch_row(statistics, rows[i], step);
  }
}
