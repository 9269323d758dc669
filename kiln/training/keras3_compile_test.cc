// The optimizers, losses and metrics added for Keras 3 parity by their Keras
// names through compile() and fit(), as a spec would name them.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/random.h"
#include "kiln/training/train_state.h"
#include "kiln/training/training_test_util.h"

namespace kiln {
namespace {

using namespace testing_training;

TEST(CompileByKerasNames, NadamHingeF1Score) {
  set_random_seed(12);
  clear_session();
  auto model = models::Sequential(std::vector<LayerPtr>{std::make_shared<TinyDense>(1)}, "model");
  model->compile("nadam", "hinge", {"f1_score", "root_mean_squared_error", "r2_score"});
  Problem p = blobs(64);
  p.y = p.y.to(at::kFloat).reshape({-1, 1});  // {0, 1}: hinge maps them to {-1, 1}
  FitArgs a = quiet(p, 3);
  auto history = model->fit(a).history;
  for (const char* key : {"loss", "f1_score", "root_mean_squared_error", "r2_score"}) {
    ASSERT_TRUE(history.count(key)) << key;
    ASSERT_EQ(history.at(key).size(), 3u) << key;
    EXPECT_TRUE(std::isfinite(history.at(key).back())) << key;
  }
  EXPECT_LT(history.at("loss").back(), history.at("loss").front());
  EXPECT_EQ(model->train_state().optimizer().class_name(), "Nadam");
  EXPECT_EQ(model->train_state().optimizer().iterations(), 12);  // 3 epochs of 64 / 16 batches
}

}  // namespace
}  // namespace kiln
