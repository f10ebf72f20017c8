// init_rows: initial embedding values from (seed, table_id, key, column) alone (random_init.cuh
// holds the recipe, shared with hash_table.cu's find_or_insert_values).
#include "random_init.cuh"

// table: [*, dim] float32, maybe split (common.cuh: split in floats); writes table[rows[i]] for
// i < n, or for i < min(n, *count) when count is given (the rows a find_or_insert placed, counted
// on the device); a negative row is skipped. a, b: (value, unused) for constant,
// (minval, maxval - minval) for uniform, (mean, stddev) for the normals. 2^lane_shift threads
// share a row (the caller picks the smallest power of two >= dim, at most 32, at most 8 for a
// group's rows: backend/cuda/random_rows.py), each taking every
// 2^lane_shift-th column: the key's stream is mixed once per row and no index is divided.
// order (may be null): the positions in the order to walk them (host_order.cu).
//
// init_rows_tagged_float32 does the same for a hash group's flat rows (engine/lookup/table_group.py):
// key i is one of table table_ids[tags[i]], whose stream it is drawn from.

// Up to two slots a group's new rows take their initial constant in (init_rows_tagged_float32:
// rows an eviction freed still hold their last key's slots), written beside the vector.
struct SlotResets {
  SplitRows<float> first, second;
  int count;
  float first_value, second_value;  // (rounded from float64 as a constant vector's value is)
};

__device__ __forceinline__ void init_rows(SplitRows<float> table, const int64* rows,
                                          const int64* keys, const int64* tags, int64 n,
                                          const uint64* count, int64 dim, int lane_shift, int kind,
                                          uint64 seed, uint64 table_id, const uint64* table_ids,
                                          double a, double b, const int64* order,
                                          const SlotResets& slots) {
  const int64 valid = count != nullptr && (int64)*count < n ? (int64)*count : n;
  if (order == nullptr) n = valid;  // else the order puts the positions past it anywhere
  const uint64 streams = table_stream(seed, table_id);
  const int64 lanes = 1LL << lane_shift;
  const int64 lane = global_thread_id() & (lanes - 1);
  const int64 stride = global_thread_count() >> lane_shift;
  for (int64 t = global_thread_id() >> lane_shift; t < n; t += stride) {
    const int64 i = order != nullptr ? order[t] : t;
    if (i >= valid) continue;
    const int64 row = rows[i];
    if (row < 0) continue;
    if (slots.count > 0) {
      float* const first = slots.first.row_at(row, dim);
      for (int64 column = lane; column < dim; column += lanes) first[column] = slots.first_value;
    }
    if (slots.count > 1) {
      float* const second = slots.second.row_at(row, dim);
      for (int64 column = lane; column < dim; column += lanes) second[column] = slots.second_value;
    }
    float* const out = table.row_at(row, dim);
    if (kind == KIND_CONSTANT) {  // (a slot's reset: no stream to mix)
      const float value = __double2float_rn(a);
      for (int64 column = lane; column < dim; column += lanes) out[column] = value;
      continue;
    }
    const uint64 own = tags != nullptr ? table_stream(seed, table_ids[tags[i]]) : streams;
    const uint64 stream = key_stream(own, keys[i]);
    for (int64 column = lane; column < dim; column += lanes) {
      out[column] = initial_value(kind, stream, (uint64)column, a, b);
    }
  }
}

extern "C" __global__ void init_rows_float32(SplitRows<float> table, const int64* rows,
                                             const int64* keys, int64 n, const uint64* count,
                                             int64 dim, int lane_shift, int kind, uint64 seed,
                                             uint64 table_id, double a, double b,
                                             const int64* order) {
  const SlotResets none = {};
  init_rows(table, rows, keys, nullptr, n, count, dim, lane_shift, kind, seed, table_id, nullptr,
            a, b, order, none);
}

// slot_count (0 to 2) of first_slot and second_slot take first_value and second_value in the
// same rows (the slots' reset of rows an eviction freed: one pass over the rows, not three).
extern "C" __global__ void init_rows_tagged_float32(SplitRows<float> table, const int64* rows,
                                                    const int64* keys, const int64* tags,
                                                    int64 n, const uint64* count, int64 dim,
                                                    int lane_shift, int kind, uint64 seed,
                                                    const uint64* table_ids, double a, double b,
                                                    double first_value, double second_value,
                                                    SplitRows<float> first_slot,
                                                    SplitRows<float> second_slot, int slot_count) {
  const SlotResets slots = {first_slot, second_slot, slot_count, __double2float_rn(first_value),
                            __double2float_rn(second_value)};
  init_rows(table, rows, keys, tags, n, count, dim, lane_shift, kind, seed, 0, table_ids, a, b,
            nullptr, slots);
}
