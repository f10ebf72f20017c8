// Optimizer updates of an embedding shard: TensorFlow's sparse-apply arithmetic in float32, the
// same formulas as sok1x/backend/cpu/optimizers.py (the reference these are tested against).
//
// Row kernels update the rows that have a gradient: rows[i] (distinct) gets grads[i * dim + c].
// One thread updates one element, e = i * dim + c, in a grid-stride loop; LazyAdam's and
// Adagrad's (update_rows, a rule's arithmetic written once) update four side by side where the
// rows allow it (their *_x4 kernels). A row -1 is a padded position (a step's buffers sized by
// its keys, not its rows: DESIGN D14): nothing is done for it.
// The *_all_rows kernels run once over every element of the shard and find a row's gradient
// through position_of_row (mark_rows fills it; -1 means no gradient this step), so state that
// decays on every row (TensorFlow's sparse Adam, Keras' RMSprop without momentum) takes one pass.
// State arrays are SplitRows (common.cuh): a hybrid table's rows pick their part here. One that
// may be absent (vhat, mg) has a null dev pointer when the optimizer does not use it.
#include "common.cuh"

typedef SplitRows<float> Rows;  // a state array, maybe split (common.cuh)

// A rule's hyper-parameters (at most six, in the order the rule takes them): the values passed,
// or, where `given` is set, read from device memory when the kernel runs. A replayed CUDA graph
// keeps the scalars it was recorded with, so a captured update reads this step's learning rate
// from an array the host fills before each replay (DESIGN D14; sok1x/backend/given_hyper.py).
struct Hyper {
  const float* given;
  float value[6];
  __device__ __forceinline__ float operator[](int i) const { return given ? given[i] : value[i]; }
};

// dst[i] = h.value[i] for i < count (at most 6), and *clock = now where a clock is given: the
// host writes a replayed update's hyper-parameters into its given array, and the time its
// recorded stamp writes (pooling.cu's fill_rows_float64 reading *clock), as one launch's
// arguments, with no host buffer or copy.
extern "C" __global__ void write_hyper(float* dst, int64 count, Hyper h, double* clock,
                                       double now, int64 with_step, double step) {
  const int64 i = global_thread_id();
  if (i < count) dst[i] = h.value[i];
  if (i == 0 && clock != nullptr) {
    clock[0] = now;
    if (with_step) clock[1] = step;  // a clock of two: (time, training step)
  }
}

#define FOR_EACH_ELEMENT(e, total) \
  for (int64 e = global_thread_id(); e < (total); e += global_thread_count())

// W floats of one row side by side: its elements c .. c + W - 1.
template <int W>
struct __align__(4 * W) Lanes {
  float x[W];
};

template <int W>
__device__ __forceinline__ Lanes<W>& lanes_at(const Rows& state, int64 s) {
  bool in_host;
  const int64 at = state.place(s, in_host);
  return *reinterpret_cast<Lanes<W>*>((in_host ? state.host : state.dev) + at);
}

// rule(state, g) on every element of the rows that have a gradient: state[j] is the element of
// states[j] (var first), g its gradient. W elements a thread: W = 4 where dim % 4 == 0 and every
// array is 16-byte aligned (the *_x4 kernels, which the cuda backend picks then), one 16-byte
// load and store per array where W = 1 made four, and a quarter of the index work.
// The loop waits on memory, not on arithmetic (Nsight Compute: dlrm's update at 70% of DRAM
// bandwidth, its warps stalled on loads, 2026-11-28), so the row of a thread's next position is
// read while this one's states are in flight, and a row's position is found by a shift where
// dim / W is a power of two (a 64-bit division is a long call).
template <int W, int N, class Rule>
__device__ __forceinline__ void update_rows(const Rule& rule, const Rows (&states)[N],
                                            const int64* rows, const float* grads, int64 n,
                                            int64 dim) {
  const int64 per_row = dim / W;
  const int64 total = n * per_row;
  const int64 stride = global_thread_count();
  const bool by_shift = (per_row & (per_row - 1)) == 0;
  const int shift = __ffsll(per_row) - 1;
  const auto position_of = [&](int64 t) { return by_shift ? t >> shift : t / per_row; };
  int64 t = global_thread_id();
  int64 i = position_of(t);
  int64 row = t < total ? rows[i] : -1;
  for (; t < total; t += stride) {
    const int64 next_t = t + stride;
    const int64 next_i = position_of(next_t);
    const int64 next_row = next_t < total ? rows[next_i] : -1;  // in flight with this one's
    if (row >= 0) {  // else padding
      const int64 c = (t - i * per_row) * W;
      const Lanes<W> g = *reinterpret_cast<const Lanes<W>*>(grads + i * dim + c);
      Lanes<W>* at[N];
      Lanes<W> value[N];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        at[j] = &lanes_at<W>(states[j], row * dim + c);
        value[j] = *at[j];
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        float element[N];
#pragma unroll
        for (int j = 0; j < N; ++j) element[j] = value[j].x[k];
        rule(element, g.x[k]);
#pragma unroll
        for (int j = 0; j < N; ++j) value[j].x[k] = element[j];
      }
#pragma unroll
      for (int j = 0; j < N; ++j) *at[j] = value[j];
    }
    i = next_i;
    row = next_row;
  }
}

// The row kernel of rule class RULE in its two widths: update_SUFFIX (one element a thread)
// and update_SUFFIX_x4. PARAMS: its state parameters in parentheses, var first; the rest: those
// states' names.
#define ROW_STATE_PARAMS(...) __VA_ARGS__
// The blocks of 256 threads (launch()'s) a multiprocessor holds of a *_x4 row kernel at least: its
// registers are capped to fit them (LazyAdam's 44 to 40 at 6, as it held before the row of the
// next position was read ahead). bench/update_grid.py compiles other values beside it.
#ifndef ROW_MIN_BLOCKS
#define ROW_MIN_BLOCKS 6
#endif
#define ROW_BOUNDS __launch_bounds__(256, ROW_MIN_BLOCKS)
#define ROW_UPDATE_KERNELS(SUFFIX, RULE, PARAMS, ...)                                           \
  extern "C" __global__ void update_##SUFFIX(ROW_STATE_PARAMS PARAMS, const int64* rows,        \
                                             const float* grads, int64 n, int64 dim, Hyper h) { \
    const Rows states[] = {__VA_ARGS__};                                                        \
    update_rows<1>(RULE(h), states, rows, grads, n, dim);                                       \
  }                                                                                             \
  extern "C" __global__ void ROW_BOUNDS update_##SUFFIX##_x4(ROW_STATE_PARAMS PARAMS,           \
                                                             const int64* rows,                 \
                                                             const float* grads, int64 n,       \
                                                             int64 dim, Hyper h) {              \
    const Rows states[] = {__VA_ARGS__};                                                        \
    update_rows<4>(RULE(h), states, rows, grads, n, dim);                                       \
  }

// Index into the [capacity, dim] state of element e of the [n, dim] gradient; negative for a
// padded position (row -1), which the caller skips.
__device__ __forceinline__ int64 shard_index(const int64* rows, int64 e, int64 dim) {
  const int64 i = e / dim;
  const int64 row = rows[i];
  return row < 0 ? -1 : row * dim + (e - i * dim);
}

extern "C" __global__ void update_sgd(Rows var, const int64* rows, const float* grads, int64 n,
                                      int64 dim, Hyper h) {
  const float lr = h[0];
  FOR_EACH_ELEMENT(e, n * dim) {
    const int64 s = shard_index(rows, e, dim);
    if (s >= 0) var[s] -= lr * grads[e];
  }
}

extern "C" __global__ void update_momentum(Rows var, Rows accum, const int64* rows,
                                           const float* grads, int64 n, int64 dim, Hyper h,
                                           int nesterov) {
  const float lr = h[0];
  const float momentum = h[1];
  FOR_EACH_ELEMENT(e, n * dim) {
    const int64 s = shard_index(rows, e, dim);
    if (s < 0) continue;
    const float g = grads[e];
    const float a = accum[s] * momentum + g;
    accum[s] = a;
    var[s] -= nesterov ? g * lr + a * momentum * lr : a * lr;
  }
}

extern "C" __global__ void update_keras_momentum(Rows var, Rows accum, const int64* rows,
                                                 const float* grads, int64 n, int64 dim, Hyper h,
                                                 int nesterov) {
  const float lr = h[0];
  const float momentum = h[1];
  FOR_EACH_ELEMENT(e, n * dim) {
    const int64 s = shard_index(rows, e, dim);
    if (s < 0) continue;
    const float g = grads[e];
    const float a = accum[s] * momentum - g * lr;
    accum[s] = a;
    var[s] += nesterov ? a * momentum - g * lr : a;
  }
}

// Adagrad on (var, accum).
struct Adagrad {
  float lr, epsilon;
  __device__ explicit Adagrad(const Hyper& h) : lr(h[0]), epsilon(h[1]) {}
  __device__ __forceinline__ void operator()(float* state, float g) const {
    const float a = state[1] + g * g;
    state[1] = a;
    state[0] -= lr * g / (sqrtf(a) + epsilon);
  }
};
ROW_UPDATE_KERNELS(adagrad, Adagrad, (Rows var, Rows accum), var, accum)

__device__ __forceinline__ float accum_power(float accum, float lr_power) {
  return lr_power == -0.5f ? sqrtf(accum) : powf(accum, -lr_power);
}

extern "C" __global__ void update_ftrl(Rows var, Rows accum, Rows linear, const int64* rows,
                                       const float* grads, int64 n, int64 dim, Hyper h) {
  const float lr = h[0];
  const float lr_power = h[1];
  const float l1 = h[2];
  const float l2 = h[3];
  const float l2_shrinkage = h[4];
  FOR_EACH_ELEMENT(e, n * dim) {
    const int64 s = shard_index(rows, e, dim);
    if (s < 0) continue;
    const float g = grads[e];
    const float w = var[s];
    const float old_accum = accum[s];
    const float shrunk = l2_shrinkage > 0.0f ? g + 2.0f * l2_shrinkage * w : g;
    const float new_accum = old_accum + g * g;
    const float new_power = accum_power(new_accum, lr_power);
    const float lin = linear[s] + shrunk - (new_power - accum_power(old_accum, lr_power)) / lr * w;
    const float quadratic = new_power / lr + 2.0f * l2;
    var[s] = (fminf(fmaxf(lin, -l1), l1) - lin) / quadratic;
    accum[s] = new_accum;
    linear[s] = lin;
  }
}

extern "C" __global__ void update_rmsprop(Rows var, Rows ms, Rows mom, Rows mg,
                                          const int64* rows, const float* grads, int64 n,
                                          int64 dim, Hyper h) {
  const float lr = h[0];
  const float rho = h[1];
  const float momentum = h[2];
  const float epsilon = h[3];
  const float one_minus_rho = 1.0f - rho;
  FOR_EACH_ELEMENT(e, n * dim) {
    const int64 s = shard_index(rows, e, dim);
    if (s < 0) continue;
    const float g = grads[e];
    const float new_ms = ms[s] * rho + g * g * one_minus_rho;
    ms[s] = new_ms;
    float denominator = new_ms + epsilon;
    if (mg.present()) {
      const float new_mg = mg[s] * rho + g * one_minus_rho;
      mg[s] = new_mg;
      denominator = new_ms - new_mg * new_mg + epsilon;
    }
    const float new_mom = mom[s] * momentum + lr * g / sqrtf(denominator);
    mom[s] = new_mom;
    var[s] -= new_mom;
  }
}

// LazyAdam on (var, m, v).
struct LazyAdam {
  float lr_t, beta1, beta2, epsilon;
  __device__ explicit LazyAdam(const Hyper& h)
      : lr_t(h[0]), beta1(h[1]), beta2(h[2]), epsilon(h[3]) {}
  __device__ __forceinline__ void operator()(float* state, float g) const {
    const float new_m = state[1] * beta1 + g * (1.0f - beta1);
    const float new_v = state[2] * beta2 + g * g * (1.0f - beta2);
    state[1] = new_m;
    state[2] = new_v;
    state[0] -= lr_t * new_m / (sqrtf(new_v) + epsilon);
  }
};
ROW_UPDATE_KERNELS(lazy_adam, LazyAdam, (Rows var, Rows m, Rows v), var, m, v)

extern "C" __global__ void update_adamax(Rows var, Rows m, Rows u, const int64* rows,
                                         const float* grads, int64 n, int64 dim, Hyper h) {
  const float lr_t = h[0];
  const float beta1 = h[1];
  const float beta2 = h[2];
  const float epsilon = h[3];
  FOR_EACH_ELEMENT(e, n * dim) {
    const int64 s = shard_index(rows, e, dim);
    if (s < 0) continue;
    const float g = grads[e];
    const float new_m = m[s] * beta1 + g * (1.0f - beta1);
    const float new_u = fmaxf(u[s] * beta2, fabsf(g));
    m[s] = new_m;
    u[s] = new_u;
    var[s] -= lr_t * (new_m / (new_u + epsilon));
  }
}

extern "C" __global__ void update_adadelta(Rows var, Rows accum, Rows accum_update,
                                           const int64* rows, const float* grads, int64 n,
                                           int64 dim, Hyper h) {
  const float lr = h[0];
  const float rho = h[1];
  const float epsilon = h[2];
  const float one_minus_rho = 1.0f - rho;
  FOR_EACH_ELEMENT(e, n * dim) {
    const int64 s = shard_index(rows, e, dim);
    if (s < 0) continue;
    const float g = grads[e];
    const float new_accum = accum[s] * rho + g * g * one_minus_rho;
    accum[s] = new_accum;
    const float old_update = accum_update[s];
    const float update = sqrtf(old_update + epsilon) / sqrtf(new_accum + epsilon) * g;
    var[s] -= update * lr;
    accum_update[s] = old_update * rho + update * update * one_minus_rho;
  }
}

// position_of_row[rows[i]] = i for every row >= 0; the caller set every entry to -1 first.
extern "C" __global__ void mark_rows(const int64* rows, int64 n, int64* position_of_row) {
  FOR_EACH_ELEMENT(i, n) {
    if (rows[i] >= 0) position_of_row[rows[i]] = i;
  }
}

// Gradient of element e of the shard, 0 for a row without one.
__device__ __forceinline__ float shard_gradient(const int64* position_of_row, const float* grads,
                                                int64 e, int64 dim, bool* has_gradient) {
  const int64 row = e / dim;
  const int64 position = position_of_row[row];
  *has_gradient = position >= 0;
  return *has_gradient ? grads[position * dim + (e - row * dim)] : 0.0f;
}

extern "C" __global__ void update_adam_all_rows(Rows var, Rows m, Rows v, Rows vhat,
                                                const int64* position_of_row, const float* grads,
                                                int64 num_rows, int64 dim, Hyper h) {
  const float lr_t = h[0];
  const float beta1 = h[1];
  const float beta2 = h[2];
  const float epsilon = h[3];
  FOR_EACH_ELEMENT(e, num_rows * dim) {
    bool has_gradient;
    const float g = shard_gradient(position_of_row, grads, e, dim, &has_gradient);
    float new_m = m[e] * beta1;
    float new_v = v[e] * beta2;
    if (has_gradient) {
      new_m += g * (1.0f - beta1);
      new_v += g * g * (1.0f - beta2);
    }
    m[e] = new_m;
    v[e] = new_v;
    float second = new_v;
    if (vhat.present()) {
      second = fmaxf(vhat[e], new_v);
      vhat[e] = second;
    }
    var[e] -= lr_t * new_m / (sqrtf(second) + epsilon);
  }
}

extern "C" __global__ void update_keras_rmsprop_all_rows(Rows var, Rows rms, Rows mg,
                                                         const int64* position_of_row,
                                                         const float* grads, int64 num_rows,
                                                         int64 dim, Hyper h) {
  const float lr = h[0];
  const float rho = h[1];
  const float epsilon = h[2];
  const float one_minus_rho = 1.0f - rho;
  FOR_EACH_ELEMENT(e, num_rows * dim) {
    bool has_gradient;
    const float g = shard_gradient(position_of_row, grads, e, dim, &has_gradient);
    float new_rms = rms[e] * rho;
    if (has_gradient) new_rms += g * g * one_minus_rho;
    rms[e] = new_rms;
    float denominator = new_rms;
    if (mg.present()) {
      float new_mg = mg[e] * rho;
      if (has_gradient) new_mg += g * one_minus_rho;
      mg[e] = new_mg;
      denominator = new_rms - new_mg * new_mg;
    }
    if (has_gradient) var[e] -= lr * g / (sqrtf(denominator) + epsilon);
  }
}
