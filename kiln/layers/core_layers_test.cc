// Special cases of the core layers: Dense, Activation, Dropout, Flatten,
// Reshape, EinsumDense (the conformance harness covers the common checks).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/names.h"
#include "kiln/core/random.h"
#include "kiln/layers/activations.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/layers/einsum_dense.h"
#include "kiln/layers/reshaping.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

// --- Dense ---------------------------------------------------------------------------
TEST(Dense, ComputesXTimesKernelPlusBias) {
  auto d = layers::Dense(2);
  at::Tensor x = at::tensor({1.0f, 2.0f, 3.0f}).reshape({1, 3});
  (*d)(x);
  d->set_weights({at::tensor({1.0f, 0.0f, 0.0f, 1.0f, 2.0f, -1.0f}).reshape({3, 2}), at::tensor({0.5f, -0.5f})});
  at::Tensor y = (*d)(x);
  // [1 2 3] @ [[1 0] [0 1] [2 -1]] + [0.5 -0.5] = [7.5 -1.5]
  EXPECT_TRUE(at::allclose(y, at::tensor({7.5f, -1.5f}).reshape({1, 2})));
}

TEST(Dense, AppliesActivationAndWorksOnTheLastAxis) {
  auto d = layers::Dense(3, "relu");
  at::Tensor x = at::randn({2, 5, 4});
  at::Tensor y = (*d)(x);
  EXPECT_EQ(sizes_of(y), (Shape{2, 5, 3}));
  at::Tensor ref = at::relu(at::matmul(x, d->kernel()->value()) + d->bias()->value());
  EXPECT_TRUE(at::allclose(y, ref));
  EXPECT_GE(y.min().item<float>(), 0.0f);
}

TEST(Dense, KerasWeightShapesNamesAndDefaults) {
  clear_session();
  auto d = layers::Dense(64);
  (*d)(at::randn({2, 784}));
  ASSERT_EQ(d->weights().size(), 2u);
  EXPECT_EQ(d->kernel()->path(), "dense/kernel");
  EXPECT_EQ(d->bias()->path(), "dense/bias");
  EXPECT_EQ(d->kernel()->shape(), (Shape{784, 64}));
  EXPECT_EQ(d->count_params(), 50240);
  EXPECT_TRUE(at::equal(d->bias()->value(), at::zeros({64})));
  // glorot_uniform: limit sqrt(6 / (784 + 64)).
  EXPECT_LE(d->kernel()->value().abs().max().item<double>(), std::sqrt(6.0 / 848) + 1e-6);
  Json c = d->get_config();
  EXPECT_EQ(c["units"], 64);
  EXPECT_EQ(c["activation"], "linear");
  EXPECT_EQ(c["use_bias"], true);
  EXPECT_EQ(c["kernel_initializer"]["class_name"], "GlorotUniform");
  EXPECT_EQ(c["bias_initializer"]["class_name"], "Zeros");
  EXPECT_TRUE(c["kernel_regularizer"].is_null());
  EXPECT_EQ(c["name"], "dense");
  EXPECT_EQ(c["trainable"], true);
  EXPECT_EQ(c["dtype"]["config"]["name"], "float32");  // a DTypePolicy object, as Keras 3 writes it
}

TEST(Dense, TypedConstructorEqualsConfigConstructor) {
  layers::DenseImpl a(8, "gelu", Json{{"use_bias", false}, {"name", "d_typed"}});
  layers::DenseImpl b(Json{{"units", 8}, {"activation", "gelu"}, {"use_bias", false}, {"name", "d_typed"}});
  EXPECT_EQ(a.get_config(), b.get_config());
}

TEST(Dense, RejectsBadConfigsNamingTheKey) {
  expect_error<ValueError>(
      [] {
        layers::DenseImpl(Json{{"units", 0}});
      },
      {"Dense", "`units`", "expected a positive integer", "units=0"});
  expect_error<ValueError>([] { layers::DenseImpl(Json{{"units", 2.5}}); }, {"`units`", "units=2.5"});
  expect_error<ValueError>([] { (void)layers::DenseImpl(Json::object()); }, {"Dense", "missing `units`"});
  expect_error<ValueError>(
      [] {
        layers::DenseImpl(Json{{"units", 3}, {"unitz", 3}});
      },
      {"unknown key `unitz`", "units"});
  expect_error<ValueError>([] { layers::DenseImpl(3, "relux"); }, {"`activation`", "relux", "relu", "gelu"});
  expect_error<ValueError>(
      [] {
        layers::DenseImpl(Json{{"units", 3}, {"use_bias", "yes"}});
      },
      {"`use_bias`", "a boolean"});
  expect_error<ValueError>(
      [] {
        layers::DenseImpl(Json{{"units", 3}, {"kernel_initializer", "glorot_unifrom"}});
      },
      {"`kernel_initializer`", "glorot_unifrom"});
  expect_error<ValueError>(
      [] {
        layers::DenseImpl(Json{{"units", 3}, {"kernel_regularizer", "l3"}});
      },
      {"`kernel_regularizer`"});
  expect_error<ValueError>(
      [] {
        layers::DenseImpl(Json{{"units", 3}, {"kernel_constraint", "max_norm"}});
      },
      {"`kernel_constraint`"});
  expect_error<ValueError>([] { layers::DenseImpl(Json{{"units", 3}, {"dtype", "float31"}}); }, {"float31"});
}

TEST(Dense, RejectsInputsOfTheWrongWidth) {
  auto d = layers::Dense(3);
  (*d)(at::randn({2, 4}));
  expect_error<ShapeError>([&] { (*d)(at::randn({2, 5})); }, {"last dimension 4", "(2, 5)"});
}

TEST(Dense, RegularizersAddToTheLoss) {
  auto d = layers::Dense(3, "linear",
                         Json{{"kernel_regularizer", {{"class_name", "L2"}, {"config", {{"l2", 0.1}}}}},
                              {"activity_regularizer", {{"class_name", "L1"}, {"config", {{"l1", 0.01}}}}}});
  at::Tensor x = at::randn({2, 4});
  at::Tensor y = (*d)(x, /*training=*/true);
  double weights_only = 0.1 * d->kernel()->value().square().sum().item<double>();
  EXPECT_NEAR(d->regularization_loss().item<double>(), weights_only + 0.01 * y.abs().sum().item<double>(), 1e-5);
  // Inference calls record no activity penalty (they may run concurrently).
  (*d)(x, /*training=*/false);
  EXPECT_NEAR(d->regularization_loss().item<double>(), weights_only, 1e-5);
  EXPECT_EQ(d->get_config()["kernel_regularizer"]["class_name"], "L2");
}

TEST(Dense, KernelProductGoesThroughTheFloatStrategyUntilQuantized) {
  auto d = layers::Dense(3);
  EXPECT_THROW(d->quantize("int8"), StateError);  // not built
  (*d)(at::randn({2, 4}));
  EXPECT_EQ(d->kernel_impl().mode(), "float");
  EXPECT_THROW(d->quantize("int4"), ValueError);
  d->quantize("int8");
  EXPECT_EQ(d->kernel_impl().mode(), "int8");
  EXPECT_THROW(d->quantize("float8"), ValueError);  // already quantized
}

// One row in inference takes a matrix-vector product (kernel_impl.cc); it
// must give the product GEMM gives, with and without a bias, and keep the
// gradient when one is asked for.
TEST(Dense, OneRowInferenceGivesTheBatchedProduct) {
  for (bool use_bias : {true, false}) {
    auto d = layers::Dense(37, "linear", Json{{"use_bias", use_bias}});
    at::Tensor batch = at::randn({5, 300});
    (*d)(batch);
    if (use_bias) d->weights()[1]->assign(at::randn({37}));  // a bias of zeros would hide a missing add
    at::Tensor want = (*d)(batch, /*training=*/true);
    for (int64_t r = 0; r < 5; ++r) {
      at::Tensor row = batch.narrow(0, r, 1);
      at::Tensor got = (*d)(row, /*training=*/false);
      ASSERT_EQ(got.sizes(), (std::vector<int64_t>{1, 37}));
      EXPECT_TRUE(at::allclose(got, want.narrow(0, r, 1), 1e-5, 1e-5)) << "use_bias=" << use_bias << " row " << r;
    }
  }
  auto d = layers::Dense(4);
  at::Tensor x = at::randn({1, 3}).requires_grad_(true);
  (*d)(x, /*training=*/false).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(at::allclose(x.grad()[0], d->kernel()->value().sum(1), 1e-6, 1e-6));
}

// --- Activation ------------------------------------------------------------------------
TEST(Activation, KerasNumericFacts) {
  at::Tensor x = at::tensor({-1.0, 0.0, 1.0}, at::kDouble);
  auto at_ = [&](const std::string& n, int i) { return get_activation(n)(x)[i].item<double>(); };
  EXPECT_DOUBLE_EQ(at_("relu", 0), 0.0);
  EXPECT_DOUBLE_EQ(at_("relu", 2), 1.0);
  EXPECT_DOUBLE_EQ(at_("linear", 0), -1.0);
  EXPECT_DOUBLE_EQ(at_("sigmoid", 1), 0.5);
  EXPECT_NEAR(at_("tanh", 2), std::tanh(1.0), 1e-12);
  EXPECT_NEAR(at_("gelu", 2), 0.8413447460685429, 1e-9);  // exact (erf) form
  EXPECT_NEAR(at_("silu", 2), 1.0 / (1.0 + std::exp(-1.0)), 1e-12);
  EXPECT_NEAR(at_("swish", 2), at_("silu", 2), 0.0);
  EXPECT_NEAR(at_("leaky_relu", 0), -0.2, 1e-12);  // Keras 3 negative_slope
  EXPECT_NEAR(at_("elu", 0), std::exp(-1.0) - 1.0, 1e-12);
  EXPECT_NEAR(at_("softplus", 1), std::log(2.0), 1e-12);
  EXPECT_NEAR(at_("softsign", 0), -0.5, 1e-12);
  EXPECT_NEAR(at_("hard_sigmoid", 1), 0.5, 1e-12);
  EXPECT_NEAR(at_("selu", 2), 1.0507009873554805, 1e-9);
}

TEST(Activation, SoftmaxRowsSumToOne) {
  auto layer = layers::Activation("softmax");
  at::Tensor y = (*layer)(at::randn({4, 7}) * 5);
  EXPECT_TRUE(at::allclose(y.sum(-1), at::ones({4})));
  EXPECT_GE(y.min().item<float>(), 0.0f);
  EXPECT_EQ(layer->get_config()["activation"], "softmax");
}

TEST(Activation, UnknownNamesListTheKnownOnes) {
  expect_error<ValueError>([] { get_activation("relux"); }, {"relux", "relu", "softmax", "swish"});
  expect_error<ValueError>([] { layers::ActivationImpl("relux"); }, {"Activation", "`activation`", "relux"});
  expect_error<ValueError>([] { (void)layers::ActivationImpl(Json::object()); }, {"missing `activation`"});
  EXPECT_TRUE(is_activation("gelu"));
  EXPECT_FALSE(is_activation("Gelu"));
}

// --- Dropout ----------------------------------------------------------------------------
TEST(Dropout, TrainingZeroesAboutRateAndScalesTheRest) {
  auto d = layers::Dropout(0.3);
  at::Tensor x = at::rand({200, 100}) + 1.0;  // no zeros of its own
  at::Tensor y = (*d)(x, /*training=*/true);
  at::Tensor dropped = y == 0;
  double frac = dropped.to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(frac, 0.3, 0.02);
  at::Tensor kept = ~dropped;
  EXPECT_TRUE(at::allclose(y.masked_select(kept), x.masked_select(kept) / 0.7));
}

TEST(Dropout, IsIdentityAtInference) {
  auto d = layers::Dropout(0.5);
  at::Tensor x = at::randn({8, 8});
  EXPECT_TRUE(at::equal((*d)(x, false), x));
}

TEST(Dropout, SeedMakesMasksRepeat) {
  auto d = layers::Dropout(0.5);
  at::Tensor x = at::ones({16, 16});
  set_random_seed(42);
  at::Tensor a = (*d)(x, true);
  set_random_seed(42);
  at::Tensor b = (*d)(x, true);
  at::Tensor c = (*d)(x, true);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(at::equal(b, c));
}

TEST(Dropout, NoiseShapeSharesTheMask) {
  auto d = layers::Dropout(0.5, Json{{"noise_shape", {nullptr, 1, 6}}});
  at::Tensor y = (*d)(at::ones({4, 5, 6}), true);
  // Every position along axis 1 is kept or dropped together.
  EXPECT_TRUE(at::equal(y, y.select(1, 0).unsqueeze(1).expand_as(y)));
  EXPECT_GT((y == 0).sum().item<int64_t>(), 0);
  EXPECT_THROW((*d)(at::ones({4, 5}), true), ShapeError);
}

TEST(Dropout, RateOneDropsEverythingAndBadRatesThrow) {
  auto d = layers::Dropout(1.0);
  EXPECT_TRUE(at::equal((*d)(at::ones({3, 3}), true), at::zeros({3, 3})));
  expect_error<ValueError>([] { layers::DropoutImpl(1.5); }, {"Dropout", "`rate`", "rate=1.5"});
  expect_error<ValueError>([] { layers::DropoutImpl(-0.1); }, {"`rate`"});
  expect_error<ValueError>([] { (void)layers::DropoutImpl(Json::object()); }, {"missing `rate`"});
}

TEST(Dropout, BFloat16TrainingWorks) {
  auto d = layers::Dropout(0.5, Json{{"dtype", "mixed_bfloat16"}});
  at::Tensor y = (*d)(at::ones({64, 64}), true);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  double frac = (y == 0).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(frac, 0.5, 0.05);
  EXPECT_TRUE(at::all((y == 0) | (y == 2)).item<bool>());
}

// --- Flatten / Reshape -------------------------------------------------------------------
TEST(Flatten, KeepsRowMajorOrderAndChannelsFirstFlattensAsChannelsLast) {
  auto f = layers::Flatten();
  at::Tensor x = at::arange(24, at::kFloat).reshape({2, 3, 4});
  EXPECT_TRUE(at::equal((*f)(x), x.reshape({2, 12})));
  auto cf = layers::Flatten(Json{{"data_format", "channels_first"}});
  at::Tensor img = at::randn({2, 3, 4, 5});  // (N, C, H, W)
  EXPECT_TRUE(at::equal((*cf)(img), img.permute({0, 2, 3, 1}).reshape({2, 60})));
  auto r1 = layers::Flatten();
  EXPECT_EQ(sizes_of((*r1)(at::randn({4}))), (Shape{4, 1}));
  EXPECT_THROW(layers::FlattenImpl(Json{{"data_format", "nhwc"}}), ValueError);
}

TEST(Reshape, InfersMinusOneAndRejectsBadTargets) {
  auto r = layers::Reshape(Shape{-1, 3});
  at::Tensor x = at::arange(24, at::kFloat).reshape({2, 12});
  at::Tensor y = (*r)(x);
  EXPECT_EQ(sizes_of(y), (Shape{2, 4, 3}));
  EXPECT_TRUE(at::equal(y, x.reshape({2, 4, 3})));
  EXPECT_EQ(r->compute_output_shape({{kNone, 12}})[0], (Shape{kNone, 4, 3}));
  EXPECT_EQ(r->compute_output_shape({{kNone, kNone}})[0], (Shape{kNone, kNone, 3}));
  expect_error<ShapeError>([&] { (*r)(at::randn({2, 10})); }, {"Reshape", "(2, 10)"});
  expect_error<ValueError>([] { layers::ReshapeImpl(Shape{-1, -1}); }, {"`target_shape`"});
  expect_error<ValueError>([] { layers::ReshapeImpl(Shape{0, 3}); }, {"`target_shape`"});
  expect_error<ValueError>([] { (void)layers::ReshapeImpl(Json::object()); }, {"missing `target_shape`"});
}

// --- EinsumDense --------------------------------------------------------------------------
TEST(EinsumDense, MatchesDenseWithTheSameWeights) {
  auto e = layers::EinsumDense("ab,bc->ac", Shape{3}, "c", "tanh");
  auto d = layers::Dense(3, "tanh");
  at::Tensor x = at::randn({5, 4});
  (*e)(x);
  (*d)(x);
  d->set_weights(e->get_weights());
  EXPECT_TRUE(at::allclose((*e)(x), (*d)(x), 1e-5, 1e-6));
}

TEST(EinsumDense, KernelAndBiasShapesFollowTheEquation) {
  auto s = analyze_einsum("t", "abc,cde->abde", "de", {kNone, 7, 16}, {kNone, 4, 8});
  EXPECT_EQ(s.kernel, (Shape{16, 4, 8}));
  EXPECT_EQ(s.bias, (Shape{4, 8}));
  EXPECT_EQ(s.full_output, (Shape{kNone, 7, 4, 8}));
  auto o = analyze_einsum("t", "abcd,cde->abe", "e", {kNone, 7, 4, 8}, {kNone, 16});
  EXPECT_EQ(o.kernel, (Shape{4, 8, 16}));
  EXPECT_EQ(o.bias, (Shape{16}));
  // Bias on a middle axis broadcasts over the axes after it.
  auto m = analyze_einsum("t", "abc,cd->abd", "b", {kNone, 5, 3}, {5, 2});
  EXPECT_EQ(m.bias, (Shape{5, 1}));
  auto l = analyze_einsum("t", "...b,bc->...c", "c", {kNone, 6, 3}, {2});
  EXPECT_EQ(l.kernel, (Shape{3, 2}));
  EXPECT_EQ(l.full_output, (Shape{kNone, 6, 2}));
  auto r = analyze_einsum("t", "ab...,bc->ac...", "", {kNone, 3, 6}, {2});
  EXPECT_EQ(r.kernel, (Shape{3, 2}));
  EXPECT_EQ(r.full_output, (Shape{kNone, 2, 6}));
  auto rl = layers::EinsumDense("ab...,bc->ac...", Shape{2});
  at::Tensor x = at::randn({4, 3, 6});
  at::Tensor y = (*rl)(x);
  EXPECT_TRUE(at::allclose(y, at::einsum("abd,bc->acd", {x, rl->kernel()->value()})));
}

TEST(EinsumDense, RejectsBadEquationsAndShapes) {
  expect_error<ValueError>([] { layers::EinsumDenseImpl("ab,bc", Shape{3}); }, {"invalid einsum equation"});
  expect_error<ValueError>([] { layers::EinsumDenseImpl("ab,bc->a1", Shape{3}); }, {"invalid einsum equation"});
  expect_error<ValueError>([] { layers::EinsumDenseImpl("ab,bc->ac", Shape{3}, "z"); }, {"`bias_axes`"});
  expect_error<ValueError>([] { layers::EinsumDenseImpl("ab,bc->ac", Shape{3, 4}); }, {"`output_shape`"});
  expect_error<ValueError>([] { layers::EinsumDenseImpl(Json{{"output_shape", 3}}); }, {"missing `equation`"});
  auto e = layers::EinsumDense("abc,cd->abd", Shape{5, 2});
  expect_error<ValueError>([&] { (*e)(at::randn({2, 4, 3})); }, {"shared dimension 'b'"});
  auto f = layers::EinsumDense("ab,bc->ac", Shape{3});
  (*f)(at::randn({2, 4}));
  expect_error<ShapeError>([&] { (*f)(at::randn({2, 5})); }, {"kernel of shape (4, 3)"});
}

}  // namespace
}  // namespace kiln
