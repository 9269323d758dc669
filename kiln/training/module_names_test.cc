// Keras's module names for the base classes and functions (issue 30): a user
// who writes keras.losses.Loss, keras.metrics.Mean, keras.optimizers.Optimizer,
// keras.models.load_model or keras.callbacks.Callback finds the same names
// under kiln::losses, kiln::metrics, ... (the classes themselves stay where
// the rest of kiln uses them).
#include <gtest/gtest.h>

#include <type_traits>

#include "kiln/data/dataset.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/layer.h"
#include "kiln/losses/loss.h"
#include "kiln/losses/regression.h"
#include "kiln/metrics/metric.h"
#include "kiln/models/model.h"
#include "kiln/models/model_json.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/adam.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/training/callback.h"

namespace {

TEST(ModuleNames, BaseClassesUnderTheirKerasModule) {
  static_assert(std::is_same_v<kiln::layers::Layer, kiln::Layer>);
  static_assert(std::is_same_v<kiln::layers::KerasTensor, kiln::KerasTensor>);
  static_assert(std::is_same_v<kiln::losses::Loss, kiln::Loss>);
  static_assert(std::is_same_v<kiln::metrics::Metric, kiln::Metric>);
  static_assert(std::is_same_v<kiln::metrics::Mean, kiln::Mean>);
  static_assert(std::is_same_v<kiln::optimizers::Optimizer, kiln::Optimizer>);
  static_assert(std::is_same_v<kiln::optimizers::LearningRateSchedule, kiln::LearningRateSchedule>);
  static_assert(std::is_same_v<kiln::models::ModelPtr, kiln::ModelPtr>);
  static_assert(std::is_base_of_v<kiln::losses::Loss, kiln::losses::MeanSquaredError>);
  static_assert(std::is_base_of_v<kiln::optimizers::Optimizer, kiln::optimizers::Adam>);
  static_assert(std::is_base_of_v<kiln::layers::Layer, kiln::models::Model>);
  static_assert(std::is_class_v<kiln::data::Dataset> && std::is_class_v<kiln::data::DatasetIterator>);
}

TEST(ModuleNames, ModelsFunctionsReadAsKeras) {
  using namespace kiln;
  models::Sequential model({layers::Input({3}), layers::Dense(2)});
  const std::string text = model_to_json(*model).dump();
  models::ModelPtr copy = models::model_from_json(text);
  EXPECT_EQ(model_to_json(*copy).dump(), text);
  metrics::Mean mean;
  mean.update(1.0);
  mean.update(3.0);
  EXPECT_DOUBLE_EQ(mean.result(), 2.0);
}

}  // namespace
