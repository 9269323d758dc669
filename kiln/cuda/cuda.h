// kiln's CUDA path: what the GPUs of this machine are, and the CUDA-only
// building blocks the GPU features stand on (side-stream copies, CUDA
// graphs, NCCL process groups, kiln's own kernels). Built only when LibTorch
// is a CUDA build and nvcc is found (KILN_CUDA, on by default then); CI
// compiles and links it without a GPU, and the tests named *CUDA* run on a
// GPU machine (scripts/gpu_check.sh).
//
//   for (const auto& g : kiln::cuda::cuda_info().gpus) std::cout << g.name << "\n";
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cuda {

struct GpuInfo {
  int index = 0;
  std::string name;                          // "NVIDIA H200"
  int64_t total_memory_bytes = 0;            // as the driver reports it
  int64_t free_memory_bytes = 0;             // at the time of the call
  int compute_major = 0, compute_minor = 0;  // compute capability, 9.0 for Hopper
  int multiprocessors = 0;
};

struct CudaInfo {
  // Versions as CUDA encodes them (1000 * major + 10 * minor: 13000 is 13.0);
  // 0 where unknown (no driver).
  int driver_version = 0;   // the highest CUDA version the installed driver supports
  int runtime_version = 0;  // the CUDA runtime LibTorch was built with
  long cudnn_version = 0;   // cuDNN as LibTorch reports it (91900 is 9.19.0)
  std::vector<GpuInfo> gpus;
  // Why `gpus` is empty ("no NVIDIA driver", "CUDA error ..."), else "".
  std::string unavailable_reason;
};

// The GPUs of this machine. Never throws: on a machine without a GPU or
// driver, `gpus` is empty and `unavailable_reason` says why.
CudaInfo cuda_info();

// "13.0" for 13000.
std::string cuda_version_string(int version);

// Runs kiln's own probe kernel (kiln/cuda/probe_kernel.cu, compiled by nvcc
// for TORCH_CUDA_ARCH_LIST) on GPU `device` and checks what it wrote: true
// when kiln's nvcc-built code runs on that GPU. Throws kiln::Error when the
// GPU is missing or the kernel cannot be launched (an architecture nvcc did
// not build for names itself there).
bool probe_gpu(int device = 0);

}  // namespace kiln::cuda
