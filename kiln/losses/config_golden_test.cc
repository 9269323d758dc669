// Every registered loss's config, byte for byte against
// testdata/loss_configs_golden.json: a saved model.json's compile config
// stays the same when a loss's config code changes. Each class is written
// with its default config and with a full config that sets every key to a
// value other than its default. KILN_WRITE_CONFIG_GOLDEN=<file> writes the
// configs there instead (to make the golden file from a known-good build).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "kiln/core/error.h"
#include "kiln/losses/loss.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

// A config setting every key of each class to a non-default value.
const std::map<std::string, Json>& full_configs() {
  static const std::map<std::string, Json> m = {
      {"BinaryCrossentropy",
       {{"name", "bce"}, {"reduction", "sum"}, {"from_logits", true}, {"label_smoothing", 0.1}, {"axis", 0}}},
      {"BinaryFocalCrossentropy",
       {{"name", "focal"},
        {"reduction", "mean"},
        {"apply_class_balancing", true},
        {"alpha", 0.5},
        {"gamma", 3.0},
        {"from_logits", true},
        {"label_smoothing", 0.2},
        {"axis", 0}}},
      {"CategoricalCrossentropy",
       {{"name", "cce"}, {"reduction", "none"}, {"from_logits", true}, {"label_smoothing", 0.3}, {"axis", 1}}},
      {"CosineSimilarity", {{"name", "cos"}, {"reduction", "sum"}, {"axis", 0}}},
      {"Hinge", {{"name", "h"}, {"reduction", "sum"}}},
      {"Huber", {{"name", "hub"}, {"reduction", "mean_with_sample_weight"}, {"delta", 2.5}}},
      {"KLDivergence", {{"name", "kl"}, {"reduction", "none"}}},
      {"LogCosh", {{"name", "lc"}, {"reduction", "mean"}}},
      {"MeanAbsoluteError", {{"name", "l1"}, {"reduction", "sum"}}},
      {"MeanSquaredError", {{"name", "l2"}, {"reduction", "none"}}},
      {"Poisson", {{"name", "pois"}, {"reduction", "sum"}}},
      {"SparseCategoricalCrossentropy",
       {{"name", "scce"}, {"reduction", "sum"}, {"from_logits", true}, {"ignore_class", 3}}},
      {"SquaredHinge", {{"name", "sh"}, {"reduction", "mean"}}},
  };
  return m;
}

TEST(LossConfigs, MatchGolden) {
  // The classes get() reaches (through a name or an alias), less the ones
  // tests register.
  std::set<std::string> classes;
  for (auto& n : Loss::known_names())
    if (n != "ZeroLoss") classes.insert(Loss::get(n)->class_name());
  Json actual = Json::object();
  for (auto& cls : classes) {
    SCOPED_TRACE(cls);
    ASSERT_TRUE(full_configs().count(cls)) << cls << " is registered but has no full config here";
    actual[cls] = Loss::from_json(Json{{"class_name", cls}, {"config", Json::object()}})->to_json().dump();
    actual[cls + "_full"] =
        Loss::from_json(Json{{"class_name", cls}, {"config", full_configs().at(cls)}})->to_json().dump();
  }
  if (write_or_expect_golden_configs(actual, "kiln/losses/testdata/loss_configs_golden.json"))
    GTEST_SKIP() << "wrote the golden configs";
}

}  // namespace
}  // namespace kiln
