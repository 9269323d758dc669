#include "kiln/models/model_json.h"

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"

namespace kiln {

Json serialize_layer(const Layer& layer) {
  Json j = layer.to_json();
  if (dynamic_cast<const models::FunctionalImpl*>(&layer)) {
    // Keras's Functional is not a public symbol: it serializes under its
    // module path, with a registered name, and builds from its graph.
    j["module"] = "keras.src.models.functional";
    j["registered_name"] = "Functional";
    j.erase("build_config");
  } else if (dynamic_cast<const models::SequentialImpl*>(&layer)) {
    j["module"] = "keras";
  } else if (dynamic_cast<const models::Model*>(&layer)) {
    // A subclassed model: a custom object, registered by class name.
    j["module"] = "kiln.models";
    j["registered_name"] = "kiln>" + layer.class_name();
  }
  return j;
}

Json model_to_json(const models::Model& model) {
  Json j = serialize_layer(model);
  if (model.compiled()) j["compile_config"] = model.compile_args().to_json();
  return j;
}

ModelPtr model_from_json(const Json& j) {
  if (!j.is_object() || !j.contains("class_name") || !j["class_name"].is_string())
    throw ValueError("a model must be {\"class_name\": \"Sequential\"|\"Functional\"|..., \"config\": {...}}");
  check_config_keys(j, {"module", "class_name", "config", "registered_name", "build_config", "compile_config"},
                    "the model JSON");
  Json arch = j;
  arch.erase("compile_config");
  auto model = std::dynamic_pointer_cast<models::Model>(layer_from_json(arch));
  if (!model)
    throw ValueError("the model JSON describes a " + j["class_name"].get<std::string>() +
                     " layer, not a model (Sequential, Functional or a registered subclass)");
  if (j.contains("compile_config") && !j["compile_config"].is_null())
    model->compile(CompileArgs::from_json(j["compile_config"]));
  return model;
}

ModelPtr model_from_json(const std::string& text) { return model_from_json(parse_json(text, "the model JSON")); }

}  // namespace kiln
