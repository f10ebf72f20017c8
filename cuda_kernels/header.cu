// The op header's records (sok1x/engine/lookup/exchange_header.py), written on the device so the
// per-owner counts and input-error flags that kernels produced never cross to the host before
// the header's one exchange. records: [size, width] int64; record j goes to rank j:
//   0..5  op, tower, call, place, error, tables   (error |= *flag when flag is given: bit 0 an
//         input error, bit 2 an overflow of a per-peer capacity, peer_capacity.py)
//   6...  counts[t * size + j] for t < tables, before shared_at (when it is not 0)
//   shared_at...  shared[0, shared_len): values this rank tells every rank alike
#include "common.cuh"

extern "C" __global__ void header_records(int64 op, int64 tower, int64 call, int64 place,
                                          int64 error, int64 tables, const int64* counts,
                                          const int64* flag, const int64* shared,
                                          int64 shared_at, int64 shared_len, int64 size,
                                          int64 width, int64* records) {
  const int64 total = size * width;
  const int64 failed = error | (flag != nullptr ? *flag : 0);
  for (int64 i = global_thread_id(); i < total; i += global_thread_count()) {
    const int64 peer = i / width;
    const int64 field = i - peer * width;
    int64 value = 0;
    if (field == 0) value = op;
    else if (field == 1) value = tower;
    else if (field == 2) value = call;
    else if (field == 3) value = place;
    else if (field == 4) value = failed;
    else if (field == 5) value = tables;
    else if (shared != nullptr && field >= shared_at && field - shared_at < shared_len)
      value = shared[field - shared_at];
    else if (counts != nullptr && field - 6 < tables && (shared_at == 0 || field < shared_at))
      value = counts[(field - 6) * size + peer];
    records[i] = value;
  }
}

// Sets *flag to 1 when a (min, max) row of `bounds` [count, 2] falls outside its row of
// `ranges` [count, 2] (lowest, highest allowed); an empty array's row (INT64_MAX, INT64_MIN)
// never does.
extern "C" __global__ void flag_outside(const int64* bounds, const int64* ranges, int64 count,
                                        int64* flag) {
  for (int64 i = global_thread_id(); i < count; i += global_thread_count()) {
    const int64 low = bounds[2 * i], high = bounds[2 * i + 1];
    if (low <= high && (low < ranges[2 * i] || high > ranges[2 * i + 1])) *flag = 1;
  }
}
