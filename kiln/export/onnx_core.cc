// ONNX exporters of the core layers: Dense, EinsumDense, the activations,
// merges, Embedding, Masking, the layers that only move data (Flatten,
// Reshape, Permute, RepeatVector, ZeroPadding2D, Cropping2D, UpSampling2D)
// and nested models.
#include "kiln/export/onnx_graph.h"

#include <array>
#include <limits>

namespace kiln::exporter::onnx {
namespace {

// ((top, bottom), (left, right)) of ZeroPadding2D / Cropping2D.
std::array<std::array<int64_t, 2>, 2> margins(const Json& j) {
  return {{{j[0][0].get<int64_t>(), j[0][1].get<int64_t>()}, {j[1][0].get<int64_t>(), j[1][1].get<int64_t>()}}};
}

}  // namespace

std::vector<std::string> export_identity(LayerCall& c) { return {c.op("Identity", {c.x()})}; }

std::vector<std::string> export_dense(LayerCall& c) {
  std::string y;
  const bool int8 = c.int8;
  if (int8)
    y = c.e.int8_matmul(c.layer, c.x(), c.raw, c.where);
  else
    y = c.op("MatMul", {c.x(), c.weight("kernel")}, "_matmul");
  // kiln's GEMMs accumulate in float32 and round once: with the bias for
  // 2-D inputs (addmm) and int8; the product, then the sum otherwise.
  const bool fused_bias = int8 || c.input_shape().size() == 2;
  if (!fused_bias) y = c.e.round_to(y, c.compute);
  if (c.cfg.value("use_bias", true)) y = c.op("Add", {y, c.weight("bias")}, "_bias");
  y = c.e.round_to(y, c.compute);
  return {c.e.activation(c.cfg.value("activation", "linear"), y, c.where, c.compute)};
}

std::vector<std::string> export_einsum_dense(LayerCall& c) {
  std::string y;
  GraphBuilder::attr(c.node("Einsum", {c.x(), c.weight("kernel")}, &y, "_einsum"), "equation",
                     c.cfg.at("equation").get<std::string>());
  if (c.w.count("bias")) y = c.op("Add", {c.e.round_to(y, c.compute), c.weight("bias")}, "_bias");
  return {c.e.activation(c.cfg.value("activation", "linear"), c.e.round_to(y, c.compute), c.where, c.compute)};
}

std::vector<std::string> export_activation(LayerCall& c) {
  return {c.e.activation(c.cfg.value("activation", "linear"), c.x(), c.where, c.compute)};
}

std::vector<std::string> export_relu(LayerCall& c) {
  const double slope = c.cfg.value("negative_slope", 0.0), threshold = c.cfg.value("threshold", 0.0);
  const Json max_value = c.cfg.value("max_value", Json(nullptr));
  std::string y;
  if (slope != 0.0 && max_value.is_null() && threshold == 0.0) {
    GraphBuilder::attr(c.node("LeakyRelu", {c.x()}, &y), "alpha", (float)slope);
    return {y};
  }
  // Keras 3's activations.relu, term by term (as kiln's ReLU).
  if (threshold != 0.0)
    y = c.op("Mul",
             {c.x(), c.cast(c.op("Greater", {c.x(), c.scalar(c.base + "_threshold", threshold)}, "_gt"),
                            kiln_onnx::TensorProto::FLOAT, "_gtf")},
             "_thr");
  else
    y = c.op("Relu", {c.x()}, "_relu");
  if (!max_value.is_null())
    y = c.op("Clip", {y, c.scalar(c.base + "_zero", 0.0f), c.scalar(c.base + "_max", max_value.get<double>())},
             "_clip");
  if (slope != 0.0) {
    auto below = c.op("Relu", {c.op("Sub", {c.scalar(c.base + "_threshold", threshold), c.x()}, "_tx")}, "_neg");
    y = c.op("Sub", {y, c.op("Mul", {below, c.scalar(c.base + "_slope", slope)}, "_negs")});
  }
  return {y};
}

std::vector<std::string> export_leaky_relu(LayerCall& c) {
  std::string y;
  GraphBuilder::attr(c.node("LeakyRelu", {c.x()}, &y), "alpha", (float)c.cfg.value("negative_slope", 0.3));
  return {y};
}

std::vector<std::string> export_prelu(LayerCall& c) { return {c.op("PRelu", {c.x(), c.weight("alpha")})}; }

std::vector<std::string> export_softmax(LayerCall& c) {
  const Json axis = c.cfg.value("axis", Json(-1));
  std::string y;
  if (!axis.is_array() || axis.size() == 1) {
    GraphBuilder::attr(c.node("Softmax", {c.x()}, &y), "axis",
                       axis.is_array() ? axis[0].get<int64_t>() : axis.get<int64_t>());
    return {y};
  }
  // Several axes: exp(x - max) / sum(exp(x - max)) over all of them.
  const auto axes = axis.get<std::vector<int64_t>>();
  auto e = c.op("Exp", {c.op("Sub", {c.x(), c.reduce("ReduceMax", c.x(), axes, true, "_max")}, "_shift")}, "_exp");
  return {c.op("Div", {e, c.reduce("ReduceSum", e, axes, true, "_sum")})};
}

std::vector<std::string> export_merge(LayerCall& c) {
  if (c.in.size() < 2) c.refuse("needs at least 2 inputs");
  if (c.cls == "Subtract") return {c.op("Sub", {c.in[0], c.in[1]})};
  const std::string op = c.cls == "Add" || c.cls == "Average" ? "Add"
                         : c.cls == "Multiply"                ? "Mul"
                         : c.cls == "Maximum"                 ? "Max"
                                                              : "Min";
  std::string acc = c.in[0];
  for (size_t i = 1; i < c.in.size(); ++i)
    acc = c.op(op, {acc, c.in[i]}, i + 1 == c.in.size() && c.cls != "Average" ? "" : "_acc");
  if (c.cls == "Average") acc = c.op("Div", {acc, c.scalar(c.base + "_n", (float)c.in.size())});
  return {acc};
}

std::vector<std::string> export_concatenate(LayerCall& c) {
  std::string out;
  GraphBuilder::attr(c.node("Concat", c.in, &out), "axis", c.cfg.value("axis", (int64_t)-1));
  return {out};
}

std::vector<std::string> export_flatten(LayerCall& c) {
  if (!c.channels_last()) c.refuse("with data_format channels_first is not supported");
  std::string out;
  GraphBuilder::attr(c.node("Flatten", {c.x()}, &out), "axis", (int64_t)1);
  return {out};
}

std::vector<std::string> export_reshape(LayerCall& c) {
  std::vector<int64_t> target = {0};  // 0: keep the batch dimension
  for (auto& d : c.cfg.at("target_shape")) target.push_back(d.get<int64_t>());
  return {c.op("Reshape", {c.x(), c.b.ints(c.base + "_shape", target)})};
}

std::vector<std::string> export_permute(LayerCall& c) {
  std::vector<int64_t> perm = {0};  // `dims` are 1-based non-batch axes
  for (auto& d : c.cfg.at("dims")) perm.push_back(d.get<int64_t>());
  return {c.transpose(c.x(), perm, "")};
}

std::vector<std::string> export_repeat_vector(LayerCall& c) {
  auto y = c.unsqueeze(c.x(), {1}, "_unsq");
  return {c.op("Tile", {y, c.b.ints(c.base + "_repeats", {1, c.cfg.at("n").get<int64_t>(), 1})})};
}

std::vector<std::string> export_zero_padding_2d(LayerCall& c) {
  auto m = margins(c.cfg.at("padding"));
  // ONNX pads: every axis's start, then every axis's end.
  std::vector<int64_t> pads = c.channels_last() ? std::vector<int64_t>{0, m[0][0], m[1][0], 0, 0, m[0][1], m[1][1], 0}
                                                : std::vector<int64_t>{0, 0, m[0][0], m[1][0], 0, 0, m[0][1], m[1][1]};
  return {c.op("Pad", {c.x(), c.b.ints(c.base + "_pads", pads)})};
}

std::vector<std::string> export_cropping_2d(LayerCall& c) {
  auto m = margins(c.cfg.at("cropping"));
  const int64_t h = c.channels_last() ? 1 : 2;
  auto end = [](int64_t crop) { return crop == 0 ? std::numeric_limits<int64_t>::max() : -crop; };
  return {c.slice(c.x(), {m[0][0], m[1][0]}, {end(m[0][1]), end(m[1][1])}, {h, h + 1}, "")};
}

std::vector<std::string> export_up_sampling_2d(LayerCall& c) {
  auto size = int_list(c.cfg.value("size", Json(2)), 2);
  const bool bilinear = c.cfg.value("interpolation", "nearest") == "bilinear";
  auto t = c.to_channels_first(c.x(), 2);
  std::string y;
  auto* n = c.node("Resize",
                   {t, "", c.b.constant(c.base + "_scales", at::tensor({1.0f, 1.0f, (float)size[0], (float)size[1]}))},
                   &y, "_resize");
  // nearest repeats rows and columns (source = floor(dest / size)); bilinear
  // uses half-pixel centres, edges clamped, as kiln (TensorFlow's resize).
  GraphBuilder::attr(n, "mode", std::string(bilinear ? "linear" : "nearest"));
  GraphBuilder::attr(n, "coordinate_transformation_mode", std::string(bilinear ? "half_pixel" : "asymmetric"));
  if (!bilinear) GraphBuilder::attr(n, "nearest_mode", std::string("floor"));
  return {c.from_channels_first(y, 2)};
}

std::vector<std::string> export_embedding(LayerCall& c) {
  auto idx = c.cast(c.x(), kiln_onnx::TensorProto::INT64, "_idx");
  if (c.int8) return {c.e.int8_gather(c.raw, idx, c.base, c.where)};
  std::string out;
  GraphBuilder::attr(c.node("Gather", {c.weight("embeddings"), idx}, &out), "axis", (int64_t)0);
  return {out};
}

std::vector<std::string> export_masking(LayerCall& c) {
  // x * any(x != mask_value, last axis); the mask itself stays out of the graph.
  auto differs = c.op(
      "Not", {c.op("Equal", {c.x(), c.scalar(c.base + "_mask_value", c.cfg.value("mask_value", 0.0))}, "_eq")}, "_ne");
  auto keep = c.reduce("ReduceMax", c.cast(differs, kiln_onnx::TensorProto::FLOAT, "_nef"), {-1}, true, "_keep");
  return {c.op("Mul", {c.x(), keep})};
}

std::vector<std::string> export_model(LayerCall& c) {
  auto* m = dynamic_cast<models::Model*>(&c.layer);
  if (!m) c.refuse("is not a kiln model");
  return c.e.emit_model(*m, c.in);
}

}  // namespace kiln::exporter::onnx
