// F1Score / FBetaScore, RootMeanSquaredError, MeanIoU and R2Score: golden
// values accumulated over several batches (numpy float64 formulas,
// scripts/golden/make_golden.py), reset, Keras's names and config round
// trips, hand-checked values and bad inputs.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/metrics/f_score.h"
#include "kiln/metrics/iou_metrics.h"
#include "kiln/metrics/metric.h"
#include "kiln/metrics/regression_metrics.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

using namespace metrics;

at::Tensor floats(std::vector<float> v) { return at::tensor(v, at::kFloat); }

// The per-class tensor for metrics that have one, else result().
at::Tensor full_result(const Metric& m) {
  if (auto* f = dynamic_cast<const FBetaScore*>(&m)) return f->result_per_class();
  if (auto* r = dynamic_cast<const R2Score*>(&m)) return r->result_per_class();
  return at::full({}, m.result(), at::kDouble);
}

TEST(Keras3MetricsGolden, MatchReferenceOverBatchesAndReset) {
  Json golden = load_golden("kiln/metrics/testdata/keras3_metrics_golden.json");
  ASSERT_GE(golden["cases"].size(), 20u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    MetricPtr m = Metric::from_json(c["metric"]);
    for (int pass = 0; pass < 2; ++pass) {  // the second pass after reset_state()
      for (size_t b = 0; b < c["batches"].size(); ++b) {
        const auto& batch = c["batches"][b];
        m->update_state(golden_tensor(batch["y_true"]), golden_tensor(batch["y_pred"]),
                        golden_tensor(batch["sample_weight"]));
        const Json& want = c["results"][b];
        at::Tensor got = full_result(*m);
        if (want.is_array()) {
          ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << "batch " << b;
          for (size_t i = 0; i < want.size(); ++i)
            EXPECT_NEAR(got[i].item<double>(), want[i].get<double>(), 1e-9) << "batch " << b << " class " << i;
          double mean = 0;
          for (const auto& v : want) mean += v.get<double>() / want.size();
          EXPECT_NEAR(m->result(), mean, 1e-9);
        } else {
          EXPECT_NEAR(m->result(), want.get<double>(), 1e-9) << "batch " << b;
        }
      }
      m->reset_state();
    }
  }
}

TEST(Keras3Metrics, RegistryNamesAndRoundTrip) {
  for (const auto& [alias, cls] :
       std::vector<std::pair<std::string, std::string>>{{"f1_score", "F1Score"},
                                                        {"fbeta_score", "FBetaScore"},
                                                        {"root_mean_squared_error", "RootMeanSquaredError"},
                                                        {"r2_score", "R2Score"}}) {
    SCOPED_TRACE(alias);
    MetricPtr m = Metric::get(alias);
    EXPECT_EQ(m->class_name(), cls);
    EXPECT_EQ(m->name(), alias);
    Json j = m->to_json();
    EXPECT_EQ(Metric::from_json(Json::parse(j.dump()))->to_json(), j);
  }
  Json f1 = Metric::get("f1_score")->get_config();
  EXPECT_TRUE(f1["average"].is_null());
  EXPECT_TRUE(f1["threshold"].is_null());
  EXPECT_FALSE(f1.contains("beta"));  // as Keras's F1Score.get_config
  EXPECT_EQ(Metric::get("r2_score")->get_config()["class_aggregation"], "uniform_average");
  EXPECT_EQ(Metric::get("r2_score")->get_config()["num_regressors"], 0);
  std::vector<MetricPtr> configured = {std::make_shared<F1Score>(std::string("weighted"), 0.3, "f1w"),
                                       std::make_shared<FBetaScore>(std::string("micro"), 2.0, std::nullopt),
                                       std::make_shared<MeanIoU>(3, -1, false, true, 1, "iou"),
                                       std::make_shared<R2Score>(std::nullopt, 2)};
  for (auto& m : configured) {
    Json j = m->to_json();
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(Metric::from_json(Json::parse(j.dump()))->to_json(), j);
  }
  // MeanIoU needs num_classes: a clear error for the bare name.
  const std::string msg = error_of<ValueError>([] { Metric::get("mean_iou"); });
  EXPECT_NE(msg.find("num_classes"), std::string::npos) << msg;
  EXPECT_EQ(Metric::from_json(Json{{"class_name", "MeanIoU"}, {"config", {{"num_classes", 2}}}})->name(), "mean_iou");
  EXPECT_TRUE(Metric::get("f1_score")->higher_is_better());
  EXPECT_FALSE(Metric::get("root_mean_squared_error")->higher_is_better());
}

TEST(Keras3Metrics, HandValues) {
  // F1 macro, argmax predictions: rows predict 0, 1, 1 for labels 0, 1, 0.
  // class 0: tp 1 fn 1 -> p 1, r 0.5, f 2/3; class 1: tp 1 fp 1 -> f 2/3.
  F1Score f1(std::string("macro"));
  at::Tensor y = floats({1, 0, 0, 1, 1, 0}).reshape({3, 2});
  at::Tensor p = floats({0.9f, 0.1f, 0.2f, 0.8f, 0.4f, 0.6f}).reshape({3, 2});
  f1.update_state(y, p);
  EXPECT_NEAR(f1.result(), 2.0 / 3, 1e-6);
  // An all-zero row predicts nothing (not every class).
  F1Score micro(std::string("micro"));
  micro.update_state(floats({1, 0}).reshape({1, 2}), floats({0, 0}).reshape({1, 2}));
  EXPECT_NEAR(micro.result(), 0.0, 1e-12);
  // RMSE of errors 3 and 4 (one output): sqrt(12.5).
  RootMeanSquaredError rmse;
  rmse.update_state(floats({0, 0}), floats({3, 4}));
  EXPECT_NEAR(rmse.result(), std::sqrt(12.5), 1e-12);
  // MeanIoU: true 0 0 1 1, pred 0 1 1 1: class 0 IoU 1/2, class 1 IoU 2/3.
  MeanIoU iou(2);
  iou.update_state(floats({0, 0, 1, 1}), floats({0, 1, 1, 1}));
  EXPECT_NEAR(iou.result(), (0.5 + 2.0 / 3) / 2, 1e-6);
  EXPECT_EQ(iou.confusion_matrix()[0][1].item<double>(), 1.0);
  // R2: a perfect prediction is 1, predicting the mean is 0.
  R2Score r2;
  r2.update_state(floats({1, 2, 3}).reshape({3, 1}), floats({1, 2, 3}).reshape({3, 1}));
  EXPECT_NEAR(r2.result(), 1.0, 1e-12);
  r2.reset_state();
  r2.update_state(floats({1, 2, 3}).reshape({3, 1}), floats({2, 2, 2}).reshape({3, 1}));
  EXPECT_NEAR(r2.result(), 0.0, 1e-12);
  // Reset returns to the empty state.
  iou.reset_state();
  EXPECT_EQ(iou.confusion_matrix().sum().item<double>(), 0.0);
  EXPECT_EQ(iou.result(), 0.0);
}

TEST(Keras3Metrics, BadArgumentsAndInputs) {
  expect_error<ValueError>([] { F1Score(std::string("samples")); }, {"average=samples"});
  expect_error<ValueError>([] { FBetaScore(std::nullopt, 0.0); }, {"beta=0"});
  expect_error<ValueError>([] { F1Score(std::nullopt, 1.5); }, {"threshold=1.5"});
  expect_error<ValueError>([] { MeanIoU(0); }, {"num_classes=0"});
  expect_error<ValueError>([] { R2Score(std::string("mean")); }, {"class_aggregation=mean"});
  expect_error<ValueError>([] { R2Score(std::string("uniform_average"), -1); }, {"num_regressors=-1"});
  EXPECT_THROW(Metric::from_json(Json{{"class_name", "F1Score"}, {"config", {{"beta", 2.0}}}}), ValueError);
  F1Score f1;
  EXPECT_THROW(f1.update_state(at::ones({4}), at::ones({4})), ShapeError);  // 2-D inputs only
  MeanIoU iou(2);
  const std::string range = error_of<ValueError>([&] { iou.update_state(floats({0, 2}), floats({0, 1})); });
  EXPECT_NE(range.find("class id 2"), std::string::npos) << range;
  R2Score r2;
  EXPECT_THROW(r2.update_state(at::ones({2, 2, 2}), at::ones({2, 2, 2})), ShapeError);
}

}  // namespace
}  // namespace kiln
