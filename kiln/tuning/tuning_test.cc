// Search spaces, oracles, the GP, pruning, the trial store and the Tuner.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/names.h"
#include "kiln/core/random.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"
#include "kiln/training/callbacks.h"
#include "kiln/tuning/gaussian_process.h"
#include "kiln/tuning/oracles.h"
#include "kiln/tuning/trial_store.h"
#include "kiln/tuning/tuner.h"

namespace kiln::tuning {
namespace {

namespace fs = std::filesystem;

// --- hyperparameters ----------------------------------------------------------------------

TEST(HyperParameters, DeclareReturnsDefaultsThenAssignedValues) {
  HyperParameters hp;
  EXPECT_EQ(hp.Int("units", 16, 64, {.step = 16}), 16);
  EXPECT_EQ(hp.Choice("optimizer", std::vector<std::string>{"rmsprop", "adam"}), "rmsprop");
  EXPECT_DOUBLE_EQ(hp.Float("lr", 1e-4, 1e-2, {.sampling = Sampling::kLog, .default_value = 1e-3}), 1e-3);
  EXPECT_FALSE(hp.Boolean("dropout"));
  hp.set("units", int64_t{48});
  EXPECT_EQ(hp.Int("units", 16, 64, {.step = 16}), 48);  // re-declaring returns the assigned value
  EXPECT_EQ(hp.space().size(), 4u);
  expect_error<ValueError>([&] { hp.Float("units", 0, 1); }, {"'units'", "Int", "Float"});
  expect_error<ValueError>([&] { hp.Int("bad", 5, 1); }, {"min_value must be <= max_value", "min_value=5"});
  expect_error<ValueError>([&] { hp.Float("bad_log", 0.0, 1.0, {.sampling = Sampling::kLog}); }, {"min_value > 0"});
}

TEST(HyperParameters, SamplingRespectsRangeStepAndLogScale) {
  HyperParameters hp;
  hp.Int("units", 16, 64, {.step = 16});
  hp.Float("lr", 1e-5, 1e-1, {.sampling = Sampling::kLog});
  hp.Float("rate", 0.0, 0.5, {.step = 0.1});
  std::mt19937_64 rng(3);
  std::set<int64_t> units;
  int below_1e3 = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    int64_t u = std::get<int64_t>(hp.space()[0].sample(rng));
    EXPECT_TRUE(u >= 16 && u <= 64 && u % 16 == 0) << u;
    units.insert(u);
    double lr = std::get<double>(hp.space()[1].sample(rng));
    EXPECT_TRUE(lr >= 1e-5 && lr <= 1e-1);
    below_1e3 += lr < 1e-3;
    double r = std::get<double>(hp.space()[2].sample(rng));
    EXPECT_NEAR(r * 10, std::round(r * 10), 1e-9);
  }
  EXPECT_EQ(units, (std::set<int64_t>{16, 32, 48, 64}));
  // Log sampling: 1e-5..1e-3 is half of the log range (uniform would give 1%).
  EXPECT_NEAR(below_1e3 / double(n), 0.5, 0.05);
}

TEST(HyperParameters, EncodingRoundTripsAndOneHotsCategories) {
  HyperParameters hp;
  hp.Int("units", 16, 64, {.step = 16});
  hp.Float("lr", 1e-4, 1e-1, {.sampling = Sampling::kReverseLog});
  hp.Choice("act", std::vector<std::string>{"relu", "tanh", "gelu"});
  hp.Choice("width", std::vector<int64_t>{8, 16, 32}, {.ordered = true});
  hp.Boolean("bn");
  hp.Fixed("classes", int64_t{10});
  EXPECT_EQ(hp.encoded_size(), 1 + 1 + 3 + 1 + 1);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    HyperParameters p = hp.copy_space();
    for (auto& h : hp.space()) p.set(h.name, h.sample(rng));
    auto x = p.encode();
    for (double v : x) EXPECT_TRUE(v >= 0 && v <= 1);
    HyperParameters q = hp.copy_space();
    q.decode(x);
    for (auto& [k, v] : p.values()) {
      if (std::holds_alternative<double>(v))
        EXPECT_NEAR(q.get_float(k), std::get<double>(v), 1e-12 * std::abs(std::get<double>(v))) << k;
      else
        EXPECT_EQ(value_to_string(q.get(k)), value_to_string(v)) << k;
    }
  }
  HyperParameters p = hp.copy_space();
  p.set("act", std::string("tanh"));
  auto x = p.encode();
  EXPECT_EQ(std::vector<double>(x.begin() + 2, x.begin() + 5), (std::vector<double>{0, 1, 0}));
}

TEST(HyperParameters, ConditionalScopesActivateOnlyForTheirParentValues) {
  auto declare = [](HyperParameters& hp) {
    std::string model = hp.Choice("model", std::vector<std::string>{"mlp", "cnn"});
    {
      auto scope = hp.conditional_scope("model", {std::string("cnn")});
      hp.Int("filters", 8, 32, {.step = 8});
    }
    {
      auto scope = hp.conditional_scope("model", {std::string("mlp")});
      hp.Int("units", 16, 64, {.step = 16});
    }
    return model;
  };
  HyperParameters hp;
  declare(hp);
  ASSERT_EQ(hp.space().size(), 3u);
  EXPECT_EQ(hp.space()[1].conditions.at(0).parent, "model");
  // mlp (default): units active, filters not.
  EXPECT_TRUE(hp.contains("units"));
  EXPECT_FALSE(hp.contains("filters"));
  EXPECT_THROW(hp.get("filters"), NotFoundError);
  hp.set("model", std::string("cnn"));
  EXPECT_TRUE(hp.contains("filters"));
  EXPECT_FALSE(hp.contains("units"));
  std::vector<std::string> names;
  for (auto& [k, v] : hp.values()) names.push_back(k);
  EXPECT_EQ(names, (std::vector<std::string>{"model", "filters"}));
  // Inactive dimensions encode as 0.5.
  auto x = hp.encode();
  EXPECT_DOUBLE_EQ(x.back(), 0.5);
  // A scope needs a declared parent.
  expect_error<ValueError>([&] { auto s = hp.conditional_scope("nope", {true}); }, {"'nope'", "declare it"});
  // JSON round trip keeps the conditions.
  HyperParameters back = HyperParameters::from_json(hp.to_json());
  EXPECT_EQ(back.fingerprint(), hp.fingerprint());
  EXPECT_EQ(back.space()[2].conditions.at(0).parent, "model");
}

TEST(HyperParameters, JsonSearchSpaceFormat) {
  Json j = Json::parse(R"([
    {"type": "Int", "name": "units", "min_value": 32, "max_value": 256, "step": 32},
    {"type": "Float", "name": "lr", "min_value": 0.0001, "max_value": 0.01, "sampling": "log"},
    {"type": "Choice", "name": "act", "values": ["relu", "gelu"]},
    {"type": "Boolean", "name": "bn", "default": true},
    {"type": "Int", "name": "depth", "min_value": 1, "max_value": 3,
     "conditions": [{"name": "bn", "values": [true]}]}])");
  HyperParameters hp = HyperParameters::from_json(j);
  EXPECT_EQ(hp.space().size(), 5u);
  EXPECT_TRUE(hp.get_bool("bn"));
  EXPECT_TRUE(hp.contains("depth"));
  expect_error<ValueError>([] { HyperParameters::from_json(Json::parse(R"([{"type": "Bogus", "name": "x"}])")); },
                           {"unknown type \"Bogus\""});
  expect_error<ValueError>(
      [] {
        HyperParameters::from_json(
            Json::parse(R"([{"type": "Float", "name": "x", "min_value": 1, "max_value": 2, "sampling": "cubic"}])"));
      },
      {"sampling", "cubic"});
}

// --- objective and trials --------------------------------------------------------------------

TEST(Objective, InfersKnownDirectionsAndRequiresCustomOnes) {
  EXPECT_EQ(Objective("val_accuracy").direction(), Direction::kMax);
  EXPECT_EQ(Objective("val_loss").direction(), Direction::kMin);
  EXPECT_EQ(Objective("mae").direction(), Direction::kMin);
  EXPECT_EQ(Objective("val_head_auc").direction(), Direction::kMax);
  expect_error<ValueError>([] { Objective("val_f2"); }, {"\"val_f2\"", "direction"});
  EXPECT_EQ(Objective("val_f2", Direction::kMax).direction(), Direction::kMax);
  EXPECT_EQ(Objective::from_json(Json::parse(R"({"name": "val_f2", "direction": "min"})")).direction(),
            Direction::kMin);
}

TEST(Trial, LegalTransitionsOnly) {
  Trial t;
  t.trial_id = "7";
  t.set_status(TrialStatus::kRunning);  // resume
  t.set_status(TrialStatus::kFailed);
  t.set_status(TrialStatus::kRunning);  // retry
  t.set_status(TrialStatus::kCompleted);
  for (auto to : {TrialStatus::kRunning, TrialStatus::kFailed, TrialStatus::kStopped})
    expect_error<StateError>([&] { t.set_status(to); }, {"trial 7", "COMPLETED ->"});
  Trial f;
  f.set_status(TrialStatus::kFailed);
  EXPECT_THROW(f.set_status(TrialStatus::kCompleted), StateError);  // a failed trial must run again first
  Trial s;
  s.set_status(TrialStatus::kStopped);
  EXPECT_THROW(s.set_status(TrialStatus::kRunning), StateError);
  Trial i;
  i.set_status(TrialStatus::kInvalid);
  EXPECT_THROW(i.set_status(TrialStatus::kRunning), StateError);
}

TEST(Trial, ScoreIsTheBestStep) {
  Trial t;
  Objective obj("val_accuracy");
  t.record({{"val_accuracy", 0.5}, {"loss", 1.0}}, 0, obj);
  t.record({{"val_accuracy", 0.8}, {"loss", 0.7}}, 1, obj);
  t.record({{"val_accuracy", 0.7}, {"loss", 0.6}}, 2, obj);
  EXPECT_DOUBLE_EQ(*t.score, 0.8);
  EXPECT_EQ(t.best_step, 1);
  Trial back = Trial::from_json(t.to_json());
  EXPECT_DOUBLE_EQ(*back.score, 0.8);
  EXPECT_EQ(back.metrics.at("loss").size(), 3u);
}

// --- oracles ---------------------------------------------------------------------------------

HyperParameters small_space() {
  HyperParameters hp;
  hp.Int("a", 0, 2);
  hp.Choice("b", std::vector<std::string>{"x", "y"});
  return hp;
}

TEST(RandomSearch, NeverRepeatsAndStopsOnlyWhenTheFiniteSpaceIsExhausted) {
  RandomSearchOracle oracle({.objective = "loss", .max_trials = 100, .seed = 1});
  oracle.update_space(small_space());
  std::set<std::string> seen;
  Next next = Next::kTrial;
  int n = 0;
  while (true) {
    Trial t = oracle.create_trial("w", &next);
    if (next != Next::kTrial) break;
    EXPECT_TRUE(seen.insert(t.hyperparameters.fingerprint()).second);
    oracle.update_trial(t.trial_id, {{"loss", 1.0 * n}}, 0);
    oracle.end_trial(t.trial_id, TrialStatus::kCompleted);
    ++n;
  }
  EXPECT_EQ(next, Next::kDone);
  EXPECT_EQ(n, 6);  // 3 x 2: every point, no early stop on collisions
}

TEST(GridSearch, WalksEveryCombinationInOrderRespectingConditions) {
  GridSearchOracle oracle({.objective = "loss", .max_trials = 0});
  HyperParameters hp;
  hp.Boolean("deep");
  {
    auto s = hp.conditional_scope("deep", {true});
    hp.Int("layers", 2, 3);
  }
  hp.Choice("act", std::vector<std::string>{"relu", "tanh"});
  oracle.update_space(hp);
  std::vector<std::string> order;
  Next next;
  while (true) {
    Trial t = oracle.create_trial("w", &next);
    if (next != Next::kTrial) break;
    order.push_back(t.hyperparameters.fingerprint());
    oracle.end_trial(t.trial_id, TrialStatus::kCompleted, "", 0.0);
  }
  // deep=false: 2 points; deep=true: 2 x 2 points.
  ASSERT_EQ(order.size(), 6u);
  EXPECT_EQ(order[0], "deep=false;act=\"relu\";");
  EXPECT_EQ(order[2], "deep=true;layers=2;act=\"relu\";");
  HyperParameters cont;
  cont.Float("lr", 0.1, 1.0);
  GridSearchOracle bad({.objective = "loss"});
  bad.update_space(cont);
  expect_error<ValueError>([&] { bad.create_trial("w"); }, {"'lr'", "step"});
}

TEST(Hyperband, KerasTunerBracketScheduleForMaxEpochs100Factor3) {
  HyperbandOracle hb({.objective = "val_loss", .max_trials = 0}, {.max_epochs = 100, .factor = 3});
  // B = 5 brackets (100 / 3^k >= 1 for k = 0..4). ceil(1 + log3(100)) = 6 trials
  // end each bracket's scale: size(s, r) = ceil(6 / 3^s * 3^(s - r)),
  // epochs(s, r) = ceil(100 / 3^(s - r)).
  ASSERT_EQ(hb.num_brackets(), 5);
  std::vector<std::vector<int>> sizes = {{6}, {6, 2}, {6, 2, 1}, {6, 2, 1, 1}, {6, 2, 1, 1, 1}};
  std::vector<std::vector<int>> epochs = {{100}, {34, 100}, {12, 34, 100}, {4, 12, 34, 100}, {2, 4, 12, 34, 100}};
  for (int s = 0; s < 5; ++s) {
    ASSERT_EQ(hb.num_rounds(s), s + 1);
    for (int r = 0; r <= s; ++r) {
      EXPECT_EQ(hb.size(s, r), sizes[s][r]) << "bracket " << s << " round " << r;
      EXPECT_EQ(hb.epochs(s, r), epochs[s][r]) << "bracket " << s << " round " << r;
    }
  }
}

TEST(Hyperband, PromotesTheBestOfARoundWithItsParentsEpochs) {
  HyperbandOracle hb({.objective = "val_loss", .max_trials = 0, .seed = 2}, {.max_epochs = 9, .factor = 3});
  HyperParameters hp;
  hp.Float("x", 0.0, 1.0);
  hb.update_space(hp);
  ASSERT_EQ(hb.num_brackets(), 3);
  // First bracket (s = 2): round 0 has size(2, 0) trials of epochs(2, 0) epochs.
  const int n0 = hb.size(2, 0);
  std::vector<Trial> round0;
  for (int i = 0; i < n0; ++i) {
    Next next;
    Trial t = hb.create_trial("w", &next);
    ASSERT_EQ(next, Next::kTrial);
    EXPECT_EQ(t.hyperparameters.get_int("tuner/epochs"), hb.epochs(2, 0));
    EXPECT_EQ(t.hyperparameters.get_int("tuner/initial_epoch"), 0);
    round0.push_back(t);
  }
  // While round 0 runs, the next proposal opens the next bracket, never a promotion.
  for (auto& t : round0) {
    hb.update_trial(t.trial_id, {{"val_loss", t.hyperparameters.get_float("x")}}, 0);
    hb.end_trial(t.trial_id, TrialStatus::kCompleted);
  }
  Next next;
  Trial promoted = hb.create_trial("w", &next);
  ASSERT_EQ(next, Next::kTrial);
  EXPECT_EQ(promoted.hyperparameters.get_int("tuner/round"), 1);
  EXPECT_EQ(promoted.hyperparameters.get_int("tuner/initial_epoch"), hb.epochs(2, 0));
  EXPECT_EQ(promoted.hyperparameters.get_int("tuner/epochs"), hb.epochs(2, 1));
  // The best (lowest x) of round 0 goes first.
  double best_x = 2;
  std::string best_id;
  for (auto& t : round0)
    if (t.hyperparameters.get_float("x") < best_x) {
      best_x = t.hyperparameters.get_float("x");
      best_id = t.trial_id;
    }
  EXPECT_EQ(promoted.hyperparameters.get_string("tuner/trial_id"), best_id);
  EXPECT_DOUBLE_EQ(promoted.hyperparameters.get_float("x"), best_x);
}

// --- Bayesian optimization -----------------------------------------------------------------------

double branin(double x1, double x2) {  // x1 in [-5, 10], x2 in [0, 15]; minimum 0.397887
  const double a = 1, b = 5.1 / (4 * M_PI * M_PI), c = 5 / M_PI, r = 6, s = 10, t = 1 / (8 * M_PI);
  return a * std::pow(x2 - b * x1 * x1 + c * x1 - r, 2) + s * (1 - t) * std::cos(x1) + s;
}

double hartmann6(const std::vector<double>& x) {  // x in [0,1]^6; minimum -3.32237
  static const double A[4][6] = {
      {10, 3, 17, 3.5, 1.7, 8}, {0.05, 10, 17, 0.1, 8, 14}, {3, 3.5, 1.7, 10, 17, 8}, {17, 8, 0.05, 10, 0.1, 14}};
  static const double P[4][6] = {{1312, 1696, 5569, 124, 8283, 5886},
                                 {2329, 4135, 8307, 3736, 1004, 9991},
                                 {2348, 1451, 3522, 2883, 3047, 6650},
                                 {4047, 8828, 8732, 5743, 1091, 381}};
  static const double alpha[4] = {1.0, 1.2, 3.0, 3.2};
  double y = 0;
  for (int i = 0; i < 4; ++i) {
    double inner = 0;
    for (int j = 0; j < 6; ++j) inner += A[i][j] * std::pow(x[j] - P[i][j] * 1e-4, 2);
    y -= alpha[i] * std::exp(-inner);
  }
  return y;
}

// Best value found after `budget` evaluations of f (minimized).
double run_oracle(Oracle& oracle, int budget, const std::function<double(const HyperParameters&)>& f) {
  double best = 1e300;
  for (int i = 0; i < budget; ++i) {
    Next next;
    Trial t = oracle.create_trial("w", &next);
    if (next != Next::kTrial) break;
    double y = f(t.hyperparameters);
    best = std::min(best, y);
    oracle.update_trial(t.trial_id, {{"loss", y}}, 0);
    oracle.end_trial(t.trial_id, TrialStatus::kCompleted);
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct RegretComparison {
  double gp_median, random_median;
  int gp_wins;
};

RegretComparison compare(const HyperParameters& space, const std::function<double(const HyperParameters&)>& f,
                         double optimum, int budget, int seeds, int initial) {
  std::vector<double> gp, rnd;
  int wins = 0;
  for (int s = 0; s < seeds; ++s) {
    BayesianOptimizationOracle bo({.objective = "loss", .max_trials = budget, .seed = 100 + (uint64_t)s},
                                  {.num_initial_points = initial, .num_candidates = 1000});
    bo.update_space(space);
    RandomSearchOracle rs({.objective = "loss", .max_trials = budget, .seed = 100 + (uint64_t)s});
    rs.update_space(space);
    gp.push_back(run_oracle(bo, budget, f) - optimum);
    rnd.push_back(run_oracle(rs, budget, f) - optimum);
    wins += gp.back() < rnd.back();
  }
  return {median(gp), median(rnd), wins};
}

TEST(BayesianOptimization, BeatsRandomSearchOnBranin) {
  HyperParameters space;
  space.Float("x1", -5, 10);
  space.Float("x2", 0, 15);
  auto f = [](const HyperParameters& hp) { return branin(hp.get_float("x1"), hp.get_float("x2")); };
  auto r = compare(space, f, 0.397887, /*budget=*/30, /*seeds=*/5, /*initial=*/6);
  // Random search's median regret at 30 evaluations is around 1; a working GP
  // gets within a few hundredths. Both a large margin and a majority of seeds.
  EXPECT_LT(r.gp_median, 0.5 * r.random_median) << "GP " << r.gp_median << " random " << r.random_median;
  EXPECT_GE(r.gp_wins, 4) << "GP " << r.gp_median << " random " << r.random_median;
}

TEST(BayesianOptimization, BeatsRandomSearchOnHartmann6) {
  HyperParameters space;
  for (int j = 0; j < 6; ++j) space.Float("x" + std::to_string(j), 0, 1);
  auto f = [](const HyperParameters& hp) {
    std::vector<double> x(6);
    for (int j = 0; j < 6; ++j) x[j] = hp.get_float("x" + std::to_string(j));
    return hartmann6(x);
  };
  auto r = compare(space, f, -3.32237, /*budget=*/40, /*seeds=*/5, /*initial=*/12);
  EXPECT_LT(r.gp_median, 0.5 * r.random_median) << "GP " << r.gp_median << " random " << r.random_median;
  EXPECT_GE(r.gp_wins, 4) << "GP " << r.gp_median << " random " << r.random_median;
}

TEST(BayesianOptimization, ConcurrentProposalsDifferAndCategoriesWork) {
  BayesianOptimizationOracle bo({.objective = "loss", .max_trials = 50, .seed = 4}, {.num_initial_points = 4});
  HyperParameters space;
  space.Float("x", 0, 1);
  space.Choice("kind", std::vector<std::string>{"a", "b", "c"});
  bo.update_space(space);
  auto f = [](const HyperParameters& hp) {
    return std::pow(hp.get_float("x") - 0.3, 2) + (hp.get_string("kind") == "b" ? 0.0 : 1.0);
  };
  run_oracle(bo, 8, f);
  // Three workers ask before any reports back: the constant liar spreads them.
  std::set<std::string> fps;
  std::vector<Trial> running;
  for (int i = 0; i < 3; ++i) {
    Trial t = bo.create_trial("w" + std::to_string(i));
    EXPECT_TRUE(fps.insert(t.hyperparameters.fingerprint()).second);
    running.push_back(t);
  }
  for (auto& t : running) bo.end_trial(t.trial_id, TrialStatus::kCompleted, "", f(t.hyperparameters));
  run_oracle(bo, 10, f);
  EXPECT_EQ(bo.get_best_trials(1)[0].hyperparameters.get_string("kind"), "b");
}

TEST(GaussianProcess, InterpolatesAndLearnsIrrelevantDimensions) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (int i = 0; i < 30; ++i) {
    X.push_back({u(rng), u(rng)});
    y.push_back(std::sin(6 * X.back()[0]));  // dimension 1 does not matter
  }
  GaussianProcess gp;
  gp.fit(X, y, 1e-6, 1);
  double m, s;
  gp.predict({0.5, 0.5}, &m, &s);
  EXPECT_NEAR(m, std::sin(3.0), 0.1);
  EXPECT_GT(gp.length_scales()[1], 2 * gp.length_scales()[0]);
}

// --- pruning ---------------------------------------------------------------------------------------

Trial with_history(const std::string& id, std::vector<double> values) {
  Trial t;
  t.trial_id = id;
  Objective obj("val_loss");
  for (size_t i = 0; i < values.size(); ++i) t.record({{"val_loss", values[i]}}, (int)i, obj);
  return t;
}

TEST(Pruning, MedianRule) {
  Objective obj("val_loss");
  std::vector<Trial> others = {with_history("a", {1.0, 0.8, 0.6}), with_history("b", {1.1, 0.9, 0.7}),
                               with_history("c", {0.9, 0.7, 0.5})};
  std::vector<const Trial*> ptrs;
  for (auto& t : others) ptrs.push_back(&t);
  MedianPruner pruner(/*n_startup_trials=*/3, /*n_warmup_steps=*/1);
  EXPECT_FALSE(pruner.should_prune(with_history("bad", {5.0}), 0, ptrs, obj));  // warm-up
  EXPECT_TRUE(pruner.should_prune(with_history("bad", {5.0, 4.0}), 1, ptrs, obj));
  EXPECT_FALSE(pruner.should_prune(with_history("good", {0.9, 0.75}), 1, ptrs, obj));
  std::vector<const Trial*> two(ptrs.begin(), ptrs.begin() + 2);
  EXPECT_FALSE(pruner.should_prune(with_history("bad", {5.0, 4.0}), 1, two, obj));  // too few to judge
}

TEST(Pruning, AshaKeepsTheTopThirdAtEachRung) {
  Objective obj("val_loss");
  std::vector<Trial> others;
  for (int i = 0; i < 5; ++i) others.push_back(with_history(std::to_string(i), {1.0 + i, 0.5 + i, 0.2 + i}));
  std::vector<const Trial*> ptrs;
  for (auto& t : others) ptrs.push_back(&t);
  AshaPruner asha(/*min_resource=*/1, /*reduction_factor=*/3);
  // Rungs at 1, 3, 9 epochs = steps 0, 2, 8. Six trials at a rung keep the best 2.
  EXPECT_FALSE(asha.should_prune(with_history("t", {0.5}), 0, ptrs, obj));  // best
  EXPECT_FALSE(asha.should_prune(with_history("t", {1.5}), 0, ptrs, obj));  // second
  EXPECT_TRUE(asha.should_prune(with_history("t", {2.5}), 0, ptrs, obj));
  EXPECT_FALSE(asha.should_prune(with_history("t", {9.0, 9.0}), 1, ptrs, obj));  // not a rung
  EXPECT_TRUE(asha.should_prune(with_history("t", {0.5, 0.5, 3.0}), 2, ptrs, obj));
}

TEST(Pruning, OracleStopsTrialsThePrunerRejects) {
  RandomSearchOracle oracle(
      {.objective = "val_loss", .max_trials = 10, .seed = 1, .pruner = std::make_shared<MedianPruner>(2, 0)});
  HyperParameters hp;
  hp.Float("x", 0, 1);
  oracle.update_space(hp);
  for (int i = 0; i < 2; ++i) {
    Trial t = oracle.create_trial("w");
    EXPECT_EQ(oracle.update_trial(t.trial_id, {{"val_loss", 1.0}}, 0), TrialStatus::kRunning);
    oracle.end_trial(t.trial_id, TrialStatus::kCompleted);
  }
  Trial bad = oracle.create_trial("w");
  EXPECT_EQ(oracle.update_trial(bad.trial_id, {{"val_loss", 3.0}}, 0), TrialStatus::kStopped);
}

// --- store and resume --------------------------------------------------------------------------------

TEST(TrialStore, PersistsTrialsInWalMode) {
  TempDir dir;
  const std::string path = dir.path() + "/p/trials.db";
  {
    TrialStore store(path);
    EXPECT_EQ(store.journal_mode(), "wal");
    Trial t;
    t.trial_id = "0";
    t.hyperparameters = small_space();
    t.record({{"loss", 0.5}}, 0, Objective("loss"));
    store.put_trial(t);
    t.set_status(TrialStatus::kCompleted);
    store.put_trial(t);  // update in place
    store.put_state("oracle", Json{{"next_id", 1}});
  }
  TrialStore again(path, /*read_only=*/true);
  auto trials = again.load_trials();
  ASSERT_EQ(trials.size(), 1u);
  EXPECT_EQ(trials[0].status, TrialStatus::kCompleted);
  EXPECT_DOUBLE_EQ(*trials[0].score, 0.5);
  EXPECT_EQ((*again.get_state("oracle"))["next_id"], 1);
  // Not a database: a clear error naming the file.
  std::ofstream(dir.path() + "/junk.db") << "this is not sqlite";
  expect_error<FormatError>([&] { TrialStore junk(dir.path() + "/junk.db"); }, {"junk.db"});
  expect_error<NotFoundError>([&] { TrialStore missing(dir.path() + "/none.db", true); }, {"none.db"});
}

TEST(TrialStore, OracleReloadKeepsCompletedAndRequeuesInterruptedTrials) {
  TempDir dir;
  const std::string path = dir.path() + "/trials.db";
  std::string interrupted_id, interrupted_fp;
  {
    RandomSearchOracle oracle({.objective = "loss", .max_trials = 5, .seed = 9});
    oracle.update_space(small_space());
    oracle.attach_store(std::make_shared<TrialStore>(path));
    for (int i = 0; i < 2; ++i) {
      Trial t = oracle.create_trial("w");
      oracle.update_trial(t.trial_id, {{"loss", 1.0 + i}}, 0);
      oracle.end_trial(t.trial_id, TrialStatus::kCompleted);
    }
    Trial t = oracle.create_trial("w");  // the process "dies" during this one
    interrupted_id = t.trial_id;
    interrupted_fp = t.hyperparameters.fingerprint();
  }
  RandomSearchOracle oracle({.objective = "loss", .max_trials = 5, .seed = 9});
  oracle.update_space(small_space());
  oracle.attach_store(std::make_shared<TrialStore>(path));
  EXPECT_EQ(oracle.count(TrialStatus::kCompleted), 2);
  Trial again = oracle.create_trial("w");
  EXPECT_EQ(again.trial_id, interrupted_id);
  EXPECT_EQ(again.hyperparameters.fingerprint(), interrupted_fp);
  oracle.end_trial(again.trial_id, TrialStatus::kCompleted, "", 0.1);
  Next next;
  int created = 0;
  while (true) {
    Trial t = oracle.create_trial("w", &next);
    if (next != Next::kTrial) break;
    EXPECT_NE(t.trial_id, interrupted_id);
    oracle.end_trial(t.trial_id, TrialStatus::kCompleted, "", 1.0);
    ++created;
  }
  EXPECT_EQ(created, 2);  // 5 in all, none twice
  EXPECT_EQ(oracle.count(TrialStatus::kCompleted), 5);
  // A directory with another kind of search is refused.
  GridSearchOracle grid({.objective = "loss"});
  expect_error<ValueError>([&] { grid.attach_store(std::make_shared<TrialStore>(path)); },
                           {"RandomSearch", "GridSearch"});
}

// --- Tuner end to end ---------------------------------------------------------------------------------

struct Data {
  at::Tensor x, y, xv, yv;
};

Data toy_data() {
  at::manual_seed(0);
  at::Tensor x = at::randn({256, 4});
  at::Tensor y = (x.select(1, 0) + 0.5 * x.select(1, 1) > 0).to(at::kLong);
  at::Tensor xv = at::randn({128, 4});
  at::Tensor yv = (xv.select(1, 0) + 0.5 * xv.select(1, 1) > 0).to(at::kLong);
  return {x, y, xv, yv};
}

ModelPtr build_toy(HyperParameters& hp) {
  auto m = models::Sequential();
  m->add(layers::Input({4}));
  m->add(layers::Dense(hp.Int("units", 4, 16, {.step = 4}), "relu"));
  m->add(layers::Dense(2, "softmax"));
  const double lr = hp.Float("lr", 1e-3, 1e-1, {.sampling = Sampling::kLog, .default_value = 1e-2});
  CompileArgs c = CompileArgs::from_names("adam", "sparse_categorical_crossentropy", {"accuracy"});
  c.optimizer->set_learning_rate(lr);
  m->compile(c);
  return m;
}

FitArgs toy_fit(const Data& d, int epochs) {
  FitArgs a;
  a.x = {d.x};
  a.y = {d.y};
  a.validation_x = {d.xv};
  a.validation_y = {d.yv};
  a.epochs = epochs;
  a.batch_size = 64;
  a.verbose = 0;
  return a;
}

TEST(Tuner, RandomSearchEndToEndWithBestModelsAndSummaries) {
  TempDir dir;
  set_random_seed(1);
  Data d = toy_data();
  Tuner tuner(make_oracle("random_search", {.objective = "val_accuracy", .max_trials = 3, .seed = 1}), build_toy,
              {.directory = dir.path(), .project_name = "toy", .keep_checkpoints = 2, .verbose = 0});
  std::ostringstream space;
  tuner.search_space_summary(space);
  EXPECT_NE(space.str().find("units (Int)\n{'default': None, 'conditions': [], 'min_value': 4, 'max_value': 16, "
                             "'step': 4, 'sampling': 'linear'}"),
            std::string::npos)
      << space.str();
  tuner.search(toy_fit(d, 3));
  EXPECT_EQ(tuner.oracle().count(TrialStatus::kCompleted), 3);
  auto best = tuner.oracle().get_best_trials(3);
  ASSERT_EQ(best.size(), 3u);
  EXPECT_GE(*best[0].score, *best[2].score);
  // The best model is the best epoch's: its val accuracy equals the trial's score.
  ModelPtr model = tuner.get_best_models(1)[0];
  auto r = model->evaluate({.x = {d.xv}, .y = {d.yv}, .batch_size = 64});
  EXPECT_NEAR(r.at("accuracy"), *best[0].score, 1e-6);
  // Only the best 2 trials keep checkpoints.
  EXPECT_FALSE(best[2].checkpoint.empty() && fs::exists(tuner.trial_dir(best[2].trial_id) + "/best"));
  EXPECT_FALSE(fs::exists(tuner.trial_dir(tuner.oracle().get_best_trials(3)[2].trial_id) + "/best"));
  std::ostringstream results;
  tuner.results_summary(2, results);
  EXPECT_NE(results.str().find("Trial " + best[0].trial_id + " summary"), std::string::npos) << results.str();
  EXPECT_NE(results.str().find("Score: "), std::string::npos);
  EXPECT_EQ(tuner.get_best_hyperparameters(1)[0].fingerprint(), best[0].hyperparameters.fingerprint());
  // History export.
  tuner.export_history(dir.path() + "/h.jsonl", "jsonl");
  tuner.export_history(dir.path() + "/h.csv", "csv");
  std::ifstream jl(dir.path() + "/h.jsonl");
  int lines = 0;
  for (std::string line; std::getline(jl, line);) {
    Json j = Json::parse(line);
    EXPECT_EQ(j["metrics"]["val_accuracy"].size(), 3u);
    ++lines;
  }
  EXPECT_EQ(lines, 3);
}

// Throws from a callback mid-trial: what a crash leaves in the store. It
// dies as epoch 2 begins, after epoch 1's backup (BackupAndRestore saves
// after every other callback's on_epoch_end, so a throw there would come
// before that epoch's backup).
struct Crash : callbacks::Callback {
  void on_epoch_begin(int epoch, const Logs&) override {
    if (epoch == 2) throw std::runtime_error("simulated crash");
  }
};

TEST(Tuner, ResumeKeepsCompletedTrialsAndFinishesTheInterruptedOne) {
  TempDir dir;
  Data d = toy_data();
  TunerOptions opts{.directory = dir.path(), .project_name = "resume", .verbose = 0};
  // A first search completes 3 trials; a second one over the same project
  // (overwrite=false) with a budget of 5 keeps them and runs 2 more.
  {
    auto oracle = make_oracle("random_search", {.objective = "val_accuracy", .max_trials = 3, .seed = 5});
    Tuner tuner(oracle, build_toy, opts);
    tuner.search(toy_fit(d, 3));
  }
  {
    auto oracle = make_oracle("random_search", {.objective = "val_accuracy", .max_trials = 5, .seed = 5});
    Tuner tuner(oracle, build_toy, opts);
    tuner.search(toy_fit(d, 3));
    EXPECT_EQ(tuner.oracle().count(TrialStatus::kCompleted), 5);
    std::set<std::string> fps;
    for (auto& t : tuner.oracle().trials()) EXPECT_TRUE(fps.insert(t.hyperparameters.fingerprint()).second);
  }
  // An interrupted trial (left RUNNING by a crash) is run again, with the
  // same values, and resumes from its BackupAndRestore checkpoint.
  const std::string path = dir.path() + "/resume/trials.db";
  std::string crashed_id;
  {
    auto oracle = make_oracle("random_search", {.objective = "val_accuracy", .max_trials = 6, .seed = 5});
    oracle->attach_store(std::make_shared<TrialStore>(path));
    HyperParameters hp;
    build_toy(hp);
    oracle->update_space(hp);
    Trial t = oracle->create_trial("w");
    crashed_id = t.trial_id;
    // Train two epochs of it with a backup, then "die" (no end_trial).
    HyperParameters values = oracle->space();
    for (auto& [k, v] : t.hyperparameters.values()) values.set(k, v);
    clear_session();  // as the tuner does before each trial's build
    ModelPtr m = build_toy(values);
    FitArgs a = toy_fit(d, 3);
    a.callbacks = {callbacks::BackupAndRestore(dir.path() + "/resume/trial_" + crashed_id + "/backup_0"),
                   std::make_shared<Crash>()};
    EXPECT_THROW(m->fit(a), std::runtime_error);
  }
  auto oracle = make_oracle("random_search", {.objective = "val_accuracy", .max_trials = 6, .seed = 5});
  Tuner tuner(oracle, build_toy, opts);
  tuner.search(toy_fit(d, 3));
  Trial resumed = tuner.oracle().get_trial(crashed_id);
  EXPECT_EQ(resumed.status, TrialStatus::kCompleted);
  // Epochs 0 and 1 ran before the crash; the resumed run reports epoch 2 only.
  EXPECT_EQ(resumed.metrics.at("val_accuracy").size(), 1u);
  EXPECT_EQ(resumed.metrics.at("val_accuracy")[0].step, 2);
  EXPECT_EQ(tuner.oracle().count(TrialStatus::kCompleted), 6);
}

TEST(Tuner, BuildErrorsMakeTrialsInvalidAndSetUpErrorsAreReported) {
  TempDir dir;
  Data d = toy_data();
  int calls = 0;
  auto flaky = [&](HyperParameters& hp) -> ModelPtr {
    int64_t u = hp.Int("units", 4, 8, {.step = 4});
    if (calls++ > 0 && u == 8) throw ValueError("units=8 does not fit");
    auto m = models::Sequential();
    m->add(layers::Input({4}));
    m->add(layers::Dense(u, "relu"));
    m->add(layers::Dense(2, "softmax"));
    m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    return m;
  };
  Tuner tuner(make_oracle("grid_search", {.objective = "val_accuracy", .max_trials = 0}), flaky,
              {.directory = dir.path(), .project_name = "inv", .verbose = 0});
  tuner.search(toy_fit(d, 1));
  EXPECT_GE(tuner.oracle().count(TrialStatus::kInvalid), 1);
  EXPECT_GE(tuner.oracle().count(TrialStatus::kCompleted), 1);
  // An objective the logs do not have is a set-up error, reported at once.
  Tuner wrong(make_oracle("random_search", {.objective = Objective("val_f9", Direction::kMax), .max_trials = 2}),
              build_toy, {.directory = dir.path(), .project_name = "wrong", .verbose = 0});
  expect_error<ValueError>([&] { wrong.search(toy_fit(d, 1)); }, {"\"val_f9\"", "val_accuracy"});
}

TEST(Tuner, HyperparametersFirstDeclaredInLaterBuildsJoinTheSpace) {
  TempDir dir;
  Data d = toy_data();
  auto build = [](HyperParameters& hp) -> ModelPtr {
    auto m = models::Sequential();
    m->add(layers::Input({4}));
    int64_t units = 4;
    if (hp.Boolean("wide")) {  // false in the first (default) build
      auto scope = hp.conditional_scope("wide", {true});
      units = hp.Int("wide_units", 8, 16, {.step = 8});
    }
    m->add(layers::Dense(units, "relu"));
    m->add(layers::Dense(2, "softmax"));
    m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    return m;
  };
  Tuner tuner(make_oracle("grid_search", {.objective = "val_accuracy", .max_trials = 0}), build,
              {.directory = dir.path(), .project_name = "grow", .verbose = 0});
  tuner.search(toy_fit(d, 1));
  ASSERT_NE(tuner.oracle().space().find("wide_units"), nullptr);
  std::set<int64_t> tried;
  for (auto& t : tuner.oracle().trials())
    if (t.hyperparameters.contains("wide_units")) tried.insert(t.hyperparameters.get_int("wide_units"));
  EXPECT_EQ(tried, (std::set<int64_t>{8, 16}));
}

TEST(Tuner, HyperbandPromotionsContinueFromTheParentCheckpoint) {
  TempDir dir;
  Data d = toy_data();
  auto oracle =
      std::make_shared<HyperbandOracle>(OracleOptions{.objective = "val_accuracy", .max_trials = 0, .seed = 3},
                                        HyperbandOptions{.max_epochs = 3, .factor = 3});
  Tuner tuner(oracle, build_toy, {.directory = dir.path(), .project_name = "hb", .verbose = 0});
  tuner.search(toy_fit(d, 100));
  bool saw_promotion = false;
  for (auto& t : tuner.oracle().trials()) {
    if (!t.hyperparameters.contains("tuner/trial_id")) continue;
    saw_promotion = true;
    // A promoted trial trains epochs [initial_epoch, epochs) only.
    auto h = t.metrics.at("val_accuracy");
    EXPECT_EQ(h.front().step, t.hyperparameters.get_int("tuner/initial_epoch"));
    EXPECT_EQ(h.back().step + 1, t.hyperparameters.get_int("tuner/epochs"));
  }
  EXPECT_TRUE(saw_promotion);
  EXPECT_TRUE(tuner.oracle().done());
}

TEST(Tuner, FinalTrainingRecipe) {
  Data d = toy_data();
  HyperParameters hp;
  build_toy(hp);
  auto r = retrain_on_full_data(build_toy, hp, toy_fit(d, 8), "val_loss", /*patience=*/2);
  EXPECT_GE(r.best_epoch, 1);
  EXPECT_EQ(r.final_epochs, (int)std::ceil(r.best_epoch * 1.2));
  ASSERT_TRUE(r.model);
  auto res = r.model->evaluate({.x = {d.xv}, .y = {d.yv}, .batch_size = 64});
  EXPECT_GT(res.at("accuracy"), 0.7);
}

}  // namespace
}  // namespace kiln::tuning
