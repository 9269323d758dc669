// Spec: the "model" section. Layers come from the registry by class name
// (layer_from_json), so the CLI speaks the same vocabulary as model.json and
// needs no layer headers.
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/layers/categorical.h"
#include "kiln/layers/layer.h"
#include "kiln/layers/preprocessing.h"
#include "kiln/layers/text_preprocessing.h"
#include "kiln/models/model_json.h"
#include "kiln/models/sequential.h"
#include "kiln/spec/spec.h"

namespace kiln::spec {
namespace {

Json layer_json(const std::string& class_name, Json config = Json::object()) {
  return Json{{"class_name", class_name}, {"config", std::move(config)}};
}

// [] is a shape too: one scalar per example (an Input(shape=()) of strings).
Shape shape_from_json(const Json& j, const std::string& where) {
  Shape s;
  if (!j.is_array())
    throw ValueError(
        where + " must be a list of positive dims without the batch dim, e.g. [784]. Received: " + json_excerpt(j));
  for (auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      throw ValueError(
          where + " must be a list of positive dims without the batch dim, e.g. [784]. Received: " + json_excerpt(j));
    s.push_back(v.get<int64_t>());
  }
  return s;
}

std::vector<int64_t> int_list(const Json& args, const char* key, std::vector<int64_t> fallback,
                              const std::string& owner) {
  if (!args.contains(key) || args[key].is_null()) return fallback;
  const Json& v = args[key];
  std::vector<int64_t> out;
  if (v.is_number_integer()) return {v.get<int64_t>()};
  if (!v.is_array())
    throw ValueError(owner + ": `" + key + "` must be a list of positive integers. Received: " + json_excerpt(v));
  for (auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 1)
      throw ValueError(owner + ": `" + key + "` must be a list of positive integers. Received: " + json_excerpt(v));
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// Applies `layers` (registry JSON) one by one after an Input of `shape`, so
// an error names the entry at fault.
ModelPtr sequential_from(const std::vector<Json>& layers, const Shape& shape, at::ScalarType dtype,
                         const std::string& name, const std::string& where) {
  auto model = models::Sequential(std::vector<LayerPtr>{}, name);
  model->add(layers::Input(shape, dtype));
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const Json& lj = layers[i];
    LayerPtr layer;
    try {
      layer = layer_from_json(lj);
    } catch (const UserError& e) {
      throw ValueError(at + ": " + e.what());
    }
    try {
      model->add(layer);
    } catch (const ShapeError& e) {
      throw ValueError(at + " (" + lj["class_name"].get<std::string>() +
                       ") does not fit after the layers before it: " + e.what());
    } catch (const UserError& e) {  // e.g. a layout the distribution refuses for its variables
      throw ValueError(at + " (" + lj["class_name"].get<std::string>() + "): " + e.what());
    }
  }
  return model;
}

ModelPtr mlp(const Json& args, const std::optional<Shape>& input_shape) {
  const std::string owner = "builtin model \"mlp\"";
  check_keys(args, {"input_shape", "hidden_units", "dropout", "activation", "num_classes", "output_activation", "name"},
             owner + " args");
  Shape shape = args.contains("input_shape") ? shape_from_json(args["input_shape"], owner + ": `input_shape`")
                                             : input_shape.value_or(Shape{784});
  auto hidden = int_list(args, "hidden_units", {256, 256}, owner);
  double dropout = get_or<double>(args, "dropout", 0.2);
  if (dropout < 0 || dropout >= 1)
    throw ValueError(owner + ": `dropout` must be in [0, 1). Received: " + std::to_string(dropout));
  std::string activation = get_or<std::string>(args, "activation", "relu");
  int64_t classes = int_or<int64_t>(args, "num_classes", 10, "model.args");
  if (classes < 1)
    throw ValueError(owner + ": `num_classes` must be a positive integer. Received: " + std::to_string(classes));
  std::vector<Json> layers;
  if (shape.size() > 1) layers.push_back(layer_json("Flatten"));
  for (auto units : hidden) {
    layers.push_back(layer_json("Dense", {{"units", units}, {"activation", activation}}));
    if (dropout > 0) layers.push_back(layer_json("Dropout", {{"rate", dropout}}));
  }
  layers.push_back(layer_json(
      "Dense", {{"units", classes}, {"activation", get_or<std::string>(args, "output_activation", "softmax")}}));
  return sequential_from(layers, shape, at::kFloat, get_or<std::string>(args, "name", "mlp"), owner);
}

ModelPtr cnn(const Json& args, const std::optional<Shape>& input_shape) {
  const std::string owner = "builtin model \"cnn\"";
  check_keys(args,
             {"input_shape", "filters", "kernel_size", "pool_size", "dense_units", "dropout", "activation",
              "num_classes", "output_activation", "name"},
             owner + " args");
  Shape shape = args.contains("input_shape") ? shape_from_json(args["input_shape"], owner + ": `input_shape`")
                                             : input_shape.value_or(Shape{28, 28, 1});
  auto filters = int_list(args, "filters", {32, 64}, owner);
  int64_t kernel = int_or<int64_t>(args, "kernel_size", 3, "model.args"),
          pool = int_or<int64_t>(args, "pool_size", 2, "model.args");
  auto dense = int_list(args, "dense_units", {}, owner);
  double dropout = get_or<double>(args, "dropout", 0.5);
  if (dropout < 0 || dropout >= 1)
    throw ValueError(owner + ": `dropout` must be in [0, 1). Received: " + std::to_string(dropout));
  std::string activation = get_or<std::string>(args, "activation", "relu");
  int64_t classes = int_or<int64_t>(args, "num_classes", 10, "model.args");
  std::vector<Json> layers;
  // Images without a channel axis (N, 28, 28) get one.
  if (shape.size() == 2)
    layers.push_back(layer_json("Reshape", {{"target_shape", Json::array({shape[0], shape[1], 1})}}));
  else if (shape.size() != 3)
    throw ValueError(owner +
                     " takes images (height, width[, channels]). Received: input_shape=" + shape_to_string(shape));
  for (auto f : filters) {
    layers.push_back(layer_json(
        "Conv2D", {{"filters", f}, {"kernel_size", Json::array({kernel, kernel})}, {"activation", activation}}));
    layers.push_back(layer_json("MaxPooling2D", {{"pool_size", Json::array({pool, pool})}}));
  }
  layers.push_back(layer_json("Flatten"));
  for (auto units : dense) layers.push_back(layer_json("Dense", {{"units", units}, {"activation", activation}}));
  if (dropout > 0) layers.push_back(layer_json("Dropout", {{"rate", dropout}}));
  layers.push_back(layer_json(
      "Dense", {{"units", classes}, {"activation", get_or<std::string>(args, "output_activation", "softmax")}}));
  return sequential_from(layers, shape, at::kFloat, get_or<std::string>(args, "name", "cnn"), owner);
}

}  // namespace

std::vector<std::string> builtin_model_names() { return {"mlp", "cnn"}; }

ModelPtr builtin_model(const std::string& name, const Json& args, const std::optional<Shape>& input_shape) {
  Json a = args.is_null() ? Json::object() : args;
  if (name == "mlp") return mlp(a, input_shape);
  if (name == "cnn") return cnn(a, input_shape);
  throw ValueError("unknown builtin model \"" + name + "\"; known builtin models: mlp, cnn");
}

ModelPtr build_model(const Json& m, const std::optional<Shape>& input_shape) {
  if (!m.is_object()) throw ValueError("the `model` section must be a JSON object. Received: " + json_excerpt(m));
  if (m.contains("builtin")) {
    check_keys(m, {"builtin", "args"}, "the `model` section (builtin)");
    if (!m["builtin"].is_string()) throw ValueError("`model.builtin` must be a name: mlp or cnn");
    return builtin_model(m["builtin"].get<std::string>(), m.value("args", Json::object()), input_shape);
  }
  if (m.contains("layers")) {
    check_keys(m, {"layers", "input_shape", "input_dtype", "name", "adapt"}, "the `model` section (layers)");
    if (!m["layers"].is_array() || m["layers"].empty())
      throw ValueError("`model.layers` must be a non-empty list of {\"class_name\", \"config\"} objects");
    std::vector<Json> layers;
    std::optional<Shape> shape;
    if (m.contains("input_shape")) shape = shape_from_json(m["input_shape"], "`model.input_shape`");
    for (size_t i = 0; i < m["layers"].size(); ++i) {
      Json lj = m["layers"][i];
      const std::string at = "model.layers[" + std::to_string(i) + "]";
      if (lj.is_string()) lj = layer_json(lj.get<std::string>());
      if (!lj.is_object() || !lj.contains("class_name") || !lj["class_name"].is_string())
        throw ValueError(at + " must be {\"class_name\": \"Dense\", \"config\": {...}}. Received: " + json_excerpt(lj));
      check_keys(lj, {"class_name", "config", "build_config", "module", "registered_name"}, at);
      if (!lj.contains("config")) lj["config"] = Json::object();
      if (lj["class_name"] == "InputLayer") {
        // Keras writes the input as the first layer of a Sequential config.
        if (i != 0) throw ValueError(at + ": an InputLayer may only come first");
        const Json& c = lj["config"];
        if (c.contains("batch_shape")) {
          Json dims = c["batch_shape"];
          dims.erase(dims.begin());
          shape = shape_from_json(dims, at + ": `batch_shape` after the batch dim");
        } else if (c.contains("shape")) {
          shape = shape_from_json(c["shape"], at + ": `shape`");
        }
        continue;
      }
      layers.push_back(lj);
    }
    if (!shape) shape = input_shape;
    if (!shape) throw ValueError("the `model` section needs `input_shape` (dims without the batch dim, e.g. [784])");
    at::ScalarType dtype = dtype_from_string(get_or<std::string>(m, "input_dtype", "float32"));
    return sequential_from(layers, *shape, dtype, get_or<std::string>(m, "name", ""), "model.layers");
  }
  if (m.contains("class_name")) {
    LayerPtr layer;
    Json arch = m;
    arch.erase("adapt");  // kiln's, read by adapt_model
    try {
      layer = layer_from_json(arch);
    } catch (const UserError& e) {
      throw ValueError(std::string("the `model` section: ") + e.what());
    }
    auto model = std::dynamic_pointer_cast<models::Model>(layer);
    if (!model)
      throw ValueError("the `model` section describes a " + m["class_name"].get<std::string>() +
                       " layer, not a model; use \"Sequential\" or \"Functional\", or list layers under `layers`");
    if (model->input_shapes().empty() && input_shape) {
      std::vector<Shape> shapes{Shape{kNone}};
      shapes[0].insert(shapes[0].end(), input_shape->begin(), input_shape->end());
      model->build_if_needed(shapes);
    }
    return model;
  }
  throw ValueError(
      "the `model` section needs one of `builtin` ({\"builtin\": \"mlp\"}), `layers` ([{\"class_name\": \"Dense\", "
      "...}]) or a Keras model config ({\"class_name\": \"Sequential\", \"config\": {...}})");
}

ModelPtr adapt_model(const Json& m, ModelPtr model, const at::Tensor& x_train) {
  if (!m.is_object() || !m.contains("adapt") || m["adapt"].is_null()) return model;
  const Json& names = m["adapt"];
  if (!names.is_array() || names.empty())
    throw ValueError("`model.adapt` must be a list of layer names, e.g. [\"vectorize\"]. Received: " +
                     json_excerpt(names));
  for (auto& n : names) {
    if (!n.is_string()) throw ValueError("`model.adapt` must list layer names. Received: " + json_excerpt(n));
    LayerPtr layer;
    try {
      layer = model->get_layer(n.get<std::string>());
    } catch (const NotFoundError& e) {
      throw ValueError(std::string("`model.adapt`: ") + e.what() + " (name the layer in its config)");
    }
    if (auto tv = std::dynamic_pointer_cast<layers::TextVectorizationImpl>(layer))
      tv->adapt(x_train);
    else if (auto sl = std::dynamic_pointer_cast<layers::StringLookupImpl>(layer))
      sl->adapt(x_train);
    else if (auto il = std::dynamic_pointer_cast<layers::IntegerLookupImpl>(layer))
      il->adapt(x_train);
    else if (auto norm = std::dynamic_pointer_cast<layers::NormalizationImpl>(layer))
      norm->adapt(x_train);
    else
      throw ValueError("`model.adapt`: layer '" + layer->name() + "' is a " + layer->class_name() +
                       ", which does not adapt; adaptable layers: TextVectorization, StringLookup, IntegerLookup, "
                       "Normalization");
  }
  // Rebuilt from the config, which now holds the vocabulary: later layers
  // see the adapted output shapes.
  auto rebuilt = std::dynamic_pointer_cast<models::Model>(layer_from_json(serialize_layer(*model)));
  if (!rebuilt) throw Error("adapt_model: the model's config did not rebuild a model");
  return rebuilt;
}

}  // namespace kiln::spec
