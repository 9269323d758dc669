// Training, evaluation, prediction and model directories on a GPU, each
// compared with the same run on the CPU. Tests named *CUDA* need a GPU (the
// test main skips them with a message where there is none;
// scripts/gpu_check.sh runs them on a GPU machine); the others check what
// the CPU path must keep doing.
#include <gtest/gtest.h>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/random.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/normalization.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/adam.h"
#include "kiln/testing/testing.h"
#include "kiln/training/data_adapter.h"
#include "kiln/training/step_graph.h"
#include "kiln/training/training_test_util.h"

namespace kiln {
namespace {

using testing_training::blobs;

// 20 -> 32 (relu) -> BatchNormalization -> 3, Adam, sparse CE, accuracy;
// weights drawn with `seed` on the host, so every device starts equal.
std::shared_ptr<models::SequentialImpl> mlp(uint64_t seed) {
  clear_session();
  set_random_seed(seed);
  auto m = models::Sequential();
  m->add(layers::Input({20}));
  m->add(layers::Dense(32, "relu"));
  m->add(layers::BatchNormalization());
  m->add(layers::Dense(3));
  CompileArgs args;
  args.optimizer = std::make_shared<optimizers::Adam>(Json{{"learning_rate", 0.01}});
  args.loss = testing_training::scce_logits();
  args.metrics = {Metric::get("accuracy", args.loss.get())};
  m->compile(args);
  return m;
}

struct Data {
  at::Tensor x, y;
};
Data data(int64_t n) {
  at::manual_seed(11);
  at::Tensor x = at::randn({n, 20});
  at::Tensor y = (x.narrow(1, 0, 3).argmax(1));
  return {x, y};
}

FitArgs fit_args(const Data& d, int epochs) {
  FitArgs a;
  a.x = {d.x};
  a.y = {d.y};
  a.epochs = epochs;
  a.batch_size = 32;
  a.shuffle = false;
  a.verbose = 0;
  return a;
}

// float32 products in IEEE precision for the comparisons (TF32 is on by
// default on GPUs, as in TensorFlow).
struct NoTf32 {
  bool before = tf32_enabled();
  NoTf32() { set_tf32_enabled(false); }
  ~NoTf32() { set_tf32_enabled(before); }
};

TEST(DevicePrefetch, IsTheSameAdapterOnTheCpu) {
  Data d = data(64);
  auto inner = make_tensor_adapter({d.x}, {d.y}, at::Tensor(), 16, false);
  DataAdapter* raw = inner.get();
  auto out = prefetch_to_device(std::move(inner), at::Device(at::kCPU));
  EXPECT_EQ(out.get(), raw);  // the CPU path is untouched
}

TEST(DevicePrefetch, AnUnbuiltModelBuildsOnTheDefaultDevice) {
  DeviceScope cpu("cpu");
  auto m = mlp(1);
  EXPECT_TRUE(model_device(*m).is_cpu());
  for (const auto& w : m->weights()) EXPECT_TRUE(w->value().device().is_cpu()) << w->path();
}

TEST(DevicePrefetchCUDA, DeliversEveryBatchInOrderOnTheGpu) {
  Data d = data(100);  // 7 batches of 16, the last one short
  const at::Device gpu(at::kCUDA, 0);
  auto adapter = prefetch_to_device(make_tensor_adapter({d.x}, {d.y}, at::ones({100}), 16, false), gpu);
  auto it = adapter->begin_epoch(0);
  int64_t row = 0;
  while (auto b = it->next()) {
    ASSERT_EQ(b->x[0].device(), gpu);
    ASSERT_EQ(b->y[0].device(), gpu);
    ASSERT_EQ(b->sample_weight.device(), gpu);
    const int64_t n = b->x[0].size(0);
    EXPECT_TRUE(at::equal(b->x[0].cpu(), d.x.narrow(0, row, n)));
    EXPECT_TRUE(at::equal(b->y[0].cpu(), d.y.narrow(0, row, n)));
    row += n;
  }
  EXPECT_EQ(row, 100);
  // Resuming mid-epoch skips whole batches, prefetched or not.
  auto again = adapter->begin_epoch(0);
  again->skip(3);
  auto b = again->next();
  ASSERT_TRUE(b);
  EXPECT_TRUE(at::equal(b->x[0].cpu(), d.x.narrow(0, 48, 16)));
}

TEST(TrainingCUDA, FitOnTheGpuMatchesTheCpu) {
  NoTf32 ieee;
  Data d = data(256);
  auto on_cpu = [&] {
    DeviceScope s("cpu");
    auto m = mlp(7);
    auto h = m->fit(fit_args(d, 3));
    return std::make_pair(m, h);
  }();
  DeviceScope gpu("cuda:0");
  auto m = mlp(7);
  auto h = m->fit(fit_args(d, 3));
  for (const auto& w : m->weights()) EXPECT_TRUE(w->value().is_cuda()) << w->path();
  auto cpu_w = on_cpu.first->weights();
  auto gpu_w = m->weights();
  ASSERT_EQ(cpu_w.size(), gpu_w.size());
  for (size_t i = 0; i < cpu_w.size(); ++i)
    EXPECT_TRUE(at::allclose(gpu_w[i]->value().cpu(), cpu_w[i]->value(), 1e-4, 1e-5)) << cpu_w[i]->path();
  EXPECT_NEAR(h.history.at("loss").back(), on_cpu.second.history.at("loss").back(), 1e-4);
  EXPECT_NEAR(h.history.at("accuracy").back(), on_cpu.second.history.at("accuracy").back(),
              0.01);  // a tie may flip one row
  // evaluate and predict: host results, equal to the CPU's.
  auto ev = m->evaluate({.x = {d.x}, .y = {d.y}, .batch_size = 64, .verbose = 0});
  auto ev_cpu = on_cpu.first->evaluate({.x = {d.x}, .y = {d.y}, .batch_size = 64, .verbose = 0});
  EXPECT_NEAR(ev.at("loss"), ev_cpu.at("loss"), 1e-4);
  at::Tensor p = m->predict(d.x, {.batch_size = 64, .verbose = 0});
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_TRUE(at::allclose(p, on_cpu.first->predict(d.x, {.batch_size = 64, .verbose = 0}), 1e-4, 1e-4));
  // train_on_batch takes host tensors too.
  m->train_on_batch({d.x.narrow(0, 0, 32)}, {d.y.narrow(0, 0, 32)});
}

// mixed_bfloat16 and mixed_float16 (with its dynamic loss scale) on the
// GPU: the same autocast semantics as the CPU path, so the same weights to
// the policies' rounding after 3 epochs from the same start.
TEST(TrainingCUDA, MixedPrecisionOnTheGpuMatchesTheCpu) {
  NoTf32 ieee;
  Data d = data(256);
  for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
    SCOPED_TRACE(policy);
    set_dtype_policy(policy);
    std::vector<at::Tensor> cpu_w;
    double cpu_loss = 0;
    {
      DeviceScope s("cpu");
      auto m = mlp(9);
      cpu_loss = m->fit(fit_args(d, 3)).history.at("loss").back();
      for (const auto& w : m->weights()) cpu_w.push_back(w->value().detach().clone());
    }
    DeviceScope gpu("cuda:0");
    auto m = mlp(9);
    const double gpu_loss = m->fit(fit_args(d, 3)).history.at("loss").back();
    set_dtype_policy("float32");
    auto w = m->weights();
    ASSERT_EQ(w.size(), cpu_w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(w[i]->value().scalar_type(), cpu_w[i].scalar_type());
      const double err = (w[i]->value().cpu().to(at::kDouble) - cpu_w[i].to(at::kDouble)).abs().max().item<double>();
      const double scale = cpu_w[i].to(at::kDouble).abs().max().item<double>() + 1e-6;
      EXPECT_LT(err / scale, 0.05) << w[i]->path();  // a few bf16/f16 ulps after 24 steps
    }
    EXPECT_NEAR(gpu_loss, cpu_loss, 0.05 * std::abs(cpu_loss) + 1e-3);
  }
}

TEST(TrainingCUDA, ModelDirectoriesAreDeviceAgnosticBitForBit) {
  TempDir dir;
  Data d = data(128);
  std::vector<at::Tensor> trained;
  {
    DeviceScope gpu("cuda:0");
    auto m = mlp(3);
    m->fit(fit_args(d, 1));
    for (const auto& w : m->weights()) trained.push_back(w->value().detach().cpu());
    m->save(dir.path() + "/m/1");
  }
  {
    DeviceScope cpu("cpu");
    auto loaded = load_model(dir.path() + "/m/1");
    auto w = loaded->weights();
    ASSERT_EQ(w.size(), trained.size());
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_TRUE(w[i]->value().device().is_cpu());
      EXPECT_TRUE(at::equal(w[i]->value(), trained[i])) << w[i]->path();
    }
    loaded->save(dir.path() + "/m/2");  // and back: saved from the CPU, loaded on the GPU
  }
  DeviceScope gpu("cuda:0");
  auto back = load_model(dir.path() + "/m/2");
  auto w = back->weights();
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(w[i]->value().is_cuda());
    EXPECT_TRUE(at::equal(w[i]->value().cpu(), trained[i])) << w[i]->path();
  }
  // The optimizer state came along and training goes on on the GPU.
  back->fit(fit_args(d, 1));
}

TEST(TrainingCUDA, FusedAdamIsTheGpuDefaultAndMatchesThePerVariableUpdate) {
  NoTf32 ieee;
  DeviceScope gpu("cuda:0");
  Data d = data(256);
  auto fused = mlp(5);  // fused: the default on a GPU
  auto plain = mlp(5);
  std::dynamic_pointer_cast<optimizers::Adam>(plain->compile_args().optimizer)->set_fused(false);
  fused->fit(fit_args(d, 2));
  plain->fit(fit_args(d, 2));
  EXPECT_TRUE(std::dynamic_pointer_cast<optimizers::Adam>(fused->compile_args().optimizer)->last_update_fused());
  auto a = fused->weights(), b = plain->weights();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::allclose(a[i]->value(), b[i]->value(), 1e-4, 1e-5)) << a[i]->path();
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// jit_compile on the CPU: the steps run eagerly (one warning names why) and
// train exactly as without it.
TEST(JitCompile, OnTheCpuStepsRunEagerlyAndTrainTheSame) {
  Data d = data(100);
  auto eager = mlp(5);
  eager->fit(fit_args(d, 2));
  auto jit = mlp(5);
  CompileArgs args = jit->train_state().compile_args();
  args.jit_compile = true;
  jit->compile(args);
  jit->fit(fit_args(d, 2));
  auto a = eager->weights(), b = jit->weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i]->value(), b[i]->value())) << a[i]->path();
  CapturedTrainStep step(jit->train_state(), at::Device(at::kCPU));
  EXPECT_NE(step.eager_reason().find("CUDA graphs need a GPU"), std::string::npos) << step.eager_reason();
  // Keras's compile config: true turns it on, "auto" and false leave it off.
  EXPECT_TRUE(CompileArgs::from_json(Json::parse(R"({"optimizer": "adam", "jit_compile": true})")).jit_compile);
  EXPECT_FALSE(CompileArgs::from_json(Json::parse(R"({"optimizer": "adam", "jit_compile": "auto"})")).jit_compile);
  EXPECT_TRUE(args.to_json()["jit_compile"].get<bool>());
}

// On a GPU: after two warm-up steps the forward, loss, backward and metric
// updates replay from a CUDA graph (BatchNormalization's moving statistics
// included); the last, smaller batch of each epoch runs eagerly. Weights,
// moving statistics and logged metrics match eager steps.
TEST(JitCompileCUDA, ReplayedStepsMatchEagerSteps) {
  NoTf32 ieee;
  DeviceScope gpu("cuda:0");
  Data d = data(100);  // batches of 32, 32, 32 and 4
  auto eager = mlp(5);
  auto he = eager->fit(fit_args(d, 3));
  auto jit = mlp(5);
  CompileArgs args = jit->train_state().compile_args();
  args.jit_compile = true;
  jit->compile(args);
  auto hj = jit->fit(fit_args(d, 3));
  auto a = eager->weights(), b = jit->weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::allclose(a[i]->value(), b[i]->value(), 1e-5, 1e-6)) << a[i]->path();
  EXPECT_NEAR(he.history.at("loss").back(), hj.history.at("loss").back(), 1e-5);
  EXPECT_EQ(he.history.at("accuracy").back(), hj.history.at("accuracy").back());

  // The same steps driven one by one: 12 batches of 32, two warm up, one is
  // captured and then replayed with the rest.
  auto m = mlp(6);
  m->build({{kNone, 20}});
  CapturedTrainStep step(m->train_state(), at::Device(at::kCUDA, 0));
  ASSERT_EQ(step.eager_reason(), "");
  for (int64_t b = 0; b < 12; ++b) {
    StepData s;
    s.model = m.get();
    s.x = {d.x.narrow(0, (b % 3) * 32, 32).cuda()};
    s.y = {d.y.narrow(0, (b % 3) * 32, 32).cuda()};
    s.variables = m->trainable_weights();
    step.run(s);
  }
  EXPECT_EQ(step.eager_reason(), "");
  EXPECT_EQ(step.replays(), 10);
}

}  // namespace
}  // namespace kiln
