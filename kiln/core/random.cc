#include "kiln/core/random.h"

#include <ATen/ATen.h>

#include <mutex>

namespace kiln {
namespace {
std::mutex g_random_mu;
}

std::mt19937_64& host_rng() {
  static std::mt19937_64 rng(0x6b696c6eULL);  // "kiln"
  return rng;
}

void set_random_seed(uint64_t seed) {
  std::lock_guard<std::mutex> l(g_random_mu);
  host_rng().seed(seed);
  at::manual_seed(seed);  // CPU generator, and CUDA's when present
}

uint64_t next_seed() {
  std::lock_guard<std::mutex> l(g_random_mu);
  return host_rng()();
}

}  // namespace kiln
