#include "kiln/distribute/nccl.h"

#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <map>
#include <utility>

#include "kiln/core/device.h"
#include "kiln/core/error.h"

namespace kiln::distribute {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    int device, double timeout_seconds) {
#if defined(USE_C10D_NCCL)
  if (device < 0 || device >= gpu_count())
    throw ValueError("make_nccl_backend: there is no GPU " + std::to_string(device) + " on this machine (" +
                     std::to_string(gpu_count()) + " GPUs)");
  if (rank < 0 || rank >= size)
    throw ValueError("make_nccl_backend: rank must be in [0, size). Received: rank=" + std::to_string(rank) +
                     ", size=" + std::to_string(size));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  // Collectives of this group run on `device` (NCCL: one GPU per rank).
  pg->setBoundDeviceId(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
  return pg;
#else
  throw ValueError(
      "make_nccl_backend: this LibTorch was built without NCCL; use a CUDA build of LibTorch "
      "(scripts/setup.sh installs one) or KILN_COLLECTIVE_BACKEND=gloo");
#endif
}

bool nccl_available() {
#if defined(USE_C10D_NCCL)
  return true;
#else
  return false;
#endif
}

std::string nccl_version() {
#if defined(USE_C10D_NCCL)
  return c10d::getNcclVersion();
#else
  return "";
#endif
}

std::string choose_collective_backend(const std::vector<RankDevice>& ranks, const std::string& requested,
                                      bool nccl_built) {
  if (requested != "" && requested != "auto" && requested != "nccl" && requested != "gloo")
    throw ValueError("KILN_COLLECTIVE_BACKEND must be auto, nccl or gloo. Received: " + requested);
  if (requested == "gloo") return "gloo";
  // Why NCCL cannot run this job, or "".
  std::string why;
  std::map<std::pair<std::string, int>, int> first_on;  // (host, GPU) -> the first rank on it
  for (size_t r = 0; r < ranks.size() && why.empty(); ++r) {
    const RankDevice& rd = ranks[r];
    if (!rd.device.is_cuda()) {
      why = "rank " + std::to_string(r) + " computes on " + rd.device.str() + ", not a GPU";
      continue;
    }
    auto [it, fresh] = first_on.emplace(std::make_pair(rd.host, static_cast<int>(rd.device.index())), r);
    if (!fresh)
      why = "ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " share " + rd.device.str() +
            " on host " + rd.host + " (NCCL needs a GPU per rank)";
  }
  if (why.empty() && !nccl_built) why = "this LibTorch was built without NCCL";
  if (why.empty()) return "nccl";
  if (requested == "nccl")
    throw ValueError("KILN_COLLECTIVE_BACKEND=nccl cannot run this job: " + why +
                     "; give each rank its own GPU (kiln launch --nproc_per_node at most the GPU count) or set "
                     "KILN_COLLECTIVE_BACKEND=gloo");
  return "gloo";
}

}  // namespace kiln::distribute
