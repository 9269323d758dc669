// Training step of a small conv net with BatchNormalization, kiln against a
// PyTorch Python loop with the same layers in channels_last memory format
// (bench/conv_peer.py), in one run (issue 29 §3):
//
//   Conv2D(32, 3, same) - BatchNormalization - ReLU - MaxPooling2D
//   Conv2D(64, 3, same) - BatchNormalization - ReLU - MaxPooling2D
//   Flatten - Dense(10)
//
// on 28x28x1 inputs (random Fashion-MNIST-shaped data), batch 128, Adam,
// float32, sparse categorical cross-entropy from logits.
//
//   build/bench/conv_bench [--steps 30] [--warmup 5] [--batch_size 128]
//                          [--threads N] [--no_pytorch] [--json out.json]
//
// Reports the median (and best) train step in ms for each and the ratio
// kiln/PyTorch. Both run with the same number of intra-op threads (kiln's
// configure_threads; the peer's torch.set_num_threads) and the same malloc
// settings (GLIBC_TUNABLES, printed; bench/conv_bench.sh runs both glibc's
// defaults and raised mmap/trim thresholds).
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "bench/python_peer.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/layers/activations.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/normalization.h"
#include "kiln/layers/pooling.h"
#include "kiln/layers/reshaping.h"
#include "kiln/models/sequential.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

struct Timing {
  std::vector<double> step_ms;
  double median() const {
    std::vector<double> v = step_ms;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  double best() const { return *std::min_element(step_ms.begin(), step_ms.end()); }
};

std::shared_ptr<models::SequentialImpl> conv_net() {
  set_random_seed(1);
  auto model = models::Sequential();
  model->add(layers::Input({28, 28, 1}));
  for (int64_t filters : {32, 64}) {
    model->add(layers::Conv2D(filters, 3, "linear", Json{{"padding", "same"}}));
    model->add(layers::BatchNormalization());
    model->add(layers::Activation("relu"));
    model->add(layers::MaxPooling2D());
  }
  model->add(layers::Flatten());
  model->add(layers::Dense(10));
  model->compile(CompileArgs::from_json(
      Json{{"optimizer", {{"class_name", "Adam"}, {"config", {{"learning_rate", 1e-3}}}}},
           {"loss", {{"class_name", "SparseCategoricalCrossentropy"}, {"config", {{"from_logits", true}}}}}}));
  return model;
}

Timing kiln_steps(int64_t batch, int warmup, int steps) {
  auto model = conv_net();
  at::Tensor x = at::rand({batch, 28, 28, 1}), y = at::randint(0, 10, {batch}, at::kLong);
  for (int i = 0; i < warmup; ++i) model->train_on_batch({x}, {y});
  Timing t;
  for (int i = 0; i < steps; ++i) {
    auto t0 = Clock::now();
    model->train_on_batch({x}, {y});
    t.step_ms.push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
  }
  return t;
}

Timing pytorch_steps(int64_t batch, int warmup, int steps, int threads) {
  const Json j = bench::run_python_peer("conv_peer.py --batch_size " + std::to_string(batch) + " --warmup " +
                                        std::to_string(warmup) + " --steps " + std::to_string(steps) + " --threads " +
                                        std::to_string(threads));
  return Timing{j["step_ms"].get<std::vector<double>>()};
}

}  // namespace

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  int steps = 30, warmup = 5, threads = 0;
  int64_t batch = 128;
  bool run_pytorch = true;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--warmup")
      warmup = std::stoi(next());
    else if (a == "--batch_size")
      batch = std::stoll(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--no_pytorch")
      run_pytorch = false;
    else if (a == "--json")
      json_out = next();
    else {
      std::cerr << "conv_bench: unknown option " << a
                << "\nusage: conv_bench [--steps 30] [--warmup 5] [--batch_size 128] [--threads N] [--no_pytorch] "
                   "[--json out.json]\n";
      return 2;
    }
  }
  if (steps < 1 || warmup < 0 || batch < 1) {
    std::cerr << "conv_bench: --steps and --batch_size must be positive, --warmup non-negative\n";
    return 2;
  }
  threads = configure_threads(ThreadConfig{threads});
  std::printf("CPU: %s\n", cpu_features().summary().c_str());
  std::printf("threads: intra-op %d\n", threads);
  // glibc's malloc returns the freed activations (~13 MB each here) to the
  // kernel and faults them in again every step unless its thresholds are
  // raised; both loops run under the same settings (the peer inherits them).
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  std::printf("malloc: %s\n", tunables && *tunables ? ("GLIBC_TUNABLES=" + std::string(tunables)).c_str()
                                                    : "glibc defaults (dynamic mmap/trim thresholds)");
  std::printf(
      "Conv2D(32,3,same)-BN-ReLU-MaxPool-Conv2D(64,3,same)-BN-ReLU-MaxPool-Flatten-Dense(10), 28x28x1, batch %lld, "
      "Adam, float32: train step (ms) over %d steps after %d warm-up\n",
      (long long)batch, steps, warmup);
  std::printf("%-28s %10s %10s\n", "loop", "median", "best");
  Json report = Json::object();
  Timing kiln = kiln_steps(batch, warmup, steps);
  std::printf("%-28s %10.2f %10.2f\n", "kiln train_on_batch", kiln.median(), kiln.best());
  report["kiln"] = Json{{"step_ms", kiln.step_ms}, {"median_ms", kiln.median()}};
  if (run_pytorch) {
    Timing torch = pytorch_steps(batch, warmup, steps, threads);
    std::printf("%-28s %10.2f %10.2f\n", "PyTorch (channels_last)", torch.median(), torch.best());
    report["pytorch"] = Json{{"step_ms", torch.step_ms}, {"median_ms", torch.median()}};
    const double ratio = kiln.median() / torch.median();
    std::printf("ratio kiln/PyTorch (median): %.3f (goal <= 1.05)\n", ratio);
    report["ratio_kiln_over_pytorch"] = ratio;
  }
  report["cpu"] = cpu_features().summary();
  report["threads"] = threads;
  report["glibc_tunables"] = tunables ? tunables : "";
  if (!json_out.empty()) atomic_write_file(json_out, report.dump(2) + "\n");
  return 0;
}
