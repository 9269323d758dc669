// kiln export --format onnx --model DIR --output model.onnx [--opset N]
//             [--weights float32|float16] [--qat_as_int8] [--optimize]
//
// Writes the model as ONNX (see docs/EXPORT.md and kiln/export/onnx_export.h).
// --weights float16 stores the weights as float16 (about half the file),
// computing in float32; inputs and outputs stay float32.
// --qat_as_int8 exports layers in int8 quantization-aware training as the
// int8 layers `kiln quantize --mode int8` would make of them.
// --optimize drops the nodes that only pass values on (same outputs).
// An unsupported layer is a one-line error naming it (exit 2).
#include <iostream>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/export/onnx_export.h"
#include "kiln/saving/model_io.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {
struct ExportOptions {
  std::string format = "onnx";
  std::string model_dir;
  std::string output;
  int64_t opset = 17;
  std::string weights = "float32";
  bool qat_as_int8 = false;
  bool optimize = false;
};
}  // namespace

Command add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* sub = app.add_subcommand("export", "Export a saved model to another format (ONNX)");
  sub->add_option("--format", o->format, "Export format (onnx)")->check(CLI::IsMember({"onnx"}));
  sub->add_option("--model", o->model_dir, "A model version directory, e.g. models/fashion_mnist/1")->required();
  sub->add_option("--output", o->output, "Where to write the file, e.g. model.onnx")->required();
  sub->add_option("--opset", o->opset, "ONNX opset (13 to 17; a model of string input is written at 20)");
  sub->add_option("--weights", o->weights,
                  "How weights are stored: float32 (default) or float16 (half the file; float32 compute, float32 "
                  "inputs and outputs)")
      ->check(CLI::IsMember({"float32", "float16"}));
  sub->add_flag(
      "--qat_as_int8", o->qat_as_int8,
      "Export int8 quantization-aware training layers as int8 (as `kiln quantize --mode int8` converts them)");
  sub->add_flag("--optimize", o->optimize,
                "Drop the nodes that only pass values on (Identity, Reshape/Flatten pairs); same outputs");
  return {sub, [o] {
            ModelPtr model = load_model(o->model_dir);
            exporter::OnnxExportOptions eo;
            eo.opset = o->opset;
            eo.weights = o->weights;
            eo.qat_as_int8 = o->qat_as_int8;
            eo.optimize = o->optimize;
            exporter::export_onnx(*model, o->output, eo);
            std::cout << "Exported " << o->model_dir << " to " << o->output << " (ONNX opset "
                      << exporter::onnx_opset(*model, eo) << ", " << o->weights << " weights)" << std::endl;
          }};
}

}  // namespace kiln::cli
