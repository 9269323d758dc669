// Shared arithmetic of convolution and pooling windows (Keras/TensorFlow
// padding rules), and layout moves between channels_last and LibTorch's
// channels_first kernels.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/layers/config_reader.h"
#include "kiln/layers/conv.h"

namespace kiln::conv_utils {

// Output length along one axis for "valid", "same" or "causal" padding;
// -1 (unknown) stays -1.
inline int64_t output_length(int64_t n, int64_t k, int64_t stride, int64_t dilation, const std::string& padding) {
  if (n < 0) return -1;
  const int64_t span = dilation * (k - 1) + 1;
  if (padding == "valid") return n >= span ? (n - span) / stride + 1 : 0;
  return (n + stride - 1) / stride;  // same, causal: ceil(n / stride)
}

// (before, after) padding along one axis. TensorFlow's "same" puts the odd
// element after; "causal" pads only before.
inline std::pair<int64_t, int64_t> padding_amounts(int64_t n, int64_t k, int64_t stride, int64_t dilation,
                                                   const std::string& padding) {
  const int64_t span = dilation * (k - 1) + 1;
  if (padding == "causal") return {span - 1, 0};
  if (padding != "same") return {0, 0};
  const int64_t out = (n + stride - 1) / stride;
  const int64_t total = std::max<int64_t>((out - 1) * stride + span - n, 0);
  return {total / 2, total - total / 2};
}

// (N, d1..dk, C) -> (N, C, d1..dk).
inline at::Tensor channels_last_to_first(const at::Tensor& x) {
  std::vector<int64_t> perm = {0, x.dim() - 1};
  for (int64_t i = 1; i < x.dim() - 1; ++i) perm.push_back(i);
  return x.permute(perm);
}

// (N, C, d1..dk) -> (N, d1..dk, C).
inline at::Tensor channels_first_to_last(const at::Tensor& x) {
  std::vector<int64_t> perm = {0};
  for (int64_t i = 2; i < x.dim(); ++i) perm.push_back(i);
  perm.push_back(1);
  return x.permute(perm);
}

// at::constant_pad_nd's argument for per-axis (before, after) pads of the
// trailing spatial axes of a channels_first tensor.
inline std::vector<int64_t> pad_arg(const std::vector<std::pair<int64_t, int64_t>>& pads) {
  std::vector<int64_t> out;
  for (auto it = pads.rbegin(); it != pads.rend(); ++it) {
    out.push_back(it->first);
    out.push_back(it->second);
  }
  return out;
}

// The geometry of checked convolution options (kernel_size, strides,
// padding, data_format, dilation_rate; groups 1). ValueError, as in Keras,
// when strides > 1 meets dilation_rate > 1.
template <class Options>
ConvGeometry checked_geometry(const std::string& owner, const Options& o) {
  ConvGeometry g{.kernel_size = o.kernel_size,
                 .strides = o.strides,
                 .dilation_rate = o.dilation_rate,
                 .padding = o.padding,
                 .channels_last = o.data_format == "channels_last"};
  auto max_of = [](const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); };
  if (max_of(g.strides) > 1 && max_of(g.dilation_rate) > 1)
    throw ValueError(owner +
                     ": `strides > 1` not supported in conjunction with `dilation_rate > 1`. Received: strides=" +
                     int_list_json(g.strides).dump() + " and dilation_rate=" + int_list_json(g.dilation_rate).dump());
  return g;
}

}  // namespace kiln::conv_utils
