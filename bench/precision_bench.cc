// Mixed precision, int8 and float8 against float32, in one run, on the CPU at
// hand (issue 12's benchmarks; results in docs/PERFORMANCE.md).
//
//   build/bench/precision_bench [--steps 20] [--threads N] [--json out.json] [--accuracy_epochs 2]
//                               [--skip_train] [--skip_bf16]
//
// 1. Training step of a 4 x Dense(1024) MLP (784 -> 1024 x4 -> 10, relu,
//    Adam), batch 256: float32, mixed_bfloat16, float8 (emulated): ms/step.
// 2. Inference of the same MLP at batch 1, 32, 256: float32, mixed_bfloat16
//    (bf16 weights cast once), int8 with the kernel kiln picks ("auto") and
//    with each kernel forced (oneDNN, fbgemm, LibTorch's exact int32
//    matmul): ms per batch.
// KILN_INT8_KERNEL and FBGEMM_ENABLE_INSTRUCTIONS apply as everywhere
// (docs/PERFORMANCE.md emulates an AVX2-only CPU with them).
// The CPU's instruction sets come first: figures are comparable only within
// one run (bench/precision_bench.sh adds PyTorch's numbers from the same run).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/json.h"
#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/quantization/int8.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

// The fastest of the timed repetitions: on a shared 2-core machine other
// processes only ever add time, so the minimum is the stable figure.
double best_ms(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()) * 1e3; }

std::shared_ptr<models::SequentialImpl> mlp(const std::string& policy) {
  set_dtype_policy(policy);
  set_random_seed(1);
  auto m = models::Sequential();
  m->add(layers::Input({784}));
  for (int i = 0; i < 4; ++i) m->add(layers::Dense(1024, "relu"));
  m->add(layers::Dense(10, "softmax"));
  set_dtype_policy("float32");
  m->predict(at::zeros({1, 784}));
  return m;
}

double infer_ms(models::Model& m, int64_t batch, int steps) {
  at::Tensor x = at::rand({batch, 784});
  at::NoGradGuard ng;
  for (int i = 0; i < 3; ++i) m.predict_on_batch({x});
  std::vector<double> t;
  const int reps = batch == 1 ? 20 : batch == 32 ? 5 : 1;  // enough work per sample to time
  for (int i = 0; i < steps; ++i) {
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) m.predict_on_batch({x});
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return best_ms(t);
}

// Where an int8 Dense's time goes at 256 x 1024 -> 1024 (best of 30), and
// one Dense per int8 kernel and batch size.
int int8_parts() {
  at::Tensor x = at::randn({256, 1024}), w = at::randn({1024, 1024}), b = at::randn({1024});
  at::Tensor wq, ws;
  std::tie(wq, ws) = quantization::abs_max_quantize(w, {0});
  quantization::Int8Weights packed(wq);
  auto time = [](const char* name, const std::function<void()>& fn) {
    std::vector<double> t;
    for (int i = 0; i < 30; ++i) {
      auto t0 = Clock::now();
      fn();
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::printf("  %-34s %8.3f ms\n", name, best_ms(t));
  };
  at::Tensor xq, xs, acc;
  time("quantize_rows", [&] { std::tie(xq, xs) = quantization::quantize_rows(x); });
  time("abs_max_quantize (ATen ops)", [&] { quantization::abs_max_quantize(x, {1}); });
  time("Int8Weights::matmul (prepacked)", [&] { acc = packed.matmul(xq); });
  time(("Int8Weights::dense (" + quantization::int8_backend(256) + ")").c_str(),
       [&] { packed.dense(x, at::Tensor(), ws.reshape({-1}), b); });
  time("int8_matmul (weights reordered per call)", [&] { quantization::int8_matmul(xq, wq); });
  time("dequantize_product", [&] { quantization::dequantize_product(acc, xs, ws, b); });
  time("dequantize (ATen ops)", [&] { (acc.to(at::kFloat) / (xs * ws.reshape({1, -1}))) + b; });
  time("float32 mm", [&] { at::mm(x, w); });
  at::Tensor x16 = x.to(at::kBFloat16), w16 = w.to(at::kBFloat16);
  time("bfloat16 mm", [&] { at::mm(x16, w16); });

  // One Dense (ReLU'd inputs) per kernel and batch size: where `auto`
  // switches kernels. Kernels and sizes interleave, best of 30 rounds.
  const std::vector<int64_t> sizes = {1, 8, 32, 64, 128, 256};
  const std::vector<std::string> kernels = {"float32", "onednn", "fbgemm"};
  std::map<std::string, std::map<int64_t, double>> best;
  for (int round = 0; round < 30; ++round)
    for (const auto& k : kernels)
      for (int64_t m : sizes) {
        at::Tensor xm = x.slice(0, 0, m).relu();
        if (k != "float32") quantization::set_int8_backend(k);
        auto run = [&] {
          k == "float32" ? at::mm(xm, w).add_(b) : packed.dense(xm, at::Tensor(), ws.reshape({-1}), b);
        };
        run();
        const int reps = static_cast<int>(std::max<int64_t>(2, 256 / m));
        auto t0 = Clock::now();
        for (int r = 0; r < reps; ++r) run();
        const double ms = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3 / reps;
        if (!best[k].count(m) || ms < best[k][m]) best[k][m] = ms;
      }
  quantization::set_int8_backend("auto");
  std::printf("\n  One 1024 -> 1024 Dense, ms (int8: Int8Weights::dense; auto: ");
  for (int64_t m : sizes) std::printf("%s%s", m == 1 ? "" : " ", quantization::int8_backend(m).c_str());
  std::printf(")\n  %-8s", "batch");
  for (int64_t m : sizes) std::printf(" %8lld", static_cast<long long>(m));
  std::printf("\n");
  for (const auto& k : kernels) {
    std::printf("  %-8s", k.c_str());
    for (int64_t m : sizes) std::printf(" %8.4f", best[k][m]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20, threads = 0, accuracy_epochs = 0;
  bool train = true, bf16_rows = true;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--int8_parts") {
      configure_threads(ThreadConfig{threads});
      return int8_parts();
    } else if (a == "--accuracy_epochs" && i + 1 < argc)
      accuracy_epochs = std::atoi(argv[++i]);
    else if (a == "--skip_train")
      train = false;
    else if (a == "--skip_bf16")
      bf16_rows = false;
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else {
      std::cerr << "usage: precision_bench [--steps N] [--threads N] [--json out.json] [--skip_train] [--skip_bf16]\n";
      return 2;
    }
  }
  ThreadConfig cfg;
  cfg.intra_op = threads;
  const int nthreads = configure_threads(cfg);
  const CpuFeatures& cpu = cpu_features();
  std::cout << "CPU: " << cpu.summary() << "\nthreads: " << nthreads << "\n\n";
  Json out;
  out["cpu"] = cpu.summary();
  out["isa_class"] = cpu.isa_class();
  out["threads"] = nthreads;

  if (train) {
    std::cout << "Training step, 4 x Dense(1024), batch 256 (ms, best of " << steps << ")\n";
    auto f32 = mlp("float32"), mixed = mlp("mixed_bfloat16"), f8 = mlp("float32");
    f8->quantize("float8");
    std::vector<std::pair<std::string, models::Model*>> variants = {
        {"float32", f32.get()}, {"mixed_bfloat16", mixed.get()}, {"float8_emulated", f8.get()}};
    at::Tensor x = at::rand({256, 784}), y = at::randint(0, 10, {256}, at::kLong);
    for (auto& [name, m] : variants) {
      m->compile("adam", "sparse_categorical_crossentropy");
      for (int i = 0; i < 2; ++i) m->train_on_batch({x}, {y});
    }
    std::map<std::string, double> best;
    for (int round = 0; round < steps; ++round)
      for (auto& [name, m] : variants) {
        auto t0 = Clock::now();
        m->train_on_batch({x}, {y});
        const double ms = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
        if (!best.count(name) || ms < best[name]) best[name] = ms;
      }
    for (auto& [name, m] : variants) {
      out["train_step_ms"][name] = best[name];
      std::printf("  %-16s %8.2f\n", name.c_str(), best[name]);
    }
    std::printf("  mixed_bfloat16 / float32 speed-up: %.2fx\n\n",
                out["train_step_ms"]["float32"].get<double>() / out["train_step_ms"]["mixed_bfloat16"].get<double>());
    std::printf("  float8 (emulated) / float32 time: %.2fx\n\n",
                out["train_step_ms"]["float8_emulated"].get<double>() / out["train_step_ms"]["float32"].get<double>());
  }
  std::cout << "Inference, 4 x Dense(1024) (ms per batch, best of " << steps << " rounds, variants interleaved)\n";
  std::printf("  %-22s %10s %10s %10s\n", "", "batch 1", "batch 32", "batch 256");
  auto f32 = mlp("float32");
  auto bf16 = mlp("bfloat16");  // inference: bf16 weights, as PyTorch's model.bfloat16()
  auto i8 = mlp("float32");
  i8->quantize("int8");
  struct Row {
    std::string name;
    models::Model* model;
    std::string backend;
  };
  // "int8" runs the kernel this process picks by default (KILN_INT8_KERNEL
  // or "auto"), the others force one each.
  const char* env_kernel = std::getenv("KILN_INT8_KERNEL");
  const std::string default_kernel = env_kernel && *env_kernel ? env_kernel : "auto";
  std::vector<Row> rows = {{"float32", f32.get(), ""},          {"bfloat16", bf16.get(), ""},
                           {"int8", i8.get(), default_kernel},  {"int8 onednn", i8.get(), "onednn"},
                           {"int8 fbgemm", i8.get(), "fbgemm"}, {"int8 exact", i8.get(), "exact"}};
  if (!bf16_rows) rows.erase(rows.begin() + 1);  // without native bf16 it takes minutes
  // Rounds interleave the variants, so a burst of load elsewhere hits all alike.
  std::map<std::string, std::map<int64_t, double>> best;
  std::map<std::string, std::map<int64_t, std::string>> ran;  // the kernel each int8 row ran on
  for (int round = 0; round < steps; ++round)
    for (auto& r : rows) {
      quantization::set_int8_backend(r.backend.empty() ? default_kernel : r.backend);
      for (int64_t b : {1, 32, 256}) {
        if (!r.backend.empty()) ran[r.name][b] = quantization::int8_backend(b);
        const double ms = infer_ms(*r.model, b, 1);
        auto it = best[r.name].find(b);
        if (it == best[r.name].end() || ms < it->second) best[r.name][b] = ms;
      }
    }
  for (auto& r : rows) {
    std::printf("  %-22s", r.name.c_str());
    for (int64_t b : {1, 32, 256}) {
      out["infer_ms"][r.name][std::to_string(b)] = best[r.name][b];
      std::printf(" %10.3f", best[r.name][b]);
    }
    if (!r.backend.empty()) {
      std::printf("   ran on");
      for (int64_t b : {1, 32, 256}) {
        out["int8_kernel"][r.name][std::to_string(b)] = ran[r.name][b];
        std::printf(" %s", ran[r.name][b].c_str());
      }
    }
    std::printf("\n");
  }
  std::printf("  fbgemm inputs: %s\n", quantization::fbgemm_wide_inputs()
                                           ? "8 bits (VNNI)"
                                           : "7 bits for rows with negative values (no VNNI in fbgemm's kernel)");
  out["fbgemm_wide_inputs"] = quantization::fbgemm_wide_inputs();
  quantization::set_int8_backend(default_kernel);

  if (accuracy_epochs > 0) {
    // The same MLP trained on Fashion-MNIST in both policies: what the
    // speed-up costs in accuracy.
    auto d = datasets::fashion_mnist();
    at::Tensor x = d.x_train.reshape({-1, 784}).to(at::kFloat) / 255.0,
               xt = d.x_test.reshape({-1, 784}).to(at::kFloat) / 255.0;
    std::printf("\nFashion-MNIST, 4 x Dense(1024), batch 256, Adam, %d epochs (test accuracy, s/epoch)\n",
                accuracy_epochs);
    for (const char* p : {"float32", "mixed_bfloat16"}) {
      auto m = mlp(p);
      m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
      auto t0 = Clock::now();
      m->fit({.x = {x}, .y = {d.y_train}, .batch_size = 256, .epochs = accuracy_epochs, .verbose = 0});
      const double s = std::chrono::duration<double>(Clock::now() - t0).count() / accuracy_epochs;
      const double acc =
          (m->predict(xt, {.batch_size = 1024}).argmax(-1) == d.y_test).to(at::kFloat).mean().item<double>() * 100;
      out["fashion_mnist"][p] = Json{{"test_accuracy", acc}, {"epoch_s", s}};
      std::printf("  %-16s %7.2f%% %8.2f s\n", p, acc, s);
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
