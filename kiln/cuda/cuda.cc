#include "kiln/cuda/cuda.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "kiln/core/error.h"
#include "kiln/cuda/probe_kernel.h"

namespace kiln::cuda {

std::string cuda_version_string(int version) {
  if (version <= 0) return "unknown";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

CudaInfo cuda_info() {
  CudaInfo info;
  cudaDriverGetVersion(&info.driver_version);  // 0 without a driver
  cudaRuntimeGetVersion(&info.runtime_version);
  try {
    info.cudnn_version = at::detail::getCUDAHooks().versionCuDNN();
  } catch (const std::exception&) {
    info.cudnn_version = 0;
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.unavailable_reason = std::string("CUDA reports no usable GPU: ") + cudaGetErrorString(err);
    cudaGetLastError();  // clear it, so that later CUDA calls do not see it
    return info;
  }
  if (count == 0) {
    info.unavailable_reason = "no GPU found";
    return info;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.total_memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
    g.compute_major = p.major;
    g.compute_minor = p.minor;
    g.multiprocessors = p.multiProcessorCount;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(i));
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      g.free_memory_bytes = static_cast<int64_t>(free_b);
    } else {
      cudaGetLastError();
    }
    info.gpus.push_back(std::move(g));
  }
  return info;
}

bool probe_gpu(int device) {
  const CudaInfo info = cuda_info();
  if (device < 0 || device >= static_cast<int>(info.gpus.size()))
    throw ValueError("probe_gpu: there is no GPU " + std::to_string(device) + " on this machine (" +
                     (info.gpus.empty() ? info.unavailable_reason : std::to_string(info.gpus.size()) + " GPUs") + ")");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  constexpr int n = 1000;
  at::Tensor out = at::full({n}, -1, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device));
  const int err = detail::launch_probe(out.data_ptr<int>(), n, c10::cuda::getCurrentCUDAStream(device).stream());
  if (err != 0) {
    const GpuInfo& g = info.gpus[device];
    throw Error("kiln's probe kernel did not launch on GPU " + std::to_string(device) + " (" + g.name +
                ", compute capability " + std::to_string(g.compute_major) + "." + std::to_string(g.compute_minor) +
                "): " + cudaGetErrorString(static_cast<cudaError_t>(err)) +
                ". Rebuild kiln with that architecture in TORCH_CUDA_ARCH_LIST.");
  }
  const at::Tensor expected = at::arange(n, at::kInt) * 3 + 1;
  return at::equal(out.cpu(), expected);
}

}  // namespace kiln::cuda
