// Internal to kiln/export: what the ONNX exporters share. GraphBuilder
// writes one GraphProto; LayerEmitter turns layer applications into ops
// (16-bit rounding, masks, int8 kernels); an exporter turns one LayerCall
// (one application of one layer) into ops. The exporters live by layer
// family in onnx_<family>.cc; onnx_export.cc holds the table of them by
// class name and the public API (onnx_export.h).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/models/functional.h"
#include "kiln_onnx/onnx.pb.h"

namespace kiln::exporter::onnx {

int32_t onnx_type(at::ScalarType t);
// A Keras int-or-list option as `rank` ints.
std::vector<int64_t> int_list(const Json& j, size_t rank);

// Builds one GraphProto.
class GraphBuilder {
 public:
  // `opset`: the ai.onnx opset the graph is written for.
  GraphBuilder(kiln_onnx::GraphProto* g, int64_t opset = 17) : g_(g), opset_(opset) {}

  int64_t opset() const { return opset_; }
  // Notes that a node uses operator domain `domain` (e.g. "ai.onnx.ml") at `version`.
  void use_domain(const std::string& domain, int64_t version) { domains_[domain] = version; }
  const std::map<std::string, int64_t>& domains() const { return domains_; }

  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int i = 1; used_.count(name); ++i) name = base + "_" + std::to_string(i);
    used_.insert(name);
    return name;
  }

  std::string constant(const std::string& base, const at::Tensor& value) {
    auto t = value.contiguous().cpu();
    auto* init = g_->add_initializer();
    std::string name = fresh(base);
    init->set_name(name);
    init->set_data_type(onnx_type(t.scalar_type()));
    for (auto d : t.sizes()) init->add_dims(d);
    init->set_raw_data(std::string(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size()));
    return name;
  }

  std::string ints(const std::string& base, const std::vector<int64_t>& v) {
    return constant(base, at::tensor(v, at::kLong));
  }

  kiln_onnx::NodeProto* node(const std::string& op, const std::vector<std::string>& inputs, const std::string& out) {
    auto* n = g_->add_node();
    n->set_op_type(op);
    n->set_name(out);
    for (auto& i : inputs) n->add_input(i);
    n->add_output(out);
    return n;
  }
  std::string op(const std::string& op, const std::vector<std::string>& inputs, const std::string& base) {
    std::string out = fresh(base);
    node(op, inputs, out);
    return out;
  }

  static void attr(kiln_onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(kiln_onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr(kiln_onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(kiln_onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void attr(kiln_onnx::NodeProto* n, const std::string& name, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(kiln_onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  static void attr(kiln_onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(kiln_onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }

  void value_info(google::protobuf::RepeatedPtrField<kiln_onnx::ValueInfoProto>* list, const std::string& name,
                  at::ScalarType type, const Shape& shape) {
    auto* v = list->Add();
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx_type(type));
    auto* s = tt->mutable_shape();
    for (size_t i = 0; i < shape.size(); ++i) {
      auto* d = s->add_dim();
      if (shape[i] < 0)
        d->set_dim_param(i == 0 ? "batch" : "d" + std::to_string(i));
      else
        d->set_dim_value(shape[i]);
    }
  }

  kiln_onnx::GraphProto* graph() { return g_; }

 private:
  kiln_onnx::GraphProto* g_;
  const int64_t opset_;
  std::set<std::string> used_;
  std::map<std::string, int64_t> domains_;  // operator domains beyond ai.onnx -> opset version
};

inline bool is_16bit(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }
// ReduceSum's axes became an input at opset 13, the other reductions' at 18.
inline bool reduce_takes_axes_input(const std::string& type, int64_t opset) {
  return type == "ReduceSum" || opset >= 18;
}

class LayerEmitter;

// One application of one layer, as its exporter sees it.
struct LayerCall {
  LayerEmitter& e;
  GraphBuilder& b;
  Layer& layer;
  const std::string cls;
  const Json cfg;  // layer.get_config(): exporters read options from it only
  const std::string base;
  const std::string where;  // "layer 'name' (Class)" for errors
  const at::ScalarType compute;
  const bool int8;  // an int8 layer, or an int8_qat one exported as quantize("int8") converts it
  const std::vector<std::string>& in;
  std::map<std::string, at::Tensor> w;    // float32 weights (rounded to `compute` when kiln reads them so)
  std::map<std::string, at::Tensor> raw;  // as stored

  const std::string& x() const { return in.at(0); }
  const at::Tensor& tensor(const std::string& n) const {
    auto it = w.find(n);
    if (it == w.end()) throw StateError("export_onnx: " + where + " has no `" + n + "` weight; build the model first");
    return it->second;
  }
  std::string weight(const std::string& n) { return b.constant(base + "_" + n, tensor(n)); }
  bool channels_last() const { return cfg.value("data_format", "channels_last") == "channels_last"; }
  const Shape& input_shape(size_t i = 0) const { return layer.build_input_shapes().at(i); }
  [[noreturn]] void refuse(const std::string& what) const { throw ValueError("export_onnx: " + where + " " + what); }

  // Small op helpers (opset 13+ forms: axes as inputs where ONNX moved them there).
  std::string op(const std::string& type, const std::vector<std::string>& ins, const std::string& suffix = "") {
    return b.op(type, ins, base + suffix);
  }
  kiln_onnx::NodeProto* node(const std::string& type, const std::vector<std::string>& ins, std::string* out,
                             const std::string& suffix = "") {
    *out = b.fresh(base + suffix);
    return b.node(type, ins, *out);
  }
  std::string transpose(const std::string& v, const std::vector<int64_t>& perm, const std::string& suffix) {
    std::string out;
    GraphBuilder::attr(node("Transpose", {v}, &out, suffix), "perm", perm);
    return out;
  }
  std::string unsqueeze(const std::string& v, const std::vector<int64_t>& axes, const std::string& suffix) {
    return op("Unsqueeze", {v, b.ints("axes", axes)}, suffix);
  }
  std::string squeeze(const std::string& v, const std::vector<int64_t>& axes, const std::string& suffix) {
    return op("Squeeze", {v, b.ints("axes", axes)}, suffix);
  }
  std::string slice(const std::string& v, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                    const std::vector<int64_t>& axes, const std::string& suffix,
                    const std::vector<int64_t>& steps = {}) {
    std::vector<std::string> ins = {v, b.ints("starts", starts), b.ints("ends", ends), b.ints("axes", axes)};
    if (!steps.empty()) ins.push_back(b.ints("steps", steps));
    return op("Slice", ins, suffix);
  }
  std::string reduce(const std::string& type, const std::string& v, const std::vector<int64_t>& axes, bool keepdims,
                     const std::string& suffix) {
    std::string out;
    auto* n = node(type, {v}, &out, suffix);
    if (reduce_takes_axes_input(type, b.opset()))
      n->add_input(b.ints("axes", axes));
    else
      GraphBuilder::attr(n, "axes", axes);
    GraphBuilder::attr(n, "keepdims", (int64_t)(keepdims ? 1 : 0));
    return out;
  }
  std::string scalar(const std::string& name, float v) { return b.constant(name, at::scalar_tensor(v)); }
  std::string cast(const std::string& v, int64_t to, const std::string& suffix) {
    std::string out;
    GraphBuilder::attr(node("Cast", {v}, &out, suffix), "to", to);
    return out;
  }
  // Channels-last (N, spatial..., C) <-> ONNX's (N, C, spatial...) for `rank` spatial axes.
  std::string to_channels_first(const std::string& v, int rank) {
    if (!channels_last()) return v;
    std::vector<int64_t> perm = {0, rank + 1};
    for (int i = 1; i <= rank; ++i) perm.push_back(i);
    return transpose(v, perm, "_nc");
  }
  std::string from_channels_first(const std::string& v, int rank) {
    if (!channels_last()) return v;
    std::vector<int64_t> perm = {0};
    for (int i = 2; i <= rank + 1; ++i) perm.push_back(i);
    perm.push_back(1);
    return transpose(v, perm, "_nlast");
  }
};

using Exporter = std::vector<std::string> (*)(LayerCall&);
const std::map<std::string, Exporter>& exporters();
std::string no_export_reason(const std::string& cls);

// Emits the ONNX ops of one layer application.
//
// Precision: every float value in the graph is float32; a value kiln holds
// in bfloat16 or float16 (a layer under a 16-bit policy) is rounded to that
// dtype where kiln rounds, by a Cast to it and back (ONNX Runtime's CPU
// kernels have no bfloat16 MatMul; the round trip is exact emulation of the
// rounding). `types_` remembers which dtype each value is kiln's.
//
// Masks: `masked_` holds the values that carry a kiln mask (Embedding with
// mask_zero, Masking, and layers that pass masks on). The graph does not
// compute masks; a layer that would use one is refused (LayerCall::refuse).
class LayerEmitter {
 public:
  LayerEmitter(GraphBuilder& b, bool qat_as_int8) : b_(b), qat_as_int8_(qat_as_int8) {}

  // The dtype kiln gives `value` (graph inputs; float32 when unknown).
  void set_type(const std::string& value, at::ScalarType t) { types_[value] = t; }
  at::ScalarType type_of(const std::string& value) const;
  bool masked(const std::string& value) const { return masked_.count(value) > 0; }

  // `x` rounded to `t` (bfloat16 or float16) as kiln's x.to(t) does; x itself
  // when it already holds values of `t` or `t` is not a 16-bit float.
  std::string round_to(const std::string& x, at::ScalarType t);

  std::vector<std::string> emit(Layer& layer, const std::vector<std::string>& in);

  // The ops of a whole Sequential or Functional model applied to `in` (graph
  // inputs at the top level, values of the outer graph when nested).
  std::vector<std::string> emit_model(models::Model& model, const std::vector<std::string>& in);

  // `compute`: the dtype kiln applies the activation in; the result is rounded
  // to it by the caller.
  std::string activation(const std::string& act, const std::string& x, const std::string& where,
                         at::ScalarType compute = at::kFloat);

  // kiln's int8 kernel (kiln/quantization/kernels.cc) from primitive ops,
  // without the bias: inputs quantized per row with abs-max scales
  // xs = 127 / (max|x| + 1e-7) (dynamic) or with the calibrated `inputs_scale`
  // (static), xq = clip(round(x * xs), -127, 127) as int8 (Round: half to
  // even, as at::round), the exact int32 product with the int8 kernel
  // (MatMulInteger, int8 x int8), then acc / (xs * kernel_scale).
  std::string int8_matmul(Layer& layer, const std::string& x, const std::map<std::string, at::Tensor>& raw,
                          const std::string& where);

  // An int8 Embedding: int8 rows and one scale per row, float(row) / scale.
  std::string int8_gather(const std::map<std::string, at::Tensor>& raw, const std::string& idx, const std::string& base,
                          const std::string& where);

 private:
  static bool keeps_float32_weights(const std::string& cls);
  // Layers whose kiln implementation uses the input's mask.
  static const std::set<std::string>& exporters_that_consume_masks();

  std::vector<std::string> emit_functional(models::FunctionalImpl& f, const std::vector<std::string>& in);

  // Refuses precisions whose numerics the graph would not reproduce; true
  // for a layer exported as int8.
  bool check_precision(Layer& layer, const std::string& where) const;

  static const at::Tensor& raw_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                                      const std::string& where);
  std::string int8_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                          const std::string& base, const std::string& where);
  static at::Tensor float_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                                 const std::string& where);
  std::string to_float(const std::string& x, const std::string& base);

  GraphBuilder& b_;
  const bool qat_as_int8_;
  std::map<std::string, at::ScalarType> types_;  // value -> the dtype kiln holds it in
  std::set<std::string> masked_;                 // values that carry a kiln mask
};

// The exporters, by family.
// onnx_core.cc
std::vector<std::string> export_identity(LayerCall& c);
std::vector<std::string> export_dense(LayerCall& c);
std::vector<std::string> export_einsum_dense(LayerCall& c);
std::vector<std::string> export_activation(LayerCall& c);
std::vector<std::string> export_relu(LayerCall& c);
std::vector<std::string> export_leaky_relu(LayerCall& c);
std::vector<std::string> export_prelu(LayerCall& c);
std::vector<std::string> export_softmax(LayerCall& c);
std::vector<std::string> export_merge(LayerCall& c);
std::vector<std::string> export_concatenate(LayerCall& c);
std::vector<std::string> export_flatten(LayerCall& c);
std::vector<std::string> export_reshape(LayerCall& c);
std::vector<std::string> export_permute(LayerCall& c);
std::vector<std::string> export_repeat_vector(LayerCall& c);
std::vector<std::string> export_zero_padding_2d(LayerCall& c);
std::vector<std::string> export_cropping_2d(LayerCall& c);
std::vector<std::string> export_up_sampling_2d(LayerCall& c);
std::vector<std::string> export_embedding(LayerCall& c);
std::vector<std::string> export_masking(LayerCall& c);
std::vector<std::string> export_model(LayerCall& c);
// onnx_conv.cc
std::vector<std::string> export_conv(LayerCall& c);
std::vector<std::string> export_depthwise_conv(LayerCall& c);
std::vector<std::string> export_conv_transpose(LayerCall& c);
std::vector<std::string> export_pooling(LayerCall& c);
std::vector<std::string> export_global_pooling(LayerCall& c);
std::vector<std::string> export_batch_normalization(LayerCall& c);
std::vector<std::string> export_layer_normalization(LayerCall& c);
std::vector<std::string> export_group_normalization(LayerCall& c);
// onnx_preprocessing.cc
std::vector<std::string> export_rescaling(LayerCall& c);
std::vector<std::string> export_normalization(LayerCall& c);
std::vector<std::string> export_category_encoding(LayerCall& c);
std::vector<std::string> export_resizing(LayerCall& c);
std::vector<std::string> export_integer_lookup(LayerCall& c);
// int64 `ids` (batch, n) as CategoryEncoding encodes them: "one_hot" their
// one-hot rows of `depth` (an id outside [0, depth) gives a row of zeros),
// "count" those rows summed over the n ids, "multi_hot" that at most 1.
std::string encode_ids(LayerCall& c, const std::string& ids, int64_t depth, const std::string& mode);
// onnx_text.cc
std::vector<std::string> export_text_vectorization(LayerCall& c);
std::vector<std::string> export_string_lookup(LayerCall& c);
// onnx_recurrent.cc
std::vector<std::string> export_recurrent(LayerCall& c);
std::vector<std::string> export_bidirectional(LayerCall& c);
std::vector<std::string> export_time_distributed(LayerCall& c);
// onnx_attention.cc
std::vector<std::string> export_multi_head_attention(LayerCall& c);

}  // namespace kiln::exporter::onnx
