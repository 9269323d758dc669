// ONNX exporter of MultiHeadAttention.
#include "kiln/export/onnx_graph.h"

#include <cmath>
#include <map>

namespace kiln::exporter::onnx {

// MultiHeadAttention: its four EinsumDense projections, then
// softmax(q k^T / sqrt(key_dim)) with masked logits at -1e9, as kiln.
std::vector<std::string> export_multi_head_attention(LayerCall& c) {
  if (c.in.size() < 2) c.refuse("needs [query, value], [query, value, key] or [query, value, key, attention_mask]");
  std::map<std::string, Layer*> dense;
  for (auto& s : c.layer.sublayers()) dense[s->name()] = s.get();
  for (auto n : {"query", "key", "value", "attention_output"})
    if (!dense.count(n)) throw StateError("export_onnx: " + c.where + " is not built; build the model first");
  const std::string& query = c.in[0];
  const std::string& value = c.in[1];
  const std::string& key = c.in.size() > 2 ? c.in[2] : value;
  const double key_dim = c.cfg.at("key_dim").get<double>();
  auto q = c.e.emit(*dense.at("query"), {query}).at(0);
  q = c.e.round_to(c.op("Mul", {q, c.scalar(c.base + "_scale", (float)(1.0 / std::sqrt(key_dim)))}, "_q"), c.compute);
  auto k = c.e.emit(*dense.at("key"), {key}).at(0);
  auto v = c.e.emit(*dense.at("value"), {value}).at(0);
  std::string logits;
  GraphBuilder::attr(c.node("Einsum", {k, q}, &logits, "_logits"), "equation", std::string("aecd,abcd->acbe"));
  logits = c.e.round_to(logits, c.compute);  // (B, N, T, S)
  std::string mask;                          // (B or 1, T, S) bool, true = attend
  if (c.in.size() > 3) mask = c.cast(c.in[3], kiln_onnx::TensorProto::BOOL, "_mask");
  if (c.cfg.value("use_causal_mask", false)) {
    // Query i attends to keys j <= i: the lower triangle of a (T, S) matrix of ones.
    auto ts = c.slice(c.op("Shape", {logits}, "_lshape"), {2}, {4}, {0}, "_ts");
    std::string ones;
    auto* n = c.node("ConstantOfShape", {ts}, &ones, "_ones");
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(kiln_onnx::AttributeProto::TENSOR);
    auto* t = a->mutable_t();
    t->set_data_type(kiln_onnx::TensorProto::FLOAT);
    t->add_dims(1);
    const float one = 1.0f;
    t->set_raw_data(std::string(reinterpret_cast<const char*>(&one), sizeof one));
    std::string tril;
    GraphBuilder::attr(c.node("Trilu", {ones}, &tril, "_tril"), "upper", (int64_t)0);
    auto causal = c.unsqueeze(c.cast(tril, kiln_onnx::TensorProto::BOOL, "_causal_b"), {0}, "_causal");
    mask = mask.empty() ? causal : c.op("And", {mask, causal}, "_mask_and");
  }
  if (!mask.empty()) {
    const float large_negative = c.compute == at::kHalf ? -3e4f : -1e9f;
    logits =
        c.op("Where", {c.unsqueeze(mask, {1}, "_mask4"), logits, c.scalar(c.base + "_large_negative", large_negative)},
             "_masked");
  }
  std::string scores;
  GraphBuilder::attr(c.node("Softmax", {logits}, &scores, "_scores"), "axis", (int64_t)-1);
  scores = c.e.round_to(scores, c.compute);
  std::string context;
  GraphBuilder::attr(c.node("Einsum", {scores, v}, &context, "_context"), "equation", std::string("acbe,aecd->abcd"));
  return {c.e.emit(*dense.at("attention_output"), {c.e.round_to(context, c.compute)}).at(0)};
}

}  // namespace kiln::exporter::onnx
