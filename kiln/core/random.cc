#include "kiln/core/random.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <mutex>
#include <sstream>

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

void share_random_state(const std::function<void(std::vector<at::Tensor>&)>& broadcast, bool sender) {
  std::ostringstream os;
  os << host_rng();
  const std::string host = os.str();
  std::vector<at::Tensor> len = {at::full({1}, static_cast<int64_t>(host.size()), at::kLong)};
  broadcast(len);
  at::Tensor bytes = at::zeros({len[0].item<int64_t>()}, at::kByte);
  if (sender && !host.empty()) std::memcpy(bytes.data_ptr(), host.data(), host.size());
  auto gen = at::detail::getDefaultCPUGenerator();
  std::vector<at::Tensor> t = {bytes, gen.get_state()};
  broadcast(t);
  std::lock_guard<std::mutex> l(g_random_mu);
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(t[1]);
  }
  std::istringstream is(std::string(static_cast<const char*>(t[0].data_ptr()), static_cast<size_t>(t[0].numel())));
  is >> host_rng();
}

}  // namespace kiln
