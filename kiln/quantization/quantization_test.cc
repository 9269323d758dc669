// Quantization and mixed precision: float8's emulation against an
// independently computed table of every value, delayed scaling, the int8
// abs-max scheme and GEMM, quantize() on Dense / EinsumDense / Embedding
// (numerics, saving, reloading bit-identically), calibration, QAT, loss
// scaling, and Fashion-MNIST accuracy in int8 and float8.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>

#include "kiln/core/cpu_features.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/einsum_dense.h"
#include "kiln/layers/embedding.h"
#include "kiln/models/calibration.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/loss_scale_optimizer.h"
#include "kiln/quantization/float8.h"
#include "kiln/quantization/int8.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

using quantization::Float8Format;

// --- float8 -------------------------------------------------------------------

// bits -> value, from scripts/float8_table.py (nan as NaN).
std::vector<double> float8_table(const std::string& name) {
  std::ifstream in(source_path("kiln/quantization/testdata/float8_" + name + ".txt"));
  std::vector<double> values(256, 0.0);
  int bits = 0;
  std::string v;
  int n = 0;
  while (in >> bits >> v) {
    values.at(bits) = v == "nan"    ? std::numeric_limits<double>::quiet_NaN()
                      : v == "inf"  ? std::numeric_limits<double>::infinity()
                      : v == "-inf" ? -std::numeric_limits<double>::infinity()
                                    : std::stod(v);
    ++n;
  }
  EXPECT_EQ(n, 256) << "table for " << name;
  return values;
}

float round1(double v, Float8Format f) {
  return quantization::round_to_float8(at::full({1}, v, at::kFloat), f).item<float>();
}

class Float8Formats : public ::testing::TestWithParam<std::pair<std::string, Float8Format>> {};

TEST_P(Float8Formats, EveryValueOfTheIndependentTableDecodesAndRoundsToItself) {
  const auto [name, f] = GetParam();
  auto table = float8_table(name);
  int finite = 0;
  for (int bits = 0; bits < 256; ++bits) {
    const double t = table[bits], d = quantization::float8_decode(static_cast<uint8_t>(bits), f);
    if (std::isnan(t)) {
      EXPECT_TRUE(std::isnan(d)) << name << " bits " << bits;
      continue;
    }
    EXPECT_EQ(d, t) << name << " bits " << bits;
    if (!std::isfinite(t)) continue;
    EXPECT_EQ(round1(t, f), static_cast<float>(t)) << name << " value " << t;
    ++finite;
  }
  EXPECT_GT(finite, 200);
}

TEST_P(Float8Formats, BetweenNeighboursRoundsToNearestTiesToEvenAndSaturates) {
  const auto [name, f] = GetParam();
  auto table = float8_table(name);
  // Positive finite values with their bit patterns, ascending.
  std::vector<std::pair<double, int>> pos;
  for (int bits = 0; bits < 128; ++bits)
    if (std::isfinite(table[bits])) pos.emplace_back(table[bits], bits);
  std::sort(pos.begin(), pos.end());
  for (size_t i = 0; i + 1 < pos.size(); ++i) {
    const auto [lo, lo_bits] = pos[i];
    const auto [hi, hi_bits] = pos[i + 1];
    const double mid = (lo + hi) / 2;
    const double even = (lo_bits % 2 == 0) ? lo : hi;  // the mantissa's last bit is the pattern's last bit
    EXPECT_EQ(round1(mid, f), static_cast<float>(even)) << name << " tie between " << lo << " and " << hi;
    EXPECT_EQ(round1(-mid, f), static_cast<float>(-even)) << name;
    EXPECT_EQ(round1(lo + (hi - lo) * 0.25, f), static_cast<float>(lo)) << name;
    EXPECT_EQ(round1(lo + (hi - lo) * 0.75, f), static_cast<float>(hi)) << name;
  }
  const double mx = quantization::float8_max(f);
  EXPECT_EQ(mx, pos.back().first);
  EXPECT_EQ(round1(mx * 1.5, f), static_cast<float>(mx));
  EXPECT_EQ(round1(-1e30, f), static_cast<float>(-mx));
  EXPECT_EQ(round1(std::numeric_limits<double>::infinity(), f), static_cast<float>(mx));
  EXPECT_TRUE(std::isnan(round1(std::numeric_limits<double>::quiet_NaN(), f)));
  // Below half the smallest subnormal: zero.
  EXPECT_EQ(round1(pos[1].first * 0.4, f), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Float8, Float8Formats,
                         ::testing::Values(std::make_pair(std::string("e4m3fn"), Float8Format::kE4M3FN),
                                           std::make_pair(std::string("e5m2"), Float8Format::kE5M2)),
                         [](const auto& info) { return info.param.first; });

TEST(Float8, DelayedScalingFollowsKerasFormulas) {
  using namespace quantization;
  at::Tensor history = at::zeros({4});
  history = compute_amax_history(at::tensor({1.0f, -3.0f, 2.0f}), history);
  EXPECT_TRUE(at::equal(history, at::tensor({3.0f, 0.0f, 0.0f, 0.0f})));
  history = compute_amax_history(at::tensor({0.5f}), history);
  EXPECT_TRUE(at::equal(history, at::tensor({0.5f, 0.0f, 0.0f, 3.0f})));  // rolled by one, newest in front
  // scale = amax / 448 (margin 0); zero or non-finite amax keeps the scale.
  at::Tensor one = at::ones({});
  EXPECT_FLOAT_EQ(compute_float8_scale(at::full({}, 3.0f), one, Float8Format::kE4M3FN).item<float>(), 3.0f / 448.0f);
  EXPECT_FLOAT_EQ(compute_float8_scale(at::zeros({}), at::full({}, 0.25f), Float8Format::kE4M3FN).item<float>(), 0.25f);
  EXPECT_FLOAT_EQ(compute_float8_scale(at::full({}, INFINITY), at::full({}, 0.5f), Float8Format::kE5M2).item<float>(),
                  0.5f);
  // quantize_and_dequantize: x / scale clipped to +-448, rounded, times scale.
  at::Tensor q = quantize_and_dequantize(at::tensor({1000.0f, 0.3f}), at::full({}, 2.0f), Float8Format::kE4M3FN);
  EXPECT_FLOAT_EQ(q[0].item<float>(), 896.0f);
  EXPECT_FLOAT_EQ(q[1].item<float>(), 2.0f * round1(0.15, Float8Format::kE4M3FN));
}

// --- int8 ---------------------------------------------------------------------

double rel_err(const at::Tensor& a, const at::Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); }

TEST(Int8, AbsMaxQuantizeIsKerasScheme) {
  at::Tensor w = at::tensor({0.5f, -2.0f, -1.0f, 1.0f, 0.25f, 0.0f}).reshape({3, 2});
  auto [q, scale] = quantization::abs_max_quantize(w, {0});
  EXPECT_EQ(q.scalar_type(), at::kChar);
  EXPECT_EQ(scale.sizes(), (at::IntArrayRef{1, 2}));
  EXPECT_NEAR(scale[0][0].item<float>(), 127.0 / (1.0 + 1e-7), 1e-4);
  EXPECT_NEAR(scale[0][1].item<float>(), 127.0 / (2.0 + 1e-7), 1e-4);
  EXPECT_EQ(q[1][0].item<int8_t>(), -127);
  EXPECT_EQ(q[0][1].item<int8_t>(), -127);
  EXPECT_EQ(q[2][0].item<int8_t>(), 32);  // round(0.25 * 127) = round(31.75)
  EXPECT_EQ(q[0][0].item<int8_t>(), 63);  // 0.5 * 127 / (2 + 1e-7) = 63.4999...
}

TEST(Int8, GemmIsExactOnEveryKernel) {
  set_random_seed(3);
  at::Tensor a = at::randint(-127, 128, {37, 300}, at::kChar), b = at::randint(-127, 128, {300, 19}, at::kChar);
  a[0].fill_(127);  // u8 255 x s8 127 pairs: what a kernel without VNNI saturates
  b.select(1, 0).fill_(127);
  at::Tensor want = at::mm(a.to(at::kLong), b.to(at::kLong));
  const std::string before = quantization::set_int8_backend("auto");
  for (const char* kernel : {"exact", "onednn", "fbgemm"}) {
    quantization::set_int8_backend(kernel);
    // oneDNN's kernel without int8 dot products saturates int16 sums: there
    // kiln keeps to LibTorch's exact GEMM.
    if (std::string(kernel) == "onednn" && !cpu_features().int8_dot()) EXPECT_EQ(quantization::int8_backend(), "exact");
    at::Tensor got = quantization::int8_matmul(a, b);
    EXPECT_EQ(got.scalar_type(), at::kInt);
    EXPECT_TRUE(at::equal(got.to(at::kLong), want)) << kernel << " ran " << quantization::int8_backend();
  }
  quantization::set_int8_backend("auto");
  EXPECT_NE(quantization::int8_backend(), "auto");
  EXPECT_THROW(quantization::set_int8_backend("mkl"), ValueError);
  quantization::set_int8_backend(before);
}

// On a GPU: cuBLASLt's int8 GEMM (at::_int_mm) where its shapes allow it,
// float64 elsewhere; both the CPU's exact integer sums, and the Dense
// product within float32 rounding of the CPU's (the scales are applied by
// other kernels).
TEST(Int8CUDA, GemmAndDenseOnTheGpuMatchTheCpu) {
  set_random_seed(3);
  const at::Device gpu(at::kCUDA, 0);
  for (int64_t m : {1, 17, 256}) {
    for (int64_t k : {64, 300}) {
      at::Tensor a = at::randint(-127, 128, {m, k}, at::kChar), b = at::randint(-127, 128, {k, 40}, at::kChar);
      at::Tensor want = at::mm(a.to(at::kLong), b.to(at::kLong));
      at::Tensor got = quantization::int8_matmul(a.to(gpu), b.to(gpu));
      EXPECT_EQ(got.device(), gpu);
      EXPECT_TRUE(at::equal(got.cpu().to(at::kLong), want)) << m << "x" << k;
    }
  }
  at::Tensor w = at::randn({96, 40});
  auto [wq, ws] = quantization::abs_max_quantize(w, {0});
  ws = ws.reshape({-1});
  at::Tensor bias = at::randn({40}), x = at::randn({64, 96});
  const std::string before = quantization::set_int8_backend("exact");
  at::Tensor want = quantization::Int8Weights(wq).dense(x, at::Tensor(), ws, bias);
  at::Tensor got = quantization::Int8Weights(wq.to(gpu)).dense(x.to(gpu), at::Tensor(), ws.to(gpu), bias.to(gpu));
  EXPECT_TRUE(at::allclose(got.cpu(), want, 1e-5, 1e-5));
  quantization::set_int8_backend(before);
}

// The Dense product on every kernel: the same bits for rows without
// negative values (post-ReLU activations), whatever the kernel, the batch
// size, the input path (loops or ATen) or the other rows in the batch. Rows
// with negative values too, except on fbgemm without VNNI, where they are
// quantized to 7 bits: there the error against float32 may grow, by at most
// about 2x.
TEST(Int8, DenseGivesTheSameResultsOnEveryKernel) {
  set_random_seed(21);
  at::Tensor w = at::randn({100, 40});
  auto [wq, ws] = quantization::abs_max_quantize(w, {0});
  ws = ws.reshape({-1});
  at::Tensor bias = at::randn({40});
  quantization::Int8Weights packed(wq);
  const std::string before = quantization::set_int8_backend("fbgemm");
  const bool narrow = quantization::int8_backend() == "fbgemm" && !quantization::fbgemm_wide_inputs();
  for (bool calibrated : {false, true}) {
    at::Tensor fixed = calibrated ? at::full({}, 40.0f) : at::Tensor();
    for (const char* kind : {"relu", "signed", "mixed"}) {
      at::Tensor x = at::randn({300, 100});  // 30,000 elements: ATen's kernels
      if (std::string(kind) == "relu") x = x.relu();
      if (std::string(kind) == "mixed") x.slice(0, 0, 150).relu_();
      at::Tensor nonneg = std::get<0>(x.min(1)).ge(0);
      const std::string what = std::string(calibrated ? "static, " : "dynamic, ") + kind;
      quantization::set_int8_backend("exact");
      at::Tensor want = packed.dense(x, fixed, ws, bias);
      at::Tensor reference = at::addmm(bias, x, w);
      for (const char* kernel : {"exact", "onednn", "fbgemm"}) {
        quantization::set_int8_backend(kernel);
        at::Tensor got = packed.dense(x, fixed, ws, bias);
        if (std::string(kernel) == "fbgemm" && narrow && std::string(kind) != "relu") {
          EXPECT_TRUE(at::equal(got.index({nonneg}), want.index({nonneg}))) << what;
          at::Tensor neg = nonneg.logical_not();
          EXPECT_FALSE(at::equal(got.index({neg}), want.index({neg}))) << what;  // 7 bits
          EXPECT_LT(rel_err(got.index({neg}), reference.index({neg})),
                    2.2 * rel_err(want.index({neg}), reference.index({neg})))
              << what;
        } else {
          EXPECT_TRUE(at::equal(got, want)) << kernel << ", " << what;
        }
        for (int64_t i : {0, 7, 160, 299}) {  // one row: the loop path, one thread
          at::Tensor one = packed.dense(x.slice(0, i, i + 1), fixed, ws, bias);
          EXPECT_TRUE(at::equal(one, got.slice(0, i, i + 1))) << kernel << ", " << what << ", row " << i;
        }
      }
    }
  }
  quantization::set_int8_backend(before);
}

// quantize_rows / dequantize_product take plain loops for small inputs (a
// served row) and ATen's kernels for large ones: the results must not depend
// on the batch size.
TEST(Int8, SmallAndLargeInputsGiveTheSameBits) {
  set_random_seed(12);
  at::Tensor x = at::randn({300, 100}) * 3;  // 30,000 elements: the ATen path
  auto [q_all, s_all] = quantization::quantize_rows(x);
  at::Tensor ws = at::rand({64}) + 0.5, bias = at::randn({64});
  at::Tensor acc_all = at::randint(-100000, 100000, {300, 64}, at::kInt);
  at::Tensor y_all = quantization::dequantize_product(acc_all, s_all, ws, bias);
  for (int64_t i : {0, 7, 299}) {  // one row: the loop path
    auto [q1, s1] = quantization::quantize_rows(x.slice(0, i, i + 1));
    EXPECT_TRUE(at::equal(q1, q_all.slice(0, i, i + 1))) << "row " << i;
    EXPECT_TRUE(at::equal(s1, s_all.slice(0, i, i + 1))) << "row " << i;
    at::Tensor y1 = quantization::dequantize_product(acc_all.slice(0, i, i + 1), s1, ws, bias);
    EXPECT_TRUE(at::equal(y1, y_all.slice(0, i, i + 1))) << "row " << i;
  }
  // A static (calibrated) scale, both paths.
  at::Tensor fixed = at::full({}, 20.0f);
  auto [qs_all, ss_all] = quantization::quantize_rows(x, fixed);
  auto [qs1, ss1] = quantization::quantize_rows(x.slice(0, 5, 6), fixed);
  EXPECT_TRUE(at::equal(qs1, qs_all.slice(0, 5, 6)));
  EXPECT_EQ(qs_all.abs().max().item<int8_t>(), 127);  // beyond the range: saturated
  auto [qa, sa] = quantization::abs_max_quantize(x, {1});
  EXPECT_TRUE(at::equal(qa, q_all));  // the same scheme as abs_max_quantize
}

// A built Dense with non-trivial weights.
std::shared_ptr<models::SequentialImpl> mlp(int64_t in = 64) {
  auto m = models::Sequential();
  m->add(layers::Input({in}));
  m->add(layers::Dense(48, "relu"));
  m->add(layers::Dense(10));
  return m;
}

TEST(QuantizeInt8, DenseStoresInt8KernelsAndStaysCloseToFloat) {
  set_random_seed(1);
  auto m = mlp();
  at::Tensor x = at::randn({32, 64});
  at::Tensor want = m->predict(x);
  m->quantize("int8");
  auto d = std::dynamic_pointer_cast<layers::DenseImpl>(m->layers().at(0));
  EXPECT_EQ(d->kernel(), nullptr);
  EXPECT_EQ(d->dtype_policy().name(), "int8_from_float32");
  EXPECT_EQ(d->kernel_impl().mode(), "int8");
  std::map<std::string, at::ScalarType> dtypes;
  for (auto& v : d->weights()) dtypes[v->name()] = v->value().scalar_type();
  EXPECT_EQ(dtypes["kernel"], at::kChar);
  EXPECT_EQ(dtypes["kernel_scale"], at::kFloat);
  EXPECT_EQ(d->trainable_weights().size(), 1u);  // the bias only
  at::Tensor got = m->predict(x);
  EXPECT_LT(rel_err(got, want), 0.02);
  EXPECT_GT(rel_err(got, want), 0.0);  // really quantized
  EXPECT_EQ(m->quantization_summary(), "int8");
  EXPECT_THROW(m->quantize("int8"), ValueError);  // nothing left to quantize
}

TEST(QuantizeInt8, SavedModelReloadsBitIdentically) {
  set_random_seed(2);
  auto m = mlp();
  at::Tensor x = at::randn({16, 64});
  m->predict(x);
  m->quantize("int8");
  TempDir dir;
  m->save(dir.path() + "/m");
  auto back = load_model(dir.path() + "/m");
  EXPECT_TRUE(at::equal(back->predict(x), m->predict(x)));
  auto d = std::dynamic_pointer_cast<layers::DenseImpl>(back->layers().at(0));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->dtype_policy().name(), "int8_from_float32");
  for (auto& v : d->weights())
    if (v->name() == "kernel") EXPECT_EQ(v->value().scalar_type(), at::kChar);
}

TEST(QuantizeInt8, EinsumDenseAndEmbedding) {
  set_random_seed(4);
  auto e = layers::EinsumDense("abc,cd->abd", Shape{5, 12}, "d");
  at::Tensor x = at::randn({3, 5, 8});
  at::Tensor want = (*e)(x);
  e->quantize("int8");
  at::Tensor got = (*e)(x);
  EXPECT_LT(rel_err(got, want), 0.02);
  EXPECT_EQ(e->kernel(), nullptr);

  auto emb = layers::Embedding(20, 6);
  at::Tensor ids = at::randint(0, 20, {4, 7}, at::kLong);
  at::Tensor e_want = (*emb)(ids);
  emb->quantize("int8");
  EXPECT_LT(rel_err((*emb)(ids), e_want), 0.01);
  EXPECT_THROW(layers::Embedding(5, 2)->quantize("float8"), ValueError);
}

TEST(QuantizeInt8, CalibratedStaticScalesAreSavedAndUsed) {
  set_random_seed(5);
  auto m = mlp();
  at::Tensor x = at::randn({64, 64});
  at::Tensor want = m->predict(x);
  m->quantize("int8");
  EXPECT_THROW(calibrate(*m, {x}, {.method = "median"}), ValueError);
  calibrate(*m, {x}, {.method = "minmax"});
  auto d = std::dynamic_pointer_cast<layers::DenseImpl>(m->layers().at(0));
  EXPECT_EQ(d->kernel_impl().activation_scheme(), "static");
  EXPECT_TRUE(d->dtype_policy().static_inputs());
  at::Tensor scale;
  for (auto& v : d->weights())
    if (v->name() == "inputs_scale") scale = v->value();
  ASSERT_TRUE(scale.defined());
  EXPECT_NEAR(scale.item<float>(), 127.0 / x.abs().max().item<float>(), 1e-3);
  at::Tensor got = m->predict(x);
  EXPECT_LT(rel_err(got, want), 0.05);
  TempDir dir;
  m->save(dir.path() + "/m");
  auto back = load_model(dir.path() + "/m");
  EXPECT_TRUE(at::equal(back->predict(x), got));
  // Percentile ranges clip outliers: a smaller range than min/max.
  auto p = mlp();
  p->predict(x);
  p->quantize("int8");
  calibrate(*p, {x}, {.method = "percentile", .percentile = 99.0});
  for (auto& v : std::dynamic_pointer_cast<layers::DenseImpl>(p->layers().at(0))->weights())
    if (v->name() == "inputs_scale") EXPECT_GT(v->value().item<float>(), scale.item<float>());
}

TEST(QuantizeInt8, QuantizationAwareTrainingMatchesTheConvertedModel) {
  set_random_seed(6);
  auto m = mlp();
  at::Tensor x = at::randn({16, 64});
  m->predict(x);
  m->quantize("int8_qat");
  auto d = std::dynamic_pointer_cast<layers::DenseImpl>(m->layers().at(0));
  EXPECT_TRUE(d->kernel());  // the float kernel trains
  m->compile("sgd", "mse");
  at::Tensor before = d->kernel()->value().clone();
  m->fit({.x = {x}, .y = {at::randn({16, 10})}, .batch_size = 16, .epochs = 1, .verbose = 0});
  EXPECT_FALSE(at::equal(before, d->kernel()->value()));  // straight-through gradients reach it
  at::Tensor fake = m->predict(x), fake_relu = m->predict(x.relu());
  m->quantize("int8");
  EXPECT_EQ(d->dtype_policy().name(), "int8_from_float32");
  EXPECT_LT(rel_err(m->predict(x.relu()), fake_relu), 1e-4);
  // QAT rounds inputs to 8 bits; fbgemm without VNNI rounds rows with
  // negative values to 7 bits (docs/PRECISION.md).
  const bool narrow = quantization::int8_backend(16) == "fbgemm" && !quantization::fbgemm_wide_inputs();
  EXPECT_LT(rel_err(m->predict(x), fake), narrow ? 0.02 : 1e-4);
}

// --- float8 layers -------------------------------------------------------------

TEST(QuantizeFloat8, TrainingAdvancesScalesAndHistoriesWhichAreSaved) {
  set_random_seed(7);
  auto m = mlp(32);
  at::Tensor x = at::randn({64, 32}), y = at::randn({64, 10});
  m->predict(x);
  at::Tensor want = m->predict(x);
  m->quantize("float8");
  auto d = std::dynamic_pointer_cast<layers::DenseImpl>(m->layers().at(0));
  EXPECT_EQ(d->dtype_policy().name(), "float8_from_float32");
  std::map<std::string, VariablePtr> vars;
  for (auto& v : d->weights()) vars[v->name()] = v;
  for (const char* n : {"inputs_scale", "inputs_amax_history", "kernel_scale", "kernel_amax_history",
                        "outputs_grad_scale", "outputs_grad_amax_history"})
    ASSERT_TRUE(vars.count(n)) << n;
  EXPECT_EQ(vars["inputs_amax_history"]->shape(), (Shape{1024}));
  EXPECT_LT(rel_err(m->predict(x), want), 0.1);  // scale 1: e4m3 rounding only
  m->compile("adam", "mse");
  m->fit({.x = {x}, .y = {y}, .batch_size = 16, .epochs = 2, .verbose = 0});
  // 8 steps: the histories hold 8 amaxes (the newest in front, the history
  // rolled by one each step), and the scales follow them.
  at::Tensor h = vars["inputs_amax_history"]->value();
  EXPECT_EQ((h != 0).sum().item<int64_t>(), 8);
  EXPECT_GT(h[0].item<float>(), 0.0f);
  EXPECT_LE(h[0].item<float>(), x.abs().max().item<float>());
  EXPECT_GT(h[1023].item<float>(), 0.0f);
  EXPECT_EQ(h.slice(0, 1, 1017).abs().sum().item<float>(), 0.0f);
  EXPECT_NE(vars["inputs_scale"]->value().item<float>(), 1.0f);
  EXPECT_GT(vars["outputs_grad_amax_history"]->value()[0].item<float>(), 0.0f);
  EXPECT_NE(vars["outputs_grad_scale"]->value().item<float>(), 1.0f);
  TempDir dir;
  m->save(dir.path() + "/m");
  auto back = load_model(dir.path() + "/m");
  EXPECT_TRUE(at::equal(back->predict(x), m->predict(x)));
}

// float8 training on a GPU's tensor cores (at::_scaled_mm; the first
// layer's product, 16 x 32 x 48, qualifies, the second's N = 10 does not and
// runs emulated) against the CPU's exact emulation, same initial weights, 8
// Adam steps. The rounding and the scales are the same; the sums' order
// differs, which may flip a float8 rounding of a later step. Adam moves a
// weight by at most about the learning rate per step, so 8 steps at 1e-3
// bound any drift by 1e-2; the amax histories agree to float rounding.
TEST(Float8CUDA, TensorCoreTrainingMatchesTheCpuEmulation) {
  const at::Device gpu(at::kCUDA, 0);
  if (!quantization::float8_tensor_cores(gpu))
    std::cout << "this GPU has no float8 tensor cores (compute capability below 8.9): both sides emulate\n";
  set_random_seed(7);
  at::Tensor x = at::randn({128, 32}), y = at::randn({128, 10});
  auto train = [&](const std::string& device) {
    DeviceScope scope(device);
    set_random_seed(8);
    auto m = mlp(32);
    m->build({{kNone, 32}});
    m->quantize("float8");
    m->compile(CompileArgs::from_names("adam", "mse", {}));
    auto h = m->fit({.x = {x}, .y = {y}, .batch_size = 16, .epochs = 1, .verbose = 0, .shuffle = false});
    return std::make_pair(m, h.history.at("loss").back());
  };
  auto [cpu, cpu_loss] = train("cpu");
  auto [gpu_model, gpu_loss] = train("cuda:0");
  auto a = cpu->weights(), b = gpu_model->weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(b[i]->value().is_cuda()) << b[i]->path();
    const double diff = (a[i]->value() - b[i]->value().cpu()).abs().max().item<double>();
    const bool history = a[i]->path().find("amax_history") != std::string::npos;
    const double scale = a[i]->value().abs().max().item<double>();
    EXPECT_LE(diff, history ? 1e-3 * scale + 1e-6 : 1e-2) << a[i]->path();
  }
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.02 * std::abs(cpu_loss));
  // Inference on the GPU after training: the same predictions to the drift.
  EXPECT_TRUE(at::allclose(gpu_model->predict(x).cpu(), cpu->predict(x), 0.05, 0.05));
}

// --- loss scaling ------------------------------------------------------------------

TEST(LossScaleOptimizer, SkipsNonFiniteStepsHalvesAndGrowsTheScale) {
  auto var = std::make_shared<Variable>("w", at::ones({3}), true);
  auto opt = std::make_shared<LossScaleOptimizer>(Optimizer::get("sgd"),
                                                  LossScaleOptions{.initial_scale = 8, .dynamic_growth_steps = 2});
  EXPECT_EQ(opt->scale_loss(at::full({}, 2.0f)).item<float>(), 16.0f);
  // Scaled gradients are unscaled before SGD's update (lr 0.01).
  opt->apply_gradients({at::full({3}, 8.0f)}, {var});
  EXPECT_TRUE(at::allclose(var->value(), at::full({3}, 0.99f)));
  EXPECT_EQ(opt->iterations(), 1);
  EXPECT_EQ(opt->scale(), 8);
  opt->apply_gradients({at::full({3}, 8.0f)}, {var});
  EXPECT_EQ(opt->scale(), 16);  // 2 finite steps: doubled
  at::Tensor before = var->value().clone();
  opt->apply_gradients({at::tensor({1.0f, INFINITY, 0.0f})}, {var});
  EXPECT_TRUE(at::equal(var->value(), before));  // skipped
  EXPECT_EQ(opt->iterations(), 2);
  EXPECT_EQ(opt->scale(), 8);
  EXPECT_EQ(opt->skipped_steps(), 1);
  opt->apply_gradients({at::tensor({NAN, 0.0f, 0.0f})}, {var});
  EXPECT_EQ(opt->scale(), 4);
  // State and config round trip.
  auto copy = LossScaleOptimizer::from_config(opt->get_config());
  copy->load_state_dict(opt->state_dict());
  EXPECT_EQ(copy->scale(), 4);
  EXPECT_EQ(copy->options().dynamic_growth_steps, 2);
  EXPECT_EQ(copy->inner_optimizer()->class_name(), "SGD");
  EXPECT_EQ(Optimizer::from_json(opt->to_json())->class_name(), "LossScaleOptimizer");
  // Fixed scale: never changes.
  auto fixed = std::make_shared<LossScaleOptimizer>(Optimizer::get("sgd"),
                                                    LossScaleOptions{.initial_scale = 64, .dynamic = false});
  fixed->apply_gradients({at::tensor({NAN, 0.0f, 0.0f})}, {var});
  EXPECT_EQ(fixed->scale(), 64);
  EXPECT_THROW(LossScaleOptimizer(Optimizer::get("sgd"), {.initial_scale = 0.5}), ValueError);
}

TEST(LossScaleOptimizer, MatchesTheInnerOptimizerOnFiniteSteps) {
  // Power-of-two scales make scaling and unscaling exact.
  set_random_seed(8);
  auto a = mlp(16), b = mlp(16);
  a->predict(at::zeros({1, 16}));
  b->predict(at::zeros({1, 16}));
  b->set_weights(a->get_weights());
  a->compile(CompileArgs::from_names("adam", "mse"));
  CompileArgs args = CompileArgs::from_names("adam", "mse");
  args.optimizer = std::make_shared<LossScaleOptimizer>(args.optimizer);
  b->compile(args);
  at::Tensor x = at::randn({32, 16}), y = at::randn({32, 10});
  a->fit({.x = {x}, .y = {y}, .batch_size = 8, .epochs = 2, .verbose = 0, .shuffle = false});
  b->fit({.x = {x}, .y = {y}, .batch_size = 8, .epochs = 2, .verbose = 0, .shuffle = false});
  auto wa = a->get_weights(), wb = b->get_weights();
  for (size_t i = 0; i < wa.size(); ++i) EXPECT_TRUE(at::allclose(wa[i], wb[i], 1e-6, 1e-7)) << i;
}

TEST(LossScaleOptimizer, SavedModelsKeepTheScaleAndCounter) {
  set_random_seed(10);
  auto m = mlp(16);
  m->predict(at::zeros({1, 16}));
  CompileArgs args = CompileArgs::from_names("adam", "mse");
  args.optimizer = std::make_shared<LossScaleOptimizer>(
      args.optimizer, LossScaleOptions{.initial_scale = 1024, .dynamic_growth_steps = 3});
  m->compile(args);
  // 4 finite steps: the scale doubles once, the counter stands at 1.
  m->fit({.x = {at::randn({32, 16})}, .y = {at::randn({32, 10})}, .batch_size = 8, .epochs = 1, .verbose = 0});
  auto* lso = dynamic_cast<LossScaleOptimizer*>(m->compile_args().optimizer.get());
  ASSERT_TRUE(lso);
  EXPECT_EQ(lso->scale(), 2048);
  EXPECT_EQ(lso->step_counter(), 1);
  TempDir dir;
  m->save(dir.path() + "/m");
  auto back = load_model(dir.path() + "/m");
  auto* restored = dynamic_cast<LossScaleOptimizer*>(back->compile_args().optimizer.get());
  ASSERT_TRUE(restored) << back->compile_args().optimizer->class_name();
  EXPECT_EQ(restored->scale(), 2048);
  EXPECT_EQ(restored->step_counter(), 1);
  EXPECT_EQ(restored->options().dynamic_growth_steps, 3);
  EXPECT_EQ(restored->iterations(), 4);
}

TEST(MixedPrecision, MixedFloat16CompilesWithLossScalingAndKeepsFloat32Variables) {
  // Linear layers only: LibTorch 1.13 has no float16 relu on CPU (kiln's
  // float16 GEMMs run upcast).
  set_dtype_policy("mixed_float16");
  auto m = models::Sequential();
  m->add(layers::Input({16}));
  m->add(layers::Dense(8));
  m->add(layers::Dense(10));
  set_dtype_policy("float32");
  m->compile("sgd", "mse");
  EXPECT_EQ(m->compile_args().optimizer->class_name(), "LossScaleOptimizer");
  for (auto& v : m->weights()) EXPECT_EQ(v->value().scalar_type(), at::kFloat) << v->path();
  at::Tensor y = m->predict(at::randn({4, 16}));
  EXPECT_EQ(y.scalar_type(), at::kHalf);
  auto h = m->fit({.x = {at::randn({8, 16})}, .y = {at::randn({8, 10})}, .batch_size = 4, .epochs = 1, .verbose = 0});
  EXPECT_TRUE(std::isfinite(h.history.at("loss").back()));
}

// Regression: LibTorch 1.13 accumulates small bf16 products (m*n*k <= 16^3)
// in bf16; kiln's bf16 Dense must accumulate in float32 at any size.
TEST(MixedPrecision, Bfloat16DenseAccumulatesInFloat32EvenForOneRow) {
  set_random_seed(9);
  set_dtype_policy("mixed_bfloat16");
  auto d = layers::Dense({.units = 64, .use_bias = false});
  set_dtype_policy("float32");
  for (int64_t rows : {1, 64}) {
    at::Tensor x = at::randn({rows, 64});
    at::Tensor y = (*d)(x);
    ASSERT_EQ(y.scalar_type(), at::kBFloat16);
    at::Tensor want = at::mm(x.to(at::kBFloat16).to(at::kFloat), d->kernel()->value().to(at::kBFloat16).to(at::kFloat))
                          .to(at::kBFloat16);
    EXPECT_TRUE(at::equal(y, want)) << rows << " rows: " << (y != want).sum().item<int64_t>() << " outputs differ";
  }
}

TEST(MixedPrecision, QuantizedPolicyNamesRoundTrip) {
  DTypePolicy p = DTypePolicy("mixed_bfloat16").quantized("int8");
  EXPECT_EQ(p.name(), "int8_from_mixed_bfloat16");
  EXPECT_EQ(p.compute_dtype(), at::kBFloat16);
  EXPECT_EQ(DTypePolicy::from_json(p.to_json()).name(), p.name());
  EXPECT_EQ(
      DTypePolicy::from_json(DTypePolicy("float32").quantized("float8", false, 16).to_json()).amax_history_length(),
      16);
  EXPECT_THROW(DTypePolicy("int4_from_float32"), ValueError);
  EXPECT_THROW(DTypePolicy("int8_from_float99"), ValueError);
  EXPECT_THROW(set_dtype_policy("int8_from_float32"), ValueError);
}

TEST(CpuFeatures, DetectsAndExplains) {
  const CpuFeatures& cpu = cpu_features();
  EXPECT_FALSE(cpu.summary().empty());
  EXPECT_NE(precision_warning("float16"), "");  // no fast float16 on any CPU
  EXPECT_NE(precision_warning("float8"), "");   // always emulated here
  EXPECT_EQ(precision_warning("float32"), "");
  EXPECT_EQ(precision_warning("mixed_bfloat16").empty(), cpu.fast_bf16());
  EXPECT_EQ(precision_warning("int8").empty(), cpu.int8_dot());
  EXPECT_TRUE(warn_once("test-key", "printed once"));
  EXPECT_FALSE(warn_once("test-key", "printed once"));
}

// --- Fashion-MNIST --------------------------------------------------------------------

struct Mnist {
  at::Tensor x_train, y_train, x_test, y_test;
};

Mnist mnist() {
  auto d = datasets::fashion_mnist();
  return {d.x_train.reshape({-1, 784}).to(at::kFloat) / 255.0, d.y_train,
          d.x_test.reshape({-1, 784}).to(at::kFloat) / 255.0, d.y_test};
}

double accuracy(models::Model& m, const at::Tensor& x, const at::Tensor& y) {
  return (m.predict(x, {.batch_size = 1024}).argmax(-1) == y).to(at::kFloat).mean().item<double>() * 100;
}

std::shared_ptr<models::SequentialImpl> fashion_mlp() {
  auto m = models::Sequential();
  m->add(layers::Input({784}));
  m->add(layers::Dense(128, "relu"));
  m->add(layers::Dense(10, "softmax"));
  m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  return m;
}

TEST(FashionMnist, Int8WithinHalfAPointAndFloat8TrainingWithinOnePointOfFloat32) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  Mnist d = mnist();
  const int64_t n = 20000;  // enough for ~84%, quick on 2 cores
  at::Tensor xt = d.x_train.slice(0, 0, n), yt = d.y_train.slice(0, 0, n);
  set_random_seed(11);
  auto f32 = fashion_mlp();
  f32->fit({.x = {xt}, .y = {yt}, .batch_size = 128, .epochs = 2, .verbose = 0});
  const double acc32 = accuracy(*f32, d.x_test, d.y_test);
  f32->quantize("int8");
  const double acc8 = accuracy(*f32, d.x_test, d.y_test);
  set_random_seed(11);
  auto fp8 = fashion_mlp();
  fp8->predict(xt.slice(0, 0, 1));
  fp8->quantize("float8");
  fp8->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  fp8->fit({.x = {xt}, .y = {yt}, .batch_size = 128, .epochs = 2, .verbose = 0});
  const double acc_fp8 = accuracy(*fp8, d.x_test, d.y_test);
  std::cout << "Fashion-MNIST test accuracy: float32 " << acc32 << "%, int8 " << acc8 << "%, float8-trained " << acc_fp8
            << "%\n";
  EXPECT_GT(acc32, 80.0);
  EXPECT_NEAR(acc8, acc32, 0.5);
  EXPECT_NEAR(acc_fp8, acc32, 1.0);
}

}  // namespace
}  // namespace kiln
