// fit() against a hand-written LibTorch loop and a PyTorch Python loop on the
// same 784-256-256-10 MLP, Fashion-MNIST data, batch size, optimizer (Adam,
// lr 1e-3, epsilon 1e-7) and epochs, all in one run.
//
//   build/bench/mlp_fit_bench [--epochs 3] [--batch_size 128] [--threads N]
//                             [--no_pytorch] [--json out.json] [--blas_threads N]
//
// Reports seconds per epoch (median over epochs after the first) and test
// accuracy for each, and the ratios fit/hand-written and fit/PyTorch.
// Thread settings are the correct ones for each: kiln's configure_threads
// (OpenMP = cores, OpenBLAS = cores with OMP_WAIT_POLICY=PASSIVE) for both C++
// loops; the PyTorch peer runs with the same environment.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "bench/python_peer.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/dtype.h"
#include "kiln/core/initializers.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/random.h"
#include "kiln/core/threads.h"

#include <dlfcn.h>
#include <unistd.h>
#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/training/callbacks.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.size() > 1) v.erase(v.begin());  // the first epoch warms caches and allocators
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  std::string name;
  std::vector<double> epoch_s;
  double test_accuracy = 0;
};

// The loop an engineer would write by hand: same init (glorot_uniform kernels,
// zero biases), same shuffling, Keras's Adam update written with in-place ops.
Result hand_written(const at::Tensor& x, const at::Tensor& y, const at::Tensor& xt, const at::Tensor& yt, int epochs,
                    int64_t batch) {
  set_random_seed(1);
  auto glorot = Initializer::get("glorot_uniform");
  std::vector<int64_t> dims = {784, 256, 256, 10};
  std::vector<at::Tensor> params;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    params.push_back(glorot->sample({dims[i], dims[i + 1]}, at::kFloat).requires_grad_(true));
    params.push_back(at::zeros({dims[i + 1]}).requires_grad_(true));
  }
  std::vector<at::Tensor> m, v;
  for (auto& p : params) m.push_back(at::zeros_like(p)), v.push_back(at::zeros_like(p));
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-7;
  auto forward = [&](const at::Tensor& in) {
    auto h = at::relu(at::addmm(params[1], in, params[0]));
    h = at::relu(at::addmm(params[3], h, params[2]));
    return at::addmm(params[5], h, params[4]);
  };
  Result r{"hand-written LibTorch loop", {}, 0};
  const int64_t n = x.size(0);
  int64_t step = 0;
  for (int e = 0; e < epochs; ++e) {
    auto t0 = Clock::now();
    auto perm = at::randperm(n, at::TensorOptions().dtype(at::kLong));
    for (int64_t i = 0; i < n; i += batch) {
      auto idx = perm.narrow(0, i, std::min(batch, n - i));
      auto xb = x.index_select(0, idx), yb = y.index_select(0, idx);
      auto loss = at::nll_loss(at::log_softmax(forward(xb), 1), yb);
      auto grads = torch::autograd::grad({loss}, params);
      ++step;
      at::NoGradGuard ng;
      const double alpha = lr * std::sqrt(1 - std::pow(b2, step)) / (1 - std::pow(b1, step));
      for (size_t k = 0; k < params.size(); ++k) {
        m[k].lerp_(grads[k], 1 - b1);
        v[k].mul_(b2).addcmul_(grads[k], grads[k], 1 - b2);
        params[k].addcdiv_(m[k], v[k].sqrt().add_(eps), -alpha);
      }
    }
    r.epoch_s.push_back(seconds_since(t0));
  }
  at::NoGradGuard ng;
  r.test_accuracy = forward(xt).argmax(1).eq(yt).to(at::kFloat).mean().item<double>();
  return r;
}

Result with_fit(const at::Tensor& x, const at::Tensor& y, const at::Tensor& xt, const at::Tensor& yt, int epochs,
                int64_t batch, const std::string& policy = "float32") {
  set_random_seed(1);
  set_dtype_policy(policy);
  auto model = models::Sequential();
  model->add(layers::Input({784}));
  model->add(layers::Dense(256, "relu"));
  model->add(layers::Dense(256, "relu"));
  model->add(layers::Dense(10));
  set_dtype_policy("float32");
  model->compile(CompileArgs::from_json(
      Json{{"optimizer", {{"class_name", "Adam"}, {"config", {{"learning_rate", 1e-3}}}}},
           {"loss", {{"class_name", "SparseCategoricalCrossentropy"}, {"config", {{"from_logits", true}}}}},
           {"metrics", {"accuracy"}}}));
  Result r{policy == "float32" ? "kiln fit()" : "kiln fit() " + policy, {}, 0};
  // Epochs are timed inside one fit() call, as a user runs it.
  auto timer = callbacks::LambdaCallback();
  Clock::time_point t0;
  timer->on_epoch_begin_fn = [&](int, const Logs&) { t0 = Clock::now(); };
  timer->on_epoch_end_fn = [&](int, Logs&) { r.epoch_s.push_back(seconds_since(t0)); };
  FitArgs args;
  args.x = {x};
  args.y = {y};
  args.batch_size = batch;
  args.epochs = epochs;
  args.verbose = 0;
  args.callbacks = {timer};
  model->fit(args);
  EvaluateArgs ev;
  ev.x = {xt};
  ev.y = {yt};
  ev.batch_size = 1024;
  r.test_accuracy = model->evaluate(ev).at("accuracy");
  return r;
}

Result pytorch_peer(int epochs, int64_t batch, int threads) {
  Result r{"PyTorch Python loop", {}, 0};
  const Json j = bench::run_python_peer("pytorch_mlp.py --epochs " + std::to_string(epochs) + " --batch_size " +
                                        std::to_string(batch) + " --threads " + std::to_string(threads));
  r.epoch_s = j["epoch_s"].get<std::vector<double>>();
  r.test_accuracy = j["test_accuracy"].get<double>();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  int epochs = 3, threads = 0, blas_threads = 0;
  int64_t batch = 128;
  bool run_pytorch = true;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--epochs")
      epochs = std::stoi(next());
    else if (a == "--batch_size")
      batch = std::stoll(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--no_pytorch")
      run_pytorch = false;
    else if (a == "--blas_threads")
      blas_threads = std::stoi(next());
    else if (a == "--json")
      json_out = next();
    else {
      std::cerr << "mlp_fit_bench: unknown option " << a << "\n";
      return 2;
    }
  }
  threads = configure_threads(ThreadConfig{threads});
  if (blas_threads > 0) {
    // Overrides kiln's choice, to reproduce an oversubscribed set-up
    // (e.g. OMP_WAIT_POLICY=ACTIVE ... --blas_threads 2).
    using SetFn = void (*)(int);
    if (auto set = reinterpret_cast<SetFn>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(blas_threads);
  }
  std::printf("CPU: %s\n", cpu_features().summary().c_str());
  std::printf("threads: intra-op %d, %s %d, OpenMP idle threads %s\n", threads, blas_library_name(), blas_num_threads(),
              omp_threads_passive() ? "sleep (PASSIVE)" : "spin (ACTIVE)");
  auto data = datasets::fashion_mnist();
  auto prep = [](const at::Tensor& img) { return img.reshape({img.size(0), 784}).to(at::kFloat).div_(255.0f); };
  at::Tensor x = prep(data.x_train), y = data.y_train.to(at::kLong);
  at::Tensor xt = prep(data.x_test), yt = data.y_test.to(at::kLong);

  std::vector<Result> results;
  results.push_back(hand_written(x, y, xt, yt, epochs, batch));
  results.push_back(with_fit(x, y, xt, yt, epochs, batch));
  if (run_pytorch) results.push_back(pytorch_peer(epochs, batch, threads));
  // The best policy this CPU runs: mixed_bfloat16 where bf16 is native.
  const bool bf16 = cpu_features().fast_bf16();
  if (bf16) results.push_back(with_fit(x, y, xt, yt, epochs, batch, "mixed_bfloat16"));

  std::printf("MLP 784-256-256-10, Fashion-MNIST (60000 train / 10000 test), batch %lld, Adam, %d epochs, %d threads\n",
              (long long)batch, epochs, threads);
  std::printf("%-28s %14s %14s\n", "loop", "s/epoch (med)", "test accuracy");
  Json report = Json::object();
  for (auto& r : results) {
    std::printf("%-28s %14.3f %14.4f\n", r.name.c_str(), median(r.epoch_s), r.test_accuracy);
    report[r.name] =
        Json{{"epoch_s", r.epoch_s}, {"median_epoch_s", median(r.epoch_s)}, {"test_accuracy", r.test_accuracy}};
  }
  const double ratio = median(results[1].epoch_s) / median(results[0].epoch_s);
  std::printf("ratio fit()/hand-written: %.3f (goal <= 1.05)\n", ratio);
  report["ratio_fit_over_hand"] = ratio;
  if (run_pytorch) {
    const double rp = median(results[1].epoch_s) / median(results[2].epoch_s);
    std::printf("ratio fit()/PyTorch:      %.3f\n", rp);
    report["ratio_fit_over_pytorch"] = rp;
    if (bf16) {
      const double rb = median(results.back().epoch_s) / median(results[2].epoch_s);
      std::printf("ratio fit() mixed_bfloat16/PyTorch float32: %.3f (goal <= 0.5)\n", rb);
      report["ratio_best_policy_over_pytorch"] = rb;
    }
  }
  report["cpu"] = cpu_features().summary();
  if (!json_out.empty()) atomic_write_file(json_out, report.dump(2) + "\n");
  return 0;
}
