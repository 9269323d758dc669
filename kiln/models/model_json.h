// Models as Keras 3's JSON: model.to_json() / keras.models.model_from_json().
//
//   Json j = model_to_json(*model);      // {"module", "class_name": "Functional",
//                                        //  "config", "registered_name", "compile_config"}
//   ModelPtr copy = model_from_json(j);  // same architecture, fresh weights,
//                                        // compiled when j has a compile_config
//
// The config is the form Keras writes (inbound nodes of __keras_tensor__
// objects, DTypePolicy objects, build_config), so a config round-trips
// between kiln and Keras; kiln's older form (and Keras 2's inbound nodes)
// still load. Unknown keys are errors (ValueError/FormatError naming them).
#pragma once

#include <string>

#include "kiln/core/json.h"
#include "kiln/models/model.h"

namespace kiln {

// A layer as Keras's serialize_keras_object writes it: module, class_name,
// config, registered_name and, once built, build_config. Models get their
// Keras module (Sequential: "keras"; Functional: "keras.src.models.functional"
// with registered_name "Functional").
Json serialize_layer(const Layer& layer);

// model.to_json(), with "compile_config" when the model is compiled.
Json model_to_json(const models::Model& model);

// keras.models.model_from_json(): accepts model_to_json's form (a string or
// parsed JSON). Compiles the model when a compile_config is present.
ModelPtr model_from_json(const Json& j);
ModelPtr model_from_json(const std::string& text);

namespace models {
using ::kiln::model_from_json;  // keras.models.model_from_json
using ::kiln::model_to_json;
}  // namespace models

}  // namespace kiln
