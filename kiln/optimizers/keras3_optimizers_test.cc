// Adagrad, Adadelta, Adamax, Nadam, Lion, Ftrl (golden data from
// scripts/golden/make_golden.py: torch.optim where its rule equals Keras's,
// numpy loops of Keras's formulas elsewhere), and the base optimizer's
// use_ema and gradient_accumulation_steps against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kiln/core/error.h"
#include "kiln/optimizers/adadelta.h"
#include "kiln/optimizers/adagrad.h"
#include "kiln/optimizers/adam.h"
#include "kiln/optimizers/adamax.h"
#include "kiln/optimizers/ftrl.h"
#include "kiln/optimizers/lion.h"
#include "kiln/optimizers/nadam.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/schedules.h"
#include "kiln/optimizers/sgd.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

using namespace optimizers;

VariablePtr scalar_var(const std::string& path, double v) {
  return std::make_shared<Variable>(path, at::full({}, v, at::kFloat), /*trainable=*/true);
}

float value_of(const VariablePtr& v) { return v->value().item<float>(); }

TEST(Keras3OptimizersGolden, MatchReference) {
  Json golden = load_golden("kiln/optimizers/testdata/keras3_optimizers_golden.json");
  ASSERT_GE(golden["cases"].size(), 18u);
  std::set<std::string> classes;
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>() + " (" + c["source"].get<std::string>() + ")");
    OptimizerPtr opt = Optimizer::from_json(c["optimizer"]);
    classes.insert(opt->class_name());
    std::vector<VariablePtr> vars;
    for (size_t i = 0; i < c["variables"].size(); ++i)
      vars.push_back(
          std::make_shared<Variable>(c["variables"][i].get<std::string>(), golden_tensor(c["initial"][i]), true));
    for (size_t s = 0; s < c["grads"].size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      EXPECT_NEAR(opt->learning_rate(), c["learning_rates"][s].get<double>(), 1e-12);
      std::vector<at::Tensor> grads;
      for (const auto& g : c["grads"][s]) grads.push_back(golden_tensor(g));
      opt->apply_gradients(grads, vars);
      for (size_t i = 0; i < vars.size(); ++i)
        EXPECT_TRUE(tensors_close(vars[i]->value(), golden_tensor(c["expected"][s][i]), 1e-5, 1e-6));
    }
  }
  EXPECT_EQ(classes, (std::set<std::string>{"Adadelta", "Adagrad", "Adamax", "Ftrl", "Lion", "Nadam"}));
}

TEST(Keras3Optimizers, RegistryNamesAndKerasDefaults) {
  struct Expect {
    const char* alias;
    const char* cls;
    Json defaults;
  };
  const std::vector<Expect> all = {
      {"adagrad", "Adagrad", {{"initial_accumulator_value", 0.1}, {"epsilon", 1e-7}}},
      {"adadelta", "Adadelta", {{"rho", 0.95}, {"epsilon", 1e-7}}},
      {"adamax", "Adamax", {{"beta_1", 0.9}, {"beta_2", 0.999}, {"epsilon", 1e-7}}},
      {"nadam", "Nadam", {{"beta_1", 0.9}, {"beta_2", 0.999}, {"epsilon", 1e-7}}},
      {"lion", "Lion", {{"beta_1", 0.9}, {"beta_2", 0.99}}},
      {"ftrl",
       "Ftrl",
       {{"learning_rate_power", -0.5},
        {"initial_accumulator_value", 0.1},
        {"l1_regularization_strength", 0.0},
        {"l2_regularization_strength", 0.0},
        {"l2_shrinkage_regularization_strength", 0.0},
        {"beta", 0.0}}},
  };
  for (const auto& e : all) {
    SCOPED_TRACE(e.alias);
    OptimizerPtr opt = Optimizer::get(e.alias);
    EXPECT_EQ(opt->class_name(), e.cls);
    EXPECT_EQ(opt->name(), e.alias);
    EXPECT_DOUBLE_EQ(opt->learning_rate(), 0.001);
    Json c = opt->get_config();
    for (auto it = e.defaults.begin(); it != e.defaults.end(); ++it)
      EXPECT_DOUBLE_EQ(c[it.key()].get<double>(), it.value().get<double>()) << it.key();
    EXPECT_EQ(Optimizer::get(e.cls)->class_name(), e.cls);
    // Round trip, with every option set away from its default.
    Json j = opt->to_json();
    j["config"]["use_ema"] = true;
    j["config"]["ema_momentum"] = 0.9;
    j["config"]["ema_overwrite_frequency"] = 3;
    j["config"]["gradient_accumulation_steps"] = 2;
    j["config"]["clipnorm"] = 1.0;
    OptimizerPtr back = Optimizer::from_json(j);
    EXPECT_EQ(back->to_json(), j);
    EXPECT_EQ(Optimizer::from_json(Json::parse(back->to_json().dump()))->to_json(), j);
  }
  const std::string msg = error_of<ValueError>([] { Optimizer::get("nadamw"); });
  EXPECT_NE(msg.find("nadam"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ftrl"), std::string::npos) << msg;
}

TEST(Keras3Optimizers, BadConfigsNameTheValue) {
  expect_error<ValueError>([] { Lion(Json{{"beta_1", 0.0}}); }, {"beta_1=0"});
  expect_error<ValueError>([] { Ftrl(Json{{"learning_rate_power", 0.5}}); }, {"learning_rate_power=0.5"});
  expect_error<ValueError>([] { Ftrl(Json{{"l1_regularization_strength", -1}}); }, {"l1_regularization"});
  expect_error<ValueError>(
      [] {
        Adagrad(Json{{"initial_accumulator_value", -0.1}});
      },
      {"initial_accumulator_value=-0.1"});
  expect_error<ValueError>([] { Nadam(Json{{"beta_2", 1.0}}); }, {"beta_2=1"});
  expect_error<ValueError>([] { Adamax(Json{{"momentum", 0.9}}); }, {"momentum"});
  expect_error<ValueError>([] { Adadelta(Json{{"rho", 2.0}}); }, {"rho=2"});
  // Base options.
  expect_error<ValueError>([] { SGD(Json{{"gradient_accumulation_steps", 1}}); }, {"gradient_accumulation_steps=1"});
  EXPECT_THROW(SGD(Json{{"gradient_accumulation_steps", 2.5}}), ValueError);
  EXPECT_NO_THROW(SGD(Json{{"gradient_accumulation_steps", 0}}));  // Keras: falsy is off
  expect_error<ValueError>([] { SGD(Json{{"ema_overwrite_frequency", -2}}); }, {"ema_overwrite_frequency=-2"});
  EXPECT_THROW(SGD(Json{{"use_ema", "yes"}}), ValueError);
}

TEST(Keras3Optimizers, StateDictResumesExactly) {
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 8; ++i) grads.push_back(at::randn({5}));
  for (const char* name : {"adagrad", "adadelta", "adamax", "nadam", "lion", "ftrl"}) {
    for (bool options : {false, true}) {
      SCOPED_TRACE(std::string(name) + (options ? " with ema + accumulation" : ""));
      Json config =
          options ? Json{{"use_ema", true}, {"ema_momentum", 0.7}, {"gradient_accumulation_steps", 2}} : Json::object();
      auto a = Optimizer::from_json(Json{{"class_name", name}, {"config", config}});
      auto va = std::make_shared<Variable>("w", at::ones({5}), true);
      for (int i = 0; i < 5; ++i) a->apply_gradients({grads[i]}, {va});  // odd: mid-accumulation
      auto checkpoint = a->state_dict();
      if (options) {
        EXPECT_TRUE(checkpoint.count("w/average"));
        EXPECT_TRUE(checkpoint.count("w/gradient_accumulator"));
      }
      at::Tensor saved = va->value().detach().clone();
      for (int i = 5; i < 8; ++i) a->apply_gradients({grads[i]}, {va});

      auto b = Optimizer::from_json(Json{{"class_name", name}, {"config", config}});
      auto vb = std::make_shared<Variable>("w", saved, true);
      b->load_state_dict(checkpoint);
      EXPECT_EQ(b->iterations(), options ? 2 : 5);
      for (int i = 5; i < 8; ++i) b->apply_gradients({grads[i]}, {vb});
      EXPECT_TRUE(at::equal(va->value(), vb->value()));
      a->finalize_variable_values({va});
      b->finalize_variable_values({vb});
      EXPECT_TRUE(at::equal(va->value(), vb->value()));
    }
  }
}

// --- use_ema (hand-computed) -------------------------------------------------------------

TEST(OptimizerEma, AveragesAndFinalize) {
  // SGD lr 0.1, gradient 1: the variable goes 1 -> 0.9 -> 0.8 -> 0.7.
  // average: 0.9 (momentum 0 on the first step), 0.5*0.9 + 0.5*0.8 = 0.85,
  // 0.5*0.85 + 0.5*0.7 = 0.775.
  SGD sgd(Json{{"learning_rate", 0.1}, {"use_ema", true}, {"ema_momentum", 0.5}});
  auto w = scalar_var("w", 1.0);
  const float expected_avg[] = {0.9f, 0.85f, 0.775f};
  for (int i = 0; i < 3; ++i) {
    sgd.apply_gradients({at::ones({})}, {w});
    EXPECT_NEAR(value_of(w), 0.9 - 0.1 * i, 1e-6);  // training itself is unaffected
    EXPECT_NEAR(sgd.state_dict()["w/average"].item<float>(), expected_avg[i], 1e-6);
  }
  sgd.finalize_variable_values({w});
  EXPECT_NEAR(value_of(w), 0.775, 1e-6);
  // Without use_ema, finalize leaves the variables alone.
  SGD plain(Json{{"learning_rate", 0.1}});
  auto v = scalar_var("v", 1.0);
  plain.apply_gradients({at::ones({})}, {v});
  plain.finalize_variable_values({v});
  EXPECT_NEAR(value_of(v), 0.9, 1e-6);
  EXPECT_FALSE(plain.state_dict().count("v/average"));
}

TEST(OptimizerEma, OverwriteFrequency) {
  // ema_overwrite_frequency 2: after step 2 (iterations 1 -> (1+1) % 2 == 0)
  // the variable becomes its average 0.85; step 3 moves it to 0.75 and the
  // average to 0.5*0.85 + 0.5*0.75 = 0.8; step 4 to 0.65, average 0.725,
  // then overwritten again.
  SGD sgd(Json{{"learning_rate", 0.1}, {"use_ema", true}, {"ema_momentum", 0.5}, {"ema_overwrite_frequency", 2}});
  auto w = scalar_var("w", 1.0);
  const float expected[] = {0.9f, 0.85f, 0.75f, 0.725f};
  for (int i = 0; i < 4; ++i) {
    sgd.apply_gradients({at::ones({})}, {w});
    EXPECT_NEAR(value_of(w), expected[i], 1e-6) << "step " << i + 1;
  }
}

TEST(OptimizerEma, VariablesWithoutGradientsAreAveragedToo) {
  // Keras averages every trainable variable, including one with no gradient.
  SGD sgd(Json{{"learning_rate", 0.1}, {"use_ema", true}, {"ema_momentum", 0.5}});
  auto w = scalar_var("w", 1.0), frozen = scalar_var("frozen", 3.0);
  sgd.apply_gradients({at::ones({}), at::Tensor()}, {w, frozen});
  {
    at::NoGradGuard no_grad;
    frozen->value().fill_(5.0);  // changed outside the optimizer
  }
  sgd.apply_gradients({at::ones({}), at::Tensor()}, {w, frozen});
  EXPECT_NEAR(sgd.state_dict()["frozen/average"].item<float>(), 4.0, 1e-6);
}

// --- gradient_accumulation_steps (hand-computed) -----------------------------------------

TEST(OptimizerAccumulation, AppliesTheMeanEveryNSteps) {
  // N = 2, SGD lr 0.1, gradients 1, 3, 2, 4: no change, then 1 - 0.1 * 2 = 0.8,
  // no change, then 0.8 - 0.1 * 3 = 0.5.
  SGD sgd(Json{{"learning_rate", 0.1}, {"gradient_accumulation_steps", 2}});
  auto w = scalar_var("w", 1.0);
  const double g[] = {1, 3, 2, 4};
  const float expected[] = {1.0f, 0.8f, 0.8f, 0.5f};
  const int64_t iterations[] = {0, 1, 1, 2};
  for (int i = 0; i < 4; ++i) {
    sgd.apply_gradients({at::full({}, g[i])}, {w});
    EXPECT_NEAR(value_of(w), expected[i], 1e-6) << "call " << i + 1;
    EXPECT_EQ(sgd.iterations(), iterations[i]);
    EXPECT_EQ(sgd.state_dict()["iterations"].item<int64_t>(), i + 1);  // the raw call count
  }
  EXPECT_EQ(sgd.state_dict()["w/gradient_accumulator"].item<float>(), 0.0f);
  EXPECT_EQ(sgd.get_config()["gradient_accumulation_steps"], 2);
}

TEST(OptimizerAccumulation, ClipsTheMeanAndCountsStepsAsKeras) {
  // Clipping applies to the mean gradient: (10 + 20) / 2 = 15 -> clipvalue 1.
  SGD clipped(Json{{"learning_rate", 0.1}, {"gradient_accumulation_steps", 2}, {"clipvalue", 1.0}});
  auto c = scalar_var("c", 0.0);
  clipped.apply_gradients({at::full({}, 10.0)}, {c});
  clipped.apply_gradients({at::full({}, 20.0)}, {c});
  EXPECT_NEAR(value_of(c), -0.1, 1e-6);

  // Adam's bias correction counts applied updates (Keras's iterations =
  // calls // N): the first update is step 1, so |delta| = lr for a constant
  // gradient, as without accumulation.
  Adam adam(Json{{"learning_rate", 0.01}, {"gradient_accumulation_steps", 3}});
  auto w = scalar_var("w", 0.0);
  for (int i = 0; i < 3; ++i) adam.apply_gradients({at::full({}, 2.0)}, {w});
  EXPECT_NEAR(value_of(w), -0.01, 1e-7);

  // Schedules read the raw call count (Keras's _iterations): with boundary 1,
  // the update at call 2 (count 1) uses 1.0 and the one at call 4 (count 3)
  // uses 0.1.
  PiecewiseConstantDecay sched({1}, {1.0, 0.1});
  SGD sgd(Json{{"learning_rate", sched.to_json()}, {"gradient_accumulation_steps", 2}});
  auto v = scalar_var("v", 0.0);
  for (int i = 0; i < 4; ++i) sgd.apply_gradients({at::ones({})}, {v});
  EXPECT_NEAR(value_of(v), -1.0 - 0.1, 1e-6);
}

TEST(OptimizerAccumulation, WithEma) {
  // Keras updates the average on every call; momentum is 0 while
  // iterations (calls // N) is 0. N = 2, SGD lr 0.1, gradient 1, momentum 0.5:
  // call 1: w 1.0, avg 1.0; call 2: w 0.9, avg 0.9 (iterations still 0);
  // call 3: w 0.9, avg 0.9; call 4: w 0.8, avg 0.85.
  SGD sgd(Json{{"learning_rate", 0.1}, {"gradient_accumulation_steps", 2}, {"use_ema", true}, {"ema_momentum", 0.5}});
  auto w = scalar_var("w", 1.0);
  const float avg[] = {1.0f, 0.9f, 0.9f, 0.85f};
  for (int i = 0; i < 4; ++i) {
    sgd.apply_gradients({at::ones({})}, {w});
    EXPECT_NEAR(sgd.state_dict()["w/average"].item<float>(), avg[i], 1e-6) << "call " << i + 1;
  }
}

// --- schedules: PolynomialDecay, InverseTimeDecay, CosineDecayRestarts --------------------

TEST(Keras3SchedulesGolden, MatchFormulaValues) {
  Json golden = load_golden("kiln/optimizers/testdata/keras3_optimizers_golden.json");
  ASSERT_GE(golden["schedules"].size(), 9u);
  for (const auto& c : golden["schedules"]) {
    SCOPED_TRACE(c["schedule"].dump());
    SchedulePtr s = LearningRateSchedule::from_json(c["schedule"]);
    for (size_t i = 0; i < c["steps"].size(); ++i)
      EXPECT_NEAR((*s)(c["steps"][i].get<int64_t>()), c["values"][i].get<double>(), 1e-12) << "step " << i;
  }
}

TEST(Keras3Schedules, HandValuesAndDefaults) {
  // PolynomialDecay(0.1, 10): linear to 1e-4 by step 10, then held.
  PolynomialDecay poly({.initial_learning_rate = 0.1, .decay_steps = 10});
  EXPECT_DOUBLE_EQ(poly(0), 0.1);
  EXPECT_NEAR(poly(5), (0.1 - 1e-4) * 0.5 + 1e-4, 1e-15);
  EXPECT_NEAR(poly(10), 1e-4, 1e-15);
  EXPECT_NEAR(poly(50), 1e-4, 1e-15);
  // cycle: step 5 of decay_steps 4 decays over 8 steps: (1 - 5/8)^1.
  PolynomialDecay cyc({.initial_learning_rate = 1.0, .decay_steps = 4, .end_learning_rate = 0.0, .cycle = true});
  EXPECT_NEAR(cyc(5), 0.375, 1e-15);
  EXPECT_NEAR(cyc(8), 0.0, 1e-15);
  EXPECT_DOUBLE_EQ(cyc(0), 1.0);
  // InverseTimeDecay(0.1, 1, 0.5): 0.1 / (1 + 0.5 t).
  InverseTimeDecay inv({.initial_learning_rate = 0.1, .decay_steps = 1, .decay_rate = 0.5});
  EXPECT_NEAR(inv(2), 0.05, 1e-15);
  EXPECT_NEAR(
      InverseTimeDecay({.initial_learning_rate = 0.1, .decay_steps = 4, .decay_rate = 1.0, .staircase = true})(7), 0.05,
      1e-15);  // floor(7/4) = 1
  // CosineDecayRestarts(1, 4): 1 -> 0 over 4 steps, restart, then 8 steps.
  CosineDecayRestarts sgdr(1.0, 4);
  EXPECT_DOUBLE_EQ(sgdr(0), 1.0);
  EXPECT_NEAR(sgdr(2), 0.5, 1e-12);
  EXPECT_NEAR(sgdr(4), 1.0, 1e-12);
  EXPECT_NEAR(sgdr(8), 0.5, 1e-12);
  EXPECT_NEAR(sgdr(12), 1.0, 1e-12);
  Json defaults = sgdr.get_config();
  EXPECT_EQ(defaults["t_mul"], 2.0);
  EXPECT_EQ(defaults["m_mul"], 1.0);
  EXPECT_EQ(defaults["alpha"], 0.0);
  EXPECT_EQ(defaults["name"], "SGDRDecay");
  EXPECT_EQ(poly.get_config()["end_learning_rate"], 0.0001);
  EXPECT_EQ(poly.get_config()["power"], 1.0);
}

TEST(Keras3Schedules, ConfigRoundTripAndBadConfigs) {
  std::vector<SchedulePtr> all = {
      std::make_shared<PolynomialDecay>(PolynomialDecayOptions{.initial_learning_rate = 0.1,
                                                               .decay_steps = 7,
                                                               .end_learning_rate = 0.01,
                                                               .power = 0.5,
                                                               .cycle = true,
                                                               .name = "poly"}),
      std::make_shared<InverseTimeDecay>(InverseTimeDecayOptions{
          .initial_learning_rate = 0.3, .decay_steps = 2.5, .decay_rate = 0.7, .staircase = true}),
      std::make_shared<CosineDecayRestarts>(0.2, 10, 1.5, 0.9, 0.05)};
  for (auto& s : all) {
    Json j = s->to_json();
    SCOPED_TRACE(j.dump());
    SchedulePtr back = LearningRateSchedule::from_json(Json::parse(j.dump()));
    EXPECT_EQ(back->to_json(), j);
    for (int64_t step : {0, 3, 17, 400}) EXPECT_DOUBLE_EQ((*back)(step), (*s)(step));
    // Inside an optimizer's config too.
    auto opt = Optimizer::from_json(Json{{"class_name", "nadam"}, {"config", {{"learning_rate", j}}}});
    EXPECT_EQ(opt->get_config()["learning_rate"], j);
    EXPECT_DOUBLE_EQ(opt->learning_rate(), (*s)(0));
  }
  // Keras's serialized form ("name": null, module/registered_name around it).
  Json keras = Json::parse(R"({"module": "keras.optimizers.schedules", "class_name": "PolynomialDecay",
      "config": {"cycle": false, "decay_steps": 10000, "end_learning_rate": 0.01, "initial_learning_rate": 0.1,
                 "name": null, "power": 0.5}, "registered_name": null})");
  EXPECT_NEAR((*LearningRateSchedule::from_json(keras))(2500), 0.09 * std::sqrt(0.75) + 0.01, 1e-12);
  EXPECT_NE(error_of<ValueError>([] {
              PolynomialDecay({.initial_learning_rate = 0.1, .decay_steps = 0});
            }).find("decay_steps=0"),
            std::string::npos);
  expect_error<ValueError>(
      [] { InverseTimeDecay({.initial_learning_rate = 0.1, .decay_steps = -1, .decay_rate = 0.5}); },
      {"decay_steps=-1"});
  expect_error<ValueError>([] { CosineDecayRestarts(0.1, 0); }, {"first_decay_steps=0"});
  EXPECT_THROW(LearningRateSchedule::from_json(Json{{"class_name", "InverseTimeDecay"},
                                                    {"config", {{"initial_learning_rate", 0.1}, {"decay_steps", 1}}}}),
               ValueError);  // decay_rate missing
  expect_error<ValueError>(
      [] {
        LearningRateSchedule::from_json(
            Json{{"class_name", "CosineDecayRestarts"},
                 {"config", {{"initial_learning_rate", 0.1}, {"first_decay_steps", 3}, {"t_mull", 2.0}}}});
      },
      {"t_mull"});
}

}  // namespace
}  // namespace kiln
