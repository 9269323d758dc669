#include "kiln/models/sequential.h"

namespace kiln {

Sequential::Sequential(std::vector<LayerPtr> layers, const std::string& name)
    : Model(name.empty() ? Json::object() : Json{{"name", name}}) {
  for (auto& l : layers) add(l);
}

Sequential::Sequential(const Json& config) : Model(config) {
  if (config.contains("build_input_shape") && !config["build_input_shape"].is_null()) {
    Shape s;
    for (auto& d : config["build_input_shape"]) s.push_back(d.is_null() ? kNone : d.get<int64_t>());
    input_shape_ = s;
  }
  if (config.contains("input_dtype")) input_dtype_ = dtype_from_string(config["input_dtype"].get<std::string>());
  for (auto& lj : config.value("layers", Json::array())) {
    if (lj.value("class_name", "") == "InputLayer") {
      auto in = std::dynamic_pointer_cast<InputLayer>(layer_from_json(lj));
      input_shape_ = in->batch_shape();
      input_dtype_ = in->input_dtype();
      continue;
    }
    Json copy = lj;
    copy.erase("build_config");  // the model builds its layers in order
    add(layer_from_json(copy));
  }
  if (input_shape_) build_if_needed({*input_shape_});
}

void Sequential::add(LayerPtr layer) {
  if (!layer) throw ValueError("Sequential.add: received a null layer");
  if (auto in = std::dynamic_pointer_cast<InputLayer>(layer)) {
    if (!layers_.empty()) throw ValueError("Sequential.add: an Input must come first");
    input_shape_ = in->batch_shape();
    input_dtype_ = in->input_dtype();
    build_if_needed({*input_shape_});
    return;
  }
  for (auto& l : layers_)
    if (l->name() == layer->name() && !l->name().empty() && l != layer)
      throw ValueError("Sequential.add: the model already has a layer named '" + layer->name() +
                       "'; layer names must be unique");
  layers_.push_back(layer);
  track(layer);
  if (built()) {
    // Keep the built model consistent: build the new layer on the current output.
    NameScope scope(name());
    std::vector<Shape> shapes = {*input_shape_};
    for (size_t i = 0; i + 1 < layers_.size(); ++i) shapes = layers_[i]->compute_output_shape(shapes);
    layer->build_if_needed(shapes);
  }
}

void Sequential::add(const KerasTensor& input) {
  if (!input.node) throw ValueError("Sequential.add: received an empty KerasTensor");
  add(input.node->layer);
}

void Sequential::pop() {
  if (layers_.empty()) throw ValueError("Sequential.pop: the model has no layers");
  layers_.pop_back();
}

std::vector<Shape> Sequential::input_shapes() const {
  if (input_shape_) return {*input_shape_};
  return build_input_shapes();
}

std::vector<at::ScalarType> Sequential::input_dtypes() const { return {input_dtype_}; }

void Sequential::build(const std::vector<Shape>& input_shapes) {
  if (input_shapes.size() != 1)
    throw ValueError("Sequential model '" + name() + "' takes one input. Received " +
                     std::to_string(input_shapes.size()));
  input_shape_ = input_shapes[0];
  std::vector<Shape> shapes = input_shapes;
  for (auto& l : layers_) {
    l->build_if_needed(shapes);
    shapes = l->compute_output_shape(shapes);
  }
}

Tensors Sequential::call(const Tensors& inputs, bool training) {
  return call_masked(inputs, {}, training, nullptr);
}

Tensors Sequential::call_masked(const Tensors& inputs, const Tensors& masks, bool training,
                                Tensors* output_masks) {
  Tensors x = inputs;
  Tensors m = masks;  // each layer's output masks feed the next layer
  for (auto& l : layers_) {
    x = l->call_with_masks(x, m, training, &m);
    if (x.size() != 1)
      throw ValueError("Sequential: layer '" + l->name() + "' returned " + std::to_string(x.size()) +
                       " outputs; every layer in a Sequential model must return one");
  }
  if (output_masks) *output_masks = m;
  return x;
}

std::vector<Shape> Sequential::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  std::vector<Shape> shapes = input_shapes;
  for (auto& l : layers_) shapes = l->compute_output_shape(shapes);
  return shapes;
}

Json Sequential::get_config() const {
  Json j = base_config();
  Json layers = Json::array();
  for (auto& l : layers_) layers.push_back(l->to_json());
  j["layers"] = layers;
  if (input_shape_) {
    Json s = Json::array();
    for (auto d : *input_shape_) s.push_back(d < 0 ? Json(nullptr) : Json(d));
    j["build_input_shape"] = s;
    j["input_dtype"] = dtype_to_string(input_dtype_);
  }
  return j;
}

KILN_REGISTER_LAYER(Sequential);

}  // namespace kiln
