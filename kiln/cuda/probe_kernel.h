// The host side of kiln/cuda/probe_kernel.cu (kept free of CUDA types so
// that C++ sources need no CUDA headers to call it).
#pragma once

namespace kiln::cuda::detail {

// Fills out[i] = 3 * i + 1 for i < n on `stream` (a cudaStream_t). Returns
// the cudaError_t of the launch (0: launched).
int launch_probe(int* out, int n, void* stream);

}  // namespace kiln::cuda::detail
