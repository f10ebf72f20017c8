// host_order: the positions of a batch of rows of a split table (common.cuh's SplitRows), grouped
// by where their rows lie: device rows first, then host rows region by region, in ascending
// address order. The row kernels walk a batch in this order (their `order` argument), so the host
// rows a kernel has in flight at any time lie close together.
//
// Why: the GPU reads mapped host memory through address translations it caches. Rows read at
// random from gigabytes of host memory miss those caches on nearly every access and cross PCIe at
// a third of the rate of the same rows read in ascending order (bench/NOTES.md, issue 21: 13.6
// against 44 GiB/s from a 2 GiB host part on one H100). Inside a region the order is free: rows of
// a batch are distinct wherever order matters (a put, an update), and a gather writes each
// position's own output row, so the results do not depend on it.
//
// A counting sort by region with one atomic per group of a warp's lanes that share a region
// (common.cuh's warp_count and warp_claim), as routing.cu's owner buckets:
//   1. host_region_counts:  counts[region] = positions whose row lies in that region;
//   2. an exclusive scan of counts gives each region's first position in the order;
//   3. host_region_scatter: order[...] = position, advancing the scan's offsets (used up).
// Region 0 holds the device rows and every position that names no host row: a negative row when
// negatives are no row (a gather's zero row), a row out of range, and positions at or past
// *count (a find_or_insert's rows past the keys it placed, which the kernels skip).
#include "common.cuh"

// split, pieces: the table's SplitRows fields in rows (common.cuh; pieces null but for a table
// group's rows split per member).
__device__ __forceinline__ int region_of(const int64* rows, int64 i, int64 n, int64 valid,
                                         int64 table_rows, int64 split, const int64* pieces,
                                         int64 shift, int zero_negative) {
  if (i >= n) return -1;  // a lane past the end of the batch
  if (i >= valid) return 0;
  int64 row = rows[i];
  if (row < 0) {
    if (zero_negative) return 0;
    row += table_rows;  // NumPy's rule, as take_rows and put_rows apply it
  }
  if (row >= table_rows) return 0;
  const SplitRows<const char> table = {nullptr, nullptr, split, pieces};
  const int64 host = table.host_place(row);
  return host < 0 ? 0 : 1 + (int)(host >> shift);
}

// counts: [regions], zeroed by the caller; count (may be null): a device count of the leading
// positions that name rows.
extern "C" __global__ void host_region_counts(const int64* rows, int64 n, const uint64* count,
                                              int64 table_rows, int64 split,
                                              const int64* pieces, int64 shift,
                                              int zero_negative, int64* counts) {
  const int64 valid = count != nullptr && (int64)*count < n ? (int64)*count : n;
  const unsigned lane = lane_id();
  for (int64 base = first_of_warp(); base < n; base += global_thread_count()) {
    const int region = region_of(rows, base + lane, n, valid, table_rows, split, pieces, shift,
                                 zero_negative);
    warp_count(counts, region, region >= 0);
  }
}

// offsets: the exclusive scan of counts (advanced here); order: [n].
extern "C" __global__ void host_region_scatter(const int64* rows, int64 n, const uint64* count,
                                               int64 table_rows, int64 split,
                                               const int64* pieces, int64 shift,
                                               int zero_negative, int64* offsets,
                                               int64* order) {
  const int64 valid = count != nullptr && (int64)*count < n ? (int64)*count : n;
  const unsigned lane = lane_id();
  for (int64 base = first_of_warp(); base < n; base += global_thread_count()) {
    const int64 i = base + lane;
    const int region = region_of(rows, i, n, valid, table_rows, split, pieces, shift,
                                 zero_negative);
    const int64 at = warp_claim(offsets, region, region >= 0, 1);
    if (region >= 0) order[at] = i;
  }
}
