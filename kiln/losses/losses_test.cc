#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/losses/crossentropy.h"
#include "kiln/losses/loss.h"
#include "kiln/losses/regression.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

using losses::BinaryCrossentropy;
using losses::BinaryCrossentropyOptions;
using losses::CategoricalCrossentropy;
using losses::CategoricalCrossentropyOptions;
using losses::Huber;
using losses::HuberOptions;
using losses::MeanAbsoluteError;
using losses::MeanSquaredError;
using losses::SparseCategoricalCrossentropy;
using losses::SparseCategoricalCrossentropyOptions;

at::Tensor f32(std::vector<float> v) { return at::tensor(v, at::kFloat); }

// --- golden data (PyTorch reference, scripts/golden/make_golden.py) -------------------

TEST(LossesGolden, MatchPyTorchReference) {
  Json golden = load_golden("kiln/losses/testdata/losses_golden.json");
  ASSERT_GE(golden["cases"].size(), 25u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    LossPtr loss = Loss::from_json(c["loss"]);
    at::Tensor y_true = golden_tensor(c["y_true"]);
    at::Tensor y_pred = golden_tensor(c["y_pred"]);
    at::Tensor per = loss->call(y_true, y_pred);
    EXPECT_EQ(per.scalar_type(), at::kFloat);
    EXPECT_TRUE(tensors_close(per, golden_tensor(c["per_sample"])));
    at::Tensor out = (*loss)(y_true, y_pred, golden_tensor(c["sample_weight"]));
    EXPECT_EQ(out.scalar_type(), at::kFloat);
    EXPECT_TRUE(tensors_close(out, golden_tensor(c["expected"])));
  }
}

// --- reductions and sample weights ----------------------------------------------------

TEST(Loss, ReductionsOfKnownValues) {
  at::Tensor y_true = at::zeros({3, 2});
  at::Tensor y_pred = f32({1, 1, 2, 2, 3, 3}).reshape({3, 2});  // per-sample MSE 1, 4, 9
  EXPECT_NEAR(MeanSquaredError()(y_true, y_pred).item<float>(), 14.0 / 3, 1e-6);
  EXPECT_NEAR(MeanSquaredError("mean")(y_true, y_pred).item<float>(), 14.0 / 3, 1e-6);
  EXPECT_NEAR(MeanSquaredError("sum")(y_true, y_pred).item<float>(), 14.0, 1e-6);
  at::Tensor none = MeanSquaredError("none")(y_true, y_pred);
  EXPECT_TRUE(tensors_close(none, f32({1, 4, 9})));

  at::Tensor w = f32({1, 0, 1});
  // sum_over_batch_size divides by the batch size, weights or not (Keras).
  EXPECT_NEAR(MeanSquaredError()(y_true, y_pred, w).item<float>(), 10.0 / 3, 1e-6);
  EXPECT_NEAR(MeanSquaredError("sum")(y_true, y_pred, w).item<float>(), 10.0, 1e-6);
  EXPECT_NEAR(MeanSquaredError("mean_with_sample_weight")(y_true, y_pred, w).item<float>(), 5.0, 1e-6);
  EXPECT_TRUE(tensors_close(MeanSquaredError("none")(y_true, y_pred, w), f32({1, 0, 9})));
  // All-zero weights: no division by zero.
  EXPECT_EQ(MeanSquaredError("mean_with_sample_weight")(y_true, y_pred, at::zeros({3})).item<float>(), 0.0f);
}

TEST(Loss, SampleWeightShapesAgree) {
  at::Tensor labels = at::tensor({0, 2, 1, 1}, at::kLong);
  at::Tensor logits = at::randn({4, 3});
  at::Tensor w = f32({0.5, 2, 0, 1});
  SparseCategoricalCrossentropy ce({.from_logits = true});
  const float a = ce(labels, logits, w).item<float>();
  EXPECT_NEAR(ce(labels, logits, w.reshape({4, 1})).item<float>(), a, 1e-6);
  EXPECT_NEAR(ce(labels.reshape({4, 1}), logits, w).item<float>(), a, 1e-6);
  // A scalar weight scales the loss.
  EXPECT_NEAR(ce(labels, logits, at::full({}, 3.0f)).item<float>(), 3 * ce(labels, logits).item<float>(), 1e-5);
  // Weights of the wrong length are a ShapeError, not a silent broadcast.
  EXPECT_THROW(ce(labels, logits, at::ones({3})), ShapeError);
}

TEST(Loss, SequenceWeightsApplyPerSample) {
  // (batch, time, features): per-sample losses have shape (batch, time).
  at::Tensor y = at::zeros({2, 3, 1});
  at::Tensor p = at::ones({2, 3, 1});
  p[1] = 2;
  MeanAbsoluteError mae("none");
  at::Tensor out = mae(y, p, f32({1, 0.5}));
  EXPECT_TRUE(tensors_close(out, f32({1, 1, 1, 1, 1, 1}).reshape({2, 3})));
  EXPECT_NEAR(MeanAbsoluteError()(y, p, f32({1, 0.5})).item<float>(), 1.0, 1e-6);
}

// --- crossentropy semantics ------------------------------------------------------------

TEST(Crossentropy, FromLogitsMatchesProbabilities) {
  at::Tensor logits = at::randn({6, 4}) * 2;
  at::Tensor labels = at::randint(0, 4, {6}, at::kLong);
  at::Tensor onehot = at::one_hot(labels, 4).to(at::kFloat);
  const float a = SparseCategoricalCrossentropy({.from_logits = true})(labels, logits).item<float>();
  EXPECT_NEAR(SparseCategoricalCrossentropy()(labels, logits.softmax(-1)).item<float>(), a, 1e-5);
  EXPECT_NEAR(CategoricalCrossentropy({.from_logits = true})(onehot, logits).item<float>(), a, 1e-5);
  EXPECT_NEAR(CategoricalCrossentropy()(onehot, logits.softmax(-1)).item<float>(), a, 1e-5);

  at::Tensor x = at::randn({6, 2});
  at::Tensor y = at::randint(0, 2, {6, 2}).to(at::kFloat);
  EXPECT_NEAR(BinaryCrossentropy({.from_logits = true})(y, x).item<float>(),
              BinaryCrossentropy()(y, x.sigmoid()).item<float>(), 1e-5);
}

TEST(Crossentropy, ProbabilitiesAreClippedLikeKeras) {
  // p = 0 for the true class: -log(1e-7) in float32, not inf.
  at::Tensor probs = f32({1, 0}).reshape({1, 2});
  const float l = SparseCategoricalCrossentropy()(at::tensor({1}, at::kLong), probs).item<float>();
  EXPECT_NEAR(l, -std::log(1e-7f), 1e-4);
  const float b = BinaryCrossentropy()(f32({1}).reshape({1, 1}), f32({0}).reshape({1, 1})).item<float>();
  EXPECT_NEAR(b, -std::log(1e-7f), 1e-4);
  // Logits far from zero stay finite and exact.
  EXPECT_NEAR(
      BinaryCrossentropy({.from_logits = true})(f32({0}).reshape({1, 1}), f32({100}).reshape({1, 1})).item<float>(),
      100.0, 1e-4);
}

TEST(Crossentropy, CategoricalRenormalisesOutputs) {
  at::Tensor onehot = f32({0, 1}).reshape({1, 2});
  // (1, 3) renormalised to (0.25, 0.75).
  EXPECT_NEAR(CategoricalCrossentropy()(onehot, f32({1, 3}).reshape({1, 2})).item<float>(), -std::log(0.75), 1e-6);
}

TEST(Crossentropy, LabelSmoothing) {
  at::Tensor y = f32({0, 1}).reshape({1, 2});
  at::Tensor logits = f32({0.3f, -1.2f}).reshape({1, 2});
  at::Tensor logp = logits.log_softmax(-1);
  // 0.2 smoothing over 2 classes: targets (0.1, 0.9).
  const double want = -(0.1 * logp[0][0].item<float>() + 0.9 * logp[0][1].item<float>());
  EXPECT_NEAR(CategoricalCrossentropy({.from_logits = true, .label_smoothing = 0.2})(y, logits).item<float>(), want,
              1e-6);
  // Binary: targets t * 0.8 + 0.1.
  at::Tensor x = f32({0.7f}).reshape({1, 1});
  const double p = 1 / (1 + std::exp(-0.7));
  const double want_b = -(0.9 * std::log(p) + 0.1 * std::log(1 - p));
  EXPECT_NEAR(
      BinaryCrossentropy({.from_logits = true, .label_smoothing = 0.2})(f32({1}).reshape({1, 1}), x).item<float>(),
      want_b, 1e-6);
}

TEST(Crossentropy, IgnoreClassMasksEntries) {
  at::Tensor logits = at::randn({4, 3});
  at::Tensor labels = at::tensor({0, -1, 2, -1}, at::kLong);
  SparseCategoricalCrossentropy ce({.from_logits = true, .ignore_class = -1});
  at::Tensor per = ce.call(labels, logits);
  EXPECT_EQ(per[1].item<float>(), 0.0f);
  EXPECT_EQ(per[3].item<float>(), 0.0f);
  // The mean runs over the two valid entries only.
  at::Tensor valid_logits = at::stack({logits[0], logits[2]});
  const float want =
      SparseCategoricalCrossentropy({.from_logits = true})(at::tensor({0, 2}, at::kLong), valid_logits).item<float>();
  EXPECT_NEAR(ce(labels, logits).item<float>(), want, 1e-5);
}

TEST(Crossentropy, BadLabelsAndShapes) {
  SparseCategoricalCrossentropy ce({.from_logits = true});
  EXPECT_THROW(ce(at::tensor({0, 3}, at::kLong), at::randn({2, 3})), ValueError);
  EXPECT_THROW(ce(at::tensor({0, 1, 2}, at::kLong), at::randn({2, 3})), ShapeError);
  EXPECT_THROW(CategoricalCrossentropy()(at::ones({2, 3}), at::ones({2, 4})), ShapeError);
  EXPECT_THROW(MeanSquaredError()(at::ones({2, 3}), at::ones({2, 4})), ShapeError);
}

// --- precision and autograd --------------------------------------------------------------

TEST(Loss, ComputesInFloat32ForReducedPrecisionInputs) {
  at::Tensor logits = at::randn({5, 4});
  at::Tensor labels = at::randint(0, 4, {5}, at::kLong);
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kDouble}) {
    at::Tensor low = logits.to(dtype);
    at::Tensor out = SparseCategoricalCrossentropy({.from_logits = true})(labels, low);
    EXPECT_EQ(out.scalar_type(), at::kFloat);
    EXPECT_NEAR(out.item<float>(),
                SparseCategoricalCrossentropy({.from_logits = true})(labels, low.to(at::kFloat)).item<float>(), 1e-6);
    EXPECT_EQ(MeanSquaredError()(logits.to(dtype), low).scalar_type(), at::kFloat);
  }
}

TEST(Loss, GradientOfSparseCrossentropyIsSoftmaxMinusOneHot) {
  at::Tensor logits = at::randn({3, 4}).requires_grad_(true);
  at::Tensor labels = at::tensor({1, 0, 3}, at::kLong);
  SparseCategoricalCrossentropy({.from_logits = true})(labels, logits).backward();
  at::Tensor want = (logits.detach().softmax(-1) - at::one_hot(labels, 4).to(at::kFloat)) / 3.0;
  EXPECT_TRUE(tensors_close(logits.grad(), want));
}

TEST(Loss, HuberIsQuadraticThenLinear) {
  at::Tensor y = at::zeros({1, 3});
  at::Tensor p = f32({0.5, -2, 3}).reshape({1, 3});
  // 0.125, 2 - 0.5, 3 - 0.5 with delta 1.
  EXPECT_NEAR(Huber()(y, p).item<float>(), (0.125 + 1.5 + 2.5) / 3, 1e-6);
  // delta 2: 0.125, 2, 6 - 2.
  EXPECT_NEAR(Huber({.delta = 2.0})(y, p).item<float>(), (0.125 + 2 + 4) / 3, 1e-6);
}

// --- names, configs and errors -------------------------------------------------------------

TEST(Loss, GetByKerasName) {
  EXPECT_EQ(Loss::get("mse")->class_name(), "MeanSquaredError");
  EXPECT_EQ(Loss::get("mse")->name(), "mean_squared_error");
  EXPECT_EQ(Loss::get("mae")->class_name(), "MeanAbsoluteError");
  EXPECT_EQ(Loss::get("huber")->class_name(), "Huber");
  EXPECT_EQ(Loss::get("huber")->name(), "huber_loss");
  EXPECT_EQ(Loss::get("sparse_categorical_crossentropy")->class_name(), "SparseCategoricalCrossentropy");
  EXPECT_EQ(Loss::get("categorical_crossentropy")->class_name(), "CategoricalCrossentropy");
  EXPECT_EQ(Loss::get("binary_crossentropy")->class_name(), "BinaryCrossentropy");
  EXPECT_EQ(Loss::get("BinaryCrossentropy")->class_name(), "BinaryCrossentropy");
  auto ce = std::dynamic_pointer_cast<SparseCategoricalCrossentropy>(Loss::get("sparse_categorical_crossentropy"));
  ASSERT_TRUE(ce);
  EXPECT_FALSE(ce->from_logits());  // Keras's default
  EXPECT_EQ(ce->reduction(), "sum_over_batch_size");
}

TEST(Loss, UnknownNameListsKnownOnes) {
  const std::string msg = error_of<ValueError>([] { Loss::get("mean_sqared_error"); });
  EXPECT_NE(msg.find("'mean_sqared_error'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sparse_categorical_crossentropy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mse"), std::string::npos) << msg;
  EXPECT_THROW(Loss::from_json(Json{{"class_name", "Nope"}}), ValueError);
  EXPECT_THROW(Loss::from_json(Json(42)), ValueError);
}

TEST(Loss, BadConfigsNameTheValue) {
  expect_error<ValueError>([] { MeanSquaredError("avg"); }, {"reduction=avg"});
  expect_error<ValueError>([] { CategoricalCrossentropy({.label_smoothing = 1.5}); }, {"label_smoothing=1.5"});
  expect_error<ValueError>([] { Huber({.delta = 0.0}); }, {"delta=0"});
  const std::string msg = error_of<ValueError>([] {
    Loss::from_json(Json{{"class_name", "BinaryCrossentropy"}, {"config", {{"form_logits", true}}}});
  });
  EXPECT_NE(msg.find("form_logits"), std::string::npos) << msg;
  EXPECT_THROW(Loss::from_json(Json{{"class_name", "Huber"}, {"config", {{"delta", "big"}}}}), ValueError);
}

TEST(Loss, ConfigRoundTrip) {
  std::vector<LossPtr> all = {
      std::make_shared<SparseCategoricalCrossentropy>(SparseCategoricalCrossentropyOptions{
          .from_logits = true, .ignore_class = 255, .reduction = "sum", .name = "scce"}),
      std::make_shared<CategoricalCrossentropy>(CategoricalCrossentropyOptions{
          .from_logits = true, .label_smoothing = 0.1, .reduction = "none", .name = "cce"}),
      std::make_shared<BinaryCrossentropy>(
          BinaryCrossentropyOptions{.label_smoothing = 0.05, .reduction = "mean_with_sample_weight", .name = "bce"}),
      std::make_shared<MeanSquaredError>("sum", "my_mse"),
      std::make_shared<MeanAbsoluteError>(),
      std::make_shared<Huber>(HuberOptions{.delta = 0.7, .name = "hub"}),
  };
  for (const auto& loss : all) {
    Json j = loss->to_json();
    SCOPED_TRACE(j.dump());
    LossPtr back = Loss::from_json(Json::parse(j.dump()));
    EXPECT_EQ(back->to_json(), j);
    EXPECT_EQ(back->name(), loss->name());
    EXPECT_EQ(back->reduction(), loss->reduction());
  }
  // Keras's own config (with its extra keys) reads back.
  Json keras = Json::parse(R"({"module": "keras.losses", "class_name": "SparseCategoricalCrossentropy",
      "config": {"name": "sparse_categorical_crossentropy", "reduction": "sum_over_batch_size",
                 "from_logits": true, "ignore_class": null}, "registered_name": null})");
  auto ce = std::dynamic_pointer_cast<SparseCategoricalCrossentropy>(Loss::from_json(keras));
  ASSERT_TRUE(ce);
  EXPECT_TRUE(ce->from_logits());
  EXPECT_EQ(Loss::from_json(Json("mse"))->class_name(), "MeanSquaredError");
}

TEST(Loss, CustomClassesRegister) {
  struct Zero : Loss {
    Zero() : Loss("zero") {}
    at::Tensor call(const at::Tensor& y, const at::Tensor& p) const override { return at::zeros({p.size(0)}); }
    std::string class_name() const override { return "ZeroLoss"; }
  };
  Loss::register_class("ZeroLoss", [](const Json&) { return std::make_shared<Zero>(); });
  EXPECT_EQ(Loss::from_json(Json{{"class_name", "ZeroLoss"}})->name(), "zero");
  EXPECT_EQ(Loss::get("ZeroLoss")->class_name(), "ZeroLoss");
}

}  // namespace
}  // namespace kiln
