#include "kiln/export/onnx_export.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/layers/preprocessing.h"
#include "kiln/models/functional.h"
#include "kiln/quantization/int8.h"
#include "kiln_onnx/onnx.pb.h"

namespace kiln::exporter {
namespace {

int32_t onnx_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kiln_onnx::TensorProto::FLOAT;
    case at::kDouble:
      return kiln_onnx::TensorProto::DOUBLE;
    case at::kLong:
      return kiln_onnx::TensorProto::INT64;
    case at::kInt:
      return kiln_onnx::TensorProto::INT32;
    case at::kByte:
      return kiln_onnx::TensorProto::UINT8;
    case at::kChar:
      return kiln_onnx::TensorProto::INT8;
    case at::kBool:
      return kiln_onnx::TensorProto::BOOL;
    default:
      throw ValueError(std::string("export_onnx: inputs of dtype ") + c10::toString(t) + " are not supported");
  }
}

std::vector<int64_t> int_list(const Json& j, size_t rank) {
  if (j.is_number_integer()) return std::vector<int64_t>(rank, j.get<int64_t>());
  return j.get<std::vector<int64_t>>();
}

// Builds one GraphProto.
class GraphBuilder {
 public:
  GraphBuilder(kiln_onnx::GraphProto* g) : g_(g) {}

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
  std::set<std::string> used_;
};

bool is_16bit(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// Layers whose ops only move values: under a 16-bit policy their outputs are
// already in the compute dtype when their inputs are.
bool moves_values_only(const std::string& cls) {
  static const std::set<std::string> s = {"Dropout",
                                          "SpatialDropout2D",
                                          "GaussianNoise",
                                          "GaussianDropout",
                                          "RandomFlip",
                                          "RandomRotation",
                                          "RandomTranslation",
                                          "RandomZoom",
                                          "InputLayer",
                                          "Flatten",
                                          "Reshape",
                                          "Permute",
                                          "RepeatVector",
                                          "Cropping2D",
                                          "ZeroPadding2D",
                                          "Concatenate",
                                          "MaxPooling1D",
                                          "MaxPooling2D",
                                          "GlobalMaxPooling1D",
                                          "GlobalMaxPooling2D",
                                          "Maximum",
                                          "Minimum"};
  return s.count(cls) > 0;
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
    if (type == "ReduceSum")  // the one reduction whose axes became an input at opset 13
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
  at::ScalarType type_of(const std::string& value) const {
    auto it = types_.find(value);
    return it == types_.end() ? at::kFloat : it->second;
  }
  bool masked(const std::string& value) const { return masked_.count(value) > 0; }

  // `x` rounded to `t` (bfloat16 or float16) as kiln's x.to(t) does; x itself
  // when it already holds values of `t` or `t` is not a 16-bit float.
  std::string round_to(const std::string& x, at::ScalarType t) {
    const at::ScalarType have = type_of(x);
    if (!is_16bit(t) || have == t || !at::isFloatingType(have)) return x;
    const std::string tag = t == at::kBFloat16 ? "_bf16" : "_f16";
    auto narrow = b_.fresh(x + tag);
    GraphBuilder::attr(
        b_.node("Cast", {x}, narrow), "to",
        (int64_t)(t == at::kBFloat16 ? kiln_onnx::TensorProto::BFLOAT16 : kiln_onnx::TensorProto::FLOAT16));
    auto out = b_.fresh(x + tag + "_f32");
    GraphBuilder::attr(b_.node("Cast", {narrow}, out), "to", (int64_t)kiln_onnx::TensorProto::FLOAT);
    types_[out] = t;
    return out;
  }

  std::vector<std::string> emit(Layer& layer, const std::vector<std::string>& in) {
    const std::string cls = layer.class_name();
    const std::string where = "layer '" + layer.name() + "' (" + cls + ")";
    const bool int8 = check_precision(layer, where);
    const at::ScalarType compute = layer.dtype_policy().compute_dtype();
    // Keras autocasting: float inputs arrive in the compute dtype.
    std::vector<std::string> cast;
    for (auto& x : in) cast.push_back(round_to(x, compute));
    LayerCall c{*this, b_, layer, cls, layer.get_config(), layer.name(), where, compute, int8, cast, {}, {}};
    // The normalizations keep their statistics and weights in float32; the
    // other layers read theirs in the compute dtype (Layer::value).
    const bool cast_weights = is_16bit(compute) && !keeps_float32_weights(cls);
    for (auto& v : layer.weights()) {
      at::Tensor t = v->value().detach();
      c.raw[v->name()] = t;
      if (cast_weights && at::isFloatingType(t.scalar_type())) t = t.to(compute);
      c.w[v->name()] = t.to(at::kFloat);
    }
    if (int8 && layer.dtype_policy().quantization_mode() == "int8_qat") {
      // The int8 weights quantize("int8") makes of the trained kernel: per
      // output channel of the (in, out) kernel (Int8Kernel::quantize_from).
      auto [q, scale] = quantization::abs_max_quantize(raw_weight(c.raw, "kernel", where), {0});
      c.raw["kernel"] = q;
      c.raw["kernel_scale"] = scale.reshape({-1});
    }
    auto it = exporters().find(cls);
    if (it == exporters().end()) throw ValueError("export_onnx: " + where + " " + no_export_reason(cls));
    std::vector<std::string> out = it->second(c);
    for (auto& y : out) {
      if (!moves_values_only(cls)) y = round_to(y, compute);
      if (!types_.count(y)) types_[y] = at::isFloatingType(compute) ? compute : at::kFloat;
    }
    // Mask bookkeeping (kiln's compute_mask): made by Masking and
    // Embedding(mask_zero), passed on by layers that support masking.
    const bool makes_mask = cls == "Masking" || (cls == "Embedding" && c.cfg.value("mask_zero", false));
    const bool passes_mask =
        layer.supports_masking() && !in.empty() && masked(cast.at(0)) && exporters_that_consume_masks().count(cls) == 0;
    if (!out.empty() && (makes_mask || passes_mask)) masked_.insert(out[0]);
    return out;
  }

  // The ops of a whole Sequential or Functional model applied to `in` (graph
  // inputs at the top level, values of the outer graph when nested).
  std::vector<std::string> emit_model(Model& model, const std::vector<std::string>& in) {
    if (auto* f = dynamic_cast<Functional*>(&model)) return emit_functional(*f, in);
    std::string x = in.at(0);
    for (auto& layer : model.layers()) {
      if (layer->class_name() == "InputLayer") continue;
      x = emit(*layer, {x}).at(0);
    }
    return {x};
  }

  // `compute`: the dtype kiln applies the activation in; the result is rounded
  // to it by the caller.
  std::string activation(const std::string& act, const std::string& x, const std::string& where,
                         at::ScalarType compute = at::kFloat) {
    const std::string base = x + "_" + act;
    if (act.empty() || act == "linear") return x;
    if (act == "relu") return b_.op("Relu", {x}, base);
    if (act == "sigmoid") return b_.op("Sigmoid", {x}, base);
    if (act == "tanh") return b_.op("Tanh", {x}, base);
    if (act == "softplus") return b_.op("Softplus", {x}, base);
    if (act == "softsign") return b_.op("Softsign", {x}, base);
    if (act == "exponential") return b_.op("Exp", {x}, base);
    if (act == "selu") return b_.op("Selu", {x}, base);  // ONNX defaults are SELU's constants
    if (act == "softmax") {
      auto out = b_.fresh(base);
      GraphBuilder::attr(b_.node("Softmax", {x}, out), "axis", (int64_t)-1);
      return out;
    }
    if (act == "elu") {
      auto out = b_.fresh(base);
      GraphBuilder::attr(b_.node("Elu", {x}, out), "alpha", 1.0f);
      return out;
    }
    if (act == "leaky_relu") {  // kiln/Keras 3 default negative_slope 0.2
      auto out = b_.fresh(base);
      GraphBuilder::attr(b_.node("LeakyRelu", {x}, out), "alpha", 0.2f);
      return out;
    }
    if ((act == "silu" || act == "swish") && is_16bit(compute)) {
      // LibTorch's 16-bit silu is x / (1 + exp(-x)) with each step rounded.
      auto e = round_to(b_.op("Exp", {b_.op("Neg", {x}, base + "_neg")}, base + "_exp"), compute);
      auto d = round_to(b_.op("Add", {e, b_.constant("one", at::scalar_tensor(1.0f))}, base + "_1p"), compute);
      return b_.op("Div", {x, d}, base);
    }
    if (act == "silu" || act == "swish") return b_.op("Mul", {x, b_.op("Sigmoid", {x}, base + "_sig")}, base);
    if (act == "relu6")
      return b_.op(
          "Clip", {x, b_.constant("zero", at::scalar_tensor(0.0f)), b_.constant("six", at::scalar_tensor(6.0f))}, base);
    if (act == "gelu") {  // exact (erf) form, as at::gelu computes it
      auto scaled = b_.op("Div", {x, b_.constant("sqrt2", at::scalar_tensor((float)std::sqrt(2.0)))}, base + "_d");
      auto erf = b_.op("Erf", {scaled}, base + "_erf");
      auto one = b_.op("Add", {erf, b_.constant("one", at::scalar_tensor(1.0f))}, base + "_1p");
      auto half = b_.op("Mul", {x, b_.constant("half", at::scalar_tensor(0.5f))}, base + "_h");
      return b_.op("Mul", {half, one}, base);
    }
    throw ValueError("export_onnx: " + where + " uses activation '" + act +
                     "', which has no ONNX export; supported: relu, relu6, gelu, sigmoid, tanh, softmax, silu, swish, "
                     "leaky_relu, elu, selu, softplus, softsign, exponential, linear");
  }

  // kiln's int8 kernel (kiln/quantization/kernels.cc) from primitive ops,
  // without the bias: inputs quantized per row with abs-max scales
  // xs = 127 / (max|x| + 1e-7) (dynamic) or with the calibrated `inputs_scale`
  // (static), xq = clip(round(x * xs), -127, 127) as int8 (Round: half to
  // even, as at::round), the exact int32 product with the int8 kernel
  // (MatMulInteger, int8 x int8), then acc / (xs * kernel_scale).
  std::string int8_matmul(Layer& layer, const std::string& x, const std::map<std::string, at::Tensor>& raw,
                          const std::string& where) {
    const std::string base = layer.name();
    const std::string kernel = int8_weight(raw, "kernel", base, where);
    at::Tensor kernel_scale = float_weight(raw, "kernel_scale", where).reshape({1, -1});
    const bool calibrated = raw.count("inputs_scale") > 0;
    std::string xs, denom;
    if (calibrated) {
      at::Tensor s = float_weight(raw, "inputs_scale", where);
      xs = b_.constant(base + "_inputs_scale", s);
      denom = b_.constant(base + "_dequant_scale", s * kernel_scale);
    } else {
      auto amax = b_.fresh(base + "_amax");
      auto* n = b_.node("ReduceMax", {b_.op("Abs", {x}, base + "_abs")}, amax);
      GraphBuilder::attr(n, "axes", std::vector<int64_t>{-1});
      GraphBuilder::attr(n, "keepdims", (int64_t)1);
      auto eps = b_.constant(base + "_eps", at::scalar_tensor(quantization::kInt8Epsilon, at::kFloat));
      xs = b_.op("Div",
                 {b_.constant(base + "_127", at::scalar_tensor(127.0f)), b_.op("Add", {amax, eps}, base + "_amax_eps")},
                 base + "_inputs_scale");
      denom = b_.op("Mul", {xs, b_.constant(base + "_kernel_scale", kernel_scale)}, base + "_dequant_scale");
    }
    auto rounded = b_.op("Round", {b_.op("Mul", {x, xs}, base + "_scaled")}, base + "_round");
    auto clipped = b_.op("Clip",
                         {rounded, b_.constant(base + "_qmin", at::scalar_tensor(-127.0f)),
                          b_.constant(base + "_qmax", at::scalar_tensor(127.0f))},
                         base + "_clip");
    auto xq = b_.fresh(base + "_xq");
    GraphBuilder::attr(b_.node("Cast", {clipped}, xq), "to", (int64_t)kiln_onnx::TensorProto::INT8);
    auto acc = b_.op("MatMulInteger", {xq, kernel}, base + "_acc");
    return b_.op("Div", {to_float(acc, base + "_acc_f32"), denom}, base + "_dequant");
  }

  // An int8 Embedding: int8 rows and one scale per row, float(row) / scale.
  std::string int8_gather(const std::map<std::string, at::Tensor>& raw, const std::string& idx, const std::string& base,
                          const std::string& where) {
    auto rows = b_.fresh(base + "_rows_int8");
    GraphBuilder::attr(b_.node("Gather", {int8_weight(raw, "embeddings", base, where), idx}, rows), "axis", (int64_t)0);
    auto scale = b_.fresh(base + "_row_scale");
    auto table = b_.constant(base + "_embeddings_scale", float_weight(raw, "embeddings_scale", where).reshape({-1, 1}));
    GraphBuilder::attr(b_.node("Gather", {table, idx}, scale), "axis", (int64_t)0);
    return b_.op("Div", {to_float(rows, base + "_rows"), scale}, base);
  }

 private:
  static bool keeps_float32_weights(const std::string& cls) {
    return cls == "BatchNormalization" || cls == "LayerNormalization" || cls == "GroupNormalization" ||
           cls == "Normalization";
  }
  // Layers whose kiln implementation uses the input's mask.
  static const std::set<std::string>& exporters_that_consume_masks() {
    static const std::set<std::string> s = {"LSTM", "GRU", "SimpleRNN", "Bidirectional"};
    return s;
  }

  std::vector<std::string> emit_functional(Functional& f, const std::vector<std::string>& in) {
    // Walk the config's graph: tensors are "<layer>:<node>:<index>".
    Json cfg = f.get_config();
    auto key = [](const Json& ref) {
      return ref[0].get<std::string>() + ":" + std::to_string(ref[1].get<int>()) + ":" +
             std::to_string(ref[2].get<int>());
    };
    std::map<std::string, std::string> tensor;  // key -> ONNX value name
    size_t k = 0;
    for (auto& ref : cfg.at("input_layers")) tensor[key(ref)] = in.at(k++);
    struct Application {
      std::string layer;
      int node;
      Json args;
    };
    // Keras 3 inbound nodes: __keras_tensor__ objects (a list of them for a
    // layer called on a list); each holds its [layer, node, index] history.
    std::function<void(const Json&, Json*)> histories = [&](const Json& a, Json* out) {
      if (a.is_array()) {
        for (auto& x : a) histories(x, out);
        return;
      }
      out->push_back(a.at("config").at("keras_history"));
    };
    std::vector<Application> pending;
    for (auto& lj : cfg.at("layers")) {
      if (lj.at("class_name") == "InputLayer") continue;
      int node = 0;
      for (auto& inbound : lj.at("inbound_nodes")) {
        Json args = Json::array();
        histories(inbound.at("args"), &args);
        pending.push_back({lj.at("name"), node++, args});
      }
    }
    while (!pending.empty()) {
      bool progressed = false;
      for (auto it = pending.begin(); it != pending.end();) {
        std::vector<std::string> ins;
        bool ready = true;
        for (auto& a : it->args) {
          auto t = tensor.find(key(a));
          if (t == tensor.end()) {
            ready = false;
            break;
          }
          ins.push_back(t->second);
        }
        if (!ready) {
          ++it;
          continue;
        }
        auto outs = emit(*f.get_layer(it->layer), ins);
        for (size_t i = 0; i < outs.size(); ++i)
          tensor[it->layer + ":" + std::to_string(it->node) + ":" + std::to_string(i)] = outs[i];
        it = pending.erase(it);
        progressed = true;
      }
      if (!progressed) throw FormatError("export_onnx: the Functional graph has a cycle or a dangling input");
    }
    std::vector<std::string> outputs;
    for (auto& ref : cfg.at("output_layers")) outputs.push_back(tensor.at(key(ref)));
    return outputs;
  }

  // Refuses precisions whose numerics the graph would not reproduce; true
  // for a layer exported as int8.
  bool check_precision(Layer& layer, const std::string& where) const {
    const DTypePolicy& p = layer.dtype_policy();
    const std::string& mode = p.quantization_mode();
    if (mode.empty()) return false;
    const std::string cls = layer.class_name();
    if (mode == "float8")
      throw ValueError("export_onnx: " + where + " is quantized as float8 (policy '" + p.name() +
                       "'), which has no ONNX export that keeps its numerics; export the model before "
                       "quantize(\"float8\") (with kiln quantize: `kiln export --format onnx --model BASE/N` on "
                       "the version before), or quantize it with quantize(\"int8\") instead");
    if (mode == "int8_qat" && !qat_as_int8_)
      throw ValueError("export_onnx: " + where + " is in int8 quantization-aware training (policy '" + p.name() +
                       "'); export it as int8 as quantize(\"int8\") converts it with `kiln export --qat_as_int8` "
                       "(OnnxExportOptions::qat_as_int8)");
    if ((mode != "int8" && mode != "int8_qat") || (cls != "Dense" && (cls != "Embedding" || mode != "int8")))
      throw ValueError("export_onnx: " + where + " is quantized as " + mode + " (policy '" + p.name() +
                       "'); ONNX export supports int8 Dense and Embedding layers only");
    return true;
  }

  static const at::Tensor& raw_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                                      const std::string& where) {
    auto it = raw.find(name);
    if (it == raw.end())
      throw StateError("export_onnx: " + where + " has no `" + name + "` weight; build the model first");
    return it->second;
  }
  std::string int8_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                          const std::string& base, const std::string& where) {
    const at::Tensor& t = raw_weight(raw, name, where);
    if (t.scalar_type() != at::kChar)
      throw FormatError("export_onnx: " + where + " is int8 but its `" + name + "` weight is " +
                        dtype_to_string(t.scalar_type()));
    return b_.constant(base + "_" + name, t);
  }
  static at::Tensor float_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                                 const std::string& where) {
    return raw_weight(raw, name, where).to(at::kFloat);
  }
  std::string to_float(const std::string& x, const std::string& base) {
    auto out = b_.fresh(base);
    GraphBuilder::attr(b_.node("Cast", {x}, out), "to", (int64_t)kiln_onnx::TensorProto::FLOAT);
    return out;
  }

  GraphBuilder& b_;
  const bool qat_as_int8_;
  std::map<std::string, at::ScalarType> types_;  // value -> the dtype kiln holds it in
  std::set<std::string> masked_;                 // values that carry a kiln mask
};

// --- Exporters, one per layer class or family ------------------------------

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
  auto* n = dynamic_cast<Normalization*>(&c.layer);
  if (!n) c.refuse("is not kiln's Normalization");
  at::Tensor m = n->mean().to(at::kFloat), v = n->variance().to(at::kFloat);
  at::Tensor sd = at::clamp_min(at::sqrt(v), 1e-7);
  if (c.cfg.value("invert", false))
    return {c.op("Add",
                 {c.op("Mul", {c.x(), c.b.constant(c.base + "_std", sd)}, "_mul"), c.b.constant(c.base + "_mean", m)})};
  auto d = c.op("Sub", {c.x(), c.b.constant(c.base + "_mean", m)}, "_sub");
  return {c.op("Div", {d, c.b.constant(c.base + "_std", sd)})};
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

// ((top, bottom), (left, right)) of ZeroPadding2D / Cropping2D.
std::array<std::array<int64_t, 2>, 2> margins(const Json& j) {
  return {{{j[0][0].get<int64_t>(), j[0][1].get<int64_t>()}, {j[1][0].get<int64_t>(), j[1][1].get<int64_t>()}}};
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

// (x - mean) / sqrt(var + eps) over `axes` (biased variance), from
// primitive ops so that it runs on any opset >= 13.
std::string standardize(LayerCall& c, const std::string& x, const std::vector<int64_t>& axes, float eps) {
  auto d = c.op("Sub", {x, c.reduce("ReduceMean", x, axes, true, "_mean")}, "_centered");
  auto var = c.reduce("ReduceMean", c.op("Mul", {d, d}, "_sq"), axes, true, "_var");
  auto sd = c.op("Sqrt", {c.op("Add", {var, c.scalar(c.base + "_eps", eps)}, "_ve")}, "_sd");
  return c.op("Div", {d, sd}, "_norm");
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

std::vector<std::string> export_category_encoding(LayerCall& c) {
  const int64_t depth = c.cfg.at("num_tokens").get<int64_t>();
  const std::string mode = c.cfg.value("output_mode", "multi_hot");
  const Shape& s = c.input_shape();
  std::string ids = c.cast(c.x(), kiln_onnx::TensorProto::INT64, "_ids");  // floats truncate, as kiln
  if (mode == "one_hot" && s.size() == 2 && s[1] == 1) ids = c.squeeze(ids, {1}, "_ids1");
  std::string oh;
  GraphBuilder::attr(
      c.node("OneHot",
             {ids, c.b.ints(c.base + "_depth", {depth}), c.b.constant(c.base + "_values", at::tensor({0.0f, 1.0f}))},
             &oh, "_one_hot"),
      "axis", (int64_t)-1);
  if (mode == "one_hot" || s.size() == 1) return {oh};  // rank 1: one id per sample
  auto counts = c.reduce("ReduceSum", oh, {1}, false, "_counts");
  if (mode == "count") return {counts};
  return {c.op("Min", {counts, c.scalar(c.base + "_one", 1.0f)})};
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

// --- Recurrent layers: ONNX LSTM / GRU / RNN --------------------------------

// ONNX's name for a Keras activation inside LSTM/GRU/RNN.
std::string rnn_activation(const LayerCall& c, const std::string& act) {
  if (act == "tanh") return "Tanh";
  if (act == "sigmoid") return "Sigmoid";
  if (act == "relu") return "Relu";
  c.refuse("uses activation '" + act + "' in its cell; ONNX's LSTM/GRU/RNN export supports tanh, sigmoid and relu");
}

// One direction's ONNX weights W (gates*units, features), R (gates*units,
// units), B (2*gates*units) and activations for one kiln recurrent layer.
struct RnnDirection {
  at::Tensor W, R, B;
  std::vector<std::string> activations;
  int64_t units;
};

RnnDirection rnn_direction(LayerCall& c, Layer& layer) {
  const std::string cls = layer.class_name();
  const Json cfg = layer.get_config();
  std::map<std::string, at::Tensor> w;
  for (auto& v : layer.weights()) {
    at::Tensor t = v->value().detach();
    if (is_16bit(c.compute)) t = t.to(c.compute);
    w[v->name()] = t.to(at::kFloat);
  }
  if (!w.count("kernel") || !w.count("recurrent_kernel"))
    throw StateError("export_onnx: " + c.where + " is not built; build the model first");
  RnnDirection d;
  d.units = cfg.at("units").get<int64_t>();
  const int64_t u = d.units;
  at::Tensor kernel = w.at("kernel"), rec = w.at("recurrent_kernel");
  at::Tensor bias = w.count("bias") ? w.at("bias") : at::Tensor();
  const std::string act = cfg.value("activation", "tanh");
  const std::string rec_act = cfg.value("recurrent_activation", "sigmoid");
  if (cls == "LSTM") {
    // Keras's gates i, f, c, o -> ONNX's i, o, f, c.
    auto order = [&](const at::Tensor& t) {
      auto g = t.split(u, -1);
      return at::cat({g[0], g[3], g[1], g[2]}, -1);
    };
    d.W = order(kernel).t();
    d.R = order(rec).t();
    at::Tensor wb = bias.defined() ? order(bias) : at::zeros({4 * u});
    d.B = at::cat({wb, at::zeros({4 * u})});
    d.activations = {rnn_activation(c, rec_act), rnn_activation(c, act), rnn_activation(c, act)};
  } else if (cls == "GRU") {
    // The same gate order z, r, h; reset_after is ONNX's linear_before_reset.
    d.W = kernel.t();
    d.R = rec.t();
    if (!bias.defined())
      d.B = at::zeros({6 * u});
    else if (bias.dim() == 2)
      d.B = at::cat({bias[0], bias[1]});
    else
      d.B = at::cat({bias, at::zeros({3 * u})});
    d.activations = {rnn_activation(c, rec_act), rnn_activation(c, act)};
  } else {
    d.W = kernel.t();
    d.R = rec.t();
    d.B = at::cat({bias.defined() ? bias : at::zeros({u}), at::zeros({u})});
    d.activations = {rnn_activation(c, act)};
  }
  d.W = d.W.contiguous();
  d.R = d.R.contiguous();
  return d;
}

bool is_recurrent(const std::string& cls) { return cls == "LSTM" || cls == "GRU" || cls == "SimpleRNN"; }

// Runs ONNX's LSTM/GRU/RNN over `x` (batch, time, features) for one layer
// ("forward") or two ("bidirectional"). `init`: initial states (batch,
// units) in kiln's order (per direction: h, then c for LSTM), or empty.
// Returns Y (time, dirs, batch, units), Y_h and, for LSTM, Y_c (dirs, batch, units).
std::vector<std::string> run_rnn(LayerCall& c, const std::vector<Layer*>& layers, const std::string& x,
                                 const std::vector<std::string>& init) {
  const std::string cls = layers[0]->class_name();
  const Json cfg = layers[0]->get_config();
  std::vector<RnnDirection> dirs;
  for (auto* l : layers) dirs.push_back(rnn_direction(c, *l));
  auto stack = [&](at::Tensor RnnDirection::*m) {
    std::vector<at::Tensor> t;
    for (auto& d : dirs) t.push_back(d.*m);
    return at::stack(t);
  };
  std::string seq = c.transpose(x, {1, 0, 2}, "_time_major");  // ONNX Runtime runs layout 0 only
  if (cfg.value("go_backwards", false) && layers.size() == 1)
    // Processed in reverse; kiln gives the outputs in that processed order.
    seq = c.slice(seq, {-1}, {std::numeric_limits<int64_t>::min()}, {0}, "_reversed", {-1});
  const int states = cls == "LSTM" ? 2 : 1;
  // ONNX's initial_h / initial_c are (dirs, batch, units).
  std::vector<std::string> initial(states, "");
  if (!init.empty()) {
    for (int s = 0; s < states; ++s) {
      std::vector<std::string> per_dir;
      for (size_t d = 0; d < layers.size(); ++d) per_dir.push_back(c.unsqueeze(init.at(d * states + s), {0}, "_init"));
      if (per_dir.size() == 1) {
        initial[s] = per_dir[0];
      } else {
        GraphBuilder::attr(c.node("Concat", per_dir, &initial[s], "_init"), "axis", (int64_t)0);
      }
    }
  }
  std::vector<std::string> ins = {seq,
                                  c.b.constant(c.base + "_W", stack(&RnnDirection::W)),
                                  c.b.constant(c.base + "_R", stack(&RnnDirection::R)),
                                  c.b.constant(c.base + "_B", stack(&RnnDirection::B)),
                                  "",
                                  initial[0]};
  if (cls == "LSTM") ins.push_back(initial[1]);
  while (!ins.empty() && ins.back().empty()) ins.pop_back();
  const std::string type = cls == "LSTM" ? "LSTM" : cls == "GRU" ? "GRU" : "RNN";
  auto* n = c.b.graph()->add_node();
  n->set_op_type(type);
  n->set_name(c.b.fresh(c.base + "_" + type));
  for (auto& i : ins) n->add_input(i);
  std::vector<std::string> outs = {c.b.fresh(c.base + "_Y"), c.b.fresh(c.base + "_Y_h")};
  if (cls == "LSTM") outs.push_back(c.b.fresh(c.base + "_Y_c"));
  for (auto& o : outs) n->add_output(o);
  GraphBuilder::attr(n, "hidden_size", dirs[0].units);
  GraphBuilder::attr(n, "direction", std::string(layers.size() == 2 ? "bidirectional" : "forward"));
  auto* a = n->add_attribute();
  a->set_name("activations");
  a->set_type(kiln_onnx::AttributeProto::STRINGS);
  for (auto& d : dirs)
    for (auto& s : d.activations) a->add_strings(s);
  if (cls == "GRU") GraphBuilder::attr(n, "linear_before_reset", (int64_t)(cfg.value("reset_after", true) ? 1 : 0));
  return outs;
}

void refuse_masked(LayerCall& c) {
  if (c.e.masked(c.x()))
    c.refuse(
        "receives a mask (from Embedding(mask_zero=true) or Masking): kiln skips masked steps anywhere in a "
        "sequence, which ONNX's LSTM/GRU/RNN (sequence_lens: trailing padding only) cannot express; export a model "
        "without the mask");
}

std::vector<std::string> export_recurrent(LayerCall& c) {
  refuse_masked(c);
  std::vector<std::string> init(c.in.begin() + 1, c.in.end());
  auto outs = run_rnn(c, {&c.layer}, c.x(), init);
  std::vector<std::string> result;
  if (c.cfg.value("return_sequences", false))
    result.push_back(c.transpose(c.squeeze(outs[0], {1}, "_seq"), {1, 0, 2}, "_sequences"));
  else
    result.push_back(c.squeeze(outs[1], {0}, "_last"));
  if (c.cfg.value("return_state", false))
    for (size_t i = 1; i < outs.size(); ++i) result.push_back(c.squeeze(outs[i], {0}, "_state"));
  return result;
}

std::vector<std::string> export_bidirectional(LayerCall& c) {
  refuse_masked(c);
  auto subs = c.layer.sublayers();
  if (subs.size() != 2 || !is_recurrent(subs[0]->class_name())) c.refuse("does not wrap a recurrent layer");
  Layer& fwd = *subs[0];
  Layer& bwd = *subs[1];
  const Json fc = fwd.get_config(), bc = bwd.get_config();
  const bool sequences = fc.value("return_sequences", false), state = fc.value("return_state", false);
  const size_t n = fwd.class_name() == "LSTM" ? 2 : 1;
  std::vector<std::string> f_init, b_init;
  for (size_t i = 1; i < c.in.size(); ++i) (i <= n ? f_init : b_init).push_back(c.in[i]);
  // The two directions in one op when ONNX's "bidirectional" is kiln's pair:
  // same cell, forward then backward; otherwise two ops.
  auto comparable = [](Json j) {
    for (auto k : {"name", "go_backwards", "kernel_initializer", "recurrent_initializer", "bias_initializer", "seed"})
      j.erase(std::string(k));
    return j;
  };
  std::vector<std::string> of, ob;  // outputs, then states, per direction
  if (fwd.class_name() == bwd.class_name() && !fc.value("go_backwards", false) && bc.value("go_backwards", false) &&
      comparable(fc) == comparable(bc)) {
    std::vector<std::string> init = f_init;
    init.insert(init.end(), b_init.begin(), b_init.end());
    auto outs = run_rnn(c, {&fwd, &bwd}, c.x(), init);
    if (sequences) {
      // Y (time, 2, batch, units): ONNX gives the backward outputs in forward time order, as kiln's merge wants.
      auto y = c.transpose(outs[0], {1, 2, 0, 3}, "_dirs");  // (2, batch, time, units)
      of.push_back(c.squeeze(c.slice(y, {0}, {1}, {0}, "_fy"), {0}, "_f"));
      ob.push_back(c.squeeze(c.slice(y, {1}, {2}, {0}, "_by"), {0}, "_b"));
    } else {
      of.push_back(c.squeeze(c.slice(outs[1], {0}, {1}, {0}, "_fh"), {0}, "_f"));
      ob.push_back(c.squeeze(c.slice(outs[1], {1}, {2}, {0}, "_bh"), {0}, "_b"));
    }
    for (size_t i = 1; i < outs.size(); ++i) {
      of.push_back(c.squeeze(c.slice(outs[i], {0}, {1}, {0}, "_fs"), {0}, "_fstate"));
      ob.push_back(c.squeeze(c.slice(outs[i], {1}, {2}, {0}, "_bs"), {0}, "_bstate"));
    }
  } else {
    for (auto [layer, init, out] : {std::tuple{&fwd, &f_init, &of}, std::tuple{&bwd, &b_init, &ob}}) {
      auto outs = run_rnn(c, {layer}, c.x(), *init);
      out->push_back(sequences ? c.transpose(c.squeeze(outs[0], {1}, "_seq"), {1, 0, 2}, "_sequences")
                               : c.squeeze(outs[1], {0}, "_last"));
      for (size_t i = 1; i < outs.size(); ++i) out->push_back(c.squeeze(outs[i], {0}, "_state"));
    }
    if (sequences)  // kiln reverses the backward outputs to the forward time order
      ob[0] = c.slice(ob[0], {-1}, {std::numeric_limits<int64_t>::min()}, {1}, "_flip", {-1});
  }
  std::vector<std::string> result;
  const Json mode = c.cfg.value("merge_mode", Json("concat"));
  if (mode.is_null()) {
    result = {of[0], ob[0]};
  } else if (mode == "concat") {
    std::string y;
    GraphBuilder::attr(c.node("Concat", {of[0], ob[0]}, &y), "axis", (int64_t)-1);
    result.push_back(y);
  } else if (mode == "sum") {
    result.push_back(c.op("Add", {of[0], ob[0]}));
  } else if (mode == "mul") {
    result.push_back(c.op("Mul", {of[0], ob[0]}));
  } else {  // ave
    result.push_back(c.op("Div", {c.op("Add", {of[0], ob[0]}, "_sum"), c.scalar(c.base + "_two", 2.0f)}));
  }
  if (state) {
    result.insert(result.end(), of.begin() + 1, of.end());
    result.insert(result.end(), ob.begin() + 1, ob.end());
  }
  return result;
}

// TimeDistributed: time folded into the batch around the wrapped layer.
std::vector<std::string> export_time_distributed(LayerCall& c) {
  auto subs = c.layer.sublayers();
  if (subs.size() != 1) c.refuse("does not wrap one layer");
  auto shape = c.op("Shape", {c.x()}, "_shape");
  auto rest = c.slice(shape, {2}, {std::numeric_limits<int64_t>::max()}, {0}, "_rest");
  std::string folded_shape;
  GraphBuilder::attr(c.node("Concat", {c.b.ints(c.base + "_minus1", {-1}), rest}, &folded_shape, "_fshape"), "axis",
                     (int64_t)0);
  auto folded = c.op("Reshape", {c.x(), folded_shape}, "_folded");
  auto y = c.e.emit(*subs[0], {folded}).at(0);
  auto batch_time = c.slice(shape, {0}, {2}, {0}, "_bt");
  auto y_rest = c.slice(c.op("Shape", {y}, "_yshape"), {1}, {std::numeric_limits<int64_t>::max()}, {0}, "_yrest");
  std::string out_shape;
  GraphBuilder::attr(c.node("Concat", {batch_time, y_rest}, &out_shape, "_oshape"), "axis", (int64_t)0);
  return {c.op("Reshape", {y, out_shape})};
}

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

std::vector<std::string> export_model(LayerCall& c) {
  auto* m = dynamic_cast<Model*>(&c.layer);
  if (!m) c.refuse("is not a kiln model");
  return c.e.emit_model(*m, c.in);
}

const std::map<std::string, Exporter>& exporters() {
  static const std::map<std::string, Exporter> table = {
      {"Activation", export_activation},
      {"Add", export_merge},
      {"Average", export_merge},
      {"AveragePooling1D", export_pooling},
      {"AveragePooling2D", export_pooling},
      {"BatchNormalization", export_batch_normalization},
      {"Bidirectional", export_bidirectional},
      {"CategoryEncoding", export_category_encoding},
      {"Concatenate", export_concatenate},
      {"Conv1D", export_conv},
      {"Conv2D", export_conv},
      {"Conv2DTranspose", export_conv_transpose},
      {"Cropping2D", export_cropping_2d},
      {"Dense", export_dense},
      {"DepthwiseConv2D", export_depthwise_conv},
      {"Dropout", export_identity},
      {"EinsumDense", export_einsum_dense},
      {"Embedding", export_embedding},
      {"Flatten", export_flatten},
      {"Functional", export_model},
      {"GaussianNoise", export_identity},
      {"GlobalAveragePooling1D", export_global_pooling},
      {"GlobalAveragePooling2D", export_global_pooling},
      {"GlobalMaxPooling1D", export_global_pooling},
      {"GlobalMaxPooling2D", export_global_pooling},
      {"GroupNormalization", export_group_normalization},
      {"GRU", export_recurrent},
      {"InputLayer", export_identity},
      {"IntegerLookup", export_integer_lookup},
      {"LayerNormalization", export_layer_normalization},
      {"LeakyReLU", export_leaky_relu},
      {"LSTM", export_recurrent},
      {"Masking", export_masking},
      {"Maximum", export_merge},
      {"MaxPooling1D", export_pooling},
      {"MaxPooling2D", export_pooling},
      {"Minimum", export_merge},
      {"MultiHeadAttention", export_multi_head_attention},
      {"Multiply", export_merge},
      {"Normalization", export_normalization},
      {"Permute", export_permute},
      {"PReLU", export_prelu},
      {"RandomFlip", export_identity},  // the Random* augmentations are the identity at inference
      {"RandomRotation", export_identity},
      {"RandomTranslation", export_identity},
      {"RandomZoom", export_identity},
      {"ReLU", export_relu},
      {"RepeatVector", export_repeat_vector},
      {"Rescaling", export_rescaling},
      {"Resizing", export_resizing},
      {"Reshape", export_reshape},
      {"SeparableConv2D", export_depthwise_conv},
      {"Sequential", export_model},
      {"SimpleRNN", export_recurrent},
      {"Softmax", export_softmax},
      {"SpatialDropout2D", export_identity},
      {"Subtract", export_merge},
      {"TimeDistributed", export_time_distributed},
      {"UpSampling2D", export_up_sampling_2d},
      {"ZeroPadding2D", export_zero_padding_2d},
  };
  return table;
}

// Registered layer classes without an ONNX export, and why (with the alternative).
const std::map<std::string, std::string>& without_onnx_form() {
  static const std::map<std::string, std::string> table = {
      {"Hashing",
       "it hashes the decimal string of each id with FarmHash Fingerprint64 or SipHash-2-4, which no ONNX operator "
       "computes; hash the ids before the model (kiln::hash_strings in the data pipeline) and export the rest"},
  };
  return table;
}

std::string no_export_reason(const std::string& cls) {
  auto it = without_onnx_form().find(cls);
  if (it != without_onnx_form().end()) return "has no ONNX export: " + it->second;
  return "has no ONNX export (no exporter is registered for this class in kiln/export/onnx_export.cc)";
}

// Stores the float32 initializers as float16, each read through a Cast to
// float32 under its old name, so the ops (and their float32 compute) are
// unchanged. The Casts go first: the nodes stay topologically sorted.
// An initializer with a finite value beyond float16's range stays float32.
void store_weights_as_float16(GraphBuilder& b) {
  auto* g = b.graph();
  google::protobuf::RepeatedPtrField<kiln_onnx::NodeProto> nodes;
  for (auto& init : *g->mutable_initializer()) {
    if (init.data_type() != kiln_onnx::TensorProto::FLOAT) continue;
    at::Tensor t = at::empty(std::vector<int64_t>(init.dims().begin(), init.dims().end()), at::kFloat);
    std::memcpy(t.data_ptr(), init.raw_data().data(), t.numel() * sizeof(float));
    at::Tensor h = t.to(at::kHalf);
    if (h.isinf().logical_and(t.isfinite()).any().item<bool>()) continue;
    const std::string name = init.name();
    init.set_name(b.fresh(name + "_f16"));
    init.set_data_type(kiln_onnx::TensorProto::FLOAT16);
    init.set_raw_data(std::string(static_cast<const char*>(h.data_ptr()), h.numel() * h.element_size()));
    auto* cast = nodes.Add();
    cast->set_op_type("Cast");
    cast->set_name(name);
    cast->add_input(init.name());
    cast->add_output(name);
    GraphBuilder::attr(cast, "to", (int64_t)kiln_onnx::TensorProto::FLOAT);
  }
  nodes.MergeFrom(g->node());
  g->mutable_node()->Swap(&nodes);
}

// OnnxExportOptions::optimize: removes the nodes that only pass values on,
// which leaves every output bit for bit as it was:
//   * Identity (Dropout, noise and augmentation layers, nested models'
//     outputs): its consumers read its input; one that names a graph output
//     renames its input's producer instead, when nothing else reads it;
//   * a Reshape or Flatten that keeps the batch axis (Flatten axis 1, a
//     Reshape to [0, ...] with no other 0) and feeds only another such node:
//     the second one gives the same result from the first one's input.
// Initializers nothing reads any more (the dropped Reshapes' shapes) go too.
void drop_pass_through_nodes(kiln_onnx::GraphProto* g) {
  std::set<std::string> outputs, sources;  // graph outputs; graph inputs and initializers
  for (auto& o : g->output()) outputs.insert(o.name());
  for (auto& i : g->input()) sources.insert(i.name());
  std::map<std::string, const kiln_onnx::TensorProto*> inits;
  for (auto& t : g->initializer()) {
    sources.insert(t.name());
    inits[t.name()] = &t;
  }
  auto keeps_batch = [&](const kiln_onnx::NodeProto& n) {
    if (n.op_type() == "Flatten") {
      for (auto& a : n.attribute())
        if (a.name() == "axis") return a.i() == 1;
      return true;  // axis defaults to 1
    }
    if (n.op_type() != "Reshape" || n.input_size() != 2 || !inits.count(n.input(1))) return false;
    for (auto& a : n.attribute())
      if (a.name() == "allowzero" && a.i() != 0) return false;
    const auto* shape = inits.at(n.input(1));
    if (shape->data_type() != kiln_onnx::TensorProto::INT64) return false;
    std::vector<int64_t> v(shape->raw_data().size() / sizeof(int64_t));
    std::memcpy(v.data(), shape->raw_data().data(), v.size() * sizeof(int64_t));
    return !v.empty() && v[0] == 0 && std::count(v.begin(), v.end(), 0) == 1;
  };
  auto* nodes = g->mutable_node();
  std::vector<bool> dropped(nodes->size(), false);
  auto uses = [&](const std::string& value) {
    int n = 0;
    for (int i = 0; i < nodes->size(); ++i)
      if (!dropped[i])
        for (auto& in : nodes->Get(i).input()) n += in == value;
    return n;
  };
  std::map<std::string, int> producer;  // value -> index of the node that makes it
  std::map<std::string, std::string> alias;
  for (int i = 0; i < nodes->size(); ++i) {
    auto* n = nodes->Mutable(i);
    for (auto& in : *n->mutable_input())
      if (alias.count(in)) in = alias.at(in);
    if (n->op_type() == "Identity" && !outputs.count(n->output(0))) {
      alias[n->output(0)] = n->input(0);
      dropped[i] = true;
      continue;
    }
    if (keeps_batch(*n) && producer.count(n->input(0))) {
      const int p = producer.at(n->input(0));
      if (keeps_batch(nodes->Get(p)) && !outputs.count(n->input(0)) && uses(n->input(0)) == 1) {
        n->set_input(0, nodes->Get(p).input(0));
        dropped[p] = true;
      }
    }
    for (auto& out : n->output()) producer[out] = i;
  }
  // Identities that name graph outputs.
  for (int i = 0; i < nodes->size(); ++i) {
    auto* n = nodes->Mutable(i);
    if (dropped[i] || n->op_type() != "Identity") continue;
    const std::string in = n->input(0);
    if (sources.count(in) || outputs.count(in) || !producer.count(in) || uses(in) != 1) continue;
    auto* p = nodes->Mutable(producer.at(in));
    for (auto& out : *p->mutable_output())
      if (out == in) out = n->output(0);
    dropped[i] = true;
  }
  google::protobuf::RepeatedPtrField<kiln_onnx::NodeProto> kept;
  for (int i = 0; i < nodes->size(); ++i)
    if (!dropped[i]) kept.Add()->Swap(nodes->Mutable(i));
  nodes->Swap(&kept);
  std::set<std::string> read;
  for (auto& n : g->node())
    for (auto& in : n.input()) read.insert(in);
  auto* initializers = g->mutable_initializer();
  for (int i = initializers->size() - 1; i >= 0; --i)
    if (!read.count(initializers->Get(i).name())) initializers->DeleteSubrange(i, 1);
}

}  // namespace

void OnnxExportOptions::validate() const {
  if (weights != "float32" && weights != "float16")
    throw ValueError(
        "export_onnx: received an invalid value for `weights`, expected \"float32\" or \"float16\". Received: "
        "weights=" +
        weights);
  if (opset < 13 || opset > 17)
    throw ValueError(
        "export_onnx: received an invalid value for `opset`, expected 13 to 17 (ReduceMean takes `axes` "
        "as an attribute up to 17). Received: opset=" +
        std::to_string(opset));
}

std::string export_onnx_bytes(Model& model, const OnnxExportOptions& options) {
  options.validate();
  if (!model.built()) throw StateError("export_onnx: the model is not built; call it on data or give it an Input");
  kiln_onnx::ModelProto proto;
  proto.set_ir_version(8);
  proto.set_producer_name("kiln");
  proto.set_producer_version("1");
  auto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(options.opset);
  GraphBuilder b(proto.mutable_graph());
  b.graph()->set_name(options.graph_name.empty() ? model.name() : options.graph_name);
  LayerEmitter e(b, options.qat_as_int8);

  const auto in_names = model.input_names();
  const auto in_shapes = model.input_shapes();
  const auto in_types = model.input_dtypes();
  for (size_t i = 0; i < in_names.size(); ++i) {
    b.fresh(in_names[i]);
    e.set_type(in_names[i], i < in_types.size() ? in_types[i] : at::kFloat);
    b.value_info(b.graph()->mutable_input(), in_names[i], i < in_types.size() ? in_types[i] : at::kFloat,
                 in_shapes.at(i));
  }

  // Graph outputs keep kiln's output names; reserve them before any op is named.
  std::vector<std::string> out_names = model.output_names();
  const auto out_shapes = model.output_shapes();
  for (size_t i = 0; i < out_shapes.size(); ++i) {
    if (i >= out_names.size()) out_names.push_back("output_" + std::to_string(i));
    out_names[i] = b.fresh(out_names[i]);
  }

  std::vector<std::string> outputs = e.emit_model(model, in_names);

  for (size_t i = 0; i < outputs.size(); ++i) {
    b.node("Identity", {outputs[i]}, out_names[i]);
    // Float outputs are float32 (16-bit policies included); integer ones (IntegerLookup) keep their type.
    const at::ScalarType t = e.type_of(outputs[i]);
    b.value_info(b.graph()->mutable_output(), out_names[i], at::isFloatingType(t) ? at::kFloat : t, out_shapes.at(i));
  }
  if (options.optimize) drop_pass_through_nodes(b.graph());
  if (options.weights == "float16") store_weights_as_float16(b);
  return proto.SerializeAsString();
}

std::vector<OnnxLayerSupport> onnx_layer_support() {
  std::vector<OnnxLayerSupport> out;
  for (const auto& cls : LayerRegistry::names()) {
    OnnxLayerSupport s{cls, exporters().count(cls) > 0, ""};
    auto it = without_onnx_form().find(cls);
    if (it != without_onnx_form().end()) s.reason = it->second;
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.class_name < b.class_name; });
  return out;
}

std::string onnx_conformance_table() {
  std::string t = "| layer class | ONNX export |\n|---|---|\n";
  for (const auto& s : onnx_layer_support()) {
    if (s.class_name.rfind("TestOnly", 0) == 0) continue;
    t += "| " + s.class_name + " | " + (s.exported ? std::string("exported") : "no: " + s.reason) + " |\n";
  }
  return t;
}

void export_onnx(Model& model, const std::string& path, const OnnxExportOptions& options) {
  atomic_write_file(path, export_onnx_bytes(model, options));
}

}  // namespace kiln::exporter
