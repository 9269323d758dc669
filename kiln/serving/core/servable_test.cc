// ModelServable runs requests concurrently (no per-model lock once the model
// is built): many threads hammering one servable get exactly the outputs a
// single thread gets, for models with BatchNormalization (inference mode),
// Dropout, attention and several inputs.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/layers/attention.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/layers/merging.h"
#include "kiln/layers/normalization.h"
#include "kiln/layers/pooling.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/saving/model_io.h"
#include "kiln/serving/core/servable.h"
#include "kiln/testing/testing.h"

namespace kiln::serving {
namespace {

// Random weights everywhere (BatchNormalization's moving statistics too, so
// that inference mode is visibly different from training mode).
void randomize(models::Model& m) {
  for (auto& w : m.weights()) {
    at::NoGradGuard ng;
    auto r = at::randn(w->value().sizes()) * 0.5;
    if (w->path().find("moving_variance") != std::string::npos) r = r.abs() + 0.5;
    w->value().copy_(r.to(w->value().scalar_type()));
  }
}

std::string save_sequential(const std::string& dir) {
  auto m = models::Sequential();
  m->add(layers::Input({8}));
  m->add(layers::Dense(16, "relu"));
  m->add(layers::BatchNormalization());
  m->add(layers::Dropout(0.5));
  m->add(layers::Dense(4, "softmax"));
  randomize(*m);
  m->save(dir);
  return dir;
}

// Two inputs, self-attention over one, merged with the other.
std::string save_functional(const std::string& dir) {
  auto seq = layers::Input({5, 8}, at::kFloat, "seq");
  auto side = layers::Input({3}, at::kFloat, "side");
  auto mha = layers::MultiHeadAttention(2, 4);
  auto att = (*mha)(KerasTensors{seq, seq})[0];
  auto pooled = layers::GlobalAveragePooling1D()(att);
  auto s = layers::Dense(8, "tanh")(side);
  auto merged = layers::Add()(KerasTensors{pooled, s});
  auto out = layers::Dense(3)(merged);
  auto m = models::Functional(KerasTensors{seq, side}, KerasTensors{out});
  randomize(*m);
  m->save(dir);
  return dir;
}

// Inputs of request i (distinct per request, so a mix-up between concurrent
// requests would show), with 1..5 rows.
TensorMap request(const Servable& s, int i) {
  TensorMap in;
  const int64_t rows = 1 + i % 5;
  for (auto& [name, spec] : s.signatures()["serving_default"]["inputs"].items()) {
    std::vector<int64_t> shape{rows};
    for (size_t d = 1; d < spec["shape"].size(); ++d) shape.push_back(spec["shape"][d].get<int64_t>());
    in[name] = at::randn(shape);
  }
  return in;
}

void hammer(const std::string& dir) {
  set_random_seed(5);
  ModelServable s(dir);
  ASSERT_TRUE(s.runs_concurrently()) << "a loaded model should be fully built; calls would be serialised";
  constexpr int kThreads = 8, kRequests = 240;
  std::vector<TensorMap> inputs, want;
  for (int i = 0; i < kRequests; ++i) {
    inputs.push_back(request(s, i));
    want.push_back(s.predict(inputs.back(), "serving_default"));  // single-threaded reference
  }
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return go; });  // start together, for the most overlap
      }
      for (int i = t; i < kRequests; i += kThreads) {
        try {
          TensorMap got = s.predict(inputs[i], "serving_default");
          for (auto& [name, y] : want[i])
            if (!got.count(name) || !at::equal(got.at(name), y)) ++mismatches;
        } catch (...) {
          ++errors;
        }
      }
    });
  {
    std::lock_guard<std::mutex> l(mu);
    go = true;
  }
  cv.notify_all();
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0) << "concurrent outputs differ from single-threaded ones";
}

TEST(ModelServable, ConcurrentRequestsMatchSingleThreadedOutputsSequential) {
  TempDir dir;
  hammer(save_sequential(dir.path() + "/1"));
}

TEST(ModelServable, ConcurrentRequestsMatchSingleThreadedOutputsFunctionalWithAttention) {
  TempDir dir;
  hammer(save_functional(dir.path() + "/1"));
}

// Small work runs on one intra-op thread (splitting it costs more than it
// saves); large work keeps the configured count; predict leaves the counts
// as it found them.
TEST(ModelServable, SmallBatchesRunOnOneIntraOpThreadAndTheCountsAreRestored) {
  TempDir dir;
  ModelServable s(save_sequential(dir.path() + "/1"));
  // 8x16+16, BatchNormalization's 4x16, 16x4+4.
  ASSERT_EQ(s.weight_count(), 8 * 16 + 16 + 4 * 16 + 16 * 4 + 4);
  const int64_t parallel_rows = (ModelServable::kParallelMinWork + s.weight_count() - 1) / s.weight_count();
  EXPECT_EQ(s.intra_op_cap(1), 1);
  EXPECT_EQ(s.intra_op_cap(parallel_rows - 1), 1);
  EXPECT_EQ(s.intra_op_cap(parallel_rows), 0);

  configure_threads(ThreadConfig{2});
  const int omp = num_threads(), blas = blas_num_threads();
  ASSERT_EQ(omp, 2);
  const std::string input = s.signatures()["serving_default"]["inputs"].begin().key();
  EXPECT_EQ(s.predict({{input, at::randn({4, 8})}}, "serving_default").size(), 1u);
  EXPECT_EQ(num_threads(), omp);
  EXPECT_EQ(blas_num_threads(), blas);
}

}  // namespace
}  // namespace kiln::serving
