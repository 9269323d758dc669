#include "kiln/layers/layer.h"

#include "kiln/layers/sharded_kernel.h"

#include <algorithm>
#include <optional>

#include <map>
#include <mutex>
#include <set>

#include "kiln/core/config_keys.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/names.h"
#include "kiln/core/registry.h"

namespace kiln {

std::string KerasTensor::name() const {
  if (!node) return "keras_tensor";
  return node->layer->name() + (index ? "_" + std::to_string(index) : "");
}

Layer::Layer(const Json& config) {
  std::string name = get_or<std::string>(config, "name", "");
  if (!name.empty()) {
    name_ = name;
    reserve_name(name);
  }
  trainable_ = get_or<bool>(config, "trainable", true);
  if (config.is_object() && config.contains("dtype") && !config["dtype"].is_null()) {
    policy_ = DTypePolicy::from_json(config["dtype"]);
  } else {
    policy_ = kiln::dtype_policy();
  }
}

Layer::~Layer() = default;

const std::string& Layer::name() const {
  if (name_.empty()) name_ = unique_name(to_snake_case(class_name()));
  return name_;
}

void Layer::build_if_needed(const std::vector<Shape>& input_shapes) {
  if (built_) return;
  NameScope scope(name());
  build(input_shapes);
  build_shapes_ = input_shapes;
  built_ = true;
}

namespace {
std::vector<Shape> shapes_of(const Tensors& ts) {
  std::vector<Shape> out;
  for (auto& t : ts) {
    Shape s(t.sizes().begin(), t.sizes().end());
    if (!s.empty()) s[0] = kNone;
    out.push_back(s);
  }
  return out;
}
}  // namespace

Tensors Layer::operator()(const Tensors& inputs, bool training) {
  std::optional<NameScope> scope;
  if (!built_) {
    build_if_needed(shapes_of(inputs));
    // Sublayers that a subclassed layer or model builds lazily in its first
    // call get their variables under its name, as in Keras
    // ("two_heads/dense/kernel").
    scope.emplace(name());
  }
  // Only training calls add activity losses; leaving an empty list alone keeps
  // inference calls read-only, so they may run concurrently (layer.h).
  if (!activity_losses_.empty()) activity_losses_.clear();
  if (!autocast()) return call(inputs, training);
  Tensors cast;
  cast.reserve(inputs.size());
  for (auto& t : inputs) cast.push_back(compute_cast(t));
  return call(cast, training);
}

Tensors Layer::call_with_masks(const Tensors& inputs, const Tensors& masks, bool training, Tensors* output_masks) {
  if (!masks.empty() && masks.size() != inputs.size())
    throw ValueError(class_name() + " '" + name() + "' received " + std::to_string(masks.size()) + " masks for " +
                     std::to_string(inputs.size()) + " inputs; give one per input (undefined = none)");
  std::optional<NameScope> scope;
  if (!built_) {
    build_if_needed(shapes_of(inputs));
    scope.emplace(name());
  }
  if (!activity_losses_.empty()) activity_losses_.clear();
  Tensors out;
  if (!autocast()) {
    out = call_masked(inputs, masks, training, output_masks);
  } else {
    Tensors cast;
    cast.reserve(inputs.size());
    for (auto& t : inputs) cast.push_back(compute_cast(t));
    out = call_masked(cast, masks, training, output_masks);
  }
  if (output_masks) output_masks->resize(out.size());
  return out;
}

Tensors Layer::call_masked(const Tensors& inputs, const Tensors& masks, bool training, Tensors* output_masks) {
  Tensors out = call(inputs, training);
  if (output_masks) *output_masks = compute_mask(inputs, masks);
  return out;
}

Tensors Layer::compute_mask(const Tensors& inputs, const Tensors& masks) {
  if (!supports_masking() || masks.empty()) return {};
  return {masks[0]};
}

at::Tensor Layer::operator()(const at::Tensor& x, bool training) {
  auto out = (*this)(Tensors{x}, training);
  if (out.size() != 1)
    throw ValueError(class_name() + " '" + name_ + "' returns " + std::to_string(out.size()) +
                     " outputs; call it with a vector to get them all");
  return out[0];
}

KerasTensors Layer::operator()(const KerasTensors& inputs) {
  std::vector<Shape> shapes;
  std::vector<at::ScalarType> dtypes;
  for (auto& k : inputs) {
    shapes.push_back(k.shape);
    dtypes.push_back(k.dtype);
  }
  auto node = std::make_shared<Node>();
  node->layer = shared_from_this();
  node->inputs = inputs;
  node->output_shapes = compute_output_shape(shapes);
  node->output_dtypes = compute_output_dtype(dtypes);
  if (node->output_dtypes.size() != node->output_shapes.size())
    node->output_dtypes.assign(node->output_shapes.size(), policy_.compute_dtype());
  KerasTensors out;
  for (size_t i = 0; i < node->output_shapes.size(); ++i)
    out.push_back(KerasTensor{node->output_shapes[i], node->output_dtypes[i], node, (int)i});
  return out;
}

KerasTensor Layer::operator()(const KerasTensor& x) {
  auto out = (*this)(KerasTensors{x});
  if (out.size() != 1)
    throw ValueError(class_name() + " '" + name_ + "' returns " + std::to_string(out.size()) + " outputs");
  return out[0];
}

std::vector<Shape> Layer::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Tensors probes;
  for (auto& s : input_shapes) {
    Shape c = concrete(s, 1);
    probes.push_back(at::zeros(c, at::TensorOptions().dtype(policy_.compute_dtype())));
  }
  at::NoGradGuard ng;
  Tensors out;
  try {
    out = (*this)(probes, false);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    std::string shapes;
    for (auto& s : input_shapes) shapes += (shapes.empty() ? "" : ", ") + shape_to_string(s);
    throw ShapeError(class_name() + " '" + name_ + "' cannot take inputs of shape " + shapes + ": " +
                     std::string(e.what()).substr(0, 300));
  }
  std::vector<Shape> shapes;
  for (size_t i = 0; i < out.size(); ++i) {
    Shape s(out[i].sizes().begin(), out[i].sizes().end());
    // Carry unknown dims through: batch (dim 0) stays unknown.
    if (!s.empty() && !input_shapes.empty() && !input_shapes[0].empty() && input_shapes[0][0] < 0) s[0] = kNone;
    shapes.push_back(s);
  }
  return shapes;
}

std::vector<at::ScalarType> Layer::compute_output_dtype(const std::vector<at::ScalarType>& in) {
  return {};  // empty: every output takes the compute dtype
}

VariablePtr Layer::add_weight(const std::string& name, const Shape& shape, InitializerPtr initializer, bool trainable,
                              RegularizerPtr regularizer, std::optional<at::ScalarType> dtype) {
  VariableSpec spec;
  spec.name = name;
  spec.shape = shape;
  spec.initializer = std::move(initializer);
  spec.trainable = trainable && trainable_;
  spec.dtype = dtype;
  auto v = VariableFactory::create(spec, policy_);
  variables_.push_back(v);
  created_trainable_.push_back(trainable);
  if (regularizer) regularized_.emplace_back(v, regularizer);
  return v;
}

std::vector<VariablePtr> Layer::weights() const {
  std::vector<VariablePtr> out;
  std::set<const Variable*> seen;
  std::function<void(const Layer&)> visit = [&](const Layer& l) {
    for (auto& v : l.variables_)
      if (seen.insert(v.get()).second) out.push_back(v);
    for (auto& s : l.sublayers()) visit(*s);
  };
  visit(*this);
  return out;
}

std::vector<VariablePtr> Layer::trainable_weights() const {
  std::vector<VariablePtr> out;
  for (auto& v : weights())
    if (v->trainable()) out.push_back(v);
  return out;
}

std::vector<VariablePtr> Layer::non_trainable_weights() const {
  std::vector<VariablePtr> out;
  for (auto& v : weights())
    if (!v->trainable()) out.push_back(v);
  return out;
}

int64_t Layer::count_params() const {
  int64_t n = 0;
  for (auto& v : weights()) n += num_elements(v->global_shape());  // whole, also when sharded
  return n;
}

Tensors Layer::get_weights() const {
  Tensors out;
  for (auto& v : weights()) out.push_back(v->value().detach().clone());
  return out;
}

void Layer::set_weights(const Tensors& values) {
  auto ws = weights();
  if (values.size() != ws.size())
    throw ValueError(class_name() + " '" + name_ + "' has " + std::to_string(ws.size()) +
                     " weights; set_weights received " + std::to_string(values.size()));
  for (size_t i = 0; i < ws.size(); ++i) ws[i]->assign(values[i]);
}

void Layer::track(LayerPtr sublayer) {
  if (!sublayer) throw ValueError("cannot track a null layer in '" + name_ + "'");
  for (auto& s : sublayers_)
    if (s == sublayer) return;
  sublayers_.push_back(std::move(sublayer));
}

void Layer::set_trainable(bool t) {
  trainable_ = t;
  // Keras: freezing makes every weight non-trainable; unfreezing restores
  // those that were created trainable (BN moving statistics never are).
  for (size_t i = 0; i < variables_.size(); ++i) variables_[i]->set_trainable(t && created_trainable_[i]);
  for (auto& s : sublayers()) s->set_trainable(t);
}

at::Tensor Layer::regularization_loss() const {
  at::Tensor total = at::zeros({}, at::kFloat);
  std::set<const Layer*> seen;
  std::function<void(const Layer&)> visit = [&](const Layer& l) {
    if (!seen.insert(&l).second) return;
    for (auto& [v, r] : l.regularized_) total = total + (*r)(v->value());
    for (auto& a : l.activity_losses_) total = total + a.to(at::kFloat);
    for (auto& s : l.sublayers()) visit(*s);
  };
  visit(*this);
  return total;
}

void Layer::add_loss(const at::Tensor& loss) { activity_losses_.push_back(loss); }
void Layer::clear_losses() {
  activity_losses_.clear();
  for (auto& s : sublayers()) s->clear_losses();
}

at::Tensor Layer::compute_cast(const at::Tensor& x) const {
  if (!x.defined() || !at::isFloatingType(x.scalar_type())) return x;
  auto dt = policy_.compute_dtype();
  return x.scalar_type() == dt ? x : x.to(dt);
}

Json Layer::base_config() const {
  Json j;
  j["name"] = name();
  j["trainable"] = trainable_;
  // Keras 3 writes the policy as a serialized DTypePolicy object.
  j["dtype"] = policy_.to_json();
  return j;
}

Json Layer::get_config() const { return base_config(); }

Json Layer::to_json() const {
  // Keras 3's serialize_keras_object: module, class_name, config,
  // registered_name, build_config ({"input_shape": shape}, or a list of
  // shapes for a layer called on a list).
  Json j;
  j["module"] = "keras.layers";
  j["class_name"] = class_name();
  j["config"] = get_config();
  j["registered_name"] = nullptr;
  if (built_ && !build_shapes_.empty()) {
    auto shape_json = [](const Shape& s) {
      Json d = Json::array();
      for (auto x : s) d.push_back(x < 0 ? Json(nullptr) : Json(x));
      return d;
    };
    Json shapes = Json::array();
    for (auto& s : build_shapes_) shapes.push_back(shape_json(s));
    j["build_config"] = Json{{"input_shape", build_shapes_.size() == 1 ? shapes[0] : shapes}};
  }
  return j;
}

void Layer::quantize(const std::string& mode) {
  throw ValueError(class_name() + " '" + name() + "' cannot be quantized (mode=" + mode +
                   "); quantizable layers are Dense, EinsumDense and Embedding");
}

KernelImplPtr Layer::build_kernel_impl(const KernelSpec& spec) {
  KernelSpec s = spec;
  s.static_inputs = policy_.static_inputs();
  const std::string mode = policy_.is_quantized() ? policy_.quantization_mode() : "float";
  KernelImplPtr impl = make_kernel_impl(mode, s, policy_.amax_history_length());
  impl->build(weight_adder());
  // Under ModelParallel a sharded kernel computes column- or row-parallel.
  VariablePtr kernel, bias;
  for (auto& v : variables_) {
    if (v->name() == "kernel") kernel = v;
    if (v->name() == "bias") bias = v;
  }
  if (!kernel) return impl;
  const std::string& path = kernel->path();
  return shard_kernel_impl(std::move(impl), s, kernel, bias, path.substr(0, path.rfind('/')));
}

bool Layer::policy_keeps_float_kernel() const { return policy_.quantization_mode() != "int8"; }

void Layer::quantize_kernel(const std::string& mode, const KernelSpec& spec, KernelImplPtr& impl, VariablePtr& kernel) {
  const std::string current = policy_.quantization_mode();
  if (!current.empty() && !(current == "int8_qat" && mode == "int8"))
    throw ValueError(class_name() + " '" + name() + "' is already quantized (policy " + policy_.name() +
                     "); quantize the float model instead");
  if (!built() || !kernel)
    throw StateError(class_name() + " '" + name() + "' must be built before quantize(\"" + mode +
                     "\"): call the model on data (or build it) first");
  if (kernel->sharded())
    throw ValueError(class_name() + " '" + name() + "' has a sharded kernel (ModelParallel); quantize the model " +
                     "loaded from its gathered model directory instead");
  DTypePolicy next = (current.empty() ? policy_ : DTypePolicy(policy_.source_name())).quantized(mode);
  KernelSpec s = spec;
  s.static_inputs = false;
  KernelImplPtr fresh = make_kernel_impl(mode, s, next.amax_history_length());
  const std::string path = kernel->path();
  const auto slash = path.rfind('/');
  fresh->build(weight_adder(slash == std::string::npos ? "" : path.substr(0, slash)));
  if (!fresh->keeps_float_kernel()) {
    fresh->quantize_from(kernel->value().detach());
    remove_weight(kernel);
    kernel = nullptr;
  }
  impl = std::move(fresh);
  policy_ = next;
}

void Layer::finish_calibration(const std::string& method, double percentile) {
  KernelImpl* impl = kernel_impl_ptr();
  if (!impl || impl->mode() != "int8") return;
  std::string scope;
  if (!variables_.empty()) {
    const std::string& p = variables_.front()->path();
    scope = p.substr(0, p.rfind('/') == std::string::npos ? 0 : p.rfind('/'));
  }
  impl->finish_calibration(method, percentile, weight_adder(scope));
  policy_ = DTypePolicy(policy_.source_name()).quantized("int8", /*static_inputs=*/true);
}

AddWeightFn Layer::weight_adder(const std::string& scope) {
  return [this, scope](const std::string& name, const Shape& shape, InitializerPtr init, bool trainable,
                       std::optional<at::ScalarType> dtype) {
    std::optional<NameScope> ns;
    if (!scope.empty()) ns.emplace(scope);
    return add_weight(name, shape, std::move(init), trainable, nullptr, dtype);
  };
}

void Layer::remove_weight(const VariablePtr& v) {
  for (size_t i = 0; i < variables_.size(); ++i)
    if (variables_[i] == v) {
      variables_.erase(variables_.begin() + i);
      created_trainable_.erase(created_trainable_.begin() + i);
      break;
    }
  regularized_.erase(
      std::remove_if(regularized_.begin(), regularized_.end(), [&](const auto& p) { return p.first == v; }),
      regularized_.end());
}

Tensors SimpleLayer::call(const Tensors& inputs, bool training) {
  if (inputs.size() != 1)
    throw ValueError(class_name() + " '" + name() + "' takes one input. Received " + std::to_string(inputs.size()));
  return {call1(inputs[0], training)};
}

// --- registry ---------------------------------------------------------------
namespace {
Registry<LayerPtr, const Json&>& layer_registry() {
  static auto* r = new Registry<LayerPtr, const Json&>("layer");  // never destroyed
  return *r;
}
}  // namespace

bool LayerRegistry::add(const std::string& class_name, LayerFactory factory) {
  return layer_registry().add(class_name, std::move(factory));
}

bool LayerRegistry::contains(const std::string& class_name) { return layer_registry().contains(class_name); }

std::vector<std::string> LayerRegistry::names() { return layer_registry().names(); }

LayerPtr LayerRegistry::create(const std::string& class_name, const Json& config) {
  return layer_registry().create(class_name, config);
}

namespace {

Shape shape_from(const Json& s, const std::string& where) {
  if (!s.is_array())
    throw ValueError(where + " must be a list of dims (null for unknown). Received: " + s.dump().substr(0, 200));
  Shape sh;
  for (auto& d : s) {
    if (!d.is_null() && !d.is_number_integer())
      throw ValueError(where + " must be a list of dims (null for unknown). Received: " + s.dump().substr(0, 200));
    sh.push_back(d.is_null() ? kNone : d.get<int64_t>());
  }
  return sh;
}

// build_config as Keras 3 writes it ({"input_shape": shape or [shapes]},
// {"shapes_dict": {"x_shape": ...}}) or kiln's older {"input_shapes": [...]}.
std::vector<Shape> build_shapes(const Json& bc, const std::string& where) {
  check_config_keys(bc, {"input_shape", "shapes_dict", "input_shapes"}, where);
  std::vector<Shape> shapes;
  if (bc.contains("input_shape") && !bc["input_shape"].is_null()) {
    const Json& s = bc["input_shape"];
    const bool several = s.is_array() && !s.empty() && s[0].is_array();
    if (several)
      for (auto& x : s) shapes.push_back(shape_from(x, where));
    else
      shapes.push_back(shape_from(s, where));
  } else if (bc.contains("shapes_dict") && bc["shapes_dict"].is_object()) {
    for (auto it = bc["shapes_dict"].begin(); it != bc["shapes_dict"].end(); ++it)
      shapes.push_back(shape_from(it.value(), where));
  } else if (bc.contains("input_shapes") && bc["input_shapes"].is_array()) {
    for (auto& x : bc["input_shapes"]) shapes.push_back(shape_from(x, where));
  }
  return shapes;
}

}  // namespace

LayerPtr layer_from_json(const Json& j) {
  if (!j.is_object() || !j.contains("class_name") || !j["class_name"].is_string())
    throw ValueError("a layer must be {\"class_name\": ..., \"config\": {...}}. Received: " + json_excerpt(j));
  const std::string cls = j["class_name"].get<std::string>();
  check_config_keys(j, {"module", "class_name", "config", "registered_name", "build_config"}, "the " + cls + " entry");
  // The layer checks its config's keys itself (ConfigReader::finish). A
  // value of the wrong JSON type that a reader takes without checking
  // surfaces as nlohmann's type_error: it becomes one ValueError naming the
  // layer (found by fuzz/model_json_fuzz.cc).
  LayerPtr layer;
  try {
    layer = LayerRegistry::create(cls, j.value("config", Json::object()));
  } catch (const Json::exception& e) {
    throw ValueError("the " + cls + " entry has a value of the wrong type (" + json_error_text(e) +
                     "); see docs/SPEC.md for the layer's config keys");
  }
  if (j.contains("build_config") && !j["build_config"].is_null()) {
    auto shapes = build_shapes(j["build_config"], "the build_config of " + cls + " '" + layer->name() + "'");
    if (!shapes.empty()) layer->build_if_needed(shapes);
  }
  return layer;
}

// --- Input ------------------------------------------------------------------
namespace {
Json without_dtype(Json c) {
  if (c.is_object()) c.erase("dtype");  // InputLayer's dtype is a tensor dtype, not a policy
  return c;
}
}  // namespace

layers::InputLayerImpl::InputLayerImpl(const Json& config) : Layer(without_dtype(config)) {
  // Keras 3 writes batch_shape (and sparse, ragged, optional); Keras 2
  // batch_input_shape; kiln's spec form may give shape (no batch dim).
  check_config_keys(
      config,
      {"batch_shape", "batch_input_shape", "shape", "dtype", "sparse", "ragged", "optional", "name", "trainable"},
      "the InputLayer config");
  for (const char* flag : {"sparse", "ragged"})
    if (config.contains(flag) && config[flag].is_boolean() && config[flag].get<bool>())
      throw ValueError(std::string("InputLayer: ") + flag +
                       " inputs are not supported; kiln's inputs are dense tensors");
  const char* key = config.contains("batch_shape")         ? "batch_shape"
                    : config.contains("batch_input_shape") ? "batch_input_shape"
                                                           : "shape";
  batch_shape_ = shape_from(require(config, key, "InputLayer"), std::string("InputLayer `") + key + "`");
  if (std::string(key) == "shape") batch_shape_.insert(batch_shape_.begin(), kNone);
  dtype_ = dtype_from_string(get_or<std::string>(config, "dtype", "float32"));
  mark_built();
}

Json layers::InputLayerImpl::get_config() const {
  Json j;
  Json bs = Json::array();
  for (auto d : batch_shape_) bs.push_back(d < 0 ? Json(nullptr) : Json(d));
  j["batch_shape"] = bs;
  j["dtype"] = dtype_to_string(dtype_);
  j["sparse"] = false;
  j["name"] = name();
  return j;
}
KILN_REGISTER_LAYER_AS(InputLayer, layers::InputLayerImpl);

KerasTensor layers::Input(const Shape& shape, at::ScalarType dtype, const std::string& name) {
  for (auto d : shape)
    if (d == 0 || d < -1)
      throw ValueError("Input: every dimension must be positive or -1 (None). Received: shape=" +
                       shape_to_string(shape));
  Json cfg;
  Json bs = Json::array({nullptr});
  for (auto d : shape) bs.push_back(d < 0 ? Json(nullptr) : Json(d));
  cfg["batch_shape"] = bs;
  cfg["dtype"] = dtype_to_string(dtype);
  cfg["name"] = name.empty() ? unique_name("input_layer") : name;
  auto layer = layers::InputLayer(cfg);
  auto node = std::make_shared<Node>();
  node->layer = layer;
  Shape full = layer->batch_shape();
  node->output_shapes = {full};
  node->output_dtypes = {dtype};
  return KerasTensor{full, dtype, node, 0};
}

}  // namespace kiln
