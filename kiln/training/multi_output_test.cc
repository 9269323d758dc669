// Multi-output training as Keras does it: a loss per output (dict by output
// name or list), loss_weights (the total is sum_i w_i * L_i), per-output
// logs "<output>_loss" and "<output>_<metric>", with "val_" in fit(), and
// the same keys from evaluate(). HandLogs values are computed by hand from
// the model's predictions.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/layers/dense.h"
#include "kiln/models/functional.h"
#include "kiln/training/train_state.h"

namespace kiln {
namespace {

struct DigitSign {
  ModelPtr model;
  at::Tensor x, digit, sign;  // 40 examples: class ids 0..2 and 0/1 labels
};

DigitSign digit_sign() {
  set_random_seed(7);
  auto in = layers::Input({4}, at::kFloat, "features");
  auto h = layers::Dense(8, "tanh", Json{{"name", "trunk"}})(in);
  auto d = layers::Dense(3, "softmax", Json{{"name", "digit"}})(h);
  auto s = layers::Dense(1, "sigmoid", Json{{"name", "sign"}})(h);
  DigitSign t;
  t.model = models::Functional(KerasTensors{in}, KerasTensors{d, s}, "two_heads");
  t.x = at::randn({40, 4});
  t.digit = at::randint(0, 3, {40}, at::kLong);
  t.sign = at::randint(0, 2, {40, 1}).to(at::kFloat);
  return t;
}

// The per-output values Keras would log, by hand from predictions.
struct HandLogs {
  double digit_loss, sign_loss, digit_accuracy, sign_accuracy;
};

HandLogs logs_by_hand(DigitSign& t) {
  Tensors p = t.model->predict(Tensors{t.x});
  at::Tensor pd = p[0].to(at::kDouble).clamp(1e-7, 1 - 1e-7), ps = p[1].to(at::kDouble).clamp(1e-7, 1 - 1e-7);
  at::Tensor y = t.sign.to(at::kDouble);
  HandLogs e;
  e.digit_loss = -pd.gather(1, t.digit.unsqueeze(1)).log().mean().item<double>();
  e.sign_loss = -(y * ps.log() + (1 - y) * (1 - ps).log()).mean().item<double>();
  e.digit_accuracy = (p[0].argmax(1) == t.digit).to(at::kDouble).mean().item<double>();
  e.sign_accuracy = ((p[1] > 0.5).to(at::kFloat) == t.sign).to(at::kDouble).mean().item<double>();
  return e;
}

TEST(MultiOutput, PerOutputLogsMatchHandComputation) {
  DigitSign t = digit_sign();
  t.model->compile(CompileArgs::from_json(Json::parse(R"({
      "optimizer": "sgd",
      "loss": {"digit": "sparse_categorical_crossentropy", "sign": "binary_crossentropy"},
      "loss_weights": {"digit": 1.0, "sign": 0.5},
      "metrics": {"digit": ["accuracy"], "sign": "accuracy"}})")));
  HandLogs e = logs_by_hand(t);
  // Two batches of unequal size (32 + 8): per-output losses are means over
  // all 40 examples, as Keras's batch-size-weighted trackers give.
  auto r = t.model->evaluate({.x = {t.x}, .y = {t.digit, t.sign}, .batch_size = 32});
  EXPECT_NEAR(r.at("digit_loss"), e.digit_loss, 1e-5);
  EXPECT_NEAR(r.at("sign_loss"), e.sign_loss, 1e-5);
  EXPECT_NEAR(r.at("loss"), e.digit_loss + 0.5 * e.sign_loss, 1e-5);
  EXPECT_NEAR(r.at("digit_accuracy"), e.digit_accuracy, 1e-9);
  EXPECT_NEAR(r.at("sign_accuracy"), e.sign_accuracy, 1e-9);
  EXPECT_EQ(r.size(), 5u);
}

TEST(MultiOutput, LossWeightsChangeTheTotalAsSumOfWeightedLosses) {
  DigitSign t = digit_sign();
  HandLogs e = logs_by_hand(t);
  for (auto [wd, ws] : {std::pair{1.0, 1.0}, std::pair{2.0, 0.0}, std::pair{0.25, 3.0}}) {
    CompileArgs a;
    a.optimizer = Optimizer::get("sgd");
    a.output_losses = {Loss::get("sparse_categorical_crossentropy"), Loss::get("binary_crossentropy")};
    a.loss_weights = {wd, ws};
    t.model->compile(a);
    auto r = t.model->evaluate({.x = {t.x}, .y = {t.digit, t.sign}, .batch_size = 40});
    EXPECT_NEAR(r.at("loss"), wd * e.digit_loss + ws * e.sign_loss, 1e-5) << wd << ", " << ws;
    // The per-output logs are unweighted, as Keras logs them.
    EXPECT_NEAR(r.at("digit_loss"), e.digit_loss, 1e-5);
    EXPECT_NEAR(r.at("sign_loss"), e.sign_loss, 1e-5);
  }
}

TEST(MultiOutput, TheStepDifferentiatesTheWeightedTotal) {
  // sign's weight 0: one SGD step must leave the sign head untouched and
  // change the digit head (and report the pre-update weighted loss).
  DigitSign t = digit_sign();
  HandLogs e = logs_by_hand(t);
  t.model->compile(
      CompileArgs::from_json(Json::parse(R"({"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}},
      "loss": ["sparse_categorical_crossentropy", "binary_crossentropy"], "loss_weights": [1.0, 0.0]})")));
  Tensors sign_before = t.model->get_layer("sign")->get_weights();
  Tensors digit_before = t.model->get_layer("digit")->get_weights();
  auto r = t.model->train_on_batch({t.x}, {t.digit, t.sign});
  EXPECT_NEAR(r.at("loss"), e.digit_loss, 1e-5);
  EXPECT_NEAR(r.at("sign_loss"), e.sign_loss, 1e-5);
  Tensors sign_after = t.model->get_layer("sign")->get_weights();
  Tensors digit_after = t.model->get_layer("digit")->get_weights();
  for (size_t i = 0; i < sign_before.size(); ++i) EXPECT_TRUE(at::equal(sign_before[i], sign_after[i]));
  EXPECT_FALSE(at::equal(digit_before[0], digit_after[0]));
}

TEST(MultiOutput, FitLogsEveryOutputWithValPrefixes) {
  DigitSign t = digit_sign();
  t.model->compile(CompileArgs::from_json(Json::parse(R"({"optimizer": "adam",
      "loss": {"digit": "sparse_categorical_crossentropy", "sign": "binary_crossentropy"},
      "metrics": [["accuracy"], ["accuracy"]]})")));
  History h = t.model->fit(
      {.x = {t.x}, .y = {t.digit, t.sign}, .batch_size = 8, .epochs = 2, .verbose = 0, .validation_split = 0.25});
  for (const char* key : {"loss", "digit_loss", "sign_loss", "digit_accuracy", "sign_accuracy", "val_loss",
                          "val_digit_loss", "val_sign_loss", "val_digit_accuracy", "val_sign_accuracy"}) {
    ASSERT_TRUE(h.history.count(key)) << key;
    EXPECT_EQ(h.history.at(key).size(), 2u) << key;
  }
  EXPECT_EQ(h.history.size(), 10u);
  // The validation logs are evaluate()'s on the held-out quarter.
  auto r =
      t.model->evaluate({.x = {t.x.narrow(0, 30, 10)}, .y = {t.digit.narrow(0, 30, 10), t.sign.narrow(0, 30, 10)}});
  for (auto& [k, v] : r) EXPECT_NEAR(h.last("val_" + k), v, 1e-6) << k;
  // A loss that lowers is one kiln tracks as lower-is-better.
  EXPECT_EQ(t.model->train_state().higher_is_better("val_digit_loss"), false);
}

TEST(MultiOutput, OutputWithoutALossAddsNothing) {
  DigitSign t = digit_sign();
  HandLogs e = logs_by_hand(t);
  CompileArgs a;
  a.optimizer = Optimizer::get("sgd");
  a.named_losses = {{"digit", Loss::get("sparse_categorical_crossentropy")}};
  a.named_metrics = {{"sign", {Metric::get("binary_accuracy")}}};
  t.model->compile(a);
  auto r = t.model->evaluate({.x = {t.x}, .y = {t.digit, t.sign}, .batch_size = 40});
  EXPECT_NEAR(r.at("loss"), e.digit_loss, 1e-5);
  EXPECT_NEAR(r.at("digit_loss"), e.digit_loss, 1e-5);
  EXPECT_EQ(r.count("sign_loss"), 0u);
  EXPECT_NEAR(r.at("sign_binary_accuracy"), e.sign_accuracy, 1e-9);
}

TEST(MultiOutput, MismatchedLossesAreClearErrors) {
  DigitSign t = digit_sign();
  auto expect = [&](const char* text, const char* want) {
    try {
      t.model->compile(CompileArgs::from_json(Json::parse(text)));
      ADD_FAILURE() << "expected ValueError for " << text;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect(R"({"optimizer": "sgd", "loss": ["mse", "mse", "mse"]})",
         "`loss` must have one entry per model output (2: digit, sign). Received 3");
  expect(R"({"optimizer": "sgd", "loss": {"digit": "mse", "sgn": "mse"}})",
         "`loss` names output 'sgn', but the model's outputs are: digit, sign");
  expect(R"({"optimizer": "sgd", "loss": "mse", "loss_weights": {"digits": 1}})", "names output 'digits'");
  expect(R"({"optimizer": "sgd", "loss": "mse", "loss_weights": [1]})", "`loss_weights` must have one entry");
  expect(R"({"optimizer": "sgd", "loss": "mse", "metrics": {"sgn": ["mae"]}})", "names output 'sgn'");
}

}  // namespace
}  // namespace kiln
