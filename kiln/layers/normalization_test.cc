// Special cases of BatchNormalization and LayerNormalization.
#include "kiln/layers/normalization.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "kiln/core/names.h"
#include "kiln/layers/activations.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/pooling.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

TEST(BatchNormalization, KerasWeightsAndDefaults) {
  clear_session();
  auto bn = layers::BatchNormalization();
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
  auto bn = layers::BatchNormalization();
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
  auto bn = layers::BatchNormalization(-1, 0.9, 1e-3);
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
  auto bn = layers::BatchNormalization();
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
  auto bn = layers::BatchNormalization(1);
  at::Tensor x = at::randn({4, 3, 5}) * 3 + 1;  // channels on axis 1
  at::Tensor y = (*bn)(x, true);
  EXPECT_EQ(bn->moving_mean()->shape(), (Shape{3}));
  EXPECT_TRUE(at::allclose(y.mean(std::vector<int64_t>{0, 2}), at::zeros({3}), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(bn->moving_mean()->value(), 0.01 * x.mean(std::vector<int64_t>{0, 2}), 1e-5, 1e-6));
}

TEST(BatchNormalization, MixedPrecisionKeepsFloat32Statistics) {
  auto bn = layers::BatchNormalization(-1, 0.99, 1e-3, Json{{"dtype", "mixed_bfloat16"}});
  at::Tensor x = at::randn({32, 4}) + 100.0;  // where bfloat16 means would lose digits
  at::Tensor y = (*bn)(x, true);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bn->moving_mean()->dtype(), at::kFloat);
  at::Tensor xb = x.to(at::kBFloat16).to(at::kFloat);  // what the layer sees after autocast
  EXPECT_TRUE(at::allclose(bn->moving_mean()->value(), 0.01 * xb.mean(0), 1e-4, 1e-5));
}

TEST(BatchNormalization, RejectsBadConfigs) {
  expect_error<ValueError>([] { (void)layers::BatchNormalizationImpl(-1, 1.5); },
                           {"BatchNormalization", "`momentum`", "1.5"});
  expect_error<ValueError>([] { (void)layers::BatchNormalizationImpl(-1, 0.9, 0.0); }, {"`epsilon`"});
  expect_error<ValueError>(
      [] {
        (void)layers::BatchNormalizationImpl(Json{{"synchronized", "yes"}});
      },
      {"`synchronized`"});
  expect_error<ValueError>([] { (void)layers::BatchNormalizationImpl(Json{{"axis", "channels"}}); }, {"`axis`"});
  auto bn = layers::BatchNormalization(0);
  expect_error<ValueError>([&] { (*bn)(at::randn({2, 3})); }, {"axis=0"});
  auto ok = layers::BatchNormalization();
  (*ok)(at::randn({2, 3}));
  expect_error<ShapeError>([&] { (*ok)(at::randn({2, 4})); }, {"built for inputs of shape (None, 3)"});
}

// --- the fused path against Keras's formula written out ---------------------
// The layer's code before it called at::batch_norm: statistics in at least
// float32 over every axis but `axis` (biased variance), then
// (x - mean) * rsqrt(var + eps) * gamma + beta.
struct Reference {
  at::Tensor y, batch_mean, batch_var;
};
Reference keras_formula(const at::Tensor& x, int64_t axis, const at::Tensor& gamma, const at::Tensor& beta,
                        const at::Tensor& moving_mean, const at::Tensor& moving_var, bool training, double eps) {
  const auto dt = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor xf = x.to(dt);
  std::vector<int64_t> reduce, bshape(x.dim(), 1);
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != axis) reduce.push_back(i);
  bshape[axis] = x.size(axis);
  Reference r;
  at::Tensor mean = moving_mean, var = moving_var;
  if (training) {
    mean = r.batch_mean = xf.mean(reduce);
    var = r.batch_var = (xf - mean.reshape(bshape)).square().mean(reduce);
  }
  at::Tensor inv = at::rsqrt(var + eps) * gamma;
  r.y = ((xf - mean.reshape(bshape)) * inv.reshape(bshape) + beta.reshape(bshape)).to(x.scalar_type());
  return r;
}

// A channels_last image batch as kiln's Conv2D hands it on: an NHWC view of
// an NCHW tensor in LibTorch's channels_last memory format.
at::Tensor nhwc(const at::Tensor& nchw) {
  return nchw.contiguous(at::MemoryFormat::ChannelsLast).permute({0, 2, 3, 1});
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor af = a.to(at::kDouble), bf = b.to(at::kDouble);
  return ((af - bf).abs().max() / bf.abs().max().clamp_min(1e-30)).item<double>();
}

// Output, moving statistics and the gradients of x, gamma and beta of the
// layer against keras_formula, in training and inference.
void expect_matches_formula(const at::Tensor& x_in, int64_t axis, double tol, double grad_tol,
                            const Json& extra = Json::object()) {
  const int64_t rank = x_in.dim(), resolved = axis < 0 ? axis + rank : axis, c = x_in.size(resolved);
  auto bn = layers::BatchNormalization(axis, 0.9, 1e-3, extra);
  (*bn)(x_in, false);  // builds
  const auto opt = at::TensorOptions().dtype(at::kFloat);
  at::Tensor g0 = at::rand({c}, opt) + 0.5, b0 = at::randn({c}, opt), m0 = at::randn({c}, opt),
             v0 = at::rand({c}, opt) + 0.5;
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "inference");
    bn->set_weights({g0, b0, m0, v0});
    at::Tensor x = x_in.detach().clone(at::MemoryFormat::Preserve).requires_grad_(true);
    at::Tensor y = (*bn)(x, training);
    ASSERT_EQ(y.sizes(), x.sizes());
    ASSERT_EQ(y.scalar_type(), x.scalar_type());
    at::Tensor xr = x_in.detach().clone().requires_grad_(true);
    at::Tensor gr = g0.clone().requires_grad_(true), br = b0.clone().requires_grad_(true);
    Reference ref = keras_formula(xr, resolved, gr, br, m0, v0, training, 1e-3);
    EXPECT_LT(max_rel(y, ref.y), tol);
    if (training) {
      EXPECT_LT(max_rel(bn->moving_mean()->value(), m0 * 0.9 + ref.batch_mean.detach() * 0.1), 1e-6);
      EXPECT_LT(max_rel(bn->moving_variance()->value(), v0 * 0.9 + ref.batch_var.detach() * 0.1), 1e-6);
    } else {
      EXPECT_TRUE(at::equal(bn->moving_mean()->value(), m0));
      EXPECT_TRUE(at::equal(bn->moving_variance()->value(), v0));
    }
    // A weighting that is not constant, so that no gradient vanishes.
    at::Tensor w = at::randn(x.sizes(), opt);
    auto got = torch::autograd::grad({(y.to(at::kFloat) * w).sum()}, {x, bn->gamma()->value(), bn->beta()->value()});
    auto want = torch::autograd::grad({(ref.y.to(at::kFloat) * w).sum()}, {xr, gr, br});
    EXPECT_LT(max_rel(got[0], want[0]), grad_tol) << "d/dx";
    EXPECT_LT(max_rel(got[1], want[1]), grad_tol) << "d/dgamma";
    EXPECT_LT(max_rel(got[2], want[2]), grad_tol) << "d/dbeta";
  }
}

TEST(BatchNormalization, FusedMatchesKerasFormulaRank2) {
  at::manual_seed(1);
  expect_matches_formula(at::randn({64, 5}) * 3 + 2, -1, 1e-5, 1e-5);
}

TEST(BatchNormalization, FusedMatchesKerasFormulaRank3) {
  at::manual_seed(2);
  expect_matches_formula(at::randn({6, 7, 4}) * 2 - 1, -1, 1e-5, 1e-5);
  expect_matches_formula(at::randn({6, 4, 7}) * 2 - 1, 1, 1e-5, 1e-5);
}

TEST(BatchNormalization, FusedMatchesKerasFormulaChannelsLastImages) {
  at::manual_seed(3);
  expect_matches_formula(nhwc(at::randn({8, 6, 5, 5}) * 2 + 3), -1, 1e-5, 1e-5);
  expect_matches_formula(at::randn({8, 5, 5, 6}) * 2 + 3, -1, 1e-5, 1e-5);  // a plain NHWC tensor
}

TEST(BatchNormalization, FusedMatchesKerasFormulaChannelsFirstAndMiddleAxes) {
  at::manual_seed(4);
  expect_matches_formula(at::randn({8, 6, 5, 5}) * 2 + 3, 1, 1e-5, 1e-5);
  expect_matches_formula(at::randn({4, 3, 6, 5}) * 2 + 3, 2, 1e-5, 1e-5);
  expect_matches_formula(at::randn({2, 3, 4, 3, 5}) - 1, -1, 1e-5, 1e-5);  // rank 5, NDHWC
}

TEST(BatchNormalization, FusedMatchesKerasFormulaInBfloat16) {
  at::manual_seed(5);
  // Statistics in float32 either way; outputs and input gradients round to
  // bfloat16 once (a unit in the last place: 2^-8 of the largest value).
  const Json mixed = {{"dtype", "mixed_bfloat16"}};  // float32 variables, bfloat16 compute
  expect_matches_formula((at::randn({32, 6}) * 2 + 50).to(at::kBFloat16), -1, 1e-2, 1e-2, mixed);
  expect_matches_formula(nhwc(at::randn({8, 6, 4, 4}) + 3).to(at::kBFloat16), -1, 1e-2, 1e-2, mixed);
}

TEST(BatchNormalization, NoScaleNoCenterOnTheFusedPath) {
  auto bn = layers::BatchNormalization(-1, 0.99, 1e-3, Json{{"scale", false}, {"center", false}});
  at::Tensor x = nhwc(at::randn({4, 3, 5, 5}) * 2 + 1);
  at::Tensor y = (*bn)(x, true);
  EXPECT_EQ(bn->weights().size(), 2u);
  at::Tensor mean = x.mean({0, 1, 2}), var = (x - mean).square().mean({0, 1, 2});
  EXPECT_LT(max_rel(y, (x - mean) / at::sqrt(var + 1e-3)), 1e-5);
}

TEST(BatchNormalization, OneRowBatchHasZeroVariance) {
  auto bn = layers::BatchNormalization(-1, 0.5, 1e-3);
  at::Tensor x = at::tensor({3.0f, -1.0f}).reshape({1, 2});
  at::Tensor y = (*bn)(x, true);
  EXPECT_TRUE(at::allclose(y, at::zeros({1, 2})));  // beta
  EXPECT_TRUE(at::allclose(bn->moving_mean()->value(), at::tensor({1.5f, -0.5f})));
  EXPECT_TRUE(at::allclose(bn->moving_variance()->value(), at::full({2}, 0.5f)));
}

// Two replicas that hold the same batch: the all-reduced sums are twice one
// replica's, so synchronized statistics equal the local ones.
class TwoIdenticalReplicas : public Distribution {
 public:
  TensorLayout layout_for(const std::string&, const Shape&) const override { return {}; }
  int num_replicas() const override { return 2; }
  void all_reduce_sum(std::vector<at::Tensor>& tensors) const override {
    for (auto& t : tensors) t.mul_(2);
  }
};

TEST(BatchNormalization, SynchronizedStatisticsMatchTheFusedPath) {
  at::Tensor x = nhwc(at::randn({8, 4, 3, 3}) * 2 + 1);
  auto local = layers::BatchNormalization();
  at::Tensor y_local = (*local)(x, true);
  set_distribution(std::make_shared<TwoIdenticalReplicas>());
  auto synced = layers::BatchNormalization({.synchronized = true});
  at::Tensor y_synced = (*synced)(x, true);
  set_distribution(nullptr);
  EXPECT_LT(max_rel(y_synced, y_local), 1e-5);
  EXPECT_LT(max_rel(synced->moving_mean()->value(), local->moving_mean()->value()), 1e-6);
  EXPECT_LT(max_rel(synced->moving_variance()->value(), local->moving_variance()->value()), 1e-6);
}

// Conv2D -> BatchNormalization -> Activation -> MaxPooling2D stays in
// LibTorch's channels_last memory format: every output is a plain NHWC
// tensor whose NCHW view is channels_last-contiguous, so no layer between
// them reorders the data, forward or (the same layouts) backward.
TEST(BatchNormalization, KeepsConvBlocksInChannelsLastMemory) {
  auto conv = layers::Conv2D(8, 3, "linear", Json{{"padding", "same"}});
  auto bn = layers::BatchNormalization();
  auto relu = layers::Activation("relu");
  auto pool = layers::MaxPooling2D();
  at::Tensor x = at::randn({4, 10, 10, 3});
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "inference");
    at::Tensor h = x;
    for (LayerPtr layer : std::vector<LayerPtr>{conv, bn, relu, pool}) {
      h = (*layer)(h, training);
      EXPECT_TRUE(h.is_contiguous()) << layer->name();
      EXPECT_TRUE(h.permute({0, 3, 1, 2}).is_contiguous(at::MemoryFormat::ChannelsLast)) << layer->name();
    }
    EXPECT_EQ(h.sizes(), (at::IntArrayRef{4, 5, 5, 8}));
  }
}

TEST(LayerNormalization, NormalisesEachSample) {
  auto ln = layers::LayerNormalization();
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
  auto ln = layers::LayerNormalization(Json{{"axis", {1, 2}}});
  at::Tensor x = at::randn({2, 3, 4}) * 3;
  at::Tensor y = (*ln)(x);
  EXPECT_EQ(ln->gamma()->shape(), (Shape{3, 4}));
  EXPECT_TRUE(at::allclose(y.mean({1, 2}), at::zeros({2}), 1e-4, 1e-5));
  auto mid = layers::LayerNormalization(1);
  at::Tensor z = (*mid)(x);
  EXPECT_TRUE(at::allclose(z.mean(1), at::zeros({2, 4}), 1e-4, 1e-5));
  EXPECT_EQ(mid->get_config()["axis"], 1);
  EXPECT_EQ(ln->get_config()["axis"], Json({1, 2}));
}

TEST(LayerNormalization, RmsScalingDividesByRootMeanSquare) {
  auto ln = layers::LayerNormalization(-1, 1e-3, Json{{"rms_scaling", true}});
  at::Tensor x = at::randn({4, 8}) + 3;
  at::Tensor y = (*ln)(x);
  EXPECT_EQ(ln->beta(), nullptr);
  EXPECT_TRUE(at::allclose(y, x / at::sqrt(x.square().mean(-1, true) + 1e-3), 1e-5, 1e-5));
}

TEST(LayerNormalization, RejectsBadConfigs) {
  expect_error<ValueError>([] { (void)layers::LayerNormalizationImpl(-1, -1.0); }, {"LayerNormalization", "`epsilon`"});
  expect_error<ValueError>([] { (void)layers::LayerNormalizationImpl(Json{{"axis", Json::array()}}); }, {"`axis`"});
  auto ln = layers::LayerNormalization(Json{{"axis", {-1, 2}}});
  expect_error<ValueError>([&] { (*ln)(at::randn({2, 3, 4})); }, {"distinct"});
}

}  // namespace
}  // namespace kiln
