// Masks reach the loss and the mean metrics (Keras 3's apply_mask): a
// model whose output carries a mask (Embedding(mask_zero) -> LSTM with
// return_sequences -> Dense) is scored on the valid steps only.
#include <gtest/gtest.h>

#include "kiln/core/names.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/embedding.h"
#include "kiln/layers/recurrent.h"
#include "kiln/models/sequential.h"
#include "kiln/training/train_state.h"

namespace kiln {
namespace {

std::shared_ptr<models::SequentialImpl> tagger() {
  return models::Sequential(std::vector<LayerPtr>{layers::Embedding(6, 4, Json{{"mask_zero", true}}),
                                                  layers::LSTM(Json{{"units", 3}, {"return_sequences", true}}),
                                                  layers::Dense(2, "softmax")});
}

TEST(MaskedLoss, LossAndAccuracyCountValidStepsOnly) {
  clear_session();
  auto model = tagger();
  model->compile("sgd", "sparse_categorical_crossentropy", {"accuracy"});
  at::Tensor x = at::tensor({1, 2, 3, 0, 0, 4, 5, 1, 2, 0, 3, 3, 3, 3, 3}, at::kLong).reshape({3, 5});
  at::Tensor valid = x != 0;
  at::Tensor y = at::tensor({0, 1, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0}, at::kLong).reshape({3, 5});
  // Confident predictions (class 0), so the targets' values weigh.
  (void)model->predict(x);
  std::dynamic_pointer_cast<layers::DenseImpl>(model->layers()[2])->bias()->assign(at::tensor({1.5f, -1.5f}));
  // test_on_batch reports running means since the last reset (Keras 3).
  auto score = [&](const at::Tensor& target, const at::Tensor& w = at::Tensor()) {
    model->train_state().reset_metrics();
    return model->test_on_batch({x}, {target}, w);
  };
  auto logs = score(y);

  // Targets at padded steps do not matter.
  at::Tensor y2 = at::where(valid, y, 1 - y);
  auto logs2 = score(y2);
  EXPECT_DOUBLE_EQ(logs["loss"], logs2["loss"]);
  EXPECT_DOUBLE_EQ(logs["accuracy"], logs2["accuracy"]);

  // The mean over valid steps, computed by hand from the predictions.
  at::Tensor p = model->predict(x).to(at::kDouble);
  at::Tensor ce = -p.gather(2, y.unsqueeze(2)).squeeze(2).log();
  const double n = valid.sum().item<double>();
  const double want_loss = (ce * valid).sum().item<double>() / n;
  const double want_acc = ((p.argmax(2) == y) & valid).sum().item<double>() / n;
  EXPECT_NEAR(logs["loss"], want_loss, 1e-5);
  EXPECT_NEAR(logs["accuracy"], want_acc, 1e-9);
  // Unmasked, the padded steps' targets would count (so the test can fail).
  at::Tensor ce2 = -p.gather(2, y2.unsqueeze(2)).squeeze(2).log();
  EXPECT_GT(std::abs(ce2.mean().item<double>() - ce.mean().item<double>()), 0.1);

  // Per-sample weights combine with the mask: weight 0 drops sequence 1.
  auto w = score(y, at::tensor({1.0, 0.0, 1.0}));
  at::Tensor keep = valid.clone();
  keep[1].fill_(false);
  EXPECT_NEAR(w["loss"], (ce * keep).sum().item<double>() / n, 1e-5);
}

TEST(MaskedLoss, TrainingOnPaddedBatchesIgnoresThePadding) {
  // One SGD step on a padded batch whose padded targets differ gives the same weights.
  clear_session();
  at::Tensor x = at::tensor({1, 2, 0, 0, 3, 4, 5, 0}, at::kLong).reshape({2, 4});
  at::Tensor y = at::tensor({1, 0, 0, 0, 0, 1, 1, 0}, at::kLong).reshape({2, 4});
  at::Tensor y2 = at::where(x != 0, y, 1 - y);
  Tensors after[2];
  for (int k = 0; k < 2; ++k) {
    clear_session();
    at::manual_seed(5);
    auto model = tagger();
    model->compile("sgd", "sparse_categorical_crossentropy");
    model->train_on_batch({x}, {k == 0 ? y : y2});
    after[k] = model->get_weights();
  }
  ASSERT_EQ(after[0].size(), after[1].size());
  for (size_t i = 0; i < after[0].size(); ++i) EXPECT_TRUE(at::equal(after[0][i], after[1][i])) << i;
}

}  // namespace
}  // namespace kiln
