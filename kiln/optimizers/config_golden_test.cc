// Every optimizer's and learning-rate schedule's config, byte for byte:
// defaults, every key set to a non-default value, every key null, and the
// typed Options constructors. Guards refactors of how configs are read and
// written (kiln/optimizers/testdata/optimizer_configs_golden.json).
//
// Regenerate (only for an intended, explained change of a config):
//   KILN_WRITE_CONFIG_GOLDEN=$PWD/kiln/optimizers/testdata/optimizer_configs_golden.json \
//     build/kiln_optimizers_test --gtest_filter='OptimizerConfigsGolden.*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "kiln/optimizers/adadelta.h"
#include "kiln/optimizers/adagrad.h"
#include "kiln/optimizers/adam.h"
#include "kiln/optimizers/adamax.h"
#include "kiln/optimizers/ftrl.h"
#include "kiln/optimizers/lion.h"
#include "kiln/optimizers/loss_scale_optimizer.h"
#include "kiln/optimizers/nadam.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/rmsprop.h"
#include "kiln/optimizers/schedules.h"
#include "kiln/optimizers/sgd.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

using namespace optimizers;

// Each optimizer's own keys, every one set to a valid non-default value.
const std::map<std::string, Json>& own_full_configs() {
  static const std::map<std::string, Json> m = {
      {"SGD", {{"momentum", 0.5}, {"nesterov", true}}},
      {"RMSprop", {{"rho", 0.8}, {"momentum", 0.3}, {"epsilon", 1e-5}, {"centered", true}}},
      {"Adam", {{"beta_1", 0.8}, {"beta_2", 0.99}, {"epsilon", 1e-6}, {"amsgrad", true}}},
      {"AdamW", {{"beta_1", 0.8}, {"beta_2", 0.99}, {"epsilon", 1e-6}, {"amsgrad", true}}},
      {"Adagrad", {{"initial_accumulator_value", 0.2}, {"epsilon", 1e-6}}},
      {"Adadelta", {{"rho", 0.9}, {"epsilon", 1e-6}}},
      {"Adamax", {{"beta_1", 0.8}, {"beta_2", 0.99}, {"epsilon", 1e-6}}},
      {"Nadam", {{"beta_1", 0.8}, {"beta_2", 0.99}, {"epsilon", 1e-6}}},
      {"Lion", {{"beta_1", 0.8}, {"beta_2", 0.95}}},
      {"Ftrl",
       {{"learning_rate_power", -0.25},
        {"initial_accumulator_value", 0.2},
        {"l1_regularization_strength", 0.01},
        {"l2_regularization_strength", 0.02},
        {"l2_shrinkage_regularization_strength", 0.03},
        {"beta", 0.5}}}};
  return m;
}

// The base optimizer's keys, non-default (one clip option: they exclude each
// other). jit_compile and is_legacy_optimizer are accepted and dropped.
Json base_full_config() {
  return Json{{"name", "custom"},
              {"learning_rate", 0.05},
              {"weight_decay", 0.01},
              {"clipnorm", 1.5},
              {"use_ema", true},
              {"ema_momentum", 0.9},
              {"ema_overwrite_frequency", 5},
              {"loss_scale_factor", nullptr},
              {"gradient_accumulation_steps", 3},
              {"jit_compile", false},
              {"is_legacy_optimizer", false}};
}

Json with(Json config, const Json& more) {
  for (auto it = more.begin(); it != more.end(); ++it) config[it.key()] = it.value();
  return config;
}

Json all_null(Json config) {
  for (auto it = config.begin(); it != config.end(); ++it) it.value() = nullptr;
  return config;
}

// The typed options equal to base_full_config().
OptimizerOptions base_full_options() {
  return OptimizerOptions{.weight_decay = 0.01,
                          .clipnorm = 1.5,
                          .use_ema = true,
                          .ema_momentum = 0.9,
                          .ema_overwrite_frequency = 5,
                          .gradient_accumulation_steps = 3,
                          .name = "custom"};
}

std::map<std::string, OptimizerPtr> typed_optimizers() {
  const OptimizerOptions b = base_full_options();
  std::map<std::string, OptimizerPtr> m;
  m["SGD"] = std::make_shared<SGD>(SGDOptions{.learning_rate = 0.05, .momentum = 0.5, .nesterov = true, .base = b});
  m["RMSprop"] = std::make_shared<RMSprop>(
      RMSpropOptions{.learning_rate = 0.05, .rho = 0.8, .momentum = 0.3, .epsilon = 1e-5, .centered = true, .base = b});
  m["Adam"] = std::make_shared<Adam>(
      AdamOptions{.learning_rate = 0.05, .beta_1 = 0.8, .beta_2 = 0.99, .epsilon = 1e-6, .amsgrad = true, .base = b});
  m["AdamW"] = std::make_shared<AdamW>(
      AdamWOptions{.learning_rate = 0.05, .beta_1 = 0.8, .beta_2 = 0.99, .epsilon = 1e-6, .amsgrad = true, .base = b});
  m["Adagrad"] = std::make_shared<Adagrad>(
      AdagradOptions{.learning_rate = 0.05, .initial_accumulator_value = 0.2, .epsilon = 1e-6, .base = b});
  m["Adadelta"] =
      std::make_shared<Adadelta>(AdadeltaOptions{.learning_rate = 0.05, .rho = 0.9, .epsilon = 1e-6, .base = b});
  m["Adamax"] = std::make_shared<Adamax>(
      AdamaxOptions{.learning_rate = 0.05, .beta_1 = 0.8, .beta_2 = 0.99, .epsilon = 1e-6, .base = b});
  m["Nadam"] = std::make_shared<Nadam>(
      NadamOptions{.learning_rate = 0.05, .beta_1 = 0.8, .beta_2 = 0.99, .epsilon = 1e-6, .base = b});
  m["Lion"] = std::make_shared<Lion>(LionOptions{.learning_rate = 0.05, .beta_1 = 0.8, .beta_2 = 0.95, .base = b});
  m["Ftrl"] = std::make_shared<Ftrl>(FtrlOptions{.learning_rate = 0.05,
                                                 .learning_rate_power = -0.25,
                                                 .initial_accumulator_value = 0.2,
                                                 .l1_regularization_strength = 0.01,
                                                 .l2_regularization_strength = 0.02,
                                                 .l2_shrinkage_regularization_strength = 0.03,
                                                 .beta = 0.5,
                                                 .base = b});
  // Typed defaults: only the learning rate (a schedule) and no base options.
  m["Adam_schedule"] = std::make_shared<Adam>(AdamOptions{
      .learning_rate = std::make_shared<CosineDecay>(0.1, 100),
  });
  m["SGD_zeros"] = std::make_shared<SGD>(SGDOptions{
      .base = {.weight_decay = 0, .clipvalue = 0, .ema_overwrite_frequency = 0, .gradient_accumulation_steps = 0}});
  m["AdamW_defaults"] = std::make_shared<AdamW>(AdamWOptions{});
  m["SGD_defaults"] = std::make_shared<SGD>(SGDOptions{});
  return m;
}

// Each schedule: the required keys only, and every key non-default.
struct ScheduleCase {
  std::string cls;
  Json required, full;
};

std::vector<ScheduleCase> schedule_cases() {
  return {
      {"ExponentialDecay",
       {{"initial_learning_rate", 0.1}, {"decay_steps", 100}, {"decay_rate", 0.5}},
       {{"initial_learning_rate", 0.1},
        {"decay_steps", 100},
        {"decay_rate", 0.5},
        {"staircase", true},
        {"name", "exp"}}},
      {"CosineDecay",
       {{"initial_learning_rate", 0.1}, {"decay_steps", 100}},
       {{"initial_learning_rate", 0.1},
        {"decay_steps", 100},
        {"alpha", 0.1},
        {"name", "cos"},
        {"warmup_target", 0.2},
        {"warmup_steps", 10}}},
      {"PiecewiseConstantDecay",
       {{"boundaries", Json::array({10})}, {"values", Json::array({0.1, 0.01})}},
       {{"boundaries", Json::array({10, 20})}, {"values", Json::array({0.1, 0.05, 0.01})}, {"name", "pw"}}},
      {"PolynomialDecay",
       {{"initial_learning_rate", 0.1}, {"decay_steps", 100}},
       {{"initial_learning_rate", 0.1},
        {"decay_steps", 100},
        {"end_learning_rate", 0.001},
        {"power", 2.0},
        {"cycle", true},
        {"name", "poly"}}},
      {"InverseTimeDecay",
       {{"initial_learning_rate", 0.1}, {"decay_steps", 2.5}, {"decay_rate", 0.5}},
       {{"initial_learning_rate", 0.1},
        {"decay_steps", 2.5},
        {"decay_rate", 0.5},
        {"staircase", true},
        {"name", "inv"}}},
      {"CosineDecayRestarts",
       {{"initial_learning_rate", 0.1}, {"first_decay_steps", 100}},
       {{"initial_learning_rate", 0.1},
        {"first_decay_steps", 100},
        {"t_mul", 1.5},
        {"m_mul", 0.8},
        {"alpha", 0.05},
        {"name", "sgdr"}}},
  };
}

std::map<std::string, SchedulePtr> typed_schedules() {
  std::map<std::string, SchedulePtr> m;
  m["ExponentialDecay"] = std::make_shared<ExponentialDecay>(ExponentialDecayOptions{
      .initial_learning_rate = 0.1, .decay_steps = 100, .decay_rate = 0.5, .staircase = true, .name = "exp"});
  m["CosineDecay"] = std::make_shared<CosineDecay>(0.1, 100, 0.1, 0.2, 10, "cos");
  m["PiecewiseConstantDecay"] = std::make_shared<PiecewiseConstantDecay>(std::vector<int64_t>{10, 20},
                                                                         std::vector<double>{0.1, 0.05, 0.01}, "pw");
  m["PolynomialDecay"] = std::make_shared<PolynomialDecay>(PolynomialDecayOptions{.initial_learning_rate = 0.1,
                                                                                  .decay_steps = 100,
                                                                                  .end_learning_rate = 0.001,
                                                                                  .power = 2.0,
                                                                                  .cycle = true,
                                                                                  .name = "poly"});
  m["InverseTimeDecay"] = std::make_shared<InverseTimeDecay>(InverseTimeDecayOptions{
      .initial_learning_rate = 0.1, .decay_steps = 2.5, .decay_rate = 0.5, .staircase = true, .name = "inv"});
  m["CosineDecayRestarts"] = std::make_shared<CosineDecayRestarts>(0.1, 100, 1.5, 0.8, 0.05, "sgdr");
  return m;
}

Json actual_configs() {
  Json actual = Json::object();
  auto opt = [&](const std::string& key, const Json& j) { actual[key] = Optimizer::from_json(j)->to_json().dump(); };
  const Json base = base_full_config();
  for (const auto& [cls, own] : own_full_configs()) {
    opt(cls + "_default", Json{{"class_name", cls}});
    opt(cls + "_full", Json{{"class_name", cls}, {"config", with(base, own)}});
    Json nulls = all_null(with(base, own));
    if (cls == "AdamW") nulls.erase("weight_decay");  // AdamW refuses a null weight_decay
    opt(cls + "_nulls", Json{{"class_name", cls}, {"config", nulls}});
  }
  // The other clip options, a learning-rate schedule, accumulation off (0).
  opt("Adam_clipvalue", Json{{"class_name", "Adam"}, {"config", {{"clipvalue", 0.5}}}});
  opt("Adam_global_clipnorm", Json{{"class_name", "Adam"}, {"config", {{"global_clipnorm", 2.0}}}});
  opt("SGD_schedule",
      Json{
          {"class_name", "SGD"},
          {"config", {{"learning_rate", {{"class_name", "ExponentialDecay"}, {"config", schedule_cases()[0].full}}}}}});
  opt("Adam_accumulation_off", Json{{"class_name", "Adam"}, {"config", {{"gradient_accumulation_steps", 0}}}});
  // Zeros where a positive value turns an option on: written as null.
  opt("Adam_zeros", Json{{"class_name", "Adam"},
                         {"config",
                          {{"weight_decay", 0},
                           {"clipnorm", 0},
                           {"ema_overwrite_frequency", 0},
                           {"gradient_accumulation_steps", 0},
                           {"use_ema", false}}}});
  opt("Adam_integer_learning_rate", Json{{"class_name", "Adam"}, {"config", {{"learning_rate", 1}}}});
  opt("LossScaleOptimizer_default",
      Json{{"class_name", "LossScaleOptimizer"}, {"config", {{"inner_optimizer", {{"class_name", "Adam"}}}}}});
  opt("LossScaleOptimizer_full",
      Json{{"class_name", "LossScaleOptimizer"},
           {"config",
            {{"name", "lso"},
             {"inner_optimizer", {{"class_name", "SGD"}, {"config", with(base, own_full_configs().at("SGD"))}}},
             {"initial_scale", 1024.0},
             {"dynamic_growth_steps", 100},
             {"dynamic", false}}}});
  for (const auto& [key, o] : typed_optimizers()) actual[key + "_options"] = o->to_json().dump();
  actual["LossScaleOptimizer_options"] =
      std::make_shared<LossScaleOptimizer>(
          typed_optimizers().at("Adam"),
          LossScaleOptions{.initial_scale = 256, .dynamic_growth_steps = 10, .dynamic = false}, "lso")
          ->to_json()
          .dump();

  auto sched = [&](const std::string& key, const std::string& cls, const Json& config) {
    actual[key] = LearningRateSchedule::from_json(Json{{"class_name", cls}, {"config", config}})->to_json().dump();
  };
  for (const auto& c : schedule_cases()) {
    sched(c.cls + "_required", c.cls, c.required);
    sched(c.cls + "_full", c.cls, c.full);
    Json nulls = c.full;
    for (const auto& key : c.required.items()) nulls.erase(key.key());
    sched(c.cls + "_nulls", c.cls, with(all_null(nulls), c.required));
  }
  // Whole-number floats where Keras writes integer steps.
  sched("ExponentialDecay_float_steps", "ExponentialDecay",
        {{"initial_learning_rate", 1}, {"decay_steps", 100.0}, {"decay_rate", 0.5}});
  for (const auto& [cls, s] : typed_schedules()) actual[cls + "_options"] = s->to_json().dump();
  return actual;
}

TEST(OptimizerConfigsGolden, ConfigsMatchGolden) {
  if (write_or_expect_golden_configs(actual_configs(), "kiln/optimizers/testdata/optimizer_configs_golden.json"))
    GTEST_SKIP() << "wrote the golden configs";
}

// Every registered optimizer class has its cases above.
TEST(OptimizerConfigsGolden, EveryRegisteredOptimizerHasACase) {
  const Json actual = actual_configs();
  for (const auto& name : Optimizer::known_names()) {
    if (std::islower(static_cast<unsigned char>(name[0]))) continue;  // an alias ("adam")
    EXPECT_TRUE(actual.contains(name + "_default")) << name << " is registered but has no config golden case";
  }
}

}  // namespace
}  // namespace kiln
