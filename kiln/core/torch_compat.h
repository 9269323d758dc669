// The one place that knows which LibTorch kiln is compiled against.
//
// kiln builds against Debian's LibTorch 1.13 (CPU) and, when Torch_DIR points
// at one, a CUDA LibTorch 2.x. Everything that differs between the two lives
// here; the rest of kiln includes this header instead of testing versions.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#ifndef TORCH_VERSION_MAJOR
#define TORCH_VERSION_MAJOR 1
#define TORCH_VERSION_MINOR 13
#endif

#define KILN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace kiln::compat {

// float8 dtypes arrived in LibTorch 2.1.
constexpr bool kHasFloat8 = KILN_TORCH_AT_LEAST(2, 1);

// LibTorch 2.x moved optional from c10::optional to std::optional; both
// accept c10::nullopt / std::nullopt through this alias.
#if KILN_TORCH_AT_LEAST(2, 3)
template <class T>
using optional = std::optional<T>;
#else
template <class T>
using optional = c10::optional<T>;
#endif

// Gradients of `outputs` with respect to `inputs` (autograd.grad).
inline std::vector<at::Tensor> grad(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                    bool create_graph = false) {
  return torch::autograd::grad(outputs, inputs, /*grad_outputs=*/{},
                               /*retain_graph=*/c10::nullopt, create_graph,
                               /*allow_unused=*/true);
}

inline bool cuda_available() { return at::hasCUDA(); }

}  // namespace kiln::compat
