// init_rows: initial embedding values from (seed, table_id, key, column) alone, following
// sok1x/backend/random_init.py step for step (cpu_random.py is the NumPy twin):
//
//   stream     = mix64(mix64(seed * GOLDEN + table_id) ^ key)
//   bits(c, d) = mix64(stream + (2 * c + d + 1) * GOLDEN)
//   uniform    = (bits >> 40) * 2**-24
//   normal(k)  = sqrt(-2 ln(1 - uniform(c, 2k))) * cos(2 pi uniform(c, 2k + 1))     in float64
//   truncated  = first normal(k), k < TRUNCATED_TRIES, with |z| <= 2, else the last clamped
//
// Every float64 step uses the _rn intrinsics so nvcc cannot fuse a multiply and an add, which
// NumPy never does: the values then match the cpu backend up to the last bit of log and cos.
#include "common.cuh"

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define MIX_1 0xBF58476D1CE4E5B9ULL
#define MIX_2 0x94D049BB133111EBULL
#define TRUNCATED_TRIES 8

#define KIND_CONSTANT 0
#define KIND_UNIFORM 1
#define KIND_NORMAL 2
#define KIND_TRUNCATED_NORMAL 3

__device__ __forceinline__ uint64 mix64(uint64 x) {
  x ^= x >> 30;
  x *= MIX_1;
  x ^= x >> 27;
  x *= MIX_2;
  return x ^ (x >> 31);
}

__device__ __forceinline__ double uniform01(uint64 stream, uint64 column, uint64 draw) {
  const uint64 bits = mix64(stream + (2 * column + draw + 1) * GOLDEN);
  return __dmul_rn((double)(bits >> 40), 5.9604644775390625e-08);  // 2**-24
}

__device__ __forceinline__ double normal01(uint64 stream, uint64 column, uint64 k) {
  const double u1 = uniform01(stream, column, 2 * k);
  const double u2 = uniform01(stream, column, 2 * k + 1);
  const double radius = sqrt(__dmul_rn(-2.0, log(__dsub_rn(1.0, u1))));
  const double two_pi = 6.283185307179586;  // 2.0 * numpy.pi, exactly
  return __dmul_rn(radius, cos(__dmul_rn(two_pi, u2)));
}

// table: [*, dim] float32, maybe split (common.cuh: split in floats); writes table[rows[i]] for
// i < n, or for i < min(n, *count) when count is given (the rows a find_or_insert placed, counted
// on the device); a negative row is skipped. a, b: (value, unused) for constant,
// (minval, maxval - minval) for uniform, (mean, stddev) for the normals. 2^lane_shift threads
// share a row (the caller picks the smallest power of two >= dim, at most 32), each taking every
// 2^lane_shift-th column: the key's stream is mixed once per row and no index is divided.
extern "C" __global__ void init_rows_float32(SplitRows<float> table, const int64* rows,
                                             const int64* keys, int64 n, const uint64* count,
                                             int64 dim, int lane_shift, int kind, uint64 seed,
                                             uint64 table_id, double a, double b) {
  if (count != nullptr && (int64)*count < n) n = (int64)*count;
  const uint64 table_stream = mix64(seed * GOLDEN + table_id);
  const int64 lanes = 1LL << lane_shift;
  const int64 lane = global_thread_id() & (lanes - 1);
  const int64 stride = global_thread_count() >> lane_shift;
  for (int64 i = global_thread_id() >> lane_shift; i < n; i += stride) {
    const int64 row = rows[i];
    if (row < 0) continue;
    const uint64 stream = mix64(table_stream ^ (uint64)keys[i]);
    for (int64 column = lane; column < dim; column += lanes) {
      double value;
      if (kind == KIND_CONSTANT) {
        value = a;
      } else if (kind == KIND_UNIFORM) {
        value = __dadd_rn(a, __dmul_rn(b, uniform01(stream, (uint64)column, 0)));
      } else if (kind == KIND_NORMAL) {
        value = __dadd_rn(a, __dmul_rn(b, normal01(stream, (uint64)column, 0)));
      } else {
        double z = normal01(stream, (uint64)column, 0);
        for (uint64 k = 1; k < TRUNCATED_TRIES && fabs(z) > 2.0; ++k) {
          z = normal01(stream, (uint64)column, k);
        }
        z = fmin(fmax(z, -2.0), 2.0);
        value = __dadd_rn(a, __dmul_rn(b, z));
      }
      table[row * dim + column] = __double2float_rn(value);
    }
  }
}
