// Initial values of embedding rows (D10), shared by random_init.cu's init_rows and
// hash_table.cu's find_or_insert_values: each value is a function of (seed, table_id, key, column)
// alone, following sok1x/backend/random_init.py step for step (cpu/random_rows.py is the NumPy twin):
//
//   stream     = mix64(mix64(seed * GOLDEN + table_id) ^ key)
//   bits(c, d) = mix64(stream + (2 * c + d + 1) * GOLDEN)
//   uniform    = (bits >> 40) * 2**-24
//   normal(k)  = sqrt(-2 ln(1 - uniform(c, 2k))) * cos(2 pi uniform(c, 2k + 1))     in float64
//   truncated  = first normal(k), k < TRUNCATED_TRIES, with |z| <= 2, else the last clamped
//
// Every float64 step uses the _rn intrinsics so nvcc cannot fuse a multiply and an add, which
// NumPy never does: the values then match the cpu backend up to the last bit of log and cos.
#pragma once
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

// The initial value of `column` of the key whose stream is `stream` (key_stream). a, b: (value,
// unused) for constant, (minval, maxval - minval) for uniform, (mean, stddev) for the normals.
__device__ __forceinline__ float initial_value(int kind, uint64 stream, uint64 column, double a,
                                               double b) {
  double value;
  if (kind == KIND_CONSTANT) {
    value = a;
  } else if (kind == KIND_UNIFORM) {
    value = __dadd_rn(a, __dmul_rn(b, uniform01(stream, column, 0)));
  } else if (kind == KIND_NORMAL) {
    value = __dadd_rn(a, __dmul_rn(b, normal01(stream, column, 0)));
  } else {
    double z = normal01(stream, column, 0);
    for (uint64 k = 1; k < TRUNCATED_TRIES && fabs(z) > 2.0; ++k) z = normal01(stream, column, k);
    z = fmin(fmax(z, -2.0), 2.0);
    value = __dadd_rn(a, __dmul_rn(b, z));
  }
  return __double2float_rn(value);
}

// A table's stream (mixed once per kernel) and a key's stream from it.
__device__ __forceinline__ uint64 table_stream(uint64 seed, uint64 table_id) {
  return mix64(seed * GOLDEN + table_id);
}

__device__ __forceinline__ uint64 key_stream(uint64 table, int64 key) {
  return mix64(table ^ (uint64)key);
}
