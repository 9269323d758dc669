#include "kiln/cuda/nccl.h"

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>

#include "kiln/core/error.h"

namespace kiln::cuda {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    int device, double timeout_seconds) {
  if (device < 0 || device >= static_cast<int>(c10::cuda::device_count()))
    throw ValueError("make_nccl_backend: there is no GPU " + std::to_string(device) + " on this machine (" +
                     std::to_string(c10::cuda::device_count()) + " GPUs)");
  if (rank < 0 || rank >= size)
    throw ValueError("make_nccl_backend: rank must be in [0, size). Received: rank=" + std::to_string(rank) +
                     ", size=" + std::to_string(size));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  // Collectives of this group run on `device` (NCCL: one GPU per rank).
  pg->setBoundDeviceId(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
  return pg;
}

std::string nccl_version() { return c10d::getNcclVersion(); }

}  // namespace kiln::cuda
