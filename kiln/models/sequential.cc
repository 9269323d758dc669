#include "kiln/models/sequential.h"

#include "kiln/core/config_keys.h"
#include "kiln/core/json_limits.h"
#include "kiln/layers/sharded_kernel.h"
#include "kiln/models/model_json.h"

namespace kiln {

models::SequentialImpl::SequentialImpl(std::vector<LayerPtr> layers, const std::string& name)
    : models::Model(name.empty() ? Json::object() : Json{{"name", name}}) {
  for (auto& l : layers) add(l);
}

models::SequentialImpl::SequentialImpl(std::initializer_list<models::SequentialItem> items, const std::string& name)
    : models::Model(name.empty() ? Json::object() : Json{{"name", name}}) {
  for (const models::SequentialItem& item : items) {
    if (item.layer())
      add(item.layer());
    else
      add(item.input());
  }
}

models::SequentialImpl::SequentialImpl(const Json& config) : models::Model(config) {
  check_config_keys(config, {"name", "trainable", "dtype", "layers", "build_input_shape", "input_dtype"},
                    "the Sequential config");
  if (config.contains("build_input_shape") && !config["build_input_shape"].is_null()) {
    const Json& bs = config["build_input_shape"];
    if (!bs.is_array() || bs.empty())
      throw FormatError(
          "Sequential config: `build_input_shape` must be a shape with the batch dim, e.g. [null, 784]. "
          "Received: " +
          bs.dump().substr(0, 120));
    Shape s;
    for (auto& d : bs) {
      if (!d.is_null() && !d.is_number_integer())
        throw FormatError("Sequential config: `build_input_shape` must hold integers or null. Received: " +
                          bs.dump().substr(0, 120));
      s.push_back(d.is_null() ? kNone : d.get<int64_t>());
    }
    input_shape_ = s;
  }
  if (config.contains("input_dtype")) {
    if (!config["input_dtype"].is_string())
      throw FormatError("Sequential config: `input_dtype` must be a dtype name such as \"float32\". Received: " +
                        json_excerpt(config["input_dtype"]));
    input_dtype_ = dtype_from_string(config["input_dtype"].get<std::string>());
  }
  const Json layers = config.value("layers", Json::array());
  if (!layers.is_array()) throw FormatError("Sequential config: `layers` must be a list");
  for (size_t i = 0; i < layers.size(); ++i) {
    const Json& lj = layers[i];
    if (lj.is_object() && lj.contains("class_name") && lj["class_name"] == "InputLayer") {
      if (i != 0)
        throw FormatError("Sequential config: an InputLayer may only come first (found at layers[" + std::to_string(i) +
                          "])");
      auto in = std::dynamic_pointer_cast<layers::InputLayerImpl>(layer_from_json(lj));
      input_shape_ = in->batch_shape();
      input_dtype_ = in->input_dtype();
      input_name_ = in->name();
      continue;
    }
    Json copy = lj;
    if (copy.is_object() && copy.contains("build_config")) {
      // The model builds its layers in order; the keys are still checked.
      if (!copy["build_config"].is_null())
        check_config_keys(copy["build_config"], {"input_shape", "shapes_dict", "input_shapes"},
                          "the build_config of Sequential layers[" + std::to_string(i) + "]");
      copy.erase("build_config");
    }
    add(layer_from_json(copy));
  }
  if (input_shape_) build_if_needed({*input_shape_});
}

void models::SequentialImpl::add(LayerPtr layer) {
  if (!layer) throw ValueError("Sequential.add: received a null layer");
  if (auto in = std::dynamic_pointer_cast<layers::InputLayerImpl>(layer)) {
    if (!layers_.empty()) throw ValueError("Sequential.add: an Input must come first");
    input_shape_ = in->batch_shape();
    input_dtype_ = in->input_dtype();
    input_name_ = in->name();
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

void models::SequentialImpl::add(const KerasTensor& input) {
  if (!input.node) throw ValueError("Sequential.add: received an empty KerasTensor");
  add(input.node->layer);
}

void models::SequentialImpl::pop() {
  if (layers_.empty()) throw ValueError("Sequential.pop: the model has no layers");
  layers_.pop_back();
}

std::vector<Shape> models::SequentialImpl::input_shapes() const {
  if (input_shape_) return {*input_shape_};
  return build_input_shapes();
}

std::vector<at::ScalarType> models::SequentialImpl::input_dtypes() const { return {input_dtype_}; }

void models::SequentialImpl::build(const std::vector<Shape>& input_shapes) {
  if (input_shapes.size() != 1)
    throw ValueError("Sequential model '" + name() + "' takes one input. Received " +
                     std::to_string(input_shapes.size()));
  if (build_in_own_scope(input_shapes)) return;
  input_shape_ = input_shapes[0];
  std::vector<Shape> shapes = input_shapes;
  for (auto& l : layers_) {
    l->build_if_needed(shapes);
    shapes = l->compute_output_shape(shapes);
  }
}

Tensors models::SequentialImpl::call(const Tensors& inputs, bool training) {
  return call_masked(inputs, {}, training, nullptr);
}

Tensors models::SequentialImpl::call_masked(const Tensors& inputs, const Tensors& masks, bool training,
                                            Tensors* output_masks) {
  // ModelParallel: no gather between a column- and a row-parallel layer.
  if (distribution()) plan_sharded_chain(layers_);
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

std::vector<Shape> models::SequentialImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  std::vector<Shape> shapes = input_shapes;
  for (auto& l : layers_) shapes = l->compute_output_shape(shapes);
  return shapes;
}

Json models::SequentialImpl::get_config() const {
  // Keras 3's form: the InputLayer first, then each layer serialized, and
  // the build shape.
  Json j = base_config();
  Json layers = Json::array();
  Json batch_shape = Json::array();
  if (input_shape_)
    for (auto d : *input_shape_) batch_shape.push_back(d < 0 ? Json(nullptr) : Json(d));
  if (input_shape_) {
    Json in;
    in["module"] = "keras.layers";
    in["class_name"] = "InputLayer";
    in["config"] = Json{{"batch_shape", batch_shape},
                        {"dtype", dtype_to_string(input_dtype_)},
                        {"sparse", false},
                        {"name", input_name_.empty() ? std::string("input_layer") : input_name_}};
    in["registered_name"] = nullptr;
    layers.push_back(in);
  }
  for (auto& l : layers_) layers.push_back(serialize_layer(*l));
  j["layers"] = layers;
  if (input_shape_) j["build_input_shape"] = batch_shape;
  return j;
}

KILN_REGISTER_LAYER_AS(Sequential, models::SequentialImpl);

}  // namespace kiln
