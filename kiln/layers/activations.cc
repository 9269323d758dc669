#include "kiln/layers/activations.h"

#include <map>

#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {

const std::map<std::string, ActivationFn>& table() {
  static const std::map<std::string, ActivationFn> t = {
      {"linear", [](const at::Tensor& x) { return x; }},
      {"relu", [](const at::Tensor& x) { return at::relu(x); }},
      {"relu6", [](const at::Tensor& x) { return at::clamp(x, 0.0, 6.0); }},
      {"gelu", [](const at::Tensor& x) { return at::gelu(x); }},
      {"sigmoid", [](const at::Tensor& x) { return at::sigmoid(x); }},
      // Keras 3: relu6(x + 3) / 6.
      {"hard_sigmoid", [](const at::Tensor& x) { return at::clamp(x + 3.0, 0.0, 6.0) / 6.0; }},
      {"tanh", [](const at::Tensor& x) { return at::tanh(x); }},
      {"softmax", [](const at::Tensor& x) { return at::softmax(x, -1); }},
      {"log_softmax", [](const at::Tensor& x) { return at::log_softmax(x, -1); }},
      {"silu", [](const at::Tensor& x) { return at::silu(x); }},
      {"swish", [](const at::Tensor& x) { return at::silu(x); }},
      {"leaky_relu", [](const at::Tensor& x) { return at::leaky_relu(x, 0.2); }},
      {"elu", [](const at::Tensor& x) { return at::elu(x); }},
      {"selu", [](const at::Tensor& x) { return at::selu(x); }},
      {"softplus", [](const at::Tensor& x) { return at::softplus(x); }},
      {"softsign", [](const at::Tensor& x) { return x / (at::abs(x) + 1.0); }},
      {"exponential", [](const at::Tensor& x) { return at::exp(x); }},
      {"mish", [](const at::Tensor& x) { return x * at::tanh(at::softplus(x)); }},
  };
  return t;
}

}  // namespace

bool is_activation(const std::string& name) { return table().count(name) > 0; }

std::vector<std::string> activation_names() {
  std::vector<std::string> out;
  for (auto& [k, v] : table()) out.push_back(k);
  return out;
}

ActivationFn get_activation(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end()) {
    std::string known;
    for (auto& n : activation_names()) known += (known.empty() ? "" : ", ") + n;
    throw ValueError("unknown activation '" + name + "'; known activations: " + known);
  }
  return it->second;
}

namespace {
const FieldTable<layers::ActivationOptions>& activation_fields() {
  static const FieldTable<layers::ActivationOptions> t = {
      field("activation", &layers::ActivationOptions::activation).activation().required("e.g. \"relu\"")};
  return t;
}
}  // namespace

layers::ActivationOptions layers::ActivationImpl::options_from_config(const Json& config) {
  return read_fields(config, "Activation", activation_fields());
}

layers::ActivationImpl::ActivationImpl(const layers::ActivationOptions& o)
    : layers::ActivationImpl(o, layer_base_config(o.base)) {}

layers::ActivationImpl::ActivationImpl(const Json& config)
    : layers::ActivationImpl(options_from_config(config), config) {}

layers::ActivationImpl::ActivationImpl(const layers::ActivationOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Activation", options_, activation_fields());
  fn_ = get_activation(options_.activation);
}

layers::ActivationImpl::ActivationImpl(const std::string& activation, const Json& extra)
    : layers::ActivationImpl(merged_config(extra, Json{{"activation", activation}})) {}

std::vector<Shape> layers::ActivationImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

at::Tensor layers::ActivationImpl::call1(const at::Tensor& x, bool training) { return fn_(x); }

Json layers::ActivationImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, activation_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Activation, layers::ActivationImpl);

}  // namespace kiln
