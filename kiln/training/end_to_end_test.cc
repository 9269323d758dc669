// fit() with the real layers, losses, metrics and optimizers by their Keras
// names, and the model directory ModelCheckpoint writes loading back.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/dtype.h"
#include "kiln/core/io.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/saving/model_io.h"
#include "kiln/testing/testing.h"
#include "kiln/training/callbacks.h"
#include "kiln/training/training_test_util.h"

namespace kiln {
namespace {

using namespace testing_training;

std::shared_ptr<models::SequentialImpl> keras_model() {
  clear_session();
  auto model = models::Sequential();
  model->add(layers::Input({2}));
  model->add(layers::Dense(16, "relu"));
  model->add(layers::Dropout(0.2));
  model->add(layers::Dense(2, "softmax"));
  model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  return model;
}

TEST(EndToEnd, RealLayersLearnAndTheCheckpointedModelLoadsBack) {
  TempDir tmp;
  set_random_seed(31);
  Problem train = blobs(512, 1), val = blobs(128, 2);
  auto model = keras_model();
  FitArgs a;
  a.x = {train.x};
  a.y = {train.y};
  a.epochs = 5;
  a.batch_size = 32;
  a.verbose = 0;
  a.validation_x = {val.x};
  a.validation_y = {val.y};
  a.callbacks = {
      callbacks::ModelCheckpoint(tmp.path() + "/best", callbacks::ModelCheckpointOptions{.save_best_only = true})};
  History h = model->fit(a);
  EXPECT_LT(h.history["loss"].back(), h.history["loss"].front());
  EXPECT_GT(h.last("val_accuracy"), 0.97);

  // The best epoch is the last here (val_loss falls steadily); the saved
  // model predicts exactly as the trained one and keeps its compile config.
  ASSERT_EQ(h.history["val_loss"].back(),
            *std::min_element(h.history["val_loss"].begin(), h.history["val_loss"].end()));
  ModelPtr loaded = load_model(tmp.path() + "/best");
  EXPECT_TRUE(at::equal(loaded->predict(val.x), model->predict(val.x)));
  ASSERT_TRUE(loaded->compiled());
  EXPECT_EQ(loaded->compile_args().optimizer->iterations(), model->compile_args().optimizer->iterations());
  auto r = loaded->evaluate({.x = {val.x}, .y = {val.y}});
  EXPECT_NEAR(r.at("loss"), h.last("val_loss"), 1e-6);
  EXPECT_NEAR(r.at("accuracy"), h.last("val_accuracy"), 1e-12);
}

TEST(EndToEnd, BackupAndRestoreWithRealLayersIsBitIdentical) {
  TempDir tmp;
  Problem p = blobs(100, 4);
  auto run = [&](std::vector<CallbackPtr> callbacks) {
    set_random_seed(5);
    auto model = keras_model();
    FitArgs a;
    a.x = {p.x};
    a.y = {p.y};
    a.epochs = 3;
    a.batch_size = 16;
    a.verbose = 0;
    a.callbacks = std::move(callbacks);
    model->fit(a);
    return model->get_weights();
  };
  Tensors ref = run({});
  auto crash = callbacks::LambdaCallback();
  crash->on_train_batch_end_fn = [](int64_t batch, const Logs&) {
    if (batch == 4) throw std::runtime_error("crash");
  };
  const std::string dir = tmp.path() + "/backup";
  EXPECT_THROW(run({callbacks::BackupAndRestore(dir, callbacks::BackupAndRestoreOptions{.save_freq = 3}), crash}),
               std::runtime_error);
  Tensors resumed = run({callbacks::BackupAndRestore(dir, callbacks::BackupAndRestoreOptions{.save_freq = 3})});
  EXPECT_TRUE(same_weights(resumed, ref));
}

TEST(EndToEnd, MixedPrecisionPolicyTrainsWithFloat32LossAndVariables) {
  set_random_seed(8);
  set_dtype_policy("mixed_bfloat16");
  auto model = keras_model();
  set_dtype_policy("float32");
  Problem p = blobs(512, 6);
  FitArgs a;
  a.x = {p.x};
  a.y = {p.y};
  a.epochs = 5;
  a.verbose = 0;
  History h = model->fit(a);
  EXPECT_EQ(model->predict(p.x).scalar_type(), at::kBFloat16);  // compute dtype
  for (auto& v : model->weights()) EXPECT_EQ(v->dtype(), at::kFloat) << v->path();
  EXPECT_TRUE(std::isfinite(h.last("loss")));
  EXPECT_LT(h.history["loss"].back(), h.history["loss"].front());
  EXPECT_GT(h.last("accuracy"), 0.9);
}

}  // namespace
}  // namespace kiln
