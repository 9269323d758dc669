// ONNX export of Sequential and Functional models built from kiln's core
// layers, for ONNX Runtime (server, browser, mobile).
//
//   ModelPtr model = load_model("models/fashion_mnist/3");
//   exporter::export_onnx(*model, "model.onnx");   // opset 17, float32
//
// Supported layers: Dense, Activation (relu, relu6, gelu, sigmoid, tanh,
// softmax, silu/swish, leaky_relu, elu, selu, softplus, softsign,
// exponential, linear), Dropout (identity), Flatten, Reshape, Rescaling,
// Normalization, Add, Subtract, Multiply, Average, Maximum, Minimum,
// Concatenate, Conv2D, MaxPooling2D, AveragePooling2D,
// GlobalAveragePooling2D, GlobalMaxPooling2D, BatchNormalization (inference
// form), LayerNormalization, Embedding. Layouts follow kiln's
// (channels_last); 2D convolutions and pools are wrapped in transposes to
// ONNX's NCHW. The batch dimension is symbolic ("batch").
//
// Precision: graph inputs and outputs are float32 (or the model's integer
// input dtype). Layers under a bfloat16/float16 policy are emulated in
// float32 with Casts to the 16-bit type and back where kiln rounds; int8
// Dense layers (dynamic or calibrated) quantize their inputs in the graph
// as kiln does and multiply with MatMulInteger on the stored int8 kernel;
// int8 Embedding gathers int8 rows and divides by their scales. float8 and
// int8_qat layers are refused (ValueError naming the layer). See
// docs/EXPORT.md for the ops and the differences measured.
//
// Errors: ValueError naming the first unsupported layer (and its class) or
// option (e.g. an activation, a data_format) before anything is written;
// StateError for a model that is not built. The file is written atomically.
// Thread safety: reads the model; do not train it concurrently.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/models/model.h"

namespace kiln::exporter {

struct OnnxExportOptions {
  int64_t opset = 17;      // ai.onnx opset; 17 is supported by ONNX Runtime >= 1.12
  std::string graph_name;  // default: the model's name
  void validate() const;
};

// The serialized ModelProto.
std::string export_onnx_bytes(Model& model, const OnnxExportOptions& options = {});
void export_onnx(Model& model, const std::string& path, const OnnxExportOptions& options = {});

}  // namespace kiln::exporter
