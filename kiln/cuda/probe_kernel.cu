// kiln's probe kernel: the smallest piece of nvcc-compiled kiln code, which
// scripts/gpu_check.sh and kiln::cuda::probe_gpu() run to show that kernels
// kiln builds itself load and run on the GPU at hand. No LibTorch headers:
// nvcc compiles plain CUDA here, quickly.
#include <cuda_runtime.h>

#include "kiln/cuda/probe_kernel.h"

namespace kiln::cuda::detail {
namespace {

__global__ void probe_fill(int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 3 * i + 1;
}

}  // namespace

int launch_probe(int* out, int n, void* stream) {
  const int threads = 256;
  probe_fill<<<(n + threads - 1) / threads, threads, 0, static_cast<cudaStream_t>(stream)>>>(out, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kiln::cuda::detail
