// Input pipeline overhead on an MLP epoch.
//
// Times the same training steps (a Keras-tutorial MLP on Fashion-MNIST,
// 784-128-10, SGD) fed two ways:
//   in-memory: batches gathered before the clock starts (the floor);
//   pipeline:  Dataset::from_tensor_slices({x, y}).shuffle(60000).batch(b)
//              .prefetch(2), iterated inside the timed epoch.
// Epochs alternate between the two so drift hits both alike. The ratio of
// the fastest epochs is the pipeline's cost (other processes on a shared
// machine only ever add time); medians are printed beside it. For reference it also times the pipeline
// without prefetch and the element-by-element path (map() before batch()
// disables the index_select fast path).
//
//   build/bench/data_pipeline_bench [--epochs 5] [--batch 128] [--hidden 128]
//                                   [--max-ratio 1.05] [--blas-threads N]
// Exits 1 if --max-ratio is given and exceeded. Uses synthetic data of the
// same shape when Fashion-MNIST is not installed.
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/threads.h"
#include "kiln/data/dataset.h"
#include "kiln/data/datasets.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Mlp {
  at::Tensor w1, b1, w2, b2;
  Mlp(int64_t in, int64_t hidden, int64_t out) {
    at::manual_seed(0);
    w1 = (at::randn({in, hidden}) * std::sqrt(2.0 / in)).set_requires_grad(true);
    b1 = at::zeros({hidden}).set_requires_grad(true);
    w2 = (at::randn({hidden, out}) * std::sqrt(1.0 / hidden)).set_requires_grad(true);
    b2 = at::zeros({out}).set_requires_grad(true);
  }
  double step(const at::Tensor& x, const at::Tensor& y, double lr) {
    auto h = at::relu(at::addmm(b1, x.reshape({x.size(0), -1}), w1));
    auto logits = at::addmm(b2, h, w2);
    auto loss = at::cross_entropy_loss(logits, y);
    loss.backward();
    {
      at::NoGradGuard no_grad;
      for (auto* p : {&w1, &b1, &w2, &b2}) {
        p->sub_(p->grad(), lr);
        p->mutable_grad().zero_();
      }
    }
    return loss.item<double>();
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double fastest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  std::printf("CPU: %s\n", kiln::cpu_features().summary().c_str());
  int epochs = 5;
  int64_t batch = 128, hidden = 128;
  double max_ratio = 0;
  int blas_threads = 0;  // 0: as configure_threads() leaves it
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--epochs")
      epochs = std::atoi(argv[i + 1]);
    else if (a == "--batch")
      batch = std::atoll(argv[i + 1]);
    else if (a == "--hidden")
      hidden = std::atoll(argv[i + 1]);
    else if (a == "--max-ratio")
      max_ratio = std::atof(argv[i + 1]);
    else if (a == "--blas-threads")
      blas_threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const int threads = kiln::configure_threads();
  if (blas_threads > 0) {
    using SetFn = void (*)(int);
    if (auto set = reinterpret_cast<SetFn>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(blas_threads);
  }

  at::Tensor x, y;
  const char* source = "fashion_mnist";
  try {
    auto t0 = Clock::now();
    auto d = kiln::datasets::fashion_mnist();
    std::printf("fashion_mnist() load: %.3f s\n", std::chrono::duration<double>(Clock::now() - t0).count());
    x = d.x_train.reshape({d.x_train.size(0), -1}).to(at::kFloat).div_(255.0);
    y = d.y_train;
  } catch (const std::exception& e) {
    source = "synthetic";
    x = at::rand({60000, 784});
    y = at::randint(10, {60000}, at::kLong);
  }
  const int64_t n = x.size(0);
  std::printf("data: %s %lld x %lld, batch %lld, MLP 784-%lld-10, intra-op threads %d, %s threads %d\n", source,
              (long long)n, (long long)x.size(1), (long long)batch, (long long)hidden, threads,
              kiln::blas_library_name(), kiln::blas_num_threads());

  Mlp model(x.size(1), hidden, 10);
  const double lr = 0.05;
  auto pipeline = kiln::data::Dataset::from_tensor_slices({x, y}).shuffle(n, /*seed=*/1).batch(batch);
  auto prefetched = pipeline.prefetch(2);

  auto run_in_memory = [&](int64_t epoch) {
    // Same shuffled batches, gathered before timing.
    std::vector<kiln::Element> batches;
    auto it = pipeline.iterator(epoch);
    while (auto b = it->next()) batches.push_back({(*b)[0].contiguous(), (*b)[1].contiguous()});
    auto t0 = Clock::now();
    double loss = 0;
    for (const auto& b : batches) loss = model.step(b[0], b[1], lr);
    (void)loss;
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  double waiting = 0;  // time in next() of the last pipeline epoch
  auto run_pipeline = [&](const kiln::data::Dataset& ds, int64_t epoch) {
    auto t0 = Clock::now();
    auto it = ds.iterator(epoch);
    waiting = 0;
    for (;;) {
      auto w0 = Clock::now();
      auto b = it->next();
      waiting += std::chrono::duration<double>(Clock::now() - w0).count();
      if (!b) break;
      model.step((*b)[0], (*b)[1], lr);
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };

  run_in_memory(0);  // warm-up: allocator, oneDNN primitives
  run_pipeline(prefetched, 0);
  std::vector<double> mem, pre, plain;
  for (int e = 1; e <= epochs; ++e) {
    mem.push_back(run_in_memory(e));
    pre.push_back(run_pipeline(prefetched, e));
    const double pre_waiting = waiting;
    plain.push_back(run_pipeline(pipeline, e));
    std::printf(
        "epoch %d: in-memory %.3f s, pipeline+prefetch %.3f s (%.3f s in next()), pipeline %.3f s "
        "(%.3f s in next())\n",
        e, mem.back(), pre.back(), pre_waiting, plain.back(), waiting);
  }
  // Data-only cost per epoch (no training step).
  auto data_only = [&](const kiln::data::Dataset& ds) {
    auto t0 = Clock::now();
    auto it = ds.iterator(7);
    int64_t rows = 0;
    while (auto b = it->next()) rows += (*b)[0].size(0);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto identity = [](const kiln::Element& e) { return e; };
  auto element_path = kiln::data::Dataset::from_tensor_slices({x, y}).map(identity).shuffle(n, 1).batch(batch);
  std::printf("data only, one epoch: fast path %.3f s, element-by-element path %.3f s\n", data_only(pipeline),
              data_only(element_path));

  const double ratio = fastest(pre) / fastest(mem);
  std::printf("median epoch: in-memory %.3f s, pipeline+prefetch %.3f s, pipeline %.3f s (ratio %.3f)\n", median(mem),
              median(pre), median(plain), median(pre) / median(mem));
  std::printf("fastest epoch: in-memory %.3f s, pipeline+prefetch %.3f s, pipeline %.3f s\n", fastest(mem),
              fastest(pre), fastest(plain));
  std::printf("ratio pipeline+prefetch / in-memory (fastest epochs): %.3f\n", ratio);
  if (max_ratio > 0 && ratio > max_ratio) {
    std::printf("FAIL: ratio %.3f exceeds --max-ratio %.3f\n", ratio, max_ratio);
    return 1;
  }
  return 0;
}
