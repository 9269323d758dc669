// kiln quantize MODEL_DIR --mode int8 [--calibration DATA [--method minmax|percentile]
//               [--percentile P] [--examples N]] --output BASE
//
// Quantizes a saved model (Keras's model.quantize) and publishes it as the
// next version under BASE, so a server watching BASE picks it up:
//   int8     Dense/EinsumDense kernels and Embedding tables as int8 with
//            per-channel abs-max scales. Inputs are quantized per row at run
//            time, or, with --calibration (a data section as for `kiln
//            evaluate`: inline JSON, a file, or a whole training spec), with
//            one input scale per layer fixed from N examples of its training
//            split (post-training static quantization).
//   float8   float8 (e4m3) inputs and kernels with delayed scaling, for
//            training on; emulated on CPU.
// The compile config is kept (so `kiln evaluate` works); optimizer state is
// not (the kernels it belonged to are gone).
#include <sys/stat.h>

#include <iostream>
#include <memory>

#include "kiln/core/cpu_features.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/models/calibration.h"
#include "kiln/models/model.h"
#include "kiln/spec/spec.h"
#include "tools/kiln/cli.h"
#include "tools/kiln/versions.h"

namespace kiln::cli {
namespace {

struct QuantizeOptions {
  std::string model_dir;
  std::string mode = "int8";
  std::string calibration;
  std::string method = "minmax";
  double percentile = 99.99;
  int64_t examples = 1000;
  std::string output;
};

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

void run_quantize(const QuantizeOptions& o) {
  if (o.mode != "int8" && o.mode != "float8") throw ValueError("--mode must be int8 or float8. Received: " + o.mode);
  if (!o.calibration.empty() && o.mode != "int8")
    throw ValueError("--calibration applies to --mode int8 only (float8 scales come from training)");
  ModelPtr model = load_model(o.model_dir);
  if (!model->supports_quantization(o.mode))
    throw ValueError(o.model_dir + " has no layer that supports " + o.mode +
                     " (int8: Dense, EinsumDense, Embedding; float8: Dense, EinsumDense)");
  model->quantize(o.mode);
  std::string scheme = o.mode == "int8" ? "dynamic per-row input scales" : "delayed scaling";
  if (!o.calibration.empty()) {
    DataSplits data = load_data(data_argument(o.calibration, "--calibration"));
    Tensors x, y;
    model_data(data, *model, /*test=*/false, &x, &y);
    const int64_t n = std::min<int64_t>(o.examples, x.at(0).size(0));
    for (auto& t : x) t = t.slice(0, 0, n);
    calibrate(*model, x, {.method = o.method, .percentile = o.percentile});
    scheme = "static input scales from " + std::to_string(n) + " examples (" + o.method +
             (o.method == "percentile" ? " " + format_metric(o.percentile) : std::string()) + ")";
  }
  const std::string dir = publish_next_version(*model, o.output, /*include_optimizer=*/false);
  const int64_t before = file_size(join_path(o.model_dir, "weights.safetensors"));
  const int64_t after = file_size(join_path(dir, "weights.safetensors"));
  std::cout << "Quantized " << o.model_dir << " to " << o.mode << " (" << scheme << ") -> " << dir << "\n";
  if (before > 0 && after > 0)
    std::cout << "weights.safetensors: " << before << " -> " << after << " bytes ("
              << format_metric(static_cast<double>(after) / before) << "x)\n";
  warn_if_slow(o.mode);
}

}  // namespace

Command add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* sub =
      app.add_subcommand("quantize", "Quantize a saved model (int8, float8) as the next version under BASE");
  sub->add_option("model_dir", o->model_dir, "A model version directory, e.g. models/fashion_mnist/1")->required();
  sub->add_option("--mode", o->mode, "int8 (default) or float8");
  sub->add_option("--calibration", o->calibration,
                  "int8: a data section (inline JSON, a file, or a training spec) to fix input scales from");
  sub->add_option("--method", o->method, "Calibration ranges: minmax (default) or percentile")
      ->check(CLI::IsMember({"minmax", "percentile"}));
  sub->add_option("--percentile", o->percentile, "With --method percentile: the percentile of |x| (default 99.99)")
      ->check(CLI::Range(0.0, 100.0));
  sub->add_option("--examples", o->examples, "Calibration examples from the training split (default 1000)")
      ->check(positive_integer());
  sub->add_option("--output", o->output, "The base directory to publish the quantized version under")->required();
  return {sub, [o] { run_quantize(*o); }};
}

}  // namespace kiln::cli
