#include "kiln/models/model.h"

#include "kiln/core/error.h"
#include "kiln/core/variable.h"

namespace kiln {

models::Model::Model(const Json& config) : Layer(config) {}

bool models::Model::build_in_own_scope(const std::vector<Shape>& input_shapes) {
  if (built()) return false;
  // Called directly (model->build(shapes), as Keras users do): without the
  // scope the sublayers' paths would lack the model's name and the saved
  // weights would not match the model load_model rebuilds.
  const std::string scope = current_name_scope();
  const std::string& me = name();
  const bool in_own_scope =
      scope == me ||
      (scope.size() > me.size() && scope.compare(scope.size() - me.size() - 1, std::string::npos, "/" + me) == 0);
  if (in_own_scope) return false;
  build_if_needed(input_shapes);  // opens the scope and calls build() again
  return true;
}

void models::Model::build(const std::vector<Shape>& input_shapes) {
  // A subclassed model makes its sublayers' variables in its first call:
  // run it once on zeros (no grad), as Keras's Model.build does, so a model
  // rebuilt from its config has its variables before weights are loaded.
  // (Under build_if_needed's name scope: paths are "<model>/<layer>/...".)
  if (build_in_own_scope(input_shapes)) return;
  if (input_shapes.empty()) return;
  Tensors probe;
  for (auto& s : input_shapes) probe.push_back(at::zeros(concrete(s, 1), at::kFloat));
  at::NoGradGuard no_grad;
  num_outputs_ = call(probe, false).size();
}
models::Model::~Model() = default;

LayerPtr models::Model::get_layer(const std::string& name) const {
  std::string known;
  for (auto& l : layers()) {
    if (l->name() == name) return l;
    known += (known.empty() ? "" : ", ") + l->name();
  }
  throw NotFoundError("no layer named '" + name + "' in model '" + this->name() + "'; layers: " + known);
}

std::vector<at::ScalarType> models::Model::input_dtypes() const {
  return std::vector<at::ScalarType>(input_shapes().size(), at::kFloat);
}

std::vector<std::string> models::Model::input_names() const {
  auto n = input_shapes().size();
  if (n <= 1) return {"inputs"};
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back("inputs_" + std::to_string(i));
  return out;
}

std::vector<std::string> models::Model::output_names() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < num_outputs_; ++i) names.push_back("output_" + std::to_string(i));
  return names;
}

std::vector<Shape> models::Model::output_shapes() {
  auto in = input_shapes();
  if (in.empty()) throw StateError("model '" + name() + "' has no known input shape yet; build it or call it once");
  return compute_output_shape(in);
}

Json models::Model::get_config() const { return base_config(); }

double History::last(const std::string& key) const {
  auto it = history.find(key);
  if (it == history.end() || it->second.empty()) {
    std::string known;
    for (auto& [k, v] : history) known += (known.empty() ? "" : ", ") + k;
    throw NotFoundError("History has no '" + key + "'; keys: " + known);
  }
  return it->second.back();
}

}  // namespace kiln
