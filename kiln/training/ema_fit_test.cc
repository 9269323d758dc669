// use_ema through fit(): at the end of fit the model's weights are the
// optimizer's moving averages (Keras's finalize_variable_values), computed
// here by hand from the weights a plain run goes through batch by batch.
#include <gtest/gtest.h>

#include "kiln/core/random.h"
#include "kiln/training/callbacks.h"
#include "kiln/training/training_test_util.h"

namespace kiln {
namespace {

using namespace testing_training;

class RecordWeights : public callbacks::Callback {
 public:
  std::vector<Tensors> after_batch;
  void on_train_batch_end(int64_t, const Logs&) override {
    Tensors w;
    for (auto& t : model().get_weights()) w.push_back(t.clone());
    after_batch.push_back(std::move(w));
  }
};

TEST(FitWithEma, EndsWithTheMovingAverages) {
  const Problem p = blobs(64);
  const double momentum = 0.8;
  // The same run without EMA (training itself does not depend on it).
  set_random_seed(11);
  auto plain = make_model(Optimizer::from_json(Json{{"class_name", "SGD"}, {"config", {{"learning_rate", 0.1}}}}));
  auto rec = std::make_shared<RecordWeights>();
  FitArgs a = quiet(p, 2);
  a.shuffle = false;
  a.callbacks = {rec};
  plain->fit(a);
  ASSERT_EQ(rec->after_batch.size(), 8u);

  set_random_seed(11);
  auto ema = make_model(Optimizer::from_json(Json{
      {"class_name", "SGD"}, {"config", {{"learning_rate", 0.1}, {"use_ema", true}, {"ema_momentum", momentum}}}}));
  FitArgs b = quiet(p, 2);
  b.shuffle = false;
  ema->fit(b);

  // average = w_1, then m * average + (1 - m) * w_k.
  Tensors expected = rec->after_batch[0];
  for (size_t k = 1; k < rec->after_batch.size(); ++k)
    for (size_t i = 0; i < expected.size(); ++i)
      expected[i] = expected[i] * momentum + rec->after_batch[k][i] * (1.0 - momentum);
  Tensors got = ema->get_weights();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(at::allclose(got[i], expected[i], 1e-5, 1e-6)) << "weight " << i;
    EXPECT_FALSE(at::allclose(got[i], rec->after_batch.back()[i], 1e-5, 1e-6)) << "weight " << i;
  }
  // Without use_ema, fit ends with the last step's weights.
  Tensors last = plain->get_weights();
  for (size_t i = 0; i < last.size(); ++i) EXPECT_TRUE(at::equal(last[i], rec->after_batch.back()[i]));
}

}  // namespace
}  // namespace kiln
