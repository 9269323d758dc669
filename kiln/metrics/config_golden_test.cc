// Every registered metric's config, byte for byte against
// testdata/metric_configs_golden.json: a saved model.json's compile config
// stays the same when a metric's config code changes. Each class is written
// with its default config and with full configs that set every key to a
// value other than its default. KILN_WRITE_CONFIG_GOLDEN=<file> writes the
// configs there instead (to make the golden file from a known-good build).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/metrics/metric.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

// The smallest config of each class (MeanIoU needs num_classes), and
// configs setting every key to a non-default value.
struct Configs {
  Json base = Json::object();
  std::vector<Json> full;
};

const std::map<std::string, Configs>& configs() {
  static const std::map<std::string, Configs> m = {
      {"AUC",
       {.full =
            {{{"name", "auc_pr"},
              {"num_thresholds", 50},
              {"curve", "PR"},
              {"summation_method", "majoring"},
              {"multi_label", false},
              {"num_labels", nullptr},
              {"label_weights", nullptr},
              {"from_logits", true}},
             {{"name", "auc_t"}, {"curve", "roc"}, {"summation_method", "minoring"}, {"thresholds", {0.25, 0.5}}}}}},
      {"Accuracy", {.full = {{{"name", "acc"}}}}},
      {"AutoAccuracy", {.full = {{{"name", "auto"}}}}},
      {"BinaryAccuracy", {.full = {{{"name", "bin"}, {"threshold", 0.7}}}}},
      {"CategoricalAccuracy", {.full = {{{"name", "cat"}}}}},
      {"F1Score", {.full = {{{"name", "f1"}, {"average", "macro"}, {"threshold", 0.4}}}}},
      {"FBetaScore", {.full = {{{"name", "fb"}, {"average", "weighted"}, {"beta", 2.0}, {"threshold", 0.6}}}}},
      {"Mean", {.full = {{{"name", "m"}}}}},
      {"MeanAbsoluteError", {.full = {{{"name", "l1"}}}}},
      {"MeanIoU",
       {.base = {{"num_classes", 3}},
        .full = {{{"name", "iou"},
                  {"num_classes", 4},
                  {"ignore_class", 0},
                  {"sparse_y_true", false},
                  {"sparse_y_pred", false},
                  {"axis", 1}}}}},
      {"MeanSquaredError", {.full = {{{"name", "l2"}}}}},
      {"Precision", {.full = {{{"name", "p"}, {"thresholds", 0.3}, {"top_k", nullptr}, {"class_id", 1}}}}},
      {"R2Score",
       {.full = {{{"name", "r2"}, {"class_aggregation", "variance_weighted_average"}, {"num_regressors", 2}},
                 {{"name", "r2_raw"}, {"class_aggregation", nullptr}}}}},
      {"Recall", {.full = {{{"name", "r"}, {"thresholds", {0.6}}, {"class_id", 2}}}}},
      {"RootMeanSquaredError", {.full = {{{"name", "rmse"}}}}},
      {"SparseCategoricalAccuracy", {.full = {{{"name", "scat"}}}}},
      {"SparseTopKCategoricalAccuracy", {.full = {{{"name", "stop"}, {"k", 2}, {"from_sorted_ids", false}}}}},
      {"TopKCategoricalAccuracy", {.full = {{{"name", "top"}, {"k", 3}}}}},
  };
  return m;
}

TEST(MetricConfigs, MatchGolden) {
  // The classes get() reaches through a name or an alias, and those listed
  // here (MeanIoU needs a config).
  std::set<std::string> classes;
  for (auto& n : Metric::known_names()) {
    try {
      classes.insert(Metric::get(n)->class_name());
    } catch (const ValueError&) {  // needs a config (MeanIoU)
    }
  }
  for (auto& [cls, c] : configs()) classes.insert(cls);
  Json actual = Json::object();
  auto add = [&](const std::string& key, const std::string& cls, const Json& config) {
    actual[key] = Metric::from_json(Json{{"class_name", cls}, {"config", config}})->to_json().dump();
  };
  for (auto& cls : classes) {
    SCOPED_TRACE(cls);
    ASSERT_TRUE(configs().count(cls)) << cls << " is registered but has no configs here";
    const Configs& c = configs().at(cls);
    add(cls, cls, c.base);
    for (size_t i = 0; i < c.full.size(); ++i) add(cls + "_full" + (i ? std::to_string(i + 1) : ""), cls, c.full[i]);
  }
  if (write_or_expect_golden_configs(actual, "kiln/metrics/testdata/metric_configs_golden.json"))
    GTEST_SKIP() << "wrote the golden configs";
}

}  // namespace
}  // namespace kiln
