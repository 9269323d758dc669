// The one place that knows which LibTorch kiln is compiled against.
//
// kiln builds against official LibTorch 2.x: the CUDA build inside the pinned
// `torch` wheel (scripts/setup.sh), or a LibTorch of your own from
// KILN_TORCH_MIN_MAJOR.KILN_TORCH_MIN_MINOR on (docs/DEPENDENCIES.md).
// Anything that differs between supported versions lives here; the rest of
// kiln includes this header instead of testing versions.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/version.h>

#define KILN_TORCH_MIN_MAJOR 2
#define KILN_TORCH_MIN_MINOR 11

#define KILN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(KILN_TORCH_AT_LEAST(KILN_TORCH_MIN_MAJOR, KILN_TORCH_MIN_MINOR),
              "kiln needs LibTorch 2.11 or newer (docs/DEPENDENCIES.md)");

namespace kiln::compat {

template <class T>
using optional = std::optional<T>;

// Gradients of `outputs` with respect to `inputs` (autograd.grad).
inline std::vector<at::Tensor> grad(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                    bool create_graph = false) {
  return torch::autograd::grad(outputs, inputs, /*grad_outputs=*/{},
                               /*retain_graph=*/std::nullopt, create_graph,
                               /*allow_unused=*/true);
}

// A CUDA GPU is present and usable. (at::hasCUDA() only says that LibTorch's
// CUDA library is loaded, which a CUDA build always is, GPU or not.)
inline bool cuda_available() { return torch::cuda::is_available(); }

}  // namespace kiln::compat
