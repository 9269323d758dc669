// Ensembles: weights with a known optimum, greedy selection, trees, saving.
#include "kiln/ensemble/ensemble.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/ensemble/gradient_boosted_trees.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/saving/model_io.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"

namespace kiln::ensemble {
namespace {

// A member that returns fixed probabilities for the rows of x (x holds row ids).
class Fixed : public Predictor {
 public:
  explicit Fixed(at::Tensor probs) : probs_(std::move(probs)) {}
  Tensors predict(const Tensors& x, int64_t) override {
    return {probs_.index_select(0, x[0].reshape({-1}).to(at::kLong))};
  }
  Json signatures() override { return Json::object(); }
  std::string kind() const override { return "fixed"; }
  void save_to(const std::string&) override {}

 private:
  at::Tensor probs_;
};

at::Tensor random_probs(int64_t n, int64_t c, at::Generator gen) {
  return at::softmax(at::randn({n, c}, gen, at::kDouble) * 2, 1);
}

TEST(Ensemble, WeightsRecoverTheMixtureThatGeneratedTheLabels) {
  // Labels drawn from q = 0.7 p1 + 0.3 p2 (+ 0 p3): the log-loss optimum over
  // the simplex converges to (0.7, 0.3, 0) as n grows.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const int64_t n = 20000, c = 4;
  at::Tensor p1 = random_probs(n, c, gen), p2 = random_probs(n, c, gen), p3 = random_probs(n, c, gen);
  at::Tensor q = 0.7 * p1 + 0.3 * p2;
  at::Tensor y = at::multinomial(q, 1, false, gen).squeeze(1);
  at::Tensor ids = at::arange(n);
  Ensemble e;
  e.add("p1", std::make_shared<Fixed>(p1), false);
  e.add("p2", std::make_shared<Fixed>(p2), false);
  e.add("p3", std::make_shared<Fixed>(p3), false);
  double loss = e.fit_weights(ids, y);
  EXPECT_NEAR(e.weights()[0], 0.7, 0.04);
  EXPECT_NEAR(e.weights()[1], 0.3, 0.04);
  EXPECT_LT(e.weights()[2], 0.03);
  // Better than every member alone and than plain averaging.
  for (auto* p : {&p1, &p2, &p3}) EXPECT_LT(loss, Ensemble::log_loss(*p, y));
  EXPECT_LT(loss, Ensemble::log_loss((p1 + p2 + p3) / 3, y));
  EXPECT_NEAR(loss, Ensemble::log_loss(e.predict_proba(ids).to(at::kDouble), y), 1e-5);
}

TEST(Ensemble, GreedySelectionNeverWorsensTheBestMemberAndSkipsUselessOnes) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t n = 5000, c = 3;
  at::Tensor truth = random_probs(n, c, gen);
  at::Tensor y = at::multinomial(truth, 1, false, gen).squeeze(1);
  // Two noisy views of the truth (complementary) and one that is pure noise.
  at::Tensor a = at::softmax(truth.log() + 0.8 * at::randn({n, c}, gen, at::kDouble), 1);
  at::Tensor b = at::softmax(truth.log() + 0.8 * at::randn({n, c}, gen, at::kDouble), 1);
  at::Tensor noise = random_probs(n, c, gen);
  at::Tensor ids = at::arange(n);
  Ensemble e;
  e.add("a", std::make_shared<Fixed>(a), false);
  e.add("b", std::make_shared<Fixed>(b), false);
  e.add("noise", std::make_shared<Fixed>(noise), false);
  double loss = e.select_greedy(ids, y, 20);
  const double best_single = std::min(Ensemble::log_loss(a, y), Ensemble::log_loss(b, y));
  EXPECT_LT(loss, best_single);
  EXPECT_GT(e.weights()[0], 0.2);
  EXPECT_GT(e.weights()[1], 0.2);
  EXPECT_DOUBLE_EQ(e.weights()[2], 0.0);
  double sum = 0;
  for (double w : e.weights()) sum += w;
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

TEST(Ensemble, AveragingAndLogitsDetection) {
  at::Tensor logits = at::tensor({2.0, -1.0, 0.5, 3.0}, at::kDouble).reshape({2, 2});
  at::Tensor probs = at::tensor({0.9, 0.1, 0.2, 0.8}, at::kDouble).reshape({2, 2});
  Ensemble e;
  e.add("logits", std::make_shared<Fixed>(logits));  // detected: softmax applied
  e.add("probs", std::make_shared<Fixed>(probs));
  e.average();
  at::Tensor ids = at::arange(2);
  at::Tensor expected = (at::softmax(logits, 1) + probs) / 2;
  EXPECT_TRUE(at::allclose(e.predict_proba(ids).to(at::kDouble), expected, 1e-6, 1e-6));
  expect_error<ValueError>([&] { e.set_weights({1.0}); }, {"2 members but 1 weights"});
  expect_error<ValueError>([&] { e.set_weights({-1.0, 2.0}); }, {">= 0"});
  expect_error<ValueError>([&] { e.add("probs", std::make_shared<Fixed>(probs)); }, {"already named 'probs'"});
}

// A mixed_bfloat16 model's softmax rows sum to 1 only within bfloat16's
// rounding: they are probabilities all the same, and a second softmax would
// flatten them (Nelder-Mead then gave all the weight to one member).
TEST(Ensemble, BFloat16ProbabilitiesAreNotTakenForLogits) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor probs = random_probs(64, 10, gen);
  at::Tensor bf = probs.to(at::kBFloat16);
  ASSERT_GT((bf.to(at::kDouble).sum(1) - 1).abs().max().item<double>(), 1e-3);  // what float32's tolerance refused
  at::Tensor logits = at::randn({64, 10}, gen, at::kDouble).to(at::kBFloat16);
  Ensemble e;
  e.add("bf16_probs", std::make_shared<Fixed>(bf));
  e.add("bf16_logits", std::make_shared<Fixed>(logits));
  e.set_weights({1.0, 0.0});
  at::Tensor ids = at::arange(64);
  EXPECT_TRUE(at::allclose(e.predict_proba(ids).to(at::kDouble), bf.to(at::kDouble), 1e-6, 1e-6));
  e.set_weights({0.0, 1.0});
  EXPECT_TRUE(at::allclose(e.predict_proba(ids).to(at::kDouble), at::softmax(logits.to(at::kDouble), 1), 1e-6, 1e-6));
}

at::Tensor two_moons_like(int64_t n, at::Tensor* y, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = at::rand({n, 6}, gen) * 2 - 1;
  // A non-linear rule trees find easily.
  *y = ((x.select(1, 0) * x.select(1, 1) > 0) ^ (x.select(1, 2) > 0.3)).to(at::kLong);
  return x.to(at::kFloat);
}

TEST(GradientBoostedTrees, LearnsANonLinearRuleAndRoundTrips) {
  TempDir dir;
  at::Tensor y, yv;
  at::Tensor x = two_moons_like(3000, &y, 1), xv = two_moons_like(1000, &yv, 2);
  auto gbt = std::make_shared<GradientBoostedTrees>(GradientBoostedTreesOptions{
      .num_class = 2, .max_depth = 4, .rounds = 60, .nthread = 1, .early_stopping_rounds = 10});
  gbt->fit(x, y, xv, yv);
  at::Tensor p = gbt->predict_proba(xv);
  EXPECT_EQ(p.sizes(), (at::IntArrayRef{1000, 2}));
  EXPECT_GT(Ensemble::accuracy(p, yv), 0.9);
  EXPECT_TRUE(at::allclose(p.sum(1), at::ones({1000}), 1e-5, 1e-5));
  gbt->save_to(dir.path() + "/gbt");
  auto again = load_predictor(dir.path() + "/gbt");
  EXPECT_EQ(again->kind(), "xgboost");
  EXPECT_TRUE(at::equal(again->predict({xv})[0], p));
  expect_error<ShapeError>([&] { gbt->predict_proba(at::zeros({2, 5})); }, {"6 features", "Received 5"});
  expect_error<ValueError>([] { GradientBoostedTrees({.num_class = 1}); }, {"num_class"});
  // A damaged booster file is a FormatError naming it.
  std::ofstream(dir.path() + "/gbt/xgboost.json") << "{ not a model";
  expect_error<FormatError>([&] { load_predictor(dir.path() + "/gbt"); }, {"xgboost.json"});
}

ModelPtr tiny_model(int64_t units, const std::string& last_activation) {
  auto m = models::Sequential();
  m->add(layers::Input({6}));
  m->add(layers::Dense(units, "relu"));
  m->add(layers::Dense(2, last_activation));
  m->compile("adam",
             last_activation == "softmax" ? "sparse_categorical_crossentropy" : "sparse_categorical_crossentropy",
             {"accuracy"});
  return m;
}

TEST(Ensemble, KilnModelsAndTreesSaveLoadAndPredictIdentically) {
  TempDir dir;
  set_random_seed(4);
  at::Tensor y, yv;
  at::Tensor x = two_moons_like(2000, &y, 5), xv = two_moons_like(500, &yv, 6);
  auto a = tiny_model(16, "softmax"), b = tiny_model(8, "softmax");
  for (auto& m : {a, b}) m->fit({.x = {x}, .y = {y}, .batch_size = 64, .epochs = 3, .verbose = 0});
  auto gbt = std::make_shared<GradientBoostedTrees>(
      GradientBoostedTreesOptions{.num_class = 2, .max_depth = 4, .rounds = 30, .nthread = 1});
  gbt->fit(x, y);
  Ensemble e;
  e.add("mlp_16", std::make_shared<ModelPredictor>(a));
  e.add("mlp_8", std::make_shared<ModelPredictor>(b));
  e.add("trees", gbt);
  e.fit_weights(xv, yv);
  auto rows = e.evaluate(xv, yv, xv, yv);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows.back().name, "ensemble");
  // The ensemble is at least as good as its best member on the data its weights were fitted on.
  double best_member = 1e9;
  for (size_t i = 0; i < 3; ++i) best_member = std::min(best_member, rows[i].val_log_loss);
  EXPECT_LE(rows.back().val_log_loss, best_member + 1e-9);
  EXPECT_NE(Ensemble::format_report(rows).find("ensemble"), std::string::npos);

  e.save(dir.path() + "/ens/1");
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/ens/1/members/2/xgboost.json"));
  auto loaded = load_predictor(dir.path() + "/ens/1");
  EXPECT_EQ(loaded->kind(), "ensemble");
  EXPECT_TRUE(at::equal(loaded->predict({xv})[0], e.predict({xv})[0]));
  Json sig = loaded->signatures();
  EXPECT_EQ(sig["serving_default"]["outputs"]["probabilities"]["shape"], Json::parse("[null, 2]"));
  // load_model takes it as a model (what show, predict, batch-predict and
  // the server load): the same predictions, the ensemble's signature.
  ModelPtr as_model = load_model(dir.path() + "/ens/1");
  EXPECT_EQ(as_model->class_name(), "Ensemble");
  EXPECT_TRUE(at::allclose(as_model->predict(xv, {.batch_size = 64}), e.predict({xv})[0], 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(as_model->predict_on_batch({xv})[0], e.predict({xv})[0], 1e-5, 1e-6));
  EXPECT_EQ(model_signatures(*as_model), sig);
  EXPECT_EQ(as_model->input_shapes(), (std::vector<Shape>{{kNone, 6}}));
  // The trees alone load as a model too.
  gbt->save_to(dir.path() + "/trees/1");
  EXPECT_TRUE(at::allclose(load_model(dir.path() + "/trees/1")->predict(xv), gbt->predict_proba(xv), 1e-5, 1e-6));
  // A damaged ensemble directory names the broken file.
  std::filesystem::remove(dir.path() + "/ens/1/members/1/weights.safetensors");
  try {
    load_predictor(dir.path() + "/ens/1");
    ADD_FAILURE() << "expected an error";
  } catch (const UserError& err) {
    EXPECT_NE(std::string(err.what()).find("members/1"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kiln::ensemble
