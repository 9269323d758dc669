// Model::train_step / test_step / predict_step overridden in a subclass
// (Keras's "Customizing what happens in fit()"): fit(), evaluate(),
// predict() and the *_on_batch forms run the override; a step that calls
// Model::train_step trains exactly as the default does.
#include <gtest/gtest.h>

#include "kiln/core/names.h"
#include "kiln/core/random.h"
#include "kiln/core/torch_compat.h"
#include "kiln/layers/dense.h"
#include "kiln/models/model.h"
#include "kiln/training/callback.h"
#include "kiln/training/train_state.h"
#include "kiln/training/training_test_util.h"

namespace kiln {
namespace {

// A trunk and a head; call() is trunk then head.
class TrunkAndHead : public models::Model {
 public:
  TrunkAndHead() {
    trunk_ = layers::Dense(8, "relu");
    head_ = layers::Dense(1);
    track(trunk_);
    track(head_);
  }
  std::string class_name() const override { return "TrunkAndHead"; }
  Tensors call(const Tensors& inputs, bool training) override {
    return {(*head_)((*trunk_)(inputs.at(0), training), training)};
  }

 protected:
  LayerPtr trunk_, head_;
};

// Custom training logic: trains the trunk only (the head keeps its initial
// weights), on the compiled loss times 2, and logs the loss it computed and
// the trunk's gradient norm.
class TrainsTrunkOnly : public TrunkAndHead {
 public:
  std::map<std::string, double> train_step(const Batch& data) override {
    TrainState& ts = train_state();
    at::Tensor y_pred = (*this)(data.x, /*training=*/true)[0];
    at::Tensor loss = ts.loss()(data.y[0], y_pred) * 2.0;
    std::vector<VariablePtr> vars = trunk_->trainable_weights();
    Tensors values;
    for (auto& v : vars) values.push_back(v->value());
    Tensors grads = compat::grad({loss}, values);
    ts.optimizer().apply_gradients(grads, vars);
    double norm = 0;
    for (auto& g : grads) norm += g.pow(2).sum().item<double>();
    ++steps;
    return {{"loss", loss.item<double>()}, {"trunk_grad_norm", std::sqrt(norm)}};
  }
  int steps = 0;
};

// Calls the default step and counts: Keras's super().train_step(data).
class CountsSteps : public TrunkAndHead {
 public:
  std::map<std::string, double> train_step(const Batch& data) override {
    ++train_steps;
    return models::Model::train_step(data);
  }
  std::map<std::string, double> test_step(const Batch& data) override {
    ++test_steps;
    return models::Model::test_step(data);
  }
  int train_steps = 0, test_steps = 0;
};

// evaluate() and predict() through their own overrides.
class CustomTestAndPredict : public TrunkAndHead {
 public:
  std::map<std::string, double> test_step(const Batch& data) override {
    at::Tensor err = ((*this)(data.x, false)[0] - data.y[0]).abs().max();
    return {{"max_error", err.item<double>()}};
  }
  Tensors predict_step(const Tensors& x) override { return {(*this)(x, false)[0] * 0 + 7}; }
};

using testing_training::Problem;
using testing_training::quiet;

// y = the sum of x's 3 columns.
Problem regression(int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  at::Tensor x = at::randn({n, 3}, gen, at::TensorOptions().dtype(at::kFloat));
  return {x, x.sum(1, true)};
}

Tensors values_of(const std::vector<VariablePtr>& vars) {
  Tensors out;
  for (auto& v : vars) out.push_back(v->value().detach().clone());
  return out;
}

TEST(CustomTrainStep, FitRunsTheOverrideAndLogsWhatItReturns) {
  clear_session();
  set_random_seed(3);
  auto model = std::make_shared<TrainsTrunkOnly>();
  model->compile(CompileArgs::from_names("sgd", "mse", {"mae"}));
  Problem d = regression(64);
  model->build({{kNone, 3}});
  const Tensors head_before = values_of(model->layers()[1]->weights());
  const Tensors trunk_before = values_of(model->layers()[0]->weights());

  History h = model->fit(quiet(d, 3));

  EXPECT_EQ(model->steps, 3 * 4);
  // The logs are the step's own: its loss and gradient norm, not the
  // compiled "mae" (which it never updates).
  ASSERT_TRUE(h.history.count("trunk_grad_norm"));
  EXPECT_EQ(h.history.count("mae"), 0u);
  EXPECT_GT(h.last("trunk_grad_norm"), 0.0);
  // The head stayed frozen; the trunk trained.
  EXPECT_TRUE(testing_training::same_weights(values_of(model->layers()[1]->weights()), head_before));
  EXPECT_FALSE(testing_training::same_weights(values_of(model->layers()[0]->weights()), trunk_before));
  EXPECT_LT(h.last("loss"), h.history["loss"].front());

  // train_on_batch runs the override too; its "loss" is twice the compiled
  // loss (what the default test_step reports) at the same weights.
  const double compiled = model->evaluate({.x = {d.x}, .y = {d.y}, .batch_size = 64}).at("loss");
  auto logs = model->train_on_batch({d.x}, {d.y});
  EXPECT_EQ(model->steps, 3 * 4 + 1);
  EXPECT_NEAR(logs.at("loss"), 2 * compiled, 1e-5 * compiled);
  EXPECT_TRUE(logs.count("trunk_grad_norm"));
}

TEST(CustomTrainStep, CallingTheDefaultStepTrainsAsFitDoes) {
  Problem d = regression(64);
  auto run = [&](bool counting) {
    clear_session();
    set_random_seed(3);
    std::shared_ptr<TrunkAndHead> m = counting ? std::make_shared<CountsSteps>() : std::make_shared<TrunkAndHead>();
    m->compile(CompileArgs::from_names("adam", "mse", {"mae"}));
    FitArgs a = quiet(d, 2);
    a.validation_x = {d.x};
    a.validation_y = {d.y};
    History h = m->fit(a);
    return std::make_pair(m, h);
  };
  auto [plain, plain_h] = run(false);
  auto [counting, counting_h] = run(true);
  auto* c = dynamic_cast<CountsSteps*>(counting.get());
  EXPECT_EQ(c->train_steps, 2 * 4);
  EXPECT_EQ(c->test_steps, 2 * 4);  // validation: 4 batches per epoch
  EXPECT_EQ(counting_h.history, plain_h.history);
  EXPECT_TRUE(testing_training::same_weights(values_of(counting->weights()), values_of(plain->weights())));
  counting->evaluate({.x = {d.x}, .y = {d.y}});
  EXPECT_EQ(c->test_steps, 2 * 4 + 2);  // evaluate: 64 rows in batches of 32
}

TEST(CustomTrainStep, EvaluateAndPredictRunTheirOverrides) {
  clear_session();
  set_random_seed(3);
  auto model = std::make_shared<CustomTestAndPredict>();
  model->compile(CompileArgs::from_names("sgd", "mse"));
  Problem d = regression(32);
  auto logs = model->evaluate({.x = {d.x}, .y = {d.y}, .batch_size = 8});
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_GT(logs.at("max_error"), 0.0);
  EXPECT_TRUE(model->test_on_batch({d.x}, {d.y}).count("max_error"));
  at::Tensor p = model->predict(d.x, {.batch_size = 8});
  EXPECT_TRUE(at::equal(p, at::full({32, 1}, 7.f)));
  EXPECT_TRUE(at::equal(model->predict_on_batch({d.x})[0], at::full({32, 1}, 7.f)));
}

TEST(PredictArgs, StepsAndCallbacks) {
  clear_session();
  set_random_seed(3);
  auto model = std::make_shared<TrunkAndHead>();
  model->compile(CompileArgs::from_names("sgd", "mse"));
  Problem d = regression(40);
  struct CountBatches : callbacks::Callback {
    int n = 0;
    void on_predict_batch_end(int64_t, const Logs&) override { ++n; }
  };
  auto counter = std::make_shared<CountBatches>();
  at::Tensor p = model->predict(d.x, {.batch_size = 8, .steps = 3, .callbacks = {counter}});
  EXPECT_EQ(p.size(0), 24);
  EXPECT_EQ(counter->n, 3);
  EXPECT_TRUE(at::equal(p, model->predict(d.x, {.batch_size = 16}).narrow(0, 0, 24)));
  EXPECT_THROW(model->predict(d.x, {.steps = -1}), ValueError);
}

// The spellings before PredictArgs still compile (deprecated for one release).
TEST(PredictArgs, OldSpellingsStillCompile) {
  clear_session();
  set_random_seed(3);
  auto model = std::make_shared<TrunkAndHead>();
  Problem d = regression(20);
  const at::Tensor want = model->predict(d.x, {.batch_size = 8});
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_TRUE(at::equal(model->predict(d.x, 8), want));
  EXPECT_TRUE(at::equal(model->predict(Tensors{d.x}, 8, 0)[0], want));
  EXPECT_TRUE(at::equal(model->predict(data::Dataset::from_tensor_slices({d.x}).batch(8), 0)[0], want));
#pragma GCC diagnostic pop
}

}  // namespace
}  // namespace kiln
