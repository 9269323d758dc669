// The model directory shared by save/load_model, checkpoints, the tuner,
// the server and batch prediction:
//
//   <dir>/model.json            architecture, compile config, dtype policy,
//                               quantization, signatures
//   <dir>/weights.safetensors   every variable, keyed by its path
//   <dir>/optimizer.safetensors optimizer slots and iterations (optional)
//   <dir>/assets/, assets/extra/ (warmup requests; written by other tools)
//
// The directory appears only when complete (AtomicDirectory). Model::save,
// Model::save_weights/load_weights and load_model (declared in
// kiln/models/model.h) are implemented in model_io.cc.
#pragma once

#include <string>

#include "kiln/core/json.h"
#include "kiln/models/model.h"
#include "kiln/saving/safetensors.h"

namespace kiln {

constexpr int kModelFormatVersion = 1;

// Signatures as `kiln show` and the server see them:
// {"serving_default": {"inputs": {name: {"dtype", "shape"}}, "outputs": {...},
//  "method_name": "predict"}}
Json model_signatures(Model& model);

// model.json of a model directory, validated (FormatError names what is missing).
Json read_model_json(const std::string& dir);

// Variables keyed by path, in model order. Error on duplicate paths.
NamedTensors named_weights(const Model& model);
// Assigns by path; FormatError names missing/extra/mismatched entries.
void assign_named_weights(Model& model, const NamedTensors& tensors, const std::string& what);

}  // namespace kiln
