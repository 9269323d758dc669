// Special cases of the merge layers, Rescaling and Normalization.
#include <gtest/gtest.h>

#include "kiln/layers/merging.h"
#include "kiln/layers/preprocessing.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

// --- merging ----------------------------------------------------------------------------
TEST(Merging, ElementwiseValues) {
  at::Tensor a = at::tensor({1.0f, -2.0f, 3.0f}).reshape({1, 3});
  at::Tensor b = at::tensor({4.0f, 5.0f, -6.0f}).reshape({1, 3});
  at::Tensor c = at::tensor({0.5f, 0.5f, 0.5f}).reshape({1, 3});
  auto run = [&](Layer& l, Tensors in) { return l(in)[0].reshape({3}); };
  layers::AddImpl add;
  layers::SubtractImpl sub;
  layers::MultiplyImpl mul;
  layers::AverageImpl avg;
  layers::MaximumImpl mx;
  layers::MinimumImpl mn;
  EXPECT_TRUE(at::allclose(run(add, {a, b, c}), at::tensor({5.5f, 3.5f, -2.5f})));
  EXPECT_TRUE(at::allclose(run(sub, {a, b}), at::tensor({-3.0f, -7.0f, 9.0f})));
  EXPECT_TRUE(at::allclose(run(mul, {a, b, c}), at::tensor({2.0f, -5.0f, -9.0f})));
  EXPECT_TRUE(at::allclose(run(avg, {a, b}), at::tensor({2.5f, 1.5f, -1.5f})));
  EXPECT_TRUE(at::allclose(run(mx, {a, b, c}), at::tensor({4.0f, 5.0f, 3.0f})));
  EXPECT_TRUE(at::allclose(run(mn, {a, b, c}), at::tensor({0.5f, -2.0f, -6.0f})));
}

TEST(Merging, RejectsWrongInputCountsAndShapes) {
  layers::AddImpl add;
  expect_error<ValueError>([&] { add(Tensors{at::randn({2, 3})}); }, {"Add", "at least 2"});
  layers::AddImpl add2;
  expect_error<ShapeError>([&] { add2(Tensors{at::randn({2, 3}), at::randn({2, 4})}); }, {"broadcastable", "(2, 4)"});
  layers::SubtractImpl sub;
  expect_error<ValueError>(
      [&] {
        sub(Tensors{at::randn({1, 2}), at::randn({1, 2}), at::randn({1, 2})});
      },
      {"exactly 2"});
  expect_error<ValueError>([] { (void)layers::AddImpl(Json{{"axis", 1}}); }, {"Add", "`axis`"});
  layers::AddImpl sym;
  expect_error<ShapeError>([&] { sym.compute_output_shape({{kNone, 3}, {kNone, 5}}); }, {"broadcastable"});
}

TEST(Concatenate, JoinsAlongTheAxis) {
  layers::ConcatenateImpl cat;
  at::Tensor a = at::randn({2, 3}), b = at::randn({2, 4});
  at::Tensor y = cat(Tensors{a, b})[0];
  EXPECT_TRUE(at::equal(y, at::cat({a, b}, 1)));
  layers::ConcatenateImpl cat1(1);
  at::Tensor p = at::randn({2, 2, 5}), q = at::randn({2, 3, 5});
  EXPECT_TRUE(at::equal(cat1(Tensors{p, q})[0], at::cat({p, q}, 1)));
  EXPECT_EQ(cat1.compute_output_shape({{kNone, 2, 5}, {kNone, kNone, 5}})[0], (Shape{kNone, kNone, 5}));
  EXPECT_EQ(cat1.get_config()["axis"], 1);
  layers::ConcatenateImpl bad;
  expect_error<ShapeError>(
      [&] {
        bad(Tensors{at::randn({2, 3, 4}), at::randn({2, 5, 4})});
      },
      {"matching shapes except for the concatenation axis"});
  layers::ConcatenateImpl batch_axis(0);
  expect_error<ValueError>([&] { batch_axis(Tensors{a, a}); }, {"axis=0"});
}

// --- Rescaling ---------------------------------------------------------------------------
TEST(Rescaling, ScalesAndOffsetsInTheComputeDType) {
  layers::RescalingImpl r(1.0 / 255);
  at::Tensor img = at::tensor({0, 51, 255}, at::kByte).reshape({1, 3});
  at::Tensor y = r(img);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(y, at::tensor({0.0f, 0.2f, 1.0f}).reshape({1, 3})));
  layers::RescalingImpl centred(1.0 / 127.5, -1.0);
  EXPECT_TRUE(at::allclose(centred(img), at::tensor({-1.0f, -0.6f, 1.0f}).reshape({1, 3})));
  layers::RescalingImpl per_channel(Json{{"scale", {1.0, 2.0, 3.0}}, {"offset", {0.0, 0.0, 1.0}}});
  EXPECT_TRUE(at::allclose(per_channel(at::ones({2, 3})), at::tensor({1.0f, 2.0f, 4.0f}).expand({2, 3})));
  layers::RescalingImpl bf(0.5, 0.0, Json{{"dtype", "mixed_bfloat16"}});
  EXPECT_EQ(bf(img).scalar_type(), at::kBFloat16);
  expect_error<ValueError>([] { (void)layers::RescalingImpl(Json{{"scale", "half"}}); }, {"Rescaling", "`scale`"});
  expect_error<ValueError>([] { (void)layers::RescalingImpl(Json::object()); }, {"missing `scale`"});
}

// --- Normalization ---------------------------------------------------------------------------
TEST(Normalization, AdaptGivesZeroMeanUnitVariance) {
  layers::NormalizationImpl norm;
  at::Tensor data = at::randn({500, 3}) * at::tensor({1.0f, 10.0f, 0.1f}) + at::tensor({5.0f, -3.0f, 100.0f});
  norm.adapt(data);
  at::Tensor y = norm(data);
  EXPECT_TRUE(at::allclose(y.mean(0), at::zeros({3}), 1e-4, 1e-4));
  EXPECT_TRUE(at::allclose(y.var(0, /*unbiased=*/false), at::ones({3}), 1e-3, 1e-3));
  auto ws = norm.weights();
  ASSERT_EQ(ws.size(), 3u);
  EXPECT_EQ(ws[0]->name(), "mean");
  EXPECT_EQ(ws[1]->name(), "variance");
  EXPECT_EQ(ws[2]->name(), "count");
  EXPECT_EQ(ws[2]->dtype(), at::kLong);
  EXPECT_EQ(ws[2]->value().item<int64_t>(), 500);
  EXPECT_TRUE(norm.trainable_weights().empty());
  EXPECT_TRUE(at::allclose(ws[0]->value(), data.mean(0), 1e-5, 1e-4));
}

TEST(Normalization, AdaptedStatisticsTravelWithTheWeights) {
  layers::NormalizationImpl a;
  a.adapt(at::randn({50, 4}) * 3 + 2);
  layers::NormalizationImpl b;
  b(at::zeros({1, 4}));
  b.set_weights(a.get_weights());
  at::Tensor x = at::randn({5, 4});
  EXPECT_TRUE(at::equal(a(x), b(x)));
}

TEST(Normalization, GivenStatisticsInvertAndAxisNull) {
  layers::NormalizationImpl fixed({1.0, 2.0, 3.0}, {4.0, 1.0, 0.25});
  at::Tensor x = at::tensor({3.0f, 2.0f, 3.5f}).reshape({1, 3});
  EXPECT_TRUE(at::allclose(fixed(x), at::tensor({1.0f, 0.0f, 1.0f}).reshape({1, 3})));
  EXPECT_TRUE(fixed.weights().empty());
  EXPECT_EQ(fixed.get_config()["mean"], Json({1.0, 2.0, 3.0}));
  expect_error<ValueError>([&] { fixed.adapt(x); }, {"cannot adapt()"});
  layers::NormalizationImpl inverse(Json{{"mean", {1.0, 2.0, 3.0}}, {"variance", {4.0, 1.0, 0.25}}, {"invert", true}});
  EXPECT_TRUE(at::allclose(inverse(fixed(x)), x));
  layers::NormalizationImpl scalar(Json{{"axis", nullptr}});
  at::Tensor d = at::randn({100, 3}) * 2 + 1;
  scalar.adapt(d);
  EXPECT_EQ(scalar.weights()[0]->shape(), Shape{});
  at::Tensor y = scalar(d);
  EXPECT_NEAR(y.mean().item<double>(), 0.0, 1e-4);
  EXPECT_NEAR(y.var(/*unbiased=*/false).item<double>(), 1.0, 1e-3);
  EXPECT_TRUE(scalar.get_config()["axis"].is_null());
}

TEST(Normalization, RejectsBadConfigsAndData) {
  expect_error<ValueError>([] { (void)layers::NormalizationImpl(Json{{"mean", {1.0}}}); }, {"`variance`"});
  expect_error<ValueError>(
      [] {
        (void)layers::NormalizationImpl(Json{{"mean", {1.0}}, {"variance", {-1.0}}});
      },
      {"`variance`", "non-negative"});
  expect_error<ValueError>([] { (void)layers::NormalizationImpl(Json{{"axis", "last"}}); }, {"`axis`"});
  layers::NormalizationImpl wrong({1.0, 2.0}, {1.0, 1.0});
  expect_error<ValueError>([&] { wrong(at::randn({2, 3})); }, {"`mean` has 2 values"});
  layers::NormalizationImpl n;
  n.adapt(at::randn({10, 3}));
  expect_error<ShapeError>([&] { n.adapt(at::randn({10, 4})); }, {"adapt() received"});
  expect_error<ShapeError>([&] { n(at::randn({10, 4})); }, {"built for inputs of shape (None, 3)"});
}

}  // namespace
}  // namespace kiln
