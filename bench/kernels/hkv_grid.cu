// HierarchicalKV's own benchmark routine on sok1x's DynamicVariable grid (a measuring reference
// only: no HierarchicalKV code is in sok1x; its benchmark file is included from a checkout at
// build time, see bench/hkv_build.sh).
//
//   hkv_grid DIM ROWS HOST_SHARE LOADS REPEATS
//
// builds one HashTable<uint64_t, float, uint64_t, kLru> of ROWS rows (init = max capacity: no
// growth) whose vectors beyond (1 - HOST_SHARE) of their bytes lie in page-locked mapped host
// memory (max_hbm_for_vectors; HierarchicalKV places whole memory slices, so the share is
// rounded to a slice), then for each load in LOADS (comma separated) and for find and
// find_or_insert runs REPEATS times the benchmark's test_one_api (clear, fill to the load, one
// timed call of 2^20 keys, 60% held and 40% not, host clock around the call and its stream
// sync). Prints one JSON line per (load, api) with every repeat in 2^30 keys/s.
#define main hkv_benchmark_main
#include "merlin_hashtable_benchmark.cc.cu"
#undef main

#include <string>
#include <vector>

namespace {

std::vector<float> parse_loads(const std::string& text) {
  std::vector<float> loads;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    loads.push_back(std::stof(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return loads;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: hkv_grid DIM ROWS HOST_SHARE LOADS REPEATS" << std::endl;
    return 2;
  }
  const size_t dim = std::stoul(argv[1]);
  const size_t rows = std::stoul(argv[2]);
  const double host_share = std::stod(argv[3]);
  const std::vector<float> loads = parse_loads(argv[4]);
  const int repeats = std::stoi(argv[5]);
  const size_t key_num_per_op = 1 << 20;
  const size_t vector_bytes = rows * dim * sizeof(V);

  CUDA_CHECK(cudaSetDevice(0));
  TableOptions options;
  options.init_capacity = rows;
  options.max_capacity = rows;
  options.dim = dim;
  options.max_hbm_for_vectors =
      static_cast<size_t>(static_cast<double>(vector_bytes) * (1.0 - host_share));
  using Table = nv::merlin::HashTable<K, V, S, EvictStrategy::kLru, Sm80>;
  auto table = std::make_shared<Table>();
  table->init(options);

  const std::pair<API_Select, const char*> apis[] = {
      {API_Select::find, "find"}, {API_Select::find_or_insert, "find_or_insert"}};
  for (float load : loads) {
    for (const auto& api : apis) {
      std::cout << "{\"dim\": " << dim << ", \"rows\": " << rows
                << ", \"host_share\": " << host_share
                << ", \"hbm_bytes\": " << options.max_hbm_for_vectors
                << ", \"load\": " << load << ", \"api\": \"" << api.second
                << "\", \"gkeys_per_s\": [";
      for (int r = 0; r < repeats; ++r) {
        table->clear();
        CUDA_CHECK(cudaDeviceSynchronize());
        float rate = test_one_api<Table>(table, api.first, dim, rows,
                                         key_num_per_op, load);
        std::cout << (r ? ", " : "") << std::setprecision(5) << rate;
      }
      std::cout << "]}" << std::endl;
    }
  }
  return 0;
}
