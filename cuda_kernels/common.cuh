// Shared by every sok1x kernel family: integer types, thread indexing and the open-addressing
// probe used by hash_table.cu and unique.cu.
//
// Hash tables here store 64-bit keys with EMPTY_KEY (-1) marking a free slot: keys that reach the
// backend are never negative. A key's home slot is fastrange(fmix64(key), slot_count), and a probe
// walks forward one slot at a time (linear probing), wrapping at the end. A slot, once claimed by
// atomicCAS, never changes its key within a kernel, so a plain load that sees a key other than
// EMPTY_KEY is final. An erase (a kernel of its own) turns a slot into TOMBSTONE_KEY (-2), which
// probes walk past like any other key and nothing claims.
#pragma once

typedef long long int64;
typedef unsigned long long uint64;

#define EMPTY_KEY (-1LL)
#define TOMBSTONE_KEY (-2LL)
#define FULL_WARP 0xffffffffu

// The member of a table group whose elements [starts[t], starts[t + 1]) hold element e, for
// 0 <= e < starts[members]: a binary search over the members' starts (a group has tens).
__device__ __forceinline__ int64 member_of(const int64* starts, int64 members, int64 e) {
  int64 low = 0, high = members;  // starts[low] <= e < starts[high]
  while (high - low > 1) {
    const int64 middle = (low + high) >> 1;
    if (__ldg(starts + middle) <= e) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return low;
}

// A row array that may be split between GPU memory and page-locked host memory mapped into the
// device's address space (a hybrid DynamicVariable, engine/tables/hybrid_rows.py): element e < split
// lives at dev[e], the others at host[e - split]; a plain array has split INT64_MAX. The row
// index picks the part here, on the device, per access.
// A table group's flat rows of such tables (hybrid_rows.GroupedRows) split per member: pieces is
// then a device listing of split members, [starts (members + 1) | first host element of each |
// shift to its device element | shift to its host element], in elements, and a member's element
// e lives at dev[e - device shift] below its first host element, else at host[e - host shift].
// Kernels that read split or host directly (hash_table.cu's single-table passes) take only
// arrays without pieces. Passed by value, its layout is that of four 8-byte kernel parameters
// (pointer, pointer, int64, pointer): launch format "PPqP".
template <typename T>
struct SplitRows {
  T* dev;
  T* host;
  int64 split;  // with pieces: the number of members
  const int64* pieces;
  // Element e's place in the part holding it; in_host tells which part.
  __device__ __forceinline__ int64 place(int64 e, bool& in_host) const {
    if (pieces == nullptr) {
      in_host = e >= split;
      return in_host ? e - split : e;
    }
    const int64 t = member_of(pieces, split, e);
    const int64* shifts = pieces + split + 1;
    in_host = e >= __ldg(shifts + t);
    return e - __ldg(shifts + (in_host ? 2 : 1) * split + t);
  }
  __device__ __forceinline__ T& operator[](int64 e) const {
    bool in_host;
    const int64 at = place(e, in_host);
    return in_host ? host[at] : dev[at];
  }
  // The element's place in the host part, or -1 for a device element (host_order.cu).
  __device__ __forceinline__ int64 host_place(int64 e) const {
    bool in_host;
    const int64 at = place(e, in_host);
    return in_host ? at : -1;
  }
  // The first element of row `row` of `dim` elements: a row never straddles two parts, so one
  // placement serves its every element (the per-element one searches a member listing).
  __device__ __forceinline__ T* row_at(int64 row, int64 dim) const {
    bool in_host;
    const int64 at = place(row * dim, in_host);
    return (in_host ? host : dev) + at;
  }
  __device__ __forceinline__ bool present() const { return dev != nullptr; }
};

__device__ __forceinline__ int64 global_thread_id() {
  return (int64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64 global_thread_count() {
  return (int64)gridDim.x * blockDim.x;
}

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }

// Index of this warp's lane 0 in the grid: a loop over `first_of_warp + k * stride` runs the same
// number of iterations in every lane of a warp, which warp votes and matches need.
__device__ __forceinline__ int64 first_of_warp() {
  return global_thread_id() - (int64)lane_id();
}

__device__ __forceinline__ unsigned lanes_below() { return (1u << lane_id()) - 1u; }

// Warp-aggregated additions to int64 counters, called by every lane of a warp together (a loop
// over first_of_warp()): the lanes that add to one counter make one atomic, by the lowest of
// them, so a hot counter (the place of a popular row) takes an atomic a warp, not one a lane.
// `valid`: whether this lane adds at all. warp_count adds one a lane; warp_claim moves the
// counter by `step` (1 or -1) a lane and returns to each valid lane what the counter held before
// its own move (the lanes of a group in lane order), as an atomicAdd of `step` of its own would;
// warp_take_one is warp_claim of -1.
__device__ __forceinline__ unsigned lanes_adding(int64 counter, bool valid) {
  return __match_any_sync(FULL_WARP, valid ? counter : -1 - (int64)lane_id());
}

__device__ __forceinline__ void warp_count(int64* counts, int64 s, bool valid) {
  const unsigned group = lanes_adding(s, valid);
  if (valid && lane_id() == (unsigned)(__ffs(group) - 1)) {
    atomicAdd(reinterpret_cast<unsigned long long*>(counts + s),
              (unsigned long long)__popc(group));
  }
}

__device__ __forceinline__ int64 warp_claim(int64* counts, int64 s, bool valid, int step) {
  const unsigned group = lanes_adding(s, valid);
  const int leader = __ffs(group) - 1;
  unsigned long long before = 0;
  if (valid && lane_id() == (unsigned)leader) {
    before = atomicAdd(reinterpret_cast<unsigned long long*>(counts + s),
                       (unsigned long long)((int64)step * __popc(group)));
  }
  before = __shfl_sync(FULL_WARP, before, leader);
  return (int64)before + step * __popc(group & lanes_below());
}

__device__ __forceinline__ int64 warp_take_one(int64* counts, int64 s, bool valid) {
  return warp_claim(counts, s, valid, -1);
}

// MurmurHash3's 64-bit finaliser.
__device__ __forceinline__ uint64 scramble_key(uint64 x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

__device__ __forceinline__ uint64 home_slot(int64 key, uint64 slot_count) {
  return __umul64hi(scramble_key((uint64)key), slot_count);
}

__device__ __forceinline__ uint64 next_slot(uint64 slot, uint64 slot_count) {
  slot += 1;
  return slot == slot_count ? 0 : slot;
}

// Slot holding `key` in a table whose slot s keeps its key at slot_keys[s * stride], or -1.
__device__ __forceinline__ int64 find_slot(const int64* slot_keys, int stride, uint64 slot_count,
                                           int64 key) {
  uint64 slot = home_slot(key, slot_count);
  for (uint64 probes = 0; probes < slot_count; ++probes) {
    int64 held = slot_keys[slot * stride];
    if (held == key) return (int64)slot;
    if (held == EMPTY_KEY) return -1;
    slot = next_slot(slot, slot_count);
  }
  return -1;
}

// Slot of `key`, claiming a free one with atomicCAS when the key is absent; *claimed says whether
// this thread placed the key. Returns -1 only when every slot holds another key.
__device__ __forceinline__ int64 find_or_claim_slot(int64* slot_keys, int stride,
                                                    uint64 slot_count, int64 key, bool* claimed) {
  *claimed = false;
  uint64 slot = home_slot(key, slot_count);
  for (uint64 probes = 0; probes < slot_count; ++probes) {
    int64* where = slot_keys + slot * stride;
    int64 held = *(volatile int64*)where;
    if (held == key) return (int64)slot;
    if (held == EMPTY_KEY) {
      int64 before = (int64)atomicCAS((uint64*)where, (uint64)EMPTY_KEY, (uint64)key);
      if (before == EMPTY_KEY) {
        *claimed = true;
        return (int64)slot;
      }
      if (before == key) return (int64)slot;
    }
    slot = next_slot(slot, slot_count);
  }
  return -1;
}

// A lookup's access statistics of one row of a growing, evicting table (engine/tables/dynamic_table.py),
// kept as one 16-byte record per row: statistics[2 * row] the step of the row's last lookup,
// statistics[2 * row + 1] its count of lookups. Sets the step and adds 1 to the count (a
// repeated row counts each time); row < 0: none. The record lies in one 32-byte sector, so a key
// costs one sector's read and write where two arrays cost two.
__device__ __forceinline__ void touch_row(int64* statistics, int64 row, int64 step) {
  if (row < 0) return;
  int64* record = statistics + 2 * row;
  record[0] = step;
  atomicAdd((uint64*)(record + 1), 1ULL);
}

// The part holding position i: the last t with starts[t] <= i (empty parts are skipped over).
__device__ __forceinline__ int64 part_of(const int64* starts, int64 count, int64 i) {
  int64 low = 0, high = count - 1;
  while (low < high) {
    const int64 middle = (low + high + 1) >> 1;
    if (starts[middle] <= i) low = middle; else high = middle - 1;
  }
  return low;
}

// to[0..3] += value as one 16-byte reduction (to 16-byte aligned): a single instruction from
// sm_90 on, four scalar atomics before (rows.cu's add_rows_float32_x4, segment_rows.cu's sums).
__device__ __forceinline__ void add_four(float* to, const float4& value) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(to), "f"(value.x),
               "f"(value.y), "f"(value.z), "f"(value.w)
               : "memory");
#else
  atomicAdd(to, value.x);
  atomicAdd(to + 1, value.y);
  atomicAdd(to + 2, value.z);
  atomicAdd(to + 3, value.w);
#endif
}
