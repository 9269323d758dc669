// `kiln show --system`'s GPU lines in a build with kiln's CUDA path
// (KILN_CUDA): kiln/cuda's inventory. CMake compiles this file or
// gpus_none.cc into the CLI, never both.
#include <iomanip>
#include <ostream>

#include "kiln/core/device.h"
#include "kiln/cuda/cuda.h"
#include "tools/kiln/gpu/gpus.h"

namespace kiln::cli {

void print_gpus(std::ostream& os) {
  const cuda::CudaInfo info = cuda::cuda_info();
  os << "CUDA: runtime " << cuda::cuda_version_string(info.runtime_version) << ", driver supports "
     << (info.driver_version ? cuda::cuda_version_string(info.driver_version) : std::string("- (no driver)"))
     << ", cuDNN " << (info.cudnn_version ? std::to_string(info.cudnn_version) : std::string("-")) << "\n";
  if (info.gpus.empty()) {
    os << "GPUs: none (" << info.unavailable_reason << "); kiln computes on the CPU\n";
    return;
  }
  os << "GPUs: " << info.gpus.size() << "\n";
  for (const auto& g : info.gpus)
    os << "  cuda:" << g.index << ": " << g.name << ", " << std::fixed << std::setprecision(1)
       << static_cast<double>(g.total_memory_bytes) / (1 << 30) << " GiB ("
       << static_cast<double>(g.free_memory_bytes) / (1 << 30) << " free), compute capability " << g.compute_major
       << "." << g.compute_minor << ", " << g.multiprocessors << " SMs\n";
  os << "Default device: " << default_device().str() << " (--device or $KILN_DEVICE to change); TF32 "
     << (tf32_enabled() ? "on" : "off") << " for float32 products ($KILN_TF32=0 turns it off)\n";
}

}  // namespace kiln::cli
