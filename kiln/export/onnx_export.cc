#include "kiln/export/onnx_export.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

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
  return cls == "Dropout" || cls == "SpatialDropout2D" || cls == "GaussianNoise" || cls == "GaussianDropout" ||
         cls == "Flatten" || cls == "Reshape" || cls == "Concatenate" || cls == "MaxPooling2D" ||
         cls == "GlobalMaxPooling2D" || cls == "Maximum" || cls == "Minimum";
}

// Emits the ONNX ops of one layer application.
//
// Precision: every float value in the graph is float32; a value kiln holds
// in bfloat16 or float16 (a layer under a 16-bit policy) is rounded to that
// dtype where kiln rounds, by a Cast to it and back (ONNX Runtime's CPU
// kernels have no bfloat16 MatMul; the round trip is exact emulation of the
// rounding). `types_` remembers which dtype each value is kiln's.
class LayerEmitter {
 public:
  explicit LayerEmitter(GraphBuilder& b) : b_(b) {}

  // The dtype kiln gives `value` (graph inputs; float32 when unknown).
  void set_type(const std::string& value, at::ScalarType t) { types_[value] = t; }
  at::ScalarType type_of(const std::string& value) const {
    auto it = types_.find(value);
    return it == types_.end() ? at::kFloat : it->second;
  }

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
    const DTypePolicy& policy = layer.dtype_policy();
    const std::string where = "layer '" + layer.name() + "' (" + layer.class_name() + ")";
    check_precision(layer, where);
    const at::ScalarType compute = policy.compute_dtype();
    // Keras autocasting: float inputs arrive in the compute dtype.
    std::vector<std::string> cast;
    for (auto& x : in) cast.push_back(round_to(x, compute));
    std::vector<std::string> out = emit_layer(layer, cast, where, compute);
    for (auto& y : out) {
      if (!moves_values_only(layer.class_name())) y = round_to(y, compute);
      if (!types_.count(y)) types_[y] = at::isFloatingType(compute) ? compute : at::kFloat;
    }
    return out;
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

  std::vector<std::string> emit_layer(Layer& layer, const std::vector<std::string>& in, const std::string& where,
                                      at::ScalarType compute) {
    const std::string cls = layer.class_name();
    const Json cfg = layer.get_config();
    const std::string base = layer.name();
    // Dense, Conv2D and Embedding read their float weights in the compute
    // dtype (Layer::value); the normalizations keep theirs in float32.
    const bool cast_weights = is_16bit(compute) && (cls == "Dense" || cls == "Conv2D" || cls == "Embedding");
    std::map<std::string, at::Tensor> w, raw;
    for (auto& v : layer.weights()) {
      at::Tensor t = v->value().detach();
      raw[v->name()] = t;
      if (cast_weights && at::isFloatingType(t.scalar_type())) t = t.to(compute);
      w[v->name()] = t.to(at::kFloat);
    }
    auto weight = [&](const std::string& n) {
      auto it = w.find(n);
      if (it == w.end())
        throw StateError("export_onnx: " + where + " has no `" + n + "` weight; build the model first");
      return b_.constant(base + "_" + n, it->second);
    };
    auto channels_last = [&] {
      std::string f = cfg.value("data_format", "channels_last");
      return f == "channels_last";
    };
    const std::string x = in.at(0);

    if (cls == "Dense") {
      std::string y;
      if (layer.dtype_policy().quantization_mode() == "int8")
        y = int8_matmul(layer, x, raw, where);
      else
        y = b_.op("MatMul", {x, weight("kernel")}, base + "_matmul");
      // kiln's GEMMs accumulate in float32 and round once: with the bias for
      // 2-D inputs (addmm) and int8; the product, then the sum otherwise.
      const bool fused_bias =
          layer.dtype_policy().quantization_mode() == "int8" || layer.build_input_shapes().at(0).size() == 2;
      if (!fused_bias) y = round_to(y, compute);
      if (cfg.value("use_bias", true)) y = b_.op("Add", {y, weight("bias")}, base + "_bias");
      y = round_to(y, compute);
      return {activation(cfg.value("activation", "linear"), y, where, compute)};
    }
    if (cls == "Activation") return {activation(cfg.value("activation", "linear"), x, where, compute)};
    if (cls == "Dropout" || cls == "SpatialDropout2D" || cls == "GaussianNoise" || cls == "GaussianDropout")
      return {b_.op("Identity", {x}, base)};
    if (cls == "Flatten") {
      if (!channels_last())
        throw ValueError("export_onnx: " + where + " with data_format channels_first is not supported");
      auto out = b_.fresh(base);
      GraphBuilder::attr(b_.node("Flatten", {x}, out), "axis", (int64_t)1);
      return {out};
    }
    if (cls == "Reshape") {
      std::vector<int64_t> target = {0};  // 0: keep the batch dimension
      for (auto& d : cfg.at("target_shape")) target.push_back(d.get<int64_t>());
      return {b_.op("Reshape", {x, b_.ints(base + "_shape", target)}, base)};
    }
    if (cls == "Rescaling") {
      auto as_tensor = [](const Json& j) {
        return j.is_array() ? at::tensor(j.get<std::vector<double>>(), at::kFloat)
                            : at::scalar_tensor(j.get<double>(), at::kFloat);
      };
      // kiln: x * scale + offset in the compute dtype, each step rounded.
      auto in_compute = [&](const at::Tensor& t) { return is_16bit(compute) ? t.to(compute).to(at::kFloat) : t; };
      auto y = b_.op("Mul", {x, b_.constant(base + "_scale", in_compute(as_tensor(cfg.at("scale"))))}, base + "_mul");
      y = round_to(y, compute);
      return {b_.op("Add", {y, b_.constant(base + "_offset", in_compute(as_tensor(cfg.at("offset"))))}, base)};
    }
    if (cls == "Normalization") {
      auto* n = dynamic_cast<Normalization*>(&layer);
      if (!n) throw ValueError("export_onnx: " + where + " is not kiln's Normalization");
      at::Tensor m = n->mean().to(at::kFloat), v = n->variance().to(at::kFloat);
      at::Tensor sd = at::clamp_min(at::sqrt(v), 1e-7);
      if (cfg.value("invert", false))
        return {b_.op(
            "Add", {b_.op("Mul", {x, b_.constant(base + "_std", sd)}, base + "_mul"), b_.constant(base + "_mean", m)},
            base)};
      auto d = b_.op("Sub", {x, b_.constant(base + "_mean", m)}, base + "_sub");
      return {b_.op("Div", {d, b_.constant(base + "_std", sd)}, base)};
    }
    if (cls == "Add" || cls == "Multiply" || cls == "Maximum" || cls == "Minimum" || cls == "Subtract" ||
        cls == "Average") {
      if (in.size() < 2) throw ValueError("export_onnx: " + where + " needs at least 2 inputs");
      if (cls == "Subtract") return {b_.op("Sub", {in[0], in[1]}, base)};
      const std::string op = cls == "Add" || cls == "Average" ? "Add"
                             : cls == "Multiply"              ? "Mul"
                             : cls == "Maximum"               ? "Max"
                                                              : "Min";
      std::string acc = in[0];
      for (size_t i = 1; i < in.size(); ++i)
        acc = b_.op(op, {acc, in[i]}, base + (i + 1 == in.size() && cls != "Average" ? "" : "_acc"));
      if (cls == "Average")
        acc = b_.op("Div", {acc, b_.constant(base + "_n", at::scalar_tensor((float)in.size()))}, base);
      return {acc};
    }
    if (cls == "Concatenate") {
      auto out = b_.fresh(base);
      GraphBuilder::attr(b_.node("Concat", in, out), "axis", cfg.value("axis", (int64_t)-1));
      return {out};
    }
    if (cls == "Conv2D" || cls == "MaxPooling2D" || cls == "AveragePooling2D") {
      const bool last = channels_last();
      std::string t = last ? transpose(x, {0, 3, 1, 2}, base + "_nchw") : x;
      const std::string padding = cfg.value("padding", "valid");
      if (padding != "valid" && padding != "same")
        throw ValueError("export_onnx: " + where + " uses padding '" + padding + "'; only valid and same export");
      std::string y = b_.fresh(base + "_op");
      kiln_onnx::NodeProto* node;
      if (cls == "Conv2D") {
        auto k = w.at("kernel").permute({3, 2, 0, 1}).contiguous();  // (kh, kw, in, out) -> (out, in, kh, kw)
        std::vector<std::string> args = {t, b_.constant(base + "_kernel", k)};
        // Under a 16-bit policy kiln rounds the convolution, then adds the bias.
        if (cfg.value("use_bias", true) && !is_16bit(compute)) args.push_back(weight("bias"));
        node = b_.node("Conv", args, y);
        GraphBuilder::attr(node, "kernel_shape", int_list(cfg.at("kernel_size"), 2));
        GraphBuilder::attr(node, "strides", int_list(cfg.value("strides", Json(1)), 2));
        GraphBuilder::attr(node, "dilations", int_list(cfg.value("dilation_rate", Json(1)), 2));
        GraphBuilder::attr(node, "group", cfg.value("groups", (int64_t)1));
      } else {
        node = b_.node(cls == "MaxPooling2D" ? "MaxPool" : "AveragePool", {t}, y);
        auto pool = int_list(cfg.at("pool_size"), 2);
        Json s = cfg.value("strides", Json(nullptr));
        GraphBuilder::attr(node, "kernel_shape", pool);
        GraphBuilder::attr(node, "strides", s.is_null() ? pool : int_list(s, 2));
      }
      // TensorFlow's "same" puts the odd padding element after: SAME_UPPER.
      GraphBuilder::attr(node, "auto_pad", std::string(padding == "same" ? "SAME_UPPER" : "VALID"));
      if (last) y = transpose(y, {0, 2, 3, 1}, base + "_nhwc");
      if (cls == "Conv2D" && cfg.value("use_bias", true) && is_16bit(compute)) {
        at::Tensor bias = w.at("bias");
        if (!last) bias = bias.reshape({-1, 1, 1});
        y = b_.op("Add", {round_to(y, compute), b_.constant(base + "_bias", bias)}, base + "_bias");
      }
      if (cls == "Conv2D") y = activation(cfg.value("activation", "linear"), round_to(y, compute), where, compute);
      return {y};
    }
    if (cls == "GlobalAveragePooling2D" || cls == "GlobalMaxPooling2D") {
      auto out = b_.fresh(base);
      auto* n = b_.node(cls == "GlobalAveragePooling2D" ? "ReduceMean" : "ReduceMax", {x}, out);
      GraphBuilder::attr(n, "axes", channels_last() ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 3});
      GraphBuilder::attr(n, "keepdims", (int64_t)(cfg.value("keepdims", false) ? 1 : 0));
      return {out};
    }
    if (cls == "BatchNormalization") {
      // Inference form folded into one scale and shift along `axis`.
      int64_t axis = cfg.value("axis", (int64_t)-1);
      const float eps = cfg.value("epsilon", 1e-3);
      at::Tensor mean = w.at("moving_mean"), var = w.at("moving_variance");
      at::Tensor gamma = w.count("gamma") ? w.at("gamma") : at::ones_like(mean);
      at::Tensor beta = w.count("beta") ? w.at("beta") : at::zeros_like(mean);
      at::Tensor scale = gamma / at::sqrt(var + eps);
      at::Tensor shift = beta - mean * scale;
      if (axis != -1) {
        const Shape& s = layer.build_input_shapes().at(0);
        int64_t rank = s.size();
        int64_t a = axis < 0 ? axis + rank : axis;
        std::vector<int64_t> bshape(rank - a, 1);
        bshape[0] = mean.size(0);
        scale = scale.reshape(bshape);
        shift = shift.reshape(bshape);
      }
      auto y = b_.op("Mul", {x, b_.constant(base + "_scale", scale)}, base + "_mul");
      return {b_.op("Add", {y, b_.constant(base + "_shift", shift)}, base)};
    }
    if (cls == "LayerNormalization") {
      if (cfg.value("rms_scaling", false))
        throw ValueError("export_onnx: " + where + " uses rms_scaling, which has no ONNX export");
      std::vector<int64_t> axes;
      Json a = cfg.value("axis", Json(-1));
      if (a.is_array())
        axes = a.get<std::vector<int64_t>>();
      else
        axes = {a.get<int64_t>()};
      const float eps = cfg.value("epsilon", 1e-3);
      auto mean = b_.fresh(base + "_mean");
      auto* n1 = b_.node("ReduceMean", {x}, mean);
      GraphBuilder::attr(n1, "axes", axes);
      GraphBuilder::attr(n1, "keepdims", (int64_t)1);
      auto d = b_.op("Sub", {x, mean}, base + "_centered");
      auto sq = b_.op("Mul", {d, d}, base + "_sq");
      auto var = b_.fresh(base + "_var");
      auto* n2 = b_.node("ReduceMean", {sq}, var);
      GraphBuilder::attr(n2, "axes", axes);
      GraphBuilder::attr(n2, "keepdims", (int64_t)1);
      auto sd = b_.op("Sqrt", {b_.op("Add", {var, b_.constant(base + "_eps", at::scalar_tensor(eps))}, base + "_ve")},
                      base + "_sd");
      std::string y = b_.op("Div", {d, sd}, base + "_norm");
      // gamma/beta have the normalized axes' shape; they broadcast when those axes trail.
      if (w.count("gamma")) y = b_.op("Mul", {y, weight("gamma")}, base + "_g");
      if (w.count("beta")) y = b_.op("Add", {y, weight("beta")}, base + "_b");
      return {b_.op("Identity", {y}, base)};
    }
    if (cls == "Embedding") {
      auto idx = b_.fresh(base + "_idx");
      GraphBuilder::attr(b_.node("Cast", {x}, idx), "to", (int64_t)kiln_onnx::TensorProto::INT64);
      if (layer.dtype_policy().quantization_mode() == "int8") {
        // int8 rows and one scale per row: float(row) / scale.
        auto rows = b_.fresh(base + "_rows_int8");
        GraphBuilder::attr(b_.node("Gather", {int8_weight(raw, "embeddings", base, where), idx}, rows), "axis",
                           (int64_t)0);
        auto scale = b_.fresh(base + "_row_scale");
        auto table =
            b_.constant(base + "_embeddings_scale", float_weight(raw, "embeddings_scale", where).reshape({-1, 1}));
        GraphBuilder::attr(b_.node("Gather", {table, idx}, scale), "axis", (int64_t)0);
        return {b_.op("Div", {to_float(rows, base + "_rows"), scale}, base)};
      }
      auto out = b_.fresh(base);
      GraphBuilder::attr(b_.node("Gather", {weight("embeddings"), idx}, out), "axis", (int64_t)0);
      return {out};
    }
    throw ValueError("export_onnx: " + where +
                     " has no ONNX export; supported layers: Dense, Activation, Dropout, Flatten, Reshape, Rescaling, "
                     "Normalization, Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate, Conv2D, "
                     "MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, GlobalMaxPooling2D, BatchNormalization, "
                     "LayerNormalization, Embedding");
  }

 private:
  // Refuses precisions whose numerics the graph would not reproduce.
  static void check_precision(Layer& layer, const std::string& where) {
    const DTypePolicy& p = layer.dtype_policy();
    const std::string& mode = p.quantization_mode();
    if (mode.empty()) return;
    const std::string cls = layer.class_name();
    if (mode == "float8")
      throw ValueError("export_onnx: " + where + " is quantized as float8 (policy '" + p.name() +
                       "'), which has no ONNX export that keeps its numerics; export the model before "
                       "quantize(\"float8\"), or quantize it with quantize(\"int8\") instead");
    if (mode == "int8_qat")
      throw ValueError("export_onnx: " + where + " is in int8 quantization-aware training (policy '" + p.name() +
                       "'); call quantize(\"int8\") on the model to convert it to int8, then export");
    if (mode != "int8" || (cls != "Dense" && cls != "Embedding"))
      throw ValueError("export_onnx: " + where + " is quantized as " + mode + " (policy '" + p.name() +
                       "'); ONNX export supports int8 Dense and Embedding layers only");
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

  std::string transpose(const std::string& x, const std::vector<int64_t>& perm, const std::string& base) {
    auto out = b_.fresh(base);
    GraphBuilder::attr(b_.node("Transpose", {x}, out), "perm", perm);
    return out;
  }

  GraphBuilder& b_;
  std::map<std::string, at::ScalarType> types_;  // value -> the dtype kiln holds it in
};

}  // namespace

void OnnxExportOptions::validate() const {
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
  LayerEmitter e(b);

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

  std::vector<std::string> outputs;
  if (auto* f = dynamic_cast<Functional*>(&model)) {
    // Walk the config's graph: tensors are "<layer>:<node>:<index>".
    Json cfg = f->get_config();
    auto key = [](const Json& ref) {
      return ref[0].get<std::string>() + ":" + std::to_string(ref[1].get<int>()) + ":" +
             std::to_string(ref[2].get<int>());
    };
    std::map<std::string, std::string> tensor;  // key -> ONNX value name
    size_t k = 0;
    for (auto& ref : cfg.at("input_layers")) tensor[key(ref)] = in_names.at(k++);
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
        auto outs = e.emit(*model.get_layer(it->layer), ins);
        for (size_t i = 0; i < outs.size(); ++i)
          tensor[it->layer + ":" + std::to_string(it->node) + ":" + std::to_string(i)] = outs[i];
        it = pending.erase(it);
        progressed = true;
      }
      if (!progressed) throw FormatError("export_onnx: the Functional graph has a cycle or a dangling input");
    }
    for (auto& ref : cfg.at("output_layers")) outputs.push_back(tensor.at(key(ref)));
  } else {
    std::string x = in_names.at(0);
    for (auto& layer : model.layers()) {
      if (layer->class_name() == "InputLayer") continue;
      x = e.emit(*layer, {x}).at(0);
    }
    outputs.push_back(x);
  }

  for (size_t i = 0; i < outputs.size(); ++i) {
    b.node("Identity", {outputs[i]}, out_names[i]);
    b.value_info(b.graph()->mutable_output(), out_names[i], at::kFloat, out_shapes.at(i));
  }
  return proto.SerializeAsString();
}

void export_onnx(Model& model, const std::string& path, const OnnxExportOptions& options) {
  atomic_write_file(path, export_onnx_bytes(model, options));
}

}  // namespace kiln::exporter
