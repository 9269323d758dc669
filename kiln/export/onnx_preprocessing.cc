// ONNX exporters of the preprocessing layers that live in the model:
// Rescaling, Normalization, CategoryEncoding, Resizing, IntegerLookup.
#include "kiln/export/onnx_graph.h"

#include <algorithm>

#include "kiln/layers/preprocessing.h"

namespace kiln::exporter::onnx {

std::vector<std::string> export_rescaling(LayerCall& c) {
  auto as_tensor = [](const Json& j) {
    return j.is_array() ? at::tensor(j.get<std::vector<double>>(), at::kFloat)
                        : at::scalar_tensor(j.get<double>(), at::kFloat);
  };
  // kiln: x * scale + offset in the compute dtype, each step rounded.
  auto in_compute = [&](const at::Tensor& t) { return is_16bit(c.compute) ? t.to(c.compute).to(at::kFloat) : t; };
  auto y = c.op("Mul", {c.x(), c.b.constant(c.base + "_scale", in_compute(as_tensor(c.cfg.at("scale"))))}, "_mul");
  y = c.e.round_to(y, c.compute);
  return {c.op("Add", {y, c.b.constant(c.base + "_offset", in_compute(as_tensor(c.cfg.at("offset"))))})};
}

std::vector<std::string> export_normalization(LayerCall& c) {
  auto* n = dynamic_cast<layers::NormalizationImpl*>(&c.layer);
  if (!n) c.refuse("is not kiln's Normalization");
  at::Tensor m = n->mean().to(at::kFloat), v = n->variance().to(at::kFloat);
  at::Tensor sd = at::clamp_min(at::sqrt(v), 1e-7);
  if (c.cfg.value("invert", false))
    return {c.op("Add",
                 {c.op("Mul", {c.x(), c.b.constant(c.base + "_std", sd)}, "_mul"), c.b.constant(c.base + "_mean", m)})};
  auto d = c.op("Sub", {c.x(), c.b.constant(c.base + "_mean", m)}, "_sub");
  return {c.op("Div", {d, c.b.constant(c.base + "_std", sd)})};
}

std::vector<std::string> export_category_encoding(LayerCall& c) {
  const int64_t depth = c.cfg.at("num_tokens").get<int64_t>();
  const std::string mode = c.cfg.value("output_mode", "multi_hot");
  const Shape& s = c.input_shape();
  std::string ids = c.cast(c.x(), kiln_onnx::TensorProto::INT64, "_ids");  // floats truncate, as kiln
  if (mode == "one_hot" && s.size() == 2 && s[1] == 1) ids = c.squeeze(ids, {1}, "_ids1");
  return {encode_ids(c, ids, depth, s.size() == 1 ? "one_hot" : mode)};  // rank 1: one id per sample
}

std::string encode_ids(LayerCall& c, const std::string& ids, int64_t depth, const std::string& mode) {
  std::string oh;
  GraphBuilder::attr(
      c.node("OneHot",
             {ids, c.b.ints(c.base + "_depth", {depth}), c.b.constant(c.base + "_values", at::tensor({0.0f, 1.0f}))},
             &oh, "_one_hot"),
      "axis", (int64_t)-1);
  if (mode == "one_hot") return oh;
  auto counts = c.reduce("ReduceSum", oh, {1}, false, "_counts");
  if (mode == "count") return counts;
  return c.op("Min", {counts, c.scalar(c.base + "_one", 1.0f)});
}

// Resizing: optional centred crop or pad to the target aspect ratio (static
// sizes), then ONNX Resize with half-pixel centres: bilinear is
// upsample_bilinear2d(align_corners=false), nearest kiln's
// floor((i + 0.5) * in / out), i.e. half_pixel with round_prefer_ceil.
std::vector<std::string> export_resizing(LayerCall& c) {
  const Shape& s = c.input_shape();
  if (s.size() != 4) c.refuse("takes image batches (batch, height, width, channels) in ONNX export");
  const int64_t height = c.cfg.at("height").get<int64_t>(), width = c.cfg.at("width").get<int64_t>();
  std::string x = c.x();
  if (!at::isFloatingType(c.e.type_of(x))) x = c.cast(x, kiln_onnx::TensorProto::FLOAT, "_float");
  x = c.to_channels_first(x, 2);  // (N, C, H, W)
  const bool crop = c.cfg.value("crop_to_aspect_ratio", false), pad = c.cfg.value("pad_to_aspect_ratio", false);
  if (crop || pad) {
    const int64_t h = s[c.channels_last() ? 1 : 2], w = s[c.channels_last() ? 2 : 3];
    if (h < 0 || w < 0) c.refuse("crops or pads to an aspect ratio of images of unknown size; give the Input a size");
    if (crop) {
      const int64_t ch = std::max<int64_t>(std::min<int64_t>(h, (int64_t)((double)(w * height) / width)), 1);
      const int64_t cw = std::max<int64_t>(std::min<int64_t>(w, (int64_t)((double)(h * width) / height)), 1);
      const int64_t hs = (int64_t)((double)(h - ch) / 2), ws = (int64_t)((double)(w - cw) / 2);
      x = c.slice(x, {hs, ws}, {hs + ch, ws + cw}, {2, 3}, "_crop");
    } else {
      const int64_t ph = std::max<int64_t>(h, (int64_t)((double)(w * height) / width));
      const int64_t pw = std::max<int64_t>(w, (int64_t)((double)(h * width) / height));
      const int64_t hs = (int64_t)((double)(ph - h) / 2), ws = (int64_t)((double)(pw - w) / 2);
      x = c.op("Pad",
               {x, c.b.ints(c.base + "_pads", {0, 0, hs, ws, 0, 0, ph - h - hs, pw - w - ws}),
                c.scalar(c.base + "_fill", c.cfg.value("fill_value", 0.0))},
               "_pad");
    }
  }
  auto nc = c.slice(c.op("Shape", {x}, "_shape"), {0}, {2}, {0}, "_nc_size");
  std::string sizes;
  GraphBuilder::attr(c.node("Concat", {nc, c.b.ints(c.base + "_hw", {height, width})}, &sizes, "_sizes"), "axis",
                     (int64_t)0);
  std::string y;
  const bool bilinear = c.cfg.value("interpolation", "bilinear") == "bilinear";
  auto* n = c.node("Resize", {x, "", "", sizes}, &y, "_resize");
  GraphBuilder::attr(n, "mode", std::string(bilinear ? "linear" : "nearest"));
  GraphBuilder::attr(n, "coordinate_transformation_mode", std::string("half_pixel"));
  if (!bilinear) GraphBuilder::attr(n, "nearest_mode", std::string("round_prefer_ceil"));
  return {c.from_channels_first(y, 2)};
}

// IntegerLookup (output_mode "int"): [mask_token -> 0] [OOV ids] [vocabulary]
// by comparing each id with the whole vocabulary; an unknown id goes to
// oov_start + floormod(id, num_oov_indices), as kiln.
std::vector<std::string> export_integer_lookup(LayerCall& c) {
  if (c.cfg.value("invert", false) || c.cfg.value("output_mode", "int") != "int")
    c.refuse("exports with output_mode \"int\" and invert=false only; encode its ids with a CategoryEncoding layer");
  const Json vocab = c.cfg.value("vocabulary", Json(nullptr));
  if (!vocab.is_array() || vocab.empty()) c.refuse("has no vocabulary; adapt() it or give one before exporting");
  const int64_t num_oov = c.cfg.value("num_oov_indices", (int64_t)1);
  if (num_oov < 1)
    c.refuse(
        "has num_oov_indices=0, where kiln raises an error for an unknown id, which an ONNX graph cannot; "
        "export it with num_oov_indices >= 1");
  const Json mask_token = c.cfg.value("mask_token", Json(nullptr));
  const int64_t oov_start = mask_token.is_null() ? 0 : 1, token_start = oov_start + num_oov;
  auto ids = c.cast(c.x(), kiln_onnx::TensorProto::INT64, "_ids");  // floats truncate, as kiln
  auto hits = c.cast(
      c.op("Equal",
           {c.unsqueeze(ids, {-1}, "_ids1"), c.b.ints(c.base + "_vocabulary", vocab.get<std::vector<int64_t>>())},
           "_eq"),
      kiln_onnx::TensorProto::FLOAT, "_hits");
  std::string position;
  auto* n = c.node("ArgMax", {hits}, &position, "_position");
  GraphBuilder::attr(n, "axis", (int64_t)-1);
  GraphBuilder::attr(n, "keepdims", (int64_t)0);
  auto known = c.cast(c.reduce("ReduceMax", hits, {-1}, false, "_found"), kiln_onnx::TensorProto::BOOL, "_known");
  std::string floormod;
  GraphBuilder::attr(
      c.node("Mod", {ids, c.b.constant(c.base + "_num_oov", at::scalar_tensor(num_oov, at::kLong))}, &floormod, "_mod"),
      "fmod", (int64_t)0);  // integer Mod with fmod=0 takes the divisor's sign: a floor mod
  auto oov =
      c.op("Add", {floormod, c.b.constant(c.base + "_oov_start", at::scalar_tensor(oov_start, at::kLong))}, "_oov");
  auto token = c.op("Add", {position, c.b.constant(c.base + "_token_start", at::scalar_tensor(token_start, at::kLong))},
                    "_token");
  std::string y = c.op("Where", {known, token, oov}, "_index");
  if (!mask_token.is_null())
    y = c.op("Where",
             {c.op("Equal",
                   {ids, c.b.constant(c.base + "_mask_token", at::scalar_tensor(mask_token.get<int64_t>(), at::kLong))},
                   "_is_mask"),
              c.b.constant(c.base + "_zero", at::scalar_tensor(0, at::kLong)), y},
             "_masked");
  y = c.op("Identity", {y});
  c.e.set_type(y, at::kLong);
  return {y};
}

}  // namespace kiln::exporter::onnx
