#include "kiln/export/onnx_graph.h"

#include <functional>

#include "kiln/core/error.h"
#include "kiln/core/string_tensor.h"
#include "kiln/quantization/int8.h"

namespace kiln::exporter::onnx {
namespace {

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

}  // namespace

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
    case kStringDType:  // a string tensor (kiln/core/string_tensor.h) is a real string tensor in ONNX
      return kiln_onnx::TensorProto::STRING;
    default:
      throw ValueError(std::string("export_onnx: inputs of dtype ") + c10::toString(t) + " are not supported");
  }
}

std::vector<int64_t> int_list(const Json& j, size_t rank) {
  if (j.is_number_integer()) return std::vector<int64_t>(rank, j.get<int64_t>());
  return j.get<std::vector<int64_t>>();
}

at::ScalarType LayerEmitter::type_of(const std::string& value) const {
  auto it = types_.find(value);
  return it == types_.end() ? at::kFloat : it->second;
}

std::string LayerEmitter::round_to(const std::string& x, at::ScalarType t) {
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

std::vector<std::string> LayerEmitter::emit(Layer& layer, const std::vector<std::string>& in) {
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

std::vector<std::string> LayerEmitter::emit_model(models::Model& model, const std::vector<std::string>& in) {
  if (auto* f = dynamic_cast<models::FunctionalImpl*>(&model)) return emit_functional(*f, in);
  std::string x = in.at(0);
  for (auto& layer : model.layers()) {
    if (layer->class_name() == "InputLayer") continue;
    x = emit(*layer, {x}).at(0);
  }
  return {x};
}

std::string LayerEmitter::activation(const std::string& act, const std::string& x, const std::string& where,
                                     at::ScalarType compute) {
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
    return b_.op("Clip", {x, b_.constant("zero", at::scalar_tensor(0.0f)), b_.constant("six", at::scalar_tensor(6.0f))},
                 base);
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

std::string LayerEmitter::int8_matmul(Layer& layer, const std::string& x, const std::map<std::string, at::Tensor>& raw,
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
    if (reduce_takes_axes_input("ReduceMax", b_.opset()))
      n->add_input(b_.ints("axes", {-1}));
    else
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

std::string LayerEmitter::int8_gather(const std::map<std::string, at::Tensor>& raw, const std::string& idx,
                                      const std::string& base, const std::string& where) {
  auto rows = b_.fresh(base + "_rows_int8");
  GraphBuilder::attr(b_.node("Gather", {int8_weight(raw, "embeddings", base, where), idx}, rows), "axis", (int64_t)0);
  auto scale = b_.fresh(base + "_row_scale");
  auto table = b_.constant(base + "_embeddings_scale", float_weight(raw, "embeddings_scale", where).reshape({-1, 1}));
  GraphBuilder::attr(b_.node("Gather", {table, idx}, scale), "axis", (int64_t)0);
  return b_.op("Div", {to_float(rows, base + "_rows"), scale}, base);
}

bool LayerEmitter::keeps_float32_weights(const std::string& cls) {
  return cls == "BatchNormalization" || cls == "LayerNormalization" || cls == "GroupNormalization" ||
         cls == "Normalization";
}

const std::set<std::string>& LayerEmitter::exporters_that_consume_masks() {
  static const std::set<std::string> s = {"LSTM", "GRU", "SimpleRNN", "Bidirectional"};
  return s;
}

std::vector<std::string> LayerEmitter::emit_functional(models::FunctionalImpl& f, const std::vector<std::string>& in) {
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

bool LayerEmitter::check_precision(Layer& layer, const std::string& where) const {
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

const at::Tensor& LayerEmitter::raw_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                                           const std::string& where) {
  auto it = raw.find(name);
  if (it == raw.end())
    throw StateError("export_onnx: " + where + " has no `" + name + "` weight; build the model first");
  return it->second;
}

std::string LayerEmitter::int8_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                                      const std::string& base, const std::string& where) {
  const at::Tensor& t = raw_weight(raw, name, where);
  if (t.scalar_type() != at::kChar)
    throw FormatError("export_onnx: " + where + " is int8 but its `" + name + "` weight is " +
                      dtype_to_string(t.scalar_type()));
  return b_.constant(base + "_" + name, t);
}

at::Tensor LayerEmitter::float_weight(const std::map<std::string, at::Tensor>& raw, const std::string& name,
                                      const std::string& where) {
  return raw_weight(raw, name, where).to(at::kFloat);
}

std::string LayerEmitter::to_float(const std::string& x, const std::string& base) {
  auto out = b_.fresh(base);
  GraphBuilder::attr(b_.node("Cast", {x}, out), "to", (int64_t)kiln_onnx::TensorProto::FLOAT);
  return out;
}

}  // namespace kiln::exporter::onnx
