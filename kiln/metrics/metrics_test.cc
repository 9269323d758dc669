#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/losses/crossentropy.h"
#include "kiln/losses/regression.h"
#include "kiln/metrics/accuracy_metrics.h"
#include "kiln/metrics/confusion_metrics.h"
#include "kiln/metrics/metric.h"
#include "kiln/metrics/regression_metrics.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

using namespace metrics;

at::Tensor f32(std::vector<float> v) { return at::tensor(v, at::kFloat); }
at::Tensor i64(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }

// --- golden data (PyTorch reference, scripts/golden/make_golden.py) -------------------

TEST(MetricsGolden, MatchPyTorchReference) {
  Json golden = load_golden("kiln/metrics/testdata/metrics_golden.json");
  ASSERT_GE(golden["cases"].size(), 25u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    MetricPtr m = Metric::from_json(c["metric"]);
    const auto& batches = c["batches"];
    for (size_t b = 0; b < batches.size(); ++b) {
      m->update_state(golden_tensor(batches[b]["y_true"]), golden_tensor(batches[b]["y_pred"]),
                      golden_tensor(batches[b]["sample_weight"]));
      const double want = c["results"][b].get<double>();
      EXPECT_NEAR(m->result(), want, 1e-9 + 1e-6 * std::abs(want)) << "after batch " << b;
    }
  }
}

// --- accumulation, reset, weights -------------------------------------------------------

// Feeding batches one by one gives the result of one update with everything.
TEST(Metrics, AccumulationAcrossBatchesEqualsOneShot) {
  at::Tensor labels = at::randint(0, 2, {60}).to(at::kFloat);
  at::Tensor scores = (labels + at::randn({60})).sigmoid().unsqueeze(1);  // (N, 1) against (N,)
  at::Tensor weights = at::rand({60});
  at::Tensor cls = at::randint(0, 4, {60}, at::kLong);
  at::Tensor probs = at::randn({60, 4}).softmax(-1);
  std::vector<std::pair<MetricPtr, MetricPtr>> pairs = {
      {std::make_shared<BinaryAccuracy>(), std::make_shared<BinaryAccuracy>()},
      {std::make_shared<AUC>(), std::make_shared<AUC>()},
      {std::make_shared<Precision>(), std::make_shared<Precision>()},
      {std::make_shared<Recall>(), std::make_shared<Recall>()},
      {std::make_shared<metrics::MeanAbsoluteError>(), std::make_shared<metrics::MeanAbsoluteError>()},
  };
  for (auto& [batched, whole] : pairs) {
    SCOPED_TRACE(batched->class_name());
    for (int64_t i = 0; i < 60; i += 20)
      batched->update_state(labels.slice(0, i, i + 20), scores.slice(0, i, i + 20), weights.slice(0, i, i + 20));
    whole->update_state(labels, scores, weights);
    EXPECT_NEAR(batched->result(), whole->result(), 1e-9);
    EXPECT_GT(whole->result(), 0.0);
  }
  SparseCategoricalAccuracy a, b;
  for (int64_t i = 0; i < 60; i += 25) a.update_state(cls.slice(0, i, i + 25), probs.slice(0, i, i + 25));
  b.update_state(cls, probs);
  EXPECT_NEAR(a.result(), b.result(), 1e-12);
}

// On a GPU every metric accumulates where the values are (no host copy per
// batch) and gives the CPU's result.
TEST(MetricsCUDA, AccumulatorsStayOnTheGpuAndMatchTheCpu) {
  const at::Device gpu(at::kCUDA, 0);
  at::Tensor labels = at::randint(0, 2, {60, 1}).to(at::kFloat);
  at::Tensor scores = (labels + at::randn({60, 1})).sigmoid();
  at::Tensor weights = at::rand({60});
  at::Tensor onehot = at::one_hot(at::randint(0, 3, {60}, at::kLong), 3).to(at::kFloat);
  at::Tensor probs = at::randn({60, 3}).softmax(-1);
  struct Case {
    Json config;
    at::Tensor y_true, y_pred;
  };
  const std::vector<Case> cases = {
      {Json{{"class_name", "AUC"}, {"config", Json::object()}}, labels, scores},
      {Json{{"class_name", "AUC"}, {"config", {{"thresholds", {0.2, 0.5, 0.7}}, {"curve", "PR"}}}}, labels, scores},
      {Json{{"class_name", "Precision"}, {"config", Json::object()}}, labels, scores},
      {Json{{"class_name", "Recall"}, {"config", Json::object()}}, labels, scores},
      {Json{{"class_name", "F1Score"}, {"config", {{"average", "macro"}}}}, onehot, probs},
      {Json{{"class_name", "R2Score"}, {"config", Json::object()}}, onehot, probs},
      {Json{{"class_name", "MeanIoU"}, {"config", {{"num_classes", 3}, {"sparse_y_pred", false}}}}, onehot.argmax(-1),
       probs},
      {Json{{"class_name", "BinaryAccuracy"}, {"config", Json::object()}}, labels, scores},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config.dump());
    MetricPtr on_cpu = Metric::from_json(c.config), on_gpu = Metric::from_json(c.config);
    for (int64_t i = 0; i < 60; i += 20) {
      on_cpu->update_state(c.y_true.slice(0, i, i + 20), c.y_pred.slice(0, i, i + 20), weights.slice(0, i, i + 20));
      on_gpu->update_state(c.y_true.slice(0, i, i + 20).to(gpu), c.y_pred.slice(0, i, i + 20).to(gpu),
                           weights.slice(0, i, i + 20).to(gpu));
    }
    for (const at::Tensor& v : on_gpu->variables()) EXPECT_TRUE(v.is_cuda());
    EXPECT_NEAR(on_gpu->result(), on_cpu->result(), 1e-6);
    on_gpu->reset_state();
    for (const at::Tensor& v : on_gpu->variables()) EXPECT_TRUE(v.is_cuda());
  }
}

TEST(Metrics, ResetStateClearsAccumulators) {
  std::vector<MetricPtr> all = {Metric::get("binary_accuracy"), Metric::get("auc"), Metric::get("precision"),
                                Metric::get("recall"), Metric::get("mse")};
  at::Tensor y = f32({1, 0, 1, 1});
  at::Tensor p = f32({0.9, 0.2, 0.3, 0.8});
  for (auto& m : all) {
    SCOPED_TRACE(m->class_name());
    m->update_state(y, p);
    const double first = m->result();
    m->update_state(1 - y, p);  // moves the result
    m->reset_state();
    EXPECT_EQ(m->result(), 0.0);
    for (auto& v : m->variables()) {
      EXPECT_EQ(v.scalar_type(), at::kDouble);
      EXPECT_EQ(v.abs().sum().item<double>(), 0.0);
    }
    m->update_state(y, p);
    EXPECT_DOUBLE_EQ(m->result(), first);
  }
}

TEST(Metrics, WeightsCountLikeKeras) {
  BinaryAccuracy acc;
  // Hits: 1, 0, 1; weights 2, 1, 0 -> (2*1 + 1*0) / 3.
  acc.update_state(f32({1, 1, 0}), f32({0.7, 0.2, 0.1}), f32({2, 1, 0}));
  EXPECT_NEAR(acc.result(), 2.0 / 3, 1e-12);
  // Unweighted samples each count once afterwards.
  acc.update_state(f32({1}), f32({0.9}));
  EXPECT_NEAR(acc.result(), 3.0 / 4, 1e-12);

  Mean mean("loss");
  mean.update(2.0, 1.0);
  mean.update(5.0, 3.0);
  EXPECT_NEAR(mean.result(), 17.0 / 4, 1e-12);
  mean.update_state(f32({1, 3}));  // two samples
  EXPECT_NEAR(mean.result(), 21.0 / 6, 1e-12);
  mean.update_state(f32({10, 20}), at::Tensor(), f32({0, 1}));
  EXPECT_NEAR(mean.result(), 41.0 / 7, 1e-12);
}

// Summing two replicas' variables gives the metric over both shards: what a
// distributed trainer does before result().
TEST(Metrics, VariablesSumAcrossReplicas) {
  at::Tensor y = at::randint(0, 2, {40}).to(at::kFloat);
  at::Tensor p = at::rand({40});
  for (const char* name : {"auc", "binary_accuracy", "precision"}) {
    SCOPED_TRACE(name);
    MetricPtr r0 = Metric::get(name), r1 = Metric::get(name), whole = Metric::get(name);
    r0->update_state(y.slice(0, 0, 25), p.slice(0, 0, 25));
    r1->update_state(y.slice(0, 25, 40), p.slice(0, 25, 40));
    whole->update_state(y, p);
    auto v0 = r0->variables(), v1 = r1->variables();
    for (size_t i = 0; i < v0.size(); ++i) v0[i].add_(v1[i]);  // in place, as an allreduce does
    EXPECT_NEAR(r0->result(), whole->result(), 1e-12);
  }
}

// --- accuracy metrics ----------------------------------------------------------------------

TEST(Accuracy, VariantsOnSmallCases) {
  at::Tensor probs = f32({0.1, 0.7, 0.2, 0.5, 0.3, 0.2, 0.2, 0.3, 0.5}).reshape({3, 3});
  at::Tensor labels = i64({1, 1, 2});  // hits: yes, no, yes
  SparseCategoricalAccuracy sparse;
  sparse.update_state(labels, probs);
  EXPECT_NEAR(sparse.result(), 2.0 / 3, 1e-12);
  SparseCategoricalAccuracy sparse_n1;
  sparse_n1.update_state(labels.reshape({3, 1}), probs);
  EXPECT_NEAR(sparse_n1.result(), 2.0 / 3, 1e-12);
  CategoricalAccuracy cat;
  cat.update_state(at::one_hot(labels, 3).to(at::kFloat), probs);
  EXPECT_NEAR(cat.result(), 2.0 / 3, 1e-12);
  SparseTopKCategoricalAccuracy top2(2);
  top2.update_state(labels, probs);  // row 1: label 1 scores 0.3, second best -> hit
  EXPECT_NEAR(top2.result(), 1.0, 1e-12);
  SparseTopKCategoricalAccuracy top1(1);
  top1.update_state(labels, probs);
  EXPECT_NEAR(top1.result(), 2.0 / 3, 1e-12);
  TopKCategoricalAccuracy top5;  // k beyond the class count: always a hit
  top5.update_state(at::one_hot(labels, 3).to(at::kFloat), probs);
  EXPECT_EQ(top5.result(), 1.0);
  Accuracy exact;
  exact.update_state(f32({1, 2, 3}), f32({1, 2, 4}));
  EXPECT_NEAR(exact.result(), 2.0 / 3, 1e-12);
}

TEST(Accuracy, TopKTiesAtTheBoundaryCount) {
  // Scores tie at the k-th place: both tied classes count as in the top k.
  at::Tensor probs = f32({0.4, 0.3, 0.3}).reshape({1, 3});
  SparseTopKCategoricalAccuracy top2(2);
  top2.update_state(i64({2}), probs);
  EXPECT_EQ(top2.result(), 1.0);
}

TEST(Accuracy, ResolvedFromLossKeepsTheUsersName) {
  losses::SparseCategoricalCrossentropy scce;
  losses::CategoricalCrossentropy cce;
  losses::BinaryCrossentropy bce;
  MetricPtr a = Metric::get("accuracy", &scce);
  EXPECT_EQ(a->class_name(), "SparseCategoricalAccuracy");
  EXPECT_EQ(a->name(), "accuracy");
  EXPECT_EQ(Metric::get("acc", &cce)->class_name(), "CategoricalAccuracy");
  EXPECT_EQ(Metric::get("acc", &cce)->name(), "acc");
  EXPECT_EQ(Metric::get("accuracy", &bce)->class_name(), "BinaryAccuracy");
  EXPECT_TRUE(a->higher_is_better());

  // Any other loss: decided by the shapes of the first batch (Keras 3).
  losses::MeanSquaredError mse;
  auto binary = std::dynamic_pointer_cast<AutoAccuracy>(Metric::get("accuracy", &mse));
  ASSERT_TRUE(binary);
  binary->update_state(f32({1, 0}), f32({0.8, 0.6}).reshape({2, 1}));
  EXPECT_EQ(binary->resolved(), "binary_accuracy");
  EXPECT_NEAR(binary->result(), 0.5, 1e-12);
  auto sparse = std::dynamic_pointer_cast<AutoAccuracy>(Metric::get("accuracy"));
  sparse->update_state(i64({0, 1}), f32({0.8, 0.2, 0.9, 0.1}).reshape({2, 2}));
  EXPECT_EQ(sparse->resolved(), "sparse_categorical_accuracy");
  EXPECT_NEAR(sparse->result(), 0.5, 1e-12);
  auto cat = std::dynamic_pointer_cast<AutoAccuracy>(Metric::get("accuracy"));
  cat->update_state(f32({0, 1, 0, 1}).reshape({2, 2}), f32({0.2, 0.8, 0.9, 0.1}).reshape({2, 2}));
  EXPECT_EQ(cat->resolved(), "categorical_accuracy");
  EXPECT_NEAR(cat->result(), 0.5, 1e-12);
}

// --- AUC, precision, recall -------------------------------------------------------------------

TEST(AUC, PerfectlySeparableIsOne) {
  AUC auc;
  auc.update_state(f32({0, 0, 0, 1, 1, 1}), f32({0.05, 0.2, 0.4, 0.6, 0.8, 0.99}));
  EXPECT_NEAR(auc.result(), 1.0, 1e-12);
  AUC inverted;
  inverted.update_state(f32({1, 1, 0, 0}), f32({0.05, 0.2, 0.6, 0.8}));
  EXPECT_NEAR(inverted.result(), 0.0, 1e-12);
}

TEST(AUC, KnownValue) {
  // Scores in distinct threshold buckets: the trapezoids give the exact
  // ROC AUC, 3 of 4 positive/negative pairs ordered correctly.
  AUC auc;
  auc.update_state(i64({0, 0, 1, 1}), f32({0.1, 0.4, 0.35, 0.8}));
  EXPECT_NEAR(auc.result(), 0.75, 1e-9);
  // Labels count as booleans (any non-zero is positive), as Keras casts them.
  AUC nonbinary;
  nonbinary.update_state(f32({0, 0, 2, 2}), f32({0.1, 0.4, 0.35, 0.8}));
  EXPECT_NEAR(nonbinary.result(), 0.75, 1e-9);
  // All predictions equal: the diagonal.
  AUC flat;
  flat.update_state(f32({0, 1, 0, 1}), f32({0.5, 0.5, 0.5, 0.5}));
  EXPECT_NEAR(flat.result(), 0.5, 1e-9);
  // Logits go through a sigmoid first.
  AUC::Options o;
  o.from_logits = true;
  AUC logits(o);
  logits.update_state(i64({0, 0, 1, 1}), f32({0.1, 0.4, 0.35, 0.8}).logit());
  EXPECT_NEAR(logits.result(), 0.75, 1e-9);
  EXPECT_EQ(auc.variables().size(), 4u);
  EXPECT_EQ(auc.variables()[0].size(0), 200);
  EXPECT_EQ(auc.thresholds().front(), -1e-7);
  EXPECT_NEAR(auc.thresholds()[1], 1.0 / 199, 1e-15);
}

TEST(AUC, RejectsBadOptions) {
  AUC::Options o;
  o.num_thresholds = 1;
  expect_error<ValueError>([&] { AUC a(o); }, {"num_thresholds=1"});
  o = AUC::Options();
  o.curve = "DET";
  expect_error<ValueError>([&] { AUC a(o); }, {"curve=DET"});
  o = AUC::Options();
  o.summation_method = "simpson";
  expect_error<ValueError>([&] { AUC a(o); }, {"simpson"});
  EXPECT_THROW(Metric::from_json(Json{{"class_name", "AUC"}, {"config", {{"multi_label", true}}}}), ValueError);
  EXPECT_THROW(Metric::from_json(Json{{"class_name", "AUC"}, {"config", {{"thresholds", {0.5, 1.5}}}}}), ValueError);
}

TEST(PrecisionRecall, CountsAndThreshold) {
  at::Tensor y = f32({1, 1, 0, 0, 1});
  at::Tensor p = f32({0.9, 0.4, 0.6, 0.1, 0.5});  // 0.5 is not > 0.5
  Precision prec;
  prec.update_state(y, p);
  EXPECT_NEAR(prec.result(), 0.5, 1e-12);  // tp 1, fp 1
  Recall rec;
  rec.update_state(y, p);
  EXPECT_NEAR(rec.result(), 1.0 / 3, 1e-12);  // tp 1, fn 2
  Recall low(0.3);
  low.update_state(y, p);
  EXPECT_NEAR(low.result(), 1.0, 1e-12);
  Precision empty;
  EXPECT_EQ(empty.result(), 0.0);  // nothing predicted positive yet
  EXPECT_THROW(Precision(1.5), ValueError);
  EXPECT_THROW(Metric::from_json(Json{{"class_name", "Precision"}, {"config", {{"thresholds", {0.3, 0.6}}}}}),
               ValueError);
  EXPECT_THROW(Metric::from_json(Json{{"class_name", "Recall"}, {"config", {{"top_k", 3}}}}), ValueError);
}

// --- names, configs, direction ------------------------------------------------------------------

TEST(Metrics, GetNamesMetricsAsGiven) {
  EXPECT_EQ(Metric::get("mae")->class_name(), "MeanAbsoluteError");
  EXPECT_EQ(Metric::get("mae")->name(), "mae");
  EXPECT_EQ(Metric::get("mean_squared_error")->class_name(), "MeanSquaredError");
  EXPECT_EQ(Metric::get("auc")->name(), "auc");
  EXPECT_EQ(Metric::get("AUC")->class_name(), "AUC");
  EXPECT_EQ(Metric::get("sparse_top_k_categorical_accuracy")->class_name(), "SparseTopKCategoricalAccuracy");
  const std::string msg = error_of<ValueError>([] { Metric::get("acuracy"); });
  EXPECT_NE(msg.find("'acuracy'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("binary_accuracy"), std::string::npos) << msg;
  expect_error<ValueError>([] { TopKCategoricalAccuracy(0); }, {"k=0"});
  expect_error<ValueError>(
      [] {
        Metric::from_json(Json{{"class_name", "BinaryAccuracy"}, {"config", {{"treshold", 1}}}});
      },
      {"treshold"});
}

TEST(Metrics, HigherIsBetter) {
  for (const char* name :
       {"accuracy", "binary_accuracy", "categorical_accuracy", "sparse_categorical_accuracy",
        "top_k_categorical_accuracy", "sparse_top_k_categorical_accuracy", "auc", "precision", "recall"})
    EXPECT_TRUE(Metric::get(name)->higher_is_better()) << name;
  for (const char* name : {"mae", "mse", "Mean"}) EXPECT_FALSE(Metric::get(name)->higher_is_better()) << name;
}

TEST(Metrics, ConfigRoundTrip) {
  AUC::Options pr;
  pr.curve = "PR";
  pr.summation_method = "majoring";
  pr.num_thresholds = 50;
  pr.name = "pr_auc";
  AUC::Options custom;
  custom.thresholds = {0.2, 0.5, 0.7};
  std::vector<MetricPtr> all = {
      std::make_shared<Mean>("loss"),
      std::make_shared<Accuracy>("exact"),
      std::make_shared<BinaryAccuracy>("bacc", 0.3),
      std::make_shared<CategoricalAccuracy>(),
      std::make_shared<SparseCategoricalAccuracy>("acc"),
      std::make_shared<TopKCategoricalAccuracy>(3, "top3"),
      std::make_shared<SparseTopKCategoricalAccuracy>(2),
      std::make_shared<AUC>(pr),
      std::make_shared<AUC>(custom),
      std::make_shared<Precision>(0.7, 2, "p2"),
      std::make_shared<Recall>(),
      std::make_shared<metrics::MeanAbsoluteError>("mae"),
      std::make_shared<metrics::MeanSquaredError>(),
  };
  for (const auto& m : all) {
    Json j = m->to_json();
    SCOPED_TRACE(j.dump());
    MetricPtr back = Metric::from_json(Json::parse(j.dump()));
    EXPECT_EQ(back->to_json(), j);
    EXPECT_EQ(back->name(), m->name());
  }
}

}  // namespace
}  // namespace kiln
