// ONNX exporters of the convolutions, the poolings and the normalization
// layers (BatchNormalization, LayerNormalization, GroupNormalization).
#include "kiln/export/onnx_graph.h"

#include <algorithm>

namespace kiln::exporter::onnx {
namespace {

// Conv1D/Conv2D, the poolings and the depthwise convolution share this:
// TensorFlow's "same" puts the odd padding element after (SAME_UPPER);
// Conv1D's "causal" pads (kernel - 1) * dilation before.
void set_padding(LayerCall& c, kiln_onnx::NodeProto* n, int rank) {
  const std::string padding = c.cfg.value("padding", "valid");
  if (padding == "causal" && rank == 1) {
    const int64_t k = int_list(c.cfg.at("kernel_size"), 1)[0],
                  d = int_list(c.cfg.value("dilation_rate", Json(1)), 1)[0];
    GraphBuilder::attr(n, "pads", std::vector<int64_t>{(k - 1) * d, 0});
    return;
  }
  if (padding != "valid" && padding != "same") c.refuse("uses padding '" + padding + "'; only valid and same export");
  const auto dilation = int_list(c.cfg.value("dilation_rate", Json(1)), rank);
  if (padding == "same" && *std::max_element(dilation.begin(), dilation.end()) > 1) {
    // ONNX Runtime refuses auto_pad with dilations; dilation > 1 means
    // strides 1 (as in Keras), so the pads are fixed: (k - 1) * d in all.
    const auto k = int_list(c.cfg.at("kernel_size"), rank);
    std::vector<int64_t> pads(2 * rank);
    for (int i = 0; i < rank; ++i) {
      const int64_t total = (k[i] - 1) * dilation[i];
      pads[i] = total / 2;
      pads[rank + i] = total - total / 2;
    }
    GraphBuilder::attr(n, "pads", pads);
    return;
  }
  GraphBuilder::attr(n, "auto_pad", std::string(padding == "same" ? "SAME_UPPER" : "VALID"));
}

// A convolution on channels-first `t` with an ONNX-layout kernel (out,
// in/group, k...); `spatial`: with the layer's strides, dilation_rate and
// padding (a 1x1 pointwise step has none).
std::string conv(LayerCall& c, const std::string& t, const at::Tensor& kernel, int64_t group, bool spatial,
                 const std::string& suffix) {
  const int rank = (int)kernel.dim() - 2;
  std::string y;
  auto* n = c.node("Conv", {t, c.b.constant(c.base + suffix + "_kernel", kernel.contiguous())}, &y, suffix);
  GraphBuilder::attr(n, "kernel_shape", std::vector<int64_t>(kernel.sizes().begin() + 2, kernel.sizes().end()));
  GraphBuilder::attr(n, "group", group);
  if (spatial) {
    GraphBuilder::attr(n, "strides", int_list(c.cfg.value("strides", Json(1)), rank));
    GraphBuilder::attr(n, "dilations", int_list(c.cfg.value("dilation_rate", Json(1)), rank));
    set_padding(c, n, rank);
  }
  return y;
}

// kiln rounds a 16-bit convolution, then adds the bias (channels-first), then the activation.
std::string conv_bias_activation(LayerCall& c, std::string y, int rank) {
  y = c.e.round_to(y, c.compute);
  if (c.cfg.value("use_bias", true)) {
    std::vector<int64_t> shape = {-1};
    for (int i = 0; i < rank; ++i) shape.push_back(1);
    y = c.e.round_to(c.op("Add", {y, c.b.constant(c.base + "_bias", c.tensor("bias").reshape(shape))}, "_bias"),
                     c.compute);
  }
  y = c.from_channels_first(y, rank);
  return c.e.activation(c.cfg.value("activation", "linear"), c.e.round_to(y, c.compute), c.where, c.compute);
}

// (x - mean) / sqrt(var + eps) over `axes` (biased variance), from
// primitive ops so that it runs on any opset >= 13.
std::string standardize(LayerCall& c, const std::string& x, const std::vector<int64_t>& axes, float eps) {
  auto d = c.op("Sub", {x, c.reduce("ReduceMean", x, axes, true, "_mean")}, "_centered");
  auto var = c.reduce("ReduceMean", c.op("Mul", {d, d}, "_sq"), axes, true, "_var");
  auto sd = c.op("Sqrt", {c.op("Add", {var, c.scalar(c.base + "_eps", eps)}, "_ve")}, "_sd");
  return c.op("Div", {d, sd}, "_norm");
}

}  // namespace

std::vector<std::string> export_conv(LayerCall& c) {
  const int rank = c.cls == "Conv1D" ? 1 : 2;
  // Keras's kernel (k..., in/groups, filters) -> ONNX's (filters, in/groups, k...).
  at::Tensor k = rank == 1 ? c.tensor("kernel").permute({2, 1, 0}) : c.tensor("kernel").permute({3, 2, 0, 1});
  auto y = conv(c, c.to_channels_first(c.x(), rank), k, c.cfg.value("groups", (int64_t)1), true, "_conv");
  return {conv_bias_activation(c, y, rank)};
}

std::vector<std::string> export_depthwise_conv(LayerCall& c) {
  // (kh, kw, in, m) -> (in * m, 1, kh, kw), group = in: output channel c * m + j.
  at::Tensor dk = c.tensor("depthwise_kernel");
  at::Tensor k = dk.reshape({dk.size(0), dk.size(1), -1}).permute({2, 0, 1}).unsqueeze(1);
  auto y = conv(c, c.to_channels_first(c.x(), 2), k, dk.size(2), true, "_depthwise");
  if (c.cls == "SeparableConv2D")  // the 1x1 pointwise kernel (1, 1, in * m, filters) -> (filters, in * m, 1, 1)
    y = conv(c, c.e.round_to(y, c.compute), c.tensor("pointwise_kernel").permute({3, 2, 0, 1}), 1, false, "_pointwise");
  return {conv_bias_activation(c, y, 2)};
}

std::vector<std::string> export_conv_transpose(LayerCall& c) {
  const Shape& s = c.input_shape();
  const bool last = c.channels_last();
  const auto k = int_list(c.cfg.at("kernel_size"), 2), st = int_list(c.cfg.value("strides", Json(1)), 2),
             d = int_list(c.cfg.value("dilation_rate", Json(1)), 2);
  const Json op = c.cfg.value("output_padding", Json(nullptr));
  const bool same = c.cfg.value("padding", "valid") == "same";
  // kiln keeps TensorFlow's window of the full transposed convolution
  // ((n-1)*s + k per axis): it starts at the forward convolution's leading
  // padding; what runs past the end is ONNX's output_padding.
  std::vector<int64_t> begin(2), end(2), extra(2);
  for (int i = 0; i < 2; ++i) {
    const int64_t n = s.at(last ? 1 + i : 2 + i);
    if (n < 0) c.refuse("has an unknown spatial size; build it on a fixed image size to export it");
    const int64_t kd = d[i] * (k[i] - 1) + 1;
    const int64_t len = op.is_null() ? (same ? n * st[i] : n * st[i] + std::max<int64_t>(kd - st[i], 0))
                                     : (n - 1) * st[i] + kd - 2 * (same ? kd / 2 : 0) + int_list(op, 2)[i];
    const int64_t full = (n - 1) * st[i] + kd;
    begin[i] = same ? std::max<int64_t>((n - 1) * st[i] + kd - len, 0) / 2 : 0;
    end[i] = std::max<int64_t>(full - len - begin[i], 0);
    extra[i] = std::max<int64_t>(len - (full - begin[i]), 0);
  }
  // Keras's kernel (kh, kw, filters, in) -> ONNX's (in, filters, kh, kw).
  std::string y;
  auto* n = c.node("ConvTranspose",
                   {c.to_channels_first(c.x(), 2),
                    c.b.constant(c.base + "_kernel", c.tensor("kernel").permute({3, 2, 0, 1}).contiguous())},
                   &y, "_convt");
  GraphBuilder::attr(n, "kernel_shape", k);
  GraphBuilder::attr(n, "strides", st);
  GraphBuilder::attr(n, "dilations", d);
  GraphBuilder::attr(n, "pads", std::vector<int64_t>{begin[0], begin[1], end[0], end[1]});
  if (extra[0] || extra[1]) {
    // ONNX's output_padding must stay below the stride: pad with zeros instead (kiln: zeros there).
    y = c.op("Pad", {y, c.b.ints(c.base + "_extra", {0, 0, 0, 0, 0, 0, extra[0], extra[1]})}, "_extra");
  }
  return {conv_bias_activation(c, y, 2)};
}

std::vector<std::string> export_pooling(LayerCall& c) {
  const int rank = c.cls.find("1D") != std::string::npos ? 1 : 2;
  const bool max = c.cls.rfind("Max", 0) == 0;
  std::string y;
  auto* n = c.node(max ? "MaxPool" : "AveragePool", {c.to_channels_first(c.x(), rank)}, &y, "_pool");
  auto pool = int_list(c.cfg.value("pool_size", Json(2)), rank);
  Json s = c.cfg.value("strides", Json(nullptr));
  GraphBuilder::attr(n, "kernel_shape", pool);
  GraphBuilder::attr(n, "strides", s.is_null() ? pool : int_list(s, rank));
  set_padding(c, n, rank);  // AveragePool's count_include_pad=0: padded cells are not counted, as kiln
  return {c.from_channels_first(y, rank)};
}

std::vector<std::string> export_global_pooling(LayerCall& c) {
  const int rank = c.cls.find("1D") != std::string::npos ? 1 : 2;
  std::vector<int64_t> axes;
  for (int i = 0; i < rank; ++i) axes.push_back(c.channels_last() ? 1 + i : 2 + i);
  return {c.reduce(c.cls.find("Average") != std::string::npos ? "ReduceMean" : "ReduceMax", c.x(), axes,
                   c.cfg.value("keepdims", false), "")};
}

std::vector<std::string> export_batch_normalization(LayerCall& c) {
  // Inference form folded into one scale and shift along `axis`.
  int64_t axis = c.cfg.value("axis", (int64_t)-1);
  const float eps = c.cfg.value("epsilon", 1e-3);
  at::Tensor mean = c.tensor("moving_mean"), var = c.tensor("moving_variance");
  at::Tensor gamma = c.w.count("gamma") ? c.w.at("gamma") : at::ones_like(mean);
  at::Tensor beta = c.w.count("beta") ? c.w.at("beta") : at::zeros_like(mean);
  at::Tensor scale = gamma / at::sqrt(var + eps);
  at::Tensor shift = beta - mean * scale;
  if (axis != -1) {
    const int64_t rank = c.input_shape().size();
    const int64_t a = axis < 0 ? axis + rank : axis;
    std::vector<int64_t> bshape(rank - a, 1);
    bshape[0] = mean.size(0);
    scale = scale.reshape(bshape);
    shift = shift.reshape(bshape);
  }
  auto y = c.op("Mul", {c.x(), c.b.constant(c.base + "_scale", scale)}, "_mul");
  return {c.op("Add", {y, c.b.constant(c.base + "_shift", shift)})};
}

std::vector<std::string> export_layer_normalization(LayerCall& c) {
  if (c.cfg.value("rms_scaling", false)) c.refuse("uses rms_scaling, which has no ONNX export");
  Json a = c.cfg.value("axis", Json(-1));
  std::vector<int64_t> axes = a.is_array() ? a.get<std::vector<int64_t>>() : std::vector<int64_t>{a.get<int64_t>()};
  std::string y = standardize(c, c.x(), axes, c.cfg.value("epsilon", 1e-3));
  // gamma/beta have the normalized axes' shape; they broadcast when those axes trail.
  if (c.w.count("gamma")) y = c.op("Mul", {y, c.weight("gamma")}, "_g");
  if (c.w.count("beta")) y = c.op("Add", {y, c.weight("beta")}, "_b");
  return {c.op("Identity", {y})};
}

std::vector<std::string> export_group_normalization(LayerCall& c) {
  const Shape& s = c.input_shape();
  const int64_t rank = s.size();
  int64_t axis = c.cfg.value("axis", (int64_t)-1);
  if (axis < 0) axis += rank;
  const int64_t channels = s.at(axis);
  int64_t groups = c.cfg.value("groups", (int64_t)32);
  if (groups == -1) groups = channels;
  // Channels last, split into (groups, channels / groups); statistics over
  // every axis but the batch and the group.
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i)
    if (i != axis) perm.push_back(i);
  perm.push_back(axis);
  std::string t = axis == rank - 1 ? c.x() : c.transpose(c.x(), perm, "_clast");
  auto shape = c.op("Shape", {t}, "_shape");
  auto grouped = c.op("Reshape", {t, c.b.ints(c.base + "_groups", {0, -1, groups, channels / groups})}, "_grouped");
  std::string y = c.op("Reshape", {standardize(c, grouped, {1, 3}, c.cfg.value("epsilon", 1e-3)), shape}, "_y");
  if (c.w.count("gamma")) y = c.op("Mul", {y, c.weight("gamma")}, "_g");
  if (c.w.count("beta")) y = c.op("Add", {y, c.weight("beta")}, "_b");
  if (axis != rank - 1) {
    std::vector<int64_t> back(rank);
    for (int64_t i = 0; i < rank; ++i) back[perm[i]] = i;
    y = c.transpose(y, back, "_back");
  }
  return {c.op("Identity", {y})};
}

}  // namespace kiln::exporter::onnx
