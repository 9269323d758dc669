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
// not (the kernels it belonged to are gone). Last, it times predict of the
// original and the quantized model on this machine (--measure_seconds) and
// prints the measured speed ratio.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "kiln/core/cpu_features.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/models/calibration.h"
#include "kiln/models/model.h"
#include "kiln/quantization/int8.h"
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
  double measure_seconds = 0.5;
};

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// Inputs of `batch` rows for the model's signature: uniform [0, 1) floats,
// zeros for integer inputs (valid ids); unknown non-batch sizes 16.
Tensors example_inputs(const models::Model& m, int64_t batch) {
  Tensors x;
  const std::vector<Shape> shapes = m.input_shapes();
  const std::vector<at::ScalarType> dtypes = m.input_dtypes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    Shape s = shapes[i];
    for (size_t d = 0; d < s.size(); ++d)
      if (s[d] == kNone) s[d] = d == 0 ? batch : 16;
    const at::ScalarType t = i < dtypes.size() ? dtypes[i] : at::kFloat;
    x.push_back(at::isFloatingType(t) ? at::rand(s).to(t) : at::zeros(s, at::TensorOptions().dtype(t)));
  }
  return x;
}

// The quantized model's predict speed against the original's, measured here
// at batch 32 and 256: the best of alternating runs within `seconds` (at
// least three each), since a CPU's flags alone do not tell (int8 on an
// AVX2-only CPU once ran 3.6x slower than float32).
std::string measured_speed(models::Model& original, models::Model& quantized, const std::string& mode, double seconds) {
  using Clock = std::chrono::steady_clock;
  at::NoGradGuard ng;
  std::string kernels = quantization::int8_backend(32);
  if (quantization::int8_backend(256) != kernels) kernels += " at 32, " + quantization::int8_backend(256) + " at 256";
  std::string line = "Measured here (" + cpu_features().isa_class() + ", " + std::to_string(at::get_num_threads()) +
                     " threads" + (mode == "int8" ? ", int8 kernel " + kernels : "") + "): " + mode +
                     " predict runs at";
  for (int64_t batch : {32, 256}) {
    Tensors x = example_inputs(original, batch);
    original.predict_on_batch(x);  // warm-up: first-call set-up (kernel packing) is not the steady state
    quantized.predict_on_batch(x);
    double best[2] = {1e30, 1e30};
    const auto start = Clock::now();
    for (int round = 0; round < 3 || std::chrono::duration<double>(Clock::now() - start).count() < seconds / 2;
         ++round) {
      for (int v = 0; v < 2; ++v) {
        const auto t0 = Clock::now();
        (v == 0 ? original : quantized).predict_on_batch(x);
        best[v] = std::min(best[v], std::chrono::duration<double>(Clock::now() - t0).count());
      }
      if (round >= 1000) break;
    }
    char part[128];
    std::snprintf(part, sizeof(part), "%s %.2fx float32's speed at batch %lld (%.3f vs %.3f ms)",
                  batch == 32 ? "" : ",", best[0] / best[1], static_cast<long long>(batch), best[1] * 1e3,
                  best[0] * 1e3);
    line += part;
  }
  return line;
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
  if (o.measure_seconds > 0) {
    ModelPtr original = load_model(o.model_dir);
    std::cout << measured_speed(*original, *model, o.mode, o.measure_seconds) << "\n";
  }
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
  sub->add_option("--measure_seconds", o->measure_seconds,
                  "Time predict of the original and quantized model for about this long and print the measured "
                  "speed ratio (default 0.5; 0: skip)")
      ->check(CLI::Range(0.0, 600.0));
  return {sub, [o] { run_quantize(*o); }};
}

}  // namespace kiln::cli
