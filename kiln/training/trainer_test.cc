#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/layers/dense.h"
#include "kiln/models/functional.h"
#include "kiln/training/callbacks.h"
#include "kiln/training/train_state.h"
#include "kiln/training/training_test_util.h"

namespace kiln {
namespace {

using namespace testing_training;

TEST(Fit, LearnsASeparableProblem) {
  set_random_seed(1);
  Problem train = blobs(256, 1), val = blobs(64, 2);
  auto model = make_model(optimizer("Adam", 0.05));
  FitArgs a = quiet(train, 8);
  a.validation_x = {val.x};
  a.validation_y = {val.y};
  History h = model->fit(a);

  std::vector<std::string> keys;
  for (auto& [k, v] : h.history) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"accuracy", "loss", "val_accuracy", "val_loss"}));
  for (auto& [k, v] : h.history) EXPECT_EQ(v.size(), 8u) << k;
  EXPECT_EQ(h.epoch, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(h.params["epochs"], 8);
  EXPECT_EQ(h.params["steps"], 16);
  EXPECT_LT(h.history["loss"].back(), 0.5 * h.history["loss"].front());
  EXPECT_GT(h.last("accuracy"), 0.97);
  EXPECT_GT(h.last("val_accuracy"), 0.97);

  auto r = model->evaluate({.x = {val.x}, .y = {val.y}});
  EXPECT_NEAR(r.at("loss"), h.last("val_loss"), 1e-6);
  EXPECT_NEAR(r.at("accuracy"), h.last("val_accuracy"), 1e-12);
}

TEST(Fit, BeforeCompileIsAStateError) {
  clear_session();
  auto model = models::Sequential(std::vector<LayerPtr>{std::make_shared<TinyDense>(2)});
  Problem p = blobs(8);
  try {
    model->fit(quiet(p, 1));
    FAIL() << "expected StateError";
  } catch (const StateError& e) {
    EXPECT_NE(std::string(e.what()).find("call compile() first"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(model->compiled());
  EXPECT_THROW(model->compile_args(), StateError);
}

TEST(Fit, LengthMismatchNamesBothLengths) {
  auto model = make_model(optimizer("SGD", 0.1));
  Problem p = blobs(10);
  FitArgs a = quiet(p, 1);
  a.y = {p.y.narrow(0, 0, 7)};
  try {
    model->fit(a);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("10"), std::string::npos) << m;
    EXPECT_NE(m.find("7"), std::string::npos) << m;
  }
}

TEST(Fit, ValidationSplitTakesTheLastFractionBeforeShuffling) {
  set_random_seed(4);
  Problem p = blobs(100);
  // Make the last quarter unlike the rest: flipped labels.
  at::Tensor y = p.y.clone();
  y.narrow(0, 75, 25).fill_(1).sub_(p.y.narrow(0, 75, 25));
  auto model = make_model(optimizer("SGD", 0.0));  // lr 0: weights stay put
  FitArgs a = quiet({p.x, y}, 2, 10);
  a.validation_split = 0.25;
  History h = model->fit(a);
  ASSERT_EQ(h.history["val_loss"].size(), 2u);
  auto head = model->evaluate({.x = {p.x.narrow(0, 0, 75)}, .y = {y.narrow(0, 0, 75)}});
  auto tail = model->evaluate({.x = {p.x.narrow(0, 75, 25)}, .y = {y.narrow(0, 75, 25)}});
  EXPECT_NEAR(h.history["val_loss"][0], tail.at("loss"), 1e-6);
  EXPECT_NEAR(h.history["loss"][1], head.at("loss"), 1e-5);
  EXPECT_GT(std::abs(tail.at("loss") - head.at("loss")), 1e-3);
  EXPECT_EQ(h.params["steps"], 8);  // ceil(75 / 10)
}

TEST(Fit, SetRandomSeedMakesRunsBitIdentical) {
  auto run = [](uint64_t seed) {
    set_random_seed(seed);
    auto model = make_model(optimizer("Adam", 0.01), /*dropout=*/0.3);
    Problem p = blobs(96);
    model->fit(quiet(p, 3, 8));
    return model->get_weights();
  };
  auto a = run(11), b = run(11), c = run(12);
  EXPECT_TRUE(same_weights(a, b));
  EXPECT_FALSE(same_weights(a, c));
}

TEST(Fit, SampleWeightAndClassWeightScaleTheLoss) {
  set_random_seed(5);
  Problem p = blobs(32);
  auto model = make_model(optimizer("SGD", 0.0));
  at::Tensor per_sample;
  {
    at::NoGradGuard ng;
    per_sample = scce_logits()->call(p.y, model->predict(p.x));
  }
  const double plain = per_sample.mean().item<double>();
  FitArgs a = quiet(p, 1, 32);  // one batch: the epoch loss is the batch loss
  EXPECT_NEAR(model->fit(a).last("loss"), plain, 1e-6);

  at::Tensor sw = at::linspace(0, 2, 32, at::kFloat);
  a.sample_weight = sw;
  EXPECT_NEAR(model->fit(a).last("loss"), (per_sample * sw).sum().item<double>() / 32, 1e-6);

  a.sample_weight = at::Tensor();
  a.class_weight = {{0, 3.0}, {1, 0.5}};
  at::Tensor cw = at::where(p.y.eq(0), at::full({32}, 3.0), at::full({32}, 0.5));
  EXPECT_NEAR(model->fit(a).last("loss"), (per_sample * cw).sum().item<double>() / 32, 1e-6);

  a.sample_weight = sw;  // both multiply
  EXPECT_NEAR(model->fit(a).last("loss"), (per_sample * cw * sw).sum().item<double>() / 32, 1e-6);
}

TEST(Fit, DatasetInputWithSampleWeights) {
  set_random_seed(6);
  Problem p = blobs(128);
  auto model = make_model(optimizer("Adam", 0.05));
  FitArgs a;
  a.dataset = data::Dataset::from_tensor_slices({p.x, p.y}).shuffle(128, 7).batch(16);
  a.epochs = 5;
  a.verbose = 0;
  History h = model->fit(a);
  EXPECT_EQ(h.params["steps"], 8);
  EXPECT_GT(h.last("accuracy"), 0.95);

  // (x, y, sample_weight) elements: zero weights give zero loss.
  FitArgs z;
  z.dataset = data::Dataset::from_tensor_slices({p.x, p.y, at::zeros({128})}).batch(32);
  z.verbose = 0;
  EXPECT_EQ(model->fit(z).last("loss"), 0.0);

  // steps_per_epoch truncates each pass.
  a.steps_per_epoch = 3;
  a.epochs = 1;
  int batches = 0;
  auto counter = callbacks::LambdaCallback();
  counter->on_train_batch_end_fn = [&](int64_t, const Logs&) { ++batches; };
  a.callbacks = {counter};
  model->fit(a);
  EXPECT_EQ(batches, 3);
}

// Keras's steps_per_execution: the batch callbacks once per execution
// (begin with its first step, end with its last; the data's end closes the
// last one), the same weights and epoch logs as one step per execution.
TEST(Fit, StepsPerExecutionCallsBatchCallbacksOncePerExecution) {
  auto run = [](int64_t per_execution, std::vector<int64_t>* begins, std::vector<int64_t>* ends) {
    set_random_seed(4);
    auto model = make_model(optimizer("Adam", 0.05));
    CompileArgs args = model->compile_args();
    args.steps_per_execution = per_execution;
    model->compile(args);
    auto rec = callbacks::LambdaCallback();
    rec->on_train_batch_begin_fn = [=](int64_t b, const Logs&) { begins->push_back(b); };
    rec->on_train_batch_end_fn = [=](int64_t b, const Logs& l) {
      EXPECT_TRUE(l.count("loss"));
      ends->push_back(b);
    };
    FitArgs a = quiet(blobs(80), 2, 8);  // 10 batches an epoch
    a.callbacks = {rec};
    History h = model->fit(a);
    return std::make_pair(model->get_weights(), h.history.at("loss"));
  };
  std::vector<int64_t> b4, e4, b1, e1;
  auto [w4, loss4] = run(4, &b4, &e4);
  auto [w1, loss1] = run(1, &b1, &e1);
  EXPECT_EQ(b4, (std::vector<int64_t>{0, 4, 8, 0, 4, 8}));
  EXPECT_EQ(e4, (std::vector<int64_t>{3, 7, 9, 3, 7, 9}));
  EXPECT_EQ(e1.size(), 20u);
  EXPECT_TRUE(same_weights(w4, w1));
  EXPECT_EQ(loss4, loss1);
}

// A step that asks the device for more memory than it has (a batch too
// large for the GPU): one ResourceExhaustedError (the CLI's exit 2) naming
// the batch size and a smaller one; the weights are left as they were.
TEST(Fit, OutOfMemoryInAStepNamesTheBatchSizeAndASmallerOne) {
  class Greedy : public SimpleLayer {
   public:
    Greedy() : SimpleLayer(Json::object()) {}
    std::string class_name() const override { return "Greedy"; }
    at::Tensor call1(const at::Tensor& x, bool training) override {
      if (training) at::empty({int64_t{1} << 62}, at::kByte);  // beyond any address space
      return x;
    }
  };
  clear_session();
  auto model = models::Sequential(std::vector<LayerPtr>{std::make_shared<TinyDense>(8, "relu"),
                                                        std::make_shared<Greedy>(), std::make_shared<TinyDense>(2)},
                                  "model");
  CompileArgs args;
  args.optimizer = optimizer("Adam", 0.1);
  args.loss = scce_logits();
  model->compile(args);
  Problem p = blobs(64);
  model->predict(p.x);  // built, so the weights can be compared
  const Tensors before = model->get_weights();
  try {
    model->fit(quiet(p, 1, 32));
    ADD_FAILURE() << "fit did not fail";
  } catch (const ResourceExhaustedError& e) {
    const std::string m = e.what();
    for (const char* want : {"out of memory on cpu", "batch size 32", "batch_size (e.g. 16)", "epoch 1, batch 0"})
      EXPECT_NE(m.find(want), std::string::npos) << want << " not in: " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_TRUE(same_weights(model->get_weights(), before));
}

TEST(Fit, StopTrainingEndsAfterTheEpoch) {
  auto model = make_model(optimizer("SGD", 0.1));
  auto stopper = callbacks::LambdaCallback();
  stopper->on_epoch_end_fn = [&](int epoch, Logs&) {
    if (epoch == 1) model->stop_training = true;
  };
  FitArgs a = quiet(blobs(32), 10);
  a.callbacks = {stopper};
  History h = model->fit(a);
  EXPECT_EQ(h.history["loss"].size(), 2u);
}

TEST(Fit, BatchLogsAreRunningAveragesAndMetricsResetEachEpoch) {
  set_random_seed(8);
  Problem p = blobs(64);
  auto model = make_model(optimizer("SGD", 0.0));
  std::vector<double> batch_losses;
  std::vector<double> last_batch_log;
  auto rec = callbacks::LambdaCallback();
  rec->on_train_batch_end_fn = [&](int64_t, const Logs& l) { batch_losses.push_back(l.at("loss")); };
  rec->on_epoch_end_fn = [&](int, Logs& l) { last_batch_log.push_back(batch_losses.back()); };
  FitArgs a = quiet(p, 2, 16);
  a.shuffle = false;
  a.callbacks = {rec};
  History h = model->fit(a);
  // Independent per-batch losses (weights are fixed at lr 0).
  std::vector<double> expect;
  double sum = 0;
  auto loss = scce_logits();
  for (int b = 0; b < 4; ++b) {
    at::NoGradGuard ng;
    sum += (*loss)(p.y.narrow(0, 16 * b, 16), model->predict(p.x.narrow(0, 16 * b, 16))).item<double>();
    expect.push_back(sum / (b + 1));
  }
  ASSERT_EQ(batch_losses.size(), 8u);
  for (int b = 0; b < 4; ++b) {
    EXPECT_NEAR(batch_losses[b], expect[b], 1e-6);
    EXPECT_NEAR(batch_losses[4 + b], expect[b], 1e-6);  // reset at the epoch start
  }
  EXPECT_EQ(h.history["loss"][0], last_batch_log[0]);
}

TEST(Fit, InitialEpochAndValidationFreq) {
  auto model = make_model(optimizer("SGD", 0.1));
  Problem p = blobs(32);
  FitArgs a = quiet(p, 6);
  a.initial_epoch = 2;
  a.validation_x = {p.x};
  a.validation_y = {p.y};
  a.validation_freq = 2;
  History h = model->fit(a);
  EXPECT_EQ(h.epoch, (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(h.history["loss"].size(), 4u);
  EXPECT_EQ(h.history["val_loss"].size(), 2u);  // after epochs 3 and 5 (1-based 4 and 6)
}

TEST(EvaluateAndPredict, BatchedMatchesWholeAndDatasets) {
  set_random_seed(9);
  Problem p = blobs(50);
  auto model = make_model(optimizer("SGD", 0.1));
  at::Tensor whole = model->predict_on_batch({p.x})[0];
  at::Tensor batched = model->predict(p.x, {.batch_size = 7});
  EXPECT_EQ(batched.sizes(), (std::vector<int64_t>{50, 2}));
  EXPECT_TRUE(at::allclose(whole, batched, 1e-6, 1e-6));
  EXPECT_FALSE(batched.requires_grad());
  Tensors from_ds = model->predict(data::Dataset::from_tensor_slices({p.x, p.y}).batch(8));
  ASSERT_EQ(from_ds.size(), 1u);
  EXPECT_TRUE(at::allclose(whole, from_ds[0], 1e-6, 1e-6));

  auto r1 = model->evaluate({.x = {p.x}, .y = {p.y}, .batch_size = 50});
  EvaluateArgs ea;
  ea.dataset = data::Dataset::from_tensor_slices({p.x, p.y}).batch(50);
  auto r2 = model->evaluate(ea);
  EXPECT_EQ(r1.size(), 2u);
  EXPECT_NEAR(r1.at("loss"), r2.at("loss"), 1e-7);
  EXPECT_NEAR(r1.at("loss"), (*scce_logits())(p.y, whole).item<double>(), 1e-6);

  auto before = model->get_weights();
  auto t = model->train_on_batch({p.x}, {p.y});
  EXPECT_TRUE(t.count("loss") && t.count("accuracy"));
  EXPECT_FALSE(same_weights(before, model->get_weights()));
  auto after = model->get_weights();
  model->test_on_batch({p.x}, {p.y});
  EXPECT_TRUE(same_weights(after, model->get_weights()));
}

// Keras 3 (keras-team/keras#22617): train_on_batch / test_on_batch return
// the values of that batch alone, not running averages over earlier calls.
TEST(Trainer, OnBatchReturnsThatBatchsValuesAndResetMetricsClears) {
  set_random_seed(12);
  Problem p = blobs(40);
  auto model = make_model(optimizer("SGD", 0.0));  // lr 0: the loss of a batch is fixed
  Tensors a = {p.x.narrow(0, 0, 20)}, ya = {p.y.narrow(0, 0, 20)};
  Tensors b = {p.x.narrow(0, 20, 20)}, yb = {p.y.narrow(0, 20, 20)};
  const double la = model->test_on_batch(a, ya).at("loss");
  const double lb = model->test_on_batch(b, yb).at("loss");
  ASSERT_NE(la, lb);
  // Each call's own loss, whatever came before.
  EXPECT_DOUBLE_EQ(model->test_on_batch(a, ya).at("loss"), la);
  EXPECT_DOUBLE_EQ(model->train_on_batch(b, yb).at("loss"), lb);
  EXPECT_DOUBLE_EQ(model->train_on_batch(a, ya).at("loss"), la);
  // reset_metrics() empties the trackers.
  model->reset_metrics();
  EXPECT_EQ(model->train_state().loss_tracker().result(), 0.0);
}

TEST(Pipeline, StagesRunInOrderAndCanBeReplaced) {
  set_random_seed(10);
  Problem p = blobs(16);
  auto model = make_model(optimizer("SGD", 0.1));
  StepPipeline& pl = model->train_state().pipeline();
  std::vector<std::string> order;
  auto wrap = [&](StepPipeline::Stage& stage, const std::string& name) {
    auto inner = stage;
    stage = [&order, inner, name](TrainState& ts, StepData& s) {
      order.push_back(name);
      inner(ts, s);
    };
  };
  wrap(pl.forward, "forward");
  wrap(pl.compute_loss, "compute_loss");
  wrap(pl.scale_loss, "scale_loss");
  wrap(pl.backward, "backward");
  wrap(pl.reduce_gradients, "reduce_gradients");
  wrap(pl.unscale_and_check, "unscale_and_check");
  wrap(pl.apply_gradients, "apply_gradients");
  wrap(pl.update_metrics, "update_metrics");
  model->train_on_batch({p.x}, {p.y});
  EXPECT_EQ(order, (std::vector<std::string>{"forward", "compute_loss", "scale_loss", "backward", "reduce_gradients",
                                             "unscale_and_check", "apply_gradients", "update_metrics"}));
  order.clear();
  model->test_on_batch({p.x}, {p.y});
  EXPECT_EQ(order, (std::vector<std::string>{"forward", "compute_loss", "update_metrics"}));

  // A loss scale of 8 undone before the update gives the same step as none.
  auto a = make_model(optimizer("SGD", 0.1));
  auto b = make_model(optimizer("SGD", 0.1));
  a->predict(p.x);  // build both, then share the initial weights
  b->predict(p.x);
  b->set_weights(a->get_weights());
  auto& pb = b->train_state().pipeline();
  pb.scale_loss = [](TrainState&, StepData& s) { s.scaled_loss = s.loss * 8.0; };
  pb.unscale_and_check = [](TrainState&, StepData& s) {
    for (auto& g : s.grads)
      if (g.defined()) g = g / 8.0;
  };
  a->train_on_batch({p.x}, {p.y});
  b->train_on_batch({p.x}, {p.y});
  auto wa = a->get_weights(), wb = b->get_weights();
  for (size_t i = 0; i < wa.size(); ++i) EXPECT_TRUE(at::allclose(wa[i], wb[i], 1e-6, 1e-7));

  // The finite check can veto an update.
  auto w0 = b->get_weights();
  pb.unscale_and_check = [](TrainState&, StepData& s) { s.apply_update = false; };
  b->train_on_batch({p.x}, {p.y});
  EXPECT_TRUE(same_weights(w0, b->get_weights()));
}

TEST(Compile, ArgsValidateAndRoundTrip) {
  clear_session();
  auto model = models::Sequential(std::vector<LayerPtr>{std::make_shared<TinyDense>(2)});
  EXPECT_THROW(model->compile(CompileArgs{}), ValueError);  // no optimizer
  model->compile("sgd", "mse");
  EXPECT_TRUE(model->compiled());
  Json j = model->compile_args().to_json();
  EXPECT_EQ(j["optimizer"]["class_name"], "SGD");
  EXPECT_EQ(j["loss"]["class_name"], "MeanSquaredError");
  CompileArgs back = CompileArgs::from_json(j);
  EXPECT_EQ(back.optimizer->class_name(), "SGD");
  EXPECT_EQ(back.loss->class_name(), "MeanSquaredError");
  EXPECT_EQ(model->train_state().metric_names(), (std::vector<std::string>{"loss"}));
}

TEST(Compile, MetricsForEveryOutputOfAMultiOutputModel) {
  clear_session();
  auto in = layers::Input({4}, at::kFloat, "features");
  auto a = layers::Dense(3, "linear", Json{{"name", "head_a"}})(in);
  auto b = layers::Dense(3, "linear", Json{{"name", "head_b"}})(in);
  auto model = models::Functional(KerasTensors{in}, KerasTensors{a, b});
  // A flat list applies to each output, with Keras's "<output>_<metric>"
  // names; each output's loss is logged as "<output>_loss".
  model->compile(CompileArgs::from_names("sgd", "sparse_categorical_crossentropy", {"accuracy"}));
  EXPECT_EQ(model->train_state().metric_names(),
            (std::vector<std::string>{"loss", "head_a_loss", "head_b_loss", "head_a_accuracy", "head_b_accuracy"}));
  // Targets such that head_a's argmax is always right and head_b's always wrong:
  // evaluate must tell the two outputs apart.
  at::Tensor x = at::randn({16, 4});
  Tensors pred = model->predict(Tensors{x});
  at::Tensor ya = pred[0].argmax(1), yb = (pred[1].argmax(1) + 1) % 3;
  auto r = model->evaluate({.x = {x}, .y = {ya, yb}});
  EXPECT_DOUBLE_EQ(r.at("head_a_accuracy"), 1.0);
  EXPECT_DOUBLE_EQ(r.at("head_b_accuracy"), 0.0);
  // Per-output lists (Keras's nested list), also through the JSON form.
  Json j =
      Json::parse(R"({"optimizer": "sgd", "loss": "sparse_categorical_crossentropy", "metrics": [["accuracy"], []]})");
  CompileArgs per_output = CompileArgs::from_json(j);
  ASSERT_EQ(per_output.output_metrics.size(), 2u);
  model->compile(per_output);
  EXPECT_EQ(model->train_state().metric_names(),
            (std::vector<std::string>{"loss", "head_a_loss", "head_b_loss", "head_a_accuracy"}));
  // compile_config keeps the metrics' own names (no prefix piling up on reload).
  EXPECT_EQ(model->compile_args().to_json()["metrics"][0][0]["config"]["name"], "accuracy");
  // One list per output, or a clear error.
  CompileArgs wrong = CompileArgs::from_json(
      Json::parse(R"({"optimizer": "sgd", "loss": "mse", "metrics": [["mae"], ["mae"], ["mae"]]})"));
  try {
    model->compile(wrong);
    ADD_FAILURE() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("one list per model output (2: head_a, head_b)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
