// ONNX export of Sequential and Functional models built from kiln's core
// layers, for ONNX Runtime (server, browser, mobile).
//
//   ModelPtr model = load_model("models/fashion_mnist/3");
//   exporter::export_onnx(*model, "model.onnx");   // opset 17, float32
//
// Layers: every registered layer class with an ONNX form at opset 17 has an
// exporter (one function per class or family, in onnx_<family>.cc, in a
// table keyed by class name in onnx_export.cc); onnx_layer_support() lists each registered class as exported or
// with the reason it is not, and docs/EXPORT.md carries that table. Among
// them: Dense, EinsumDense, the activations and activation layers,
// Conv1D/Conv2D/Conv2DTranspose/DepthwiseConv2D/SeparableConv2D, the 1D/2D
// and global poolings, the reshaping layers, the normalizations, the merging
// layers, Embedding, LSTM/GRU/SimpleRNN (ONNX LSTM/GRU/RNN) and
// Bidirectional, TimeDistributed, MultiHeadAttention (with attention_mask
// and use_causal_mask), nested Sequential/Functional models, the
// preprocessing layers (Rescaling, Normalization, Resizing,
// CategoryEncoding, IntegerLookup with output_mode "int"), the string
// layers (TextVectorization with standardize "lower" or null and split
// "whitespace" or null, StringLookup with output_mode "int": StringNormalizer,
// StringSplit and ai.onnx.ml LabelEncoder, from the layer's config), and the
// identity-at-inference layers (Dropout, noise, Random* augmentations).
// Layouts follow kiln's (channels_last); convolutions and pools are wrapped
// in transposes to ONNX's channels-first. The batch dimension is symbolic
// ("batch"). Masks (Embedding mask_zero, Masking) are not carried: a
// recurrent layer that would use one is refused.
//
// Strings: a string input (dtype "string") is a tensor(string) of its
// logical shape, and the model is written at opset 20 at least (StringSplit
// came at 20; onnx_opset()).
//
// Precision: graph inputs and outputs are float32 (or the model's integer
// input dtype). Layers under a bfloat16/float16 policy are emulated in
// float32 with Casts to the 16-bit type and back where kiln rounds; int8
// Dense layers (dynamic or calibrated) quantize their inputs in the graph
// as kiln does and multiply with MatMulInteger on the stored int8 kernel;
// int8 Embedding gathers int8 rows and divides by their scales. float8
// layers are refused (ValueError naming the layer), as are int8_qat ones
// unless OnnxExportOptions::qat_as_int8 converts them. See
// docs/EXPORT.md for the ops and the differences measured.
//
// Errors: ValueError naming the first unsupported layer (its class, and the
// reason and alternative when it has no ONNX form) or
// option (e.g. an activation, a data_format) before anything is written;
// StateError for a model that is not built. The file is written atomically.
// Thread safety: reads the model; do not train it concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/models/model.h"

namespace kiln::exporter {

struct OnnxExportOptions {
  int64_t opset = 17;      // ai.onnx opset; 17 is supported by ONNX Runtime >= 1.12
  std::string graph_name;  // default: the model's name
  // How float initializers (weights, constants) are stored: "float32", or
  // "float16" for a file about half the size. With float16, each one is
  // followed by a Cast to float32, which ONNX Runtime folds at load: the
  // graph computes in float32 on float16-rounded weights (measured: within
  // 1e-3 of kiln, docs/EXPORT.md). An initializer float16 cannot hold (a
  // value beyond +-65504) stays float32. Inputs and outputs stay float32
  // (onnxconverter-common's keep_io_types=True).
  std::string weights = "float32";
  // Layers in int8 quantization-aware training (quantize("int8_qat")) are
  // refused unless true; then each is exported as the int8 layer
  // quantize("int8") would convert it to (int8 kernel with per-channel
  // scales, per-row input scales), without changing the model.
  bool qat_as_int8 = false;
  // Removes the nodes that only pass values on (Identity from Dropout and
  // the other identity-at-inference layers, a Reshape or Flatten feeding
  // only another one); the outputs are bit for bit the same, with fewer
  // nodes. ONNX Runtime's own optimizer still fuses the rest at load.
  bool optimize = false;
  void validate() const;
};

// The ai.onnx opset export_onnx writes `model` at: options.opset, raised to
// 20 for a model with a string input.
int64_t onnx_opset(const models::Model& model, const OnnxExportOptions& options);

// The serialized ModelProto.
std::string export_onnx_bytes(models::Model& model, const OnnxExportOptions& options = {});
void export_onnx(models::Model& model, const std::string& path, const OnnxExportOptions& options = {});

// The conformance of the layer registry: one entry per registered layer
// class (LayerRegistry::names()), sorted by name. `exported`: the class has
// an exporter; otherwise `reason` says why not and what to do instead (empty
// for a class that is in neither list, which kiln_export_test refuses).
// `except`: for an exported class, the settings its exporter refuses, and why.
struct OnnxLayerSupport {
  std::string class_name;
  bool exported = false;
  std::string reason;
  std::string except;
};
std::vector<OnnxLayerSupport> onnx_layer_support();
// onnx_layer_support() as the Markdown table in docs/EXPORT.md.
std::string onnx_conformance_table();

}  // namespace kiln::exporter
