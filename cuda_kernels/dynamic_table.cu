// Access statistics of a growing, evicting table's rows (engine/dynamic_table.py): for each row
// >= 0 of a lookup, last_step[row] = step and counts[row] += 1 (a repeated row counts each time).
#include "common.cuh"

extern "C" __global__ void touch_rows(int64* last_step, int64* counts, const int64* rows, int64 n,
                                      int64 step) {
  for (int64 i = global_thread_id(); i < n; i += global_thread_count()) {
    touch_row(last_step, counts, rows[i], step);
  }
}
