#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/torch_compat.h"
#include "kiln/optimizers/adam.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/rmsprop.h"
#include "kiln/optimizers/schedules.h"
#include "kiln/optimizers/sgd.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

using namespace optimizers;

VariablePtr var(const std::string& path, at::Tensor value) {
  return std::make_shared<Variable>(path, std::move(value), /*trainable=*/true);
}

// --- golden data (PyTorch reference, scripts/golden/make_golden.py) -------------------

TEST(OptimizersGolden, MatchPyTorchReference) {
  Json golden = load_golden("kiln/optimizers/testdata/optimizers_golden.json");
  ASSERT_GE(golden["cases"].size(), 12u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    OptimizerPtr opt = Optimizer::from_json(c["optimizer"]);
    std::vector<VariablePtr> vars;
    for (size_t i = 0; i < c["variables"].size(); ++i)
      vars.push_back(var(c["variables"][i].get<std::string>(), golden_tensor(c["initial"][i])));
    const auto& steps = c["grads"];
    for (size_t s = 0; s < steps.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      EXPECT_NEAR(opt->learning_rate(), c["learning_rates"][s].get<double>(), 1e-12);
      std::vector<at::Tensor> grads;
      for (const auto& g : steps[s]) grads.push_back(golden_tensor(g));
      opt->apply_gradients(grads, vars);
      for (size_t i = 0; i < vars.size(); ++i)
        EXPECT_TRUE(tensors_close(vars[i]->value(), golden_tensor(c["expected"][s][i]), 1e-5, 1e-6));
    }
    EXPECT_EQ(opt->iterations(), static_cast<int64_t>(steps.size()));
  }
}

TEST(SchedulesGolden, MatchReferenceValues) {
  Json golden = load_golden("kiln/optimizers/testdata/optimizers_golden.json");
  ASSERT_GE(golden["schedules"].size(), 6u);
  for (const auto& c : golden["schedules"]) {
    SCOPED_TRACE(c["schedule"].dump());
    SchedulePtr s = LearningRateSchedule::from_json(c["schedule"]);
    for (size_t i = 0; i < c["steps"].size(); ++i)
      EXPECT_NEAR((*s)(c["steps"][i].get<int64_t>()), c["values"][i].get<double>(), 1e-12) << "step " << i;
  }
}

// --- schedules ---------------------------------------------------------------------------

TEST(Schedules, KerasSemantics) {
  ExponentialDecay exp_decay({.initial_learning_rate = 0.1, .decay_steps = 10, .decay_rate = 0.5});
  EXPECT_DOUBLE_EQ(exp_decay(0), 0.1);
  EXPECT_NEAR(exp_decay(5), 0.1 * std::sqrt(0.5), 1e-15);
  EXPECT_DOUBLE_EQ(
      ExponentialDecay({.initial_learning_rate = 0.1, .decay_steps = 10, .decay_rate = 0.5, .staircase = true})(19),
      0.05);

  CosineDecay cos(1.0, 4, 0.1);
  EXPECT_DOUBLE_EQ(cos(0), 1.0);
  EXPECT_NEAR(cos(2), 0.55, 1e-12);   // 0.9 * 0.5 + 0.1
  EXPECT_NEAR(cos(100), 0.1, 1e-12);  // held at alpha after decay_steps
  // Warmup: linear from initial to target over warmup_steps, then decays.
  CosineDecay warm(0.0, 10, 0.0, 1.0, 4);
  EXPECT_DOUBLE_EQ(warm(0), 0.0);
  EXPECT_DOUBLE_EQ(warm(1), 0.25);
  EXPECT_DOUBLE_EQ(warm(4), 1.0);
  EXPECT_NEAR(warm(9), 0.5, 1e-12);
  EXPECT_NEAR(warm(14), 0.0, 1e-12);
  EXPECT_NEAR(warm(50), 0.0, 1e-12);

  PiecewiseConstantDecay pw({10, 20}, {1.0, 0.5, 0.1});
  EXPECT_EQ(pw(0), 1.0);
  EXPECT_EQ(pw(10), 1.0);
  EXPECT_EQ(pw(11), 0.5);
  EXPECT_EQ(pw(20), 0.5);
  EXPECT_EQ(pw(21), 0.1);
}

TEST(Schedules, BadConfigsAndRoundTrip) {
  expect_error<ValueError>(
      [] { ExponentialDecay({.initial_learning_rate = 0.1, .decay_steps = 0, .decay_rate = 0.5}); }, {"decay_steps=0"});
  expect_error<ValueError>([] { PiecewiseConstantDecay({1, 2}, {1.0, 2.0}); }, {"length"});
  EXPECT_THROW(PiecewiseConstantDecay({5, 2}, {1.0, 2.0, 3.0}), ValueError);
  EXPECT_THROW(LearningRateSchedule::from_json(Json{{"class_name", "LinearDecay"}, {"config", Json::object()}}),
               ValueError);
  EXPECT_THROW(LearningRateSchedule::from_json(Json{{"class_name", "CosineDecay"}, {"config", {{"decay_steps", 3}}}}),
               ValueError);  // initial_learning_rate missing
  std::vector<SchedulePtr> all = {
      std::make_shared<ExponentialDecay>(ExponentialDecayOptions{
          .initial_learning_rate = 0.1, .decay_steps = 7, .decay_rate = 0.9, .staircase = true}),
      std::make_shared<CosineDecay>(0.2, 100, 0.05, 0.5, 10), std::make_shared<CosineDecay>(0.2, 100),
      std::make_shared<PiecewiseConstantDecay>(std::vector<int64_t>{3, 9}, std::vector<double>{0.3, 0.2, 0.1})};
  for (auto& s : all) {
    Json j = s->to_json();
    SchedulePtr back = LearningRateSchedule::from_json(Json::parse(j.dump()));
    EXPECT_EQ(back->to_json(), j);
    for (int64_t step : {0, 4, 50, 200}) EXPECT_DOUBLE_EQ((*back)(step), (*s)(step));
  }
}

// --- base optimizer behaviour ----------------------------------------------------------------

TEST(Optimizer, OnlyOneClipOption) {
  const std::string msg = error_of<ValueError>([] { Adam(Json{{"clipnorm", 1.0}, {"global_clipnorm", 2.0}}); });
  EXPECT_NE(msg.find("clipnorm=1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("global_clipnorm=2"), std::string::npos) << msg;
  EXPECT_THROW(SGD(Json{{"clipvalue", 1.0}, {"clipnorm", 1.0}}), ValueError);
  EXPECT_NO_THROW(SGD(Json{{"clipvalue", 1.0}, {"clipnorm", nullptr}}));
  EXPECT_THROW(SGD(Json{{"clipnorm", -1.0}}), ValueError);
}

TEST(Optimizer, BadConfigsNameTheValue) {
  expect_error<ValueError>([] { SGD(Json{{"momentum", 1.5}}); }, {"momentum=1.5"});
  expect_error<ValueError>([] { Adam(Json{{"beta1", 0.8}}); }, {"beta1"});
  expect_error<ValueError>([] { Adam(Json{{"learning_rate", "fast"}}); }, {"fast"});
  expect_error<ValueError>([] { AdamW(Json{{"weight_decay", nullptr}}); }, {"weight_decay"});
  EXPECT_THROW(RMSprop(Json{{"rho", 1.0}}), ValueError);
  expect_error<ValueError>([] { Adam(Json{{"use_ema", true}, {"ema_momentum", 1.5}}); }, {"ema_momentum=1.5"});
  const std::string msg = error_of<ValueError>([] { Optimizer::get("adagrad_typo"); });
  EXPECT_NE(msg.find("'adagrad_typo'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("adamw"), std::string::npos) << msg;
}

// AdamW with weight_decay 0 used to write null, which AdamW refuses: its
// saved config did not load.
TEST(Optimizer, AdamWWithoutWeightDecayRoundTrips) {
  AdamW off(Json{{"weight_decay", 0.0}});
  const Json c = off.get_config();
  EXPECT_EQ(c["weight_decay"], 0.0);
  AdamW back(c);
  EXPECT_EQ(back.weight_decay(), 0.0);
  EXPECT_EQ(back.get_config(), c);
}

TEST(Optimizer, GetByNameWithKerasDefaults) {
  auto adam = Optimizer::get("adam");
  EXPECT_EQ(adam->class_name(), "Adam");
  EXPECT_EQ(adam->name(), "adam");
  Json c = adam->get_config();
  EXPECT_DOUBLE_EQ(c["learning_rate"].get<double>(), 0.001);
  EXPECT_DOUBLE_EQ(c["beta_1"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(c["beta_2"].get<double>(), 0.999);
  EXPECT_DOUBLE_EQ(c["epsilon"].get<double>(), 1e-7);
  EXPECT_FALSE(c["amsgrad"].get<bool>());
  EXPECT_TRUE(c["weight_decay"].is_null());
  auto sgd = Optimizer::get("sgd");
  EXPECT_EQ(sgd->name(), "SGD");
  EXPECT_DOUBLE_EQ(sgd->learning_rate(), 0.01);
  auto rms = Optimizer::get("rmsprop")->get_config();
  EXPECT_DOUBLE_EQ(rms["rho"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(rms["momentum"].get<double>(), 0.0);
  EXPECT_FALSE(rms["centered"].get<bool>());
  auto adamw = Optimizer::get("adamw");
  EXPECT_EQ(adamw->class_name(), "AdamW");
  EXPECT_DOUBLE_EQ(adamw->weight_decay(), 0.004);
  EXPECT_EQ(Optimizer::get("RMSprop")->class_name(), "RMSprop");
}

TEST(Optimizer, ConfigRoundTrip) {
  ExponentialDecay sched({.initial_learning_rate = 0.1, .decay_steps = 100, .decay_rate = 0.96});
  std::vector<OptimizerPtr> all = {
      std::make_shared<SGD>(Json{{"learning_rate", 0.05}, {"momentum", 0.9}, {"nesterov", true}, {"clipvalue", 2.0}}),
      std::make_shared<RMSprop>(Json{{"rho", 0.8}, {"centered", true}, {"momentum", 0.3}, {"name", "rms"}}),
      std::make_shared<Adam>(Json{{"learning_rate", sched.to_json()}, {"amsgrad", true}, {"global_clipnorm", 1.0}}),
      std::make_shared<AdamW>(Json{{"weight_decay", 0.01}, {"clipnorm", 0.5}}),
  };
  for (auto& opt : all) {
    Json j = opt->to_json();
    SCOPED_TRACE(j.dump());
    OptimizerPtr back = Optimizer::from_json(Json::parse(j.dump()));
    EXPECT_EQ(back->to_json(), j);
    EXPECT_EQ(back->class_name(), opt->class_name());
  }
  EXPECT_TRUE(Optimizer::from_json(all[2]->to_json())->has_schedule());
  // Keras's serialized schedule (with module/registered_name) reads back.
  Json keras = Json::parse(R"({"class_name": "SGD", "config": {"name": "SGD", "learning_rate":
      {"module": "keras.optimizers.schedules", "class_name": "PiecewiseConstantDecay",
       "config": {"boundaries": [10], "values": [0.1, 0.01], "name": "PiecewiseConstant"},
       "registered_name": null}, "weight_decay": null, "clipnorm": null, "global_clipnorm": null,
      "clipvalue": null, "use_ema": false, "ema_momentum": 0.99, "ema_overwrite_frequency": null,
      "loss_scale_factor": null, "gradient_accumulation_steps": null, "momentum": 0.0, "nesterov": false}})");
  EXPECT_DOUBLE_EQ(Optimizer::from_json(keras)->learning_rate(), 0.1);
}

TEST(Optimizer, LearningRateConstantOrSchedule) {
  SGD sgd(Json{{"learning_rate", 0.1}});
  sgd.set_learning_rate(0.02);
  EXPECT_DOUBLE_EQ(sgd.learning_rate(), 0.02);
  EXPECT_THROW(sgd.set_learning_rate(-1), ValueError);
  auto v = var("w", at::ones({2}));
  sgd.apply_gradients({at::ones({2})}, {v});
  EXPECT_TRUE(tensors_close(v->value(), at::full({2}, 0.98f)));

  SGD scheduled(Json{{"learning_rate", PiecewiseConstantDecay({0}, {0.5, 0.25}).to_json()}});
  EXPECT_THROW(scheduled.set_learning_rate(0.1), StateError);
  auto w = var("w", at::zeros({1}));
  scheduled.apply_gradients({at::ones({1})}, {w});  // step 0: lr 0.5
  scheduled.apply_gradients({at::ones({1})}, {w});  // step 1: lr 0.25
  EXPECT_NEAR(w->value().item<float>(), -0.75, 1e-7);
  EXPECT_DOUBLE_EQ(scheduled.learning_rate(), 0.25);
}

TEST(Optimizer, OwnershipFilterUpdatesAndKeepsOnlyOwnedVariables) {
  auto a = std::make_shared<Variable>("a/kernel", at::ones({4}), true);
  auto b = std::make_shared<Variable>("b/kernel", at::ones({2}), true);
  auto opt = Optimizer::get("adam");
  opt->apply_gradients({at::ones({4}), at::ones({2})}, {a, b});
  EXPECT_EQ(opt->state_dict().count("b/kernel/momentum"), 1u);
  opt->set_ownership([](const std::string& p) { return p.rfind("a/", 0) == 0; });
  EXPECT_EQ(opt->state_dict().count("b/kernel/momentum"), 0u) << "an unowned variable's slots are dropped";
  const at::Tensor b_before = b->value().clone();
  opt->apply_gradients({at::ones({4}), at::ones({2})}, {a, b});
  EXPECT_TRUE(at::equal(b->value(), b_before)) << "an unowned variable is left to its owner";
  EXPECT_EQ(opt->iterations(), 2);
  // No gradient for any variable is not an error when sharded (this replica may own none).
  opt->apply_gradients({at::Tensor(), at::Tensor()}, {a, b});
  EXPECT_EQ(opt->iterations(), 3);
  // A whole state loaded while sharded keeps only the owned slots.
  auto other = Optimizer::get("adam");
  other->apply_gradients({at::ones({4}), at::ones({2})}, {a, b});
  opt->load_state_dict(other->state_dict());
  EXPECT_EQ(opt->state_dict().count("a/kernel/momentum"), 1u);
  EXPECT_EQ(opt->state_dict().count("b/kernel/momentum"), 0u);
  opt->set_ownership(nullptr);
  EXPECT_FALSE(opt->sharded());
}

TEST(Optimizer, SlotsAreLazyAndKeyedByPath) {
  Adam adam(Json{{"amsgrad", true}});
  auto k = var("dense/kernel", at::randn({2, 3}));
  auto b = var("dense/bias", at::zeros({3}));
  auto state = adam.state_dict();
  EXPECT_EQ(state.size(), 2u);                                      // iterations + learning_rate, no slots yet
  adam.apply_gradients({at::randn({2, 3}), at::Tensor()}, {k, b});  // bias has no gradient
  state = adam.state_dict();
  EXPECT_TRUE(state.count("dense/kernel/momentum"));
  EXPECT_TRUE(state.count("dense/kernel/velocity"));
  EXPECT_TRUE(state.count("dense/kernel/velocity_hat"));
  EXPECT_FALSE(state.count("dense/bias/momentum"));
  EXPECT_EQ(state["iterations"].item<int64_t>(), 1);
  EXPECT_EQ(b->value().abs().sum().item<float>(), 0.0f);  // untouched
  EXPECT_TRUE(state["dense/kernel/momentum"].sizes().equals({2, 3}));
}

TEST(Optimizer, StateDictRestoresTraining) {
  // Train 3 steps, checkpoint, train 3 more; a fresh optimizer loaded from
  // the checkpoint must reproduce the last 3 steps exactly.
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(at::randn({4}));
  for (const char* name : {"adam", "rmsprop", "sgd"}) {
    SCOPED_TRACE(name);
    Json config = std::string(name) == "sgd" ? Json{{"momentum", 0.9}} : Json{{"centered", true}};
    if (std::string(name) == "adam") config = Json::object();
    auto a = Optimizer::from_json(Json{{"class_name", name}, {"config", config}});
    auto va = var("w", at::ones({4}));
    for (int i = 0; i < 3; ++i) a->apply_gradients({grads[i]}, {va});
    auto checkpoint = a->state_dict();
    at::Tensor saved = va->value().detach().clone();
    for (int i = 3; i < 6; ++i) a->apply_gradients({grads[i]}, {va});

    auto b = Optimizer::from_json(Json{{"class_name", name}, {"config", config}});
    auto vb = var("w", saved);
    b->load_state_dict(checkpoint);
    EXPECT_EQ(b->iterations(), 3);
    for (int i = 3; i < 6; ++i) b->apply_gradients({grads[i]}, {vb});
    EXPECT_TRUE(at::equal(va->value(), vb->value()));
  }
  Adam adam;
  EXPECT_THROW(adam.load_state_dict({{"w/accumulator", at::zeros({4})}}), ValueError);
  EXPECT_THROW(adam.load_state_dict({{"w/momentum", at::zeros({4})}}), ValueError);  // velocity missing
}

TEST(Optimizer, WeightDecayIsDecoupledAndExcludable) {
  // Zero gradient: only the decay moves the weights, var -= lr * wd * var.
  SGD sgd(Json{{"learning_rate", 0.1}, {"weight_decay", 0.5}});
  sgd.exclude_from_weight_decay({"bias"});
  auto k = var("dense/kernel", at::full({2}, 2.0f));
  auto b = var("dense/bias", at::full({2}, 2.0f));
  sgd.apply_gradients({at::zeros({2}), at::zeros({2})}, {k, b});
  EXPECT_TRUE(tensors_close(k->value(), at::full({2}, 1.9f)));
  EXPECT_TRUE(tensors_close(b->value(), at::full({2}, 2.0f)));
}

TEST(Optimizer, Clipping) {
  auto run = [](const Json& config, std::vector<at::Tensor> grads) {
    SGD sgd(config);
    std::vector<VariablePtr> vars;
    for (size_t i = 0; i < grads.size(); ++i) vars.push_back(var("v" + std::to_string(i), at::zeros_like(grads[i])));
    sgd.apply_gradients(grads, vars);
    std::vector<at::Tensor> moved;
    for (auto& v : vars) moved.push_back(-v->value().detach());  // lr 1: the applied gradient
    return moved;
  };
  at::Tensor g1 = at::tensor({3.0f, 4.0f});  // norm 5
  at::Tensor g2 = at::tensor({0.0f, 0.5f});
  auto by_norm = run(Json{{"learning_rate", 1.0}, {"clipnorm", 1.0}}, {g1, g2});
  EXPECT_TRUE(tensors_close(by_norm[0], at::tensor({0.6f, 0.8f})));
  EXPECT_TRUE(tensors_close(by_norm[1], g2));  // under the norm: unchanged
  auto global = run(Json{{"learning_rate", 1.0}, {"global_clipnorm", 1.0}}, {g1, g2});
  const float total = std::sqrt(25.0f + 0.25f);
  EXPECT_TRUE(tensors_close(global[0], g1 / total));
  EXPECT_TRUE(tensors_close(global[1], g2 / total));
  auto by_value = run(Json{{"learning_rate", 1.0}, {"clipvalue", 0.4}}, {g1, g2});
  EXPECT_TRUE(tensors_close(by_value[0], at::tensor({0.4f, 0.4f})));
  EXPECT_TRUE(tensors_close(by_value[1], at::tensor({0.0f, 0.4f})));
}

TEST(Optimizer, RejectsBadGradients) {
  SGD sgd;
  auto a = var("a", at::zeros({2}));
  auto b = var("b", at::zeros({2}));
  EXPECT_THROW(sgd.apply_gradients({at::Tensor(), at::Tensor()}, {a, b}), ValueError);
  EXPECT_THROW(sgd.apply_gradients({at::zeros({3})}, {a}), ShapeError);
  EXPECT_THROW(sgd.apply_gradients({at::zeros({2})}, {a, b}), ValueError);
  auto a2 = var("a", at::zeros({2}));
  EXPECT_THROW(sgd.apply_gradients({at::zeros({2}), at::zeros({2})}, {a, a2}), ValueError);
  EXPECT_EQ(sgd.iterations(), 0);
}

TEST(Optimizer, UpdatesReducedPrecisionVariablesInTheirDtype) {
  Adam adam(Json{{"learning_rate", 0.1}});
  auto v = var("w", at::ones({3}, at::kBFloat16));
  adam.apply_gradients({at::ones({3}, at::kFloat)}, {v});
  EXPECT_EQ(v->value().scalar_type(), at::kBFloat16);
  // First Adam step moves by ~lr in the gradient's sign.
  EXPECT_NEAR(v->value()[0].item<float>(), 0.9f, 1e-2);
  EXPECT_EQ(adam.state_dict()["w/momentum"].scalar_type(), at::kBFloat16);
}

TEST(Optimizer, MinimisesAQuadratic) {
  // End to end with autograd: each optimizer drives (w - 3)^2 towards 0.
  for (const char* name : {"sgd", "rmsprop", "adam", "adamw"}) {
    SCOPED_TRACE(name);
    auto opt = Optimizer::from_json(Json{{"class_name", name}, {"config", {{"learning_rate", 0.1}}}});
    auto w = var("w", at::zeros({1}));
    for (int i = 0; i < 300; ++i) {
      at::Tensor loss = (w->value() - 3).square().sum();
      auto grads = compat::grad({loss}, {w->value()});
      opt->apply_gradients(grads, {w});
    }
    EXPECT_NEAR(w->value().item<float>(), 3.0f, std::string(name) == "adamw" ? 0.1f : 0.02f);
  }
}

// The fused kernel (one pass over every variable; the default) computes
// Keras's Adam: against the per-variable update over 50 steps, with and
// without amsgrad and with decoupled weight decay (AdamW).
TEST(Optimizer, FusedAdamMatchesThePerVariableUpdate) {
  for (const char* cls : {"Adam", "AdamW"})
    for (bool amsgrad : {false, true}) {
      SCOPED_TRACE(std::string(cls) + (amsgrad ? " amsgrad" : ""));
      const Json config{{"class_name", cls}, {"config", {{"learning_rate", 0.01}, {"amsgrad", amsgrad}}}};
      auto plain = Optimizer::from_json(config);
      auto fused = Optimizer::from_json(config);  // fused: the default
      ASSERT_TRUE(std::dynamic_pointer_cast<Adam>(plain));
      std::dynamic_pointer_cast<Adam>(plain)->set_fused(false);
      at::manual_seed(5);
      const at::Tensor w0 = at::randn({64, 32}), b0 = at::randn({32});
      std::vector<VariablePtr> a = {var("w", w0.clone()), var("b", b0.clone())};
      std::vector<VariablePtr> f = {var("w", w0.clone()), var("b", b0.clone())};
      for (int step = 0; step < 50; ++step) {
        // Gradients that shrink and change sign: epsilon and the bias
        // correction both matter.
        const std::vector<at::Tensor> g = {at::randn({64, 32}) * std::pow(0.8, step), at::randn({32}) * 1e-4};
        plain->apply_gradients(g, a);
        fused->apply_gradients(g, f);
        ASSERT_TRUE(std::dynamic_pointer_cast<Adam>(fused)->last_update_fused());
        ASSERT_FALSE(std::dynamic_pointer_cast<Adam>(plain)->last_update_fused());
      }
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(at::allclose(a[i]->value(), f[i]->value(), /*rtol=*/1e-5, /*atol=*/1e-6)) << a[i]->path();
        EXPECT_FALSE(at::equal(a[i]->value(), i == 0 ? w0 : b0));  // they moved
      }
      EXPECT_EQ(fused->iterations(), 50);
      const auto ps = plain->state_dict(), fs = fused->state_dict();
      for (const auto& [key, t] : ps)
        EXPECT_TRUE(at::allclose(t.to(at::kDouble), fs.at(key).to(at::kDouble), 1e-5, 1e-7)) << key;
    }
}

}  // namespace
}  // namespace kiln
