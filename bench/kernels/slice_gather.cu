// bench/host_slices.py's probe: a gather of random rows from host memory held as separate
// allocations (HierarchicalKV's layout: its host vectors are slices of 128 MiB, each its own
// cudaHostAlloc) through a table of slice base addresses. One thread moves one 16-byte word, as
// sok1x's take_rows does for rows whose size is a multiple of 16 bytes.
extern "C" __global__ void gather_slices(const float4* const* slices, long long rows_per_slice,
                                         const long long* index, long long n,
                                         long long words_per_row, float4* out) {
  const long long total = n * words_per_row;
  for (long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x; w < total;
       w += (long long)gridDim.x * blockDim.x) {
    const long long i = w / words_per_row;
    const long long row = index[i];
    const long long slice = row / rows_per_slice;
    const long long word = (row - slice * rows_per_slice) * words_per_row + (w - i * words_per_row);
    out[w] = slices[slice][word];
  }
}
