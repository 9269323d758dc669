// Special cases of BatchNormalization and LayerNormalization.
#include "kiln/layers/normalization.h"

#include <gtest/gtest.h>

#include "kiln/core/names.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

TEST(BatchNormalization, KerasWeightsAndDefaults) {
  clear_session();
  auto bn = std::make_shared<BatchNormalization>();
  (*bn)(at::randn({4, 3}));
  auto ws = bn->weights();
  ASSERT_EQ(ws.size(), 4u);
  EXPECT_EQ(ws[0]->path(), "batch_normalization/gamma");
  EXPECT_EQ(ws[1]->path(), "batch_normalization/beta");
  EXPECT_EQ(ws[2]->path(), "batch_normalization/moving_mean");
  EXPECT_EQ(ws[3]->path(), "batch_normalization/moving_variance");
  EXPECT_TRUE(ws[0]->trainable() && ws[1]->trainable());
  EXPECT_FALSE(ws[2]->trainable() || ws[3]->trainable());
  Json c = bn->get_config();
  EXPECT_EQ(c["axis"], -1);
  EXPECT_DOUBLE_EQ(c["momentum"].get<double>(), 0.99);
  EXPECT_DOUBLE_EQ(c["epsilon"].get<double>(), 1e-3);
  EXPECT_EQ(c["center"], true);
  EXPECT_EQ(c["scale"], true);
  // Unfreezing never makes the moving statistics trainable.
  bn->set_trainable(false);
  bn->set_trainable(true);
  EXPECT_EQ(bn->trainable_weights().size(), 2u);
}

TEST(BatchNormalization, TrainingUpdatesMovingStatisticsWithMomentum) {
  auto bn = std::make_shared<BatchNormalization>();
  at::Tensor x = at::randn({64, 3}) * 2.0 + at::tensor({1.0f, -2.0f, 5.0f});
  at::Tensor y = (*bn)(x, /*training=*/true);
  at::Tensor mean = x.mean(0), var = (x - mean).square().mean(0);  // biased
  EXPECT_TRUE(at::allclose(bn->moving_mean()->value(), 0.01 * mean, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(bn->moving_variance()->value(), 0.99 + 0.01 * var, 1e-5, 1e-6));
  // Output normalised with the batch statistics (gamma 1, beta 0).
  EXPECT_TRUE(at::allclose(y, (x - mean) / at::sqrt(var + 1e-3), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(y.mean(0), at::zeros({3}), 1e-4, 1e-5));
  // A second step moves them again: m2 = 0.99 * m1 + 0.01 * mean.
  (*bn)(x, true);
  EXPECT_TRUE(at::allclose(bn->moving_mean()->value(), 0.99 * 0.01 * mean + 0.01 * mean, 1e-5, 1e-6));
}

TEST(BatchNormalization, InferenceUsesMovingStatistics) {
  auto bn = std::make_shared<BatchNormalization>(-1, 0.9, 1e-3);
  at::Tensor x = at::randn({8, 2});
  (*bn)(x);
  bn->set_weights(
      {at::tensor({2.0f, 0.5f}), at::tensor({1.0f, -1.0f}), at::tensor({3.0f, -3.0f}), at::tensor({4.0f, 0.25f})});
  at::Tensor y = (*bn)(x, false);
  at::Tensor ref =
      (x - at::tensor({3.0f, -3.0f})) / at::sqrt(at::tensor({4.0f, 0.25f}) + 1e-3) * at::tensor({2.0f, 0.5f}) +
      at::tensor({1.0f, -1.0f});
  EXPECT_TRUE(at::allclose(y, ref, 1e-5, 1e-6));
  at::Tensor before = bn->moving_mean()->value().clone();
  (*bn)(x, false);
  EXPECT_TRUE(at::equal(bn->moving_mean()->value(), before)) << "inference must not update statistics";
}

TEST(BatchNormalization, FrozenLayerRunsInInferenceMode) {
  auto bn = std::make_shared<BatchNormalization>();
  at::Tensor x = at::randn({16, 3}) + 4.0;
  (*bn)(x);
  bn->set_trainable(false);
  EXPECT_TRUE(bn->trainable_weights().empty());
  at::Tensor before = bn->moving_mean()->value().clone();
  at::Tensor y_train = (*bn)(x, /*training=*/true);
  EXPECT_TRUE(at::equal(bn->moving_mean()->value(), before));
  EXPECT_TRUE(at::equal(y_train, (*bn)(x, false)));
}

TEST(BatchNormalization, NormalisesTheConfiguredAxis) {
  auto bn = std::make_shared<BatchNormalization>(1);
  at::Tensor x = at::randn({4, 3, 5}) * 3 + 1;  // channels on axis 1
  at::Tensor y = (*bn)(x, true);
  EXPECT_EQ(bn->moving_mean()->shape(), (Shape{3}));
  EXPECT_TRUE(at::allclose(y.mean(std::vector<int64_t>{0, 2}), at::zeros({3}), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(bn->moving_mean()->value(), 0.01 * x.mean(std::vector<int64_t>{0, 2}), 1e-5, 1e-6));
}

TEST(BatchNormalization, MixedPrecisionKeepsFloat32Statistics) {
  auto bn = std::make_shared<BatchNormalization>(-1, 0.99, 1e-3, Json{{"dtype", "mixed_bfloat16"}});
  at::Tensor x = at::randn({32, 4}) + 100.0;  // where bfloat16 means would lose digits
  at::Tensor y = (*bn)(x, true);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bn->moving_mean()->dtype(), at::kFloat);
  at::Tensor xb = x.to(at::kBFloat16).to(at::kFloat);  // what the layer sees after autocast
  EXPECT_TRUE(at::allclose(bn->moving_mean()->value(), 0.01 * xb.mean(0), 1e-4, 1e-5));
}

TEST(BatchNormalization, RejectsBadConfigs) {
  expect_error<ValueError>([] { (void)BatchNormalization(-1, 1.5); }, {"BatchNormalization", "`momentum`", "1.5"});
  expect_error<ValueError>([] { (void)BatchNormalization(-1, 0.9, 0.0); }, {"`epsilon`"});
  expect_error<ValueError>([] { (void)BatchNormalization(Json{{"synchronized", "yes"}}); }, {"`synchronized`"});
  expect_error<ValueError>([] { (void)BatchNormalization(Json{{"axis", "channels"}}); }, {"`axis`"});
  auto bn = std::make_shared<BatchNormalization>(0);
  expect_error<ValueError>([&] { (*bn)(at::randn({2, 3})); }, {"axis=0"});
  auto ok = std::make_shared<BatchNormalization>();
  (*ok)(at::randn({2, 3}));
  expect_error<ShapeError>([&] { (*ok)(at::randn({2, 4})); }, {"built for inputs of shape (None, 3)"});
}

TEST(LayerNormalization, NormalisesEachSample) {
  auto ln = std::make_shared<LayerNormalization>();
  at::Tensor x = at::randn({3, 5, 16}) * 4 + 2;
  at::Tensor y = (*ln)(x);
  EXPECT_TRUE(at::allclose(y.mean(-1), at::zeros({3, 5}), 1e-4, 1e-5));
  at::Tensor var = x.var(-1, /*unbiased=*/false);
  EXPECT_TRUE(at::allclose(y.square().mean(-1), var / (var + 1e-3), 1e-4, 1e-5));  // epsilon 1e-3
  EXPECT_DOUBLE_EQ(ln->get_config()["epsilon"].get<double>(), 1e-3);
  // gamma and beta apply per feature.
  ln->set_weights({at::full({16}, 2.0f), at::full({16}, 0.5f)});
  EXPECT_TRUE(at::allclose((*ln)(x), y * 2 + 0.5, 1e-5, 1e-5));
}

TEST(LayerNormalization, SeveralAxesAndNonTrailingAxes) {
  auto ln = std::make_shared<LayerNormalization>(Json{{"axis", {1, 2}}});
  at::Tensor x = at::randn({2, 3, 4}) * 3;
  at::Tensor y = (*ln)(x);
  EXPECT_EQ(ln->gamma()->shape(), (Shape{3, 4}));
  EXPECT_TRUE(at::allclose(y.mean({1, 2}), at::zeros({2}), 1e-4, 1e-5));
  auto mid = std::make_shared<LayerNormalization>(1);
  at::Tensor z = (*mid)(x);
  EXPECT_TRUE(at::allclose(z.mean(1), at::zeros({2, 4}), 1e-4, 1e-5));
  EXPECT_EQ(mid->get_config()["axis"], 1);
  EXPECT_EQ(ln->get_config()["axis"], Json({1, 2}));
}

TEST(LayerNormalization, RmsScalingDividesByRootMeanSquare) {
  auto ln = std::make_shared<LayerNormalization>(-1, 1e-3, Json{{"rms_scaling", true}});
  at::Tensor x = at::randn({4, 8}) + 3;
  at::Tensor y = (*ln)(x);
  EXPECT_EQ(ln->beta(), nullptr);
  EXPECT_TRUE(at::allclose(y, x / at::sqrt(x.square().mean(-1, true) + 1e-3), 1e-5, 1e-5));
}

TEST(LayerNormalization, RejectsBadConfigs) {
  expect_error<ValueError>([] { (void)LayerNormalization(-1, -1.0); }, {"LayerNormalization", "`epsilon`"});
  expect_error<ValueError>([] { (void)LayerNormalization(Json{{"axis", Json::array()}}); }, {"`axis`"});
  auto ln = std::make_shared<LayerNormalization>(Json{{"axis", {-1, 2}}});
  expect_error<ValueError>([&] { (*ln)(at::randn({2, 3, 4})); }, {"distinct"});
}

}  // namespace
}  // namespace kiln
