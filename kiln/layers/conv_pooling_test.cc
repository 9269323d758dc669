// Special cases of Conv1D/Conv2D and the pooling layers.
#include <gtest/gtest.h>

#include "kiln/layers/conv.h"
#include "kiln/layers/pooling.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

// Direct loops over a channels_last input and a (kh, kw, in, out) kernel:
// an independent reference for "valid" convolution with strides.
at::Tensor reference_conv2d(const at::Tensor& x, const at::Tensor& k, int64_t sh, int64_t sw) {
  const int64_t n = x.size(0), h = x.size(1), w = x.size(2), ci = x.size(3);
  const int64_t kh = k.size(0), kw = k.size(1), co = k.size(3);
  const int64_t oh = (h - kh) / sh + 1, ow = (w - kw) / sw + 1;
  at::Tensor y = at::zeros({n, oh, ow, co}, at::kDouble);
  at::Tensor xd = x.detach().to(at::kDouble), kd = k.detach().to(at::kDouble);
  auto X = xd.accessor<double, 4>();
  auto K = kd.accessor<double, 4>();
  auto Y = y.accessor<double, 4>();
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t o = 0; o < co; ++o) {
          double s = 0;
          for (int64_t p = 0; p < kh; ++p)
            for (int64_t q = 0; q < kw; ++q)
              for (int64_t c = 0; c < ci; ++c) s += X[b][i * sh + p][j * sw + q][c] * K[p][q][c][o];
          Y[b][i][j][o] = s;
        }
  return y;
}

TEST(Conv2D, MatchesDirectLoopsWithKerasKernelLayout) {
  auto conv = layers::Conv2D(3, std::vector<int64_t>{2, 3}, "linear", Json{{"strides", {1, 2}}});
  at::Tensor x = at::randn({2, 5, 7, 4});
  at::Tensor y = (*conv)(x);
  EXPECT_EQ(conv->kernel()->shape(), (Shape{2, 3, 4, 3}));  // (kh, kw, in, out)
  at::Tensor ref = reference_conv2d(x, conv->kernel()->value(), 1, 2) + conv->bias()->value().to(at::kDouble);
  EXPECT_EQ(sizes_of(y), sizes_of(ref));
  EXPECT_TRUE(at::allclose(y.to(at::kDouble), ref, 1e-5, 1e-5));
}

TEST(Conv2D, SamePaddingKeepsHeightAndWidth) {
  auto conv = layers::Conv2D(8, 3, "relu", Json{{"padding", "same"}});
  EXPECT_EQ(sizes_of((*conv)(at::randn({2, 9, 7, 3}))), (Shape{2, 9, 7, 8}));
  auto c5 = layers::Conv2D(2, 5, "linear", Json{{"padding", "same"}});
  EXPECT_EQ(sizes_of((*c5)(at::randn({1, 6, 6, 1}))), (Shape{1, 6, 6, 2}));
}

TEST(Conv2D, SamePaddingWithStridesPutsTheOddPadAfterLikeTensorFlow) {
  // n=6, k=3, s=2: output 3, total padding 1, all of it after.
  auto conv = layers::Conv2D(2, 3, "linear", Json{{"padding", "same"}, {"strides", 2}, {"use_bias", false}});
  at::Tensor x = at::randn({1, 6, 6, 2});
  at::Tensor y = (*conv)(x);
  EXPECT_EQ(sizes_of(y), (Shape{1, 3, 3, 2}));
  at::Tensor padded = at::constant_pad_nd(x, {0, 0, 0, 1, 0, 1});  // W after, H after
  at::Tensor ref = reference_conv2d(padded, conv->kernel()->value(), 2, 2);
  EXPECT_TRUE(at::allclose(y.to(at::kDouble), ref, 1e-5, 1e-5));
}

TEST(Conv2D, ChannelsFirstAgreesWithChannelsLast) {
  auto last = layers::Conv2D(4, 3, "linear", Json{{"padding", "same"}});
  auto first = layers::Conv2D(4, 3, "linear", Json{{"padding", "same"}, {"data_format", "channels_first"}});
  at::Tensor x = at::randn({2, 5, 5, 3});
  at::Tensor a = (*last)(x);
  (*first)(x.permute({0, 3, 1, 2}).contiguous());
  first->set_weights(last->get_weights());
  at::Tensor b = (*first)(x.permute({0, 3, 1, 2}).contiguous());
  EXPECT_TRUE(at::allclose(a, b.permute({0, 2, 3, 1}), 1e-5, 1e-6));
  EXPECT_EQ(first->compute_output_shape({{kNone, 3, 5, 5}})[0], (Shape{kNone, 4, 5, 5}));
}

TEST(Conv2D, GroupsSplitChannels) {
  auto conv = layers::Conv2D(4, 1, "linear", Json{{"groups", 2}, {"use_bias", false}});
  at::Tensor x = at::randn({1, 3, 3, 4});
  at::Tensor y = (*conv)(x);
  EXPECT_EQ(conv->kernel()->shape(), (Shape{1, 1, 2, 4}));
  at::Tensor k = conv->kernel()->value()[0][0];  // (2, 4)
  // Outputs 0-1 see input channels 0-1 only; outputs 2-3 see channels 2-3.
  at::Tensor ref0 = at::matmul(x.slice(3, 0, 2), k.slice(1, 0, 2));
  at::Tensor ref1 = at::matmul(x.slice(3, 2, 4), k.slice(1, 2, 4));
  EXPECT_TRUE(at::allclose(y, at::cat({ref0, ref1}, 3), 1e-5, 1e-6));
}

TEST(Conv1D, CausalPaddingNeverLooksAhead) {
  auto conv = layers::Conv1D(2, 3, "linear", Json{{"padding", "causal"}, {"dilation_rate", 2}});
  at::Tensor x = at::randn({1, 10, 3});
  at::Tensor y = (*conv)(x);
  EXPECT_EQ(sizes_of(y), (Shape{1, 10, 2}));
  at::Tensor x2 = x.clone();
  x2.slice(1, 6, 10).add_(1.0);
  at::Tensor y2 = (*conv)(x2);
  EXPECT_TRUE(at::equal(y.slice(1, 0, 6), y2.slice(1, 0, 6)));
  EXPECT_FALSE(at::allclose(y.slice(1, 6, 10), y2.slice(1, 6, 10)));
}

TEST(Conv, RejectsBadConfigs) {
  expect_error<ValueError>([] { (void)layers::Conv2DImpl(0, 3); }, {"Conv2D", "`filters`", "filters=0"});
  expect_error<ValueError>(
      [] {
        (void)layers::Conv2DImpl(Json{{"filters", 2}, {"kernel_size", {3}}});
      },
      {"`kernel_size`", "list of 2"});
  expect_error<ValueError>([] { (void)layers::Conv2DImpl(Json{{"filters", 2}}); }, {"missing `kernel_size`"});
  expect_error<ValueError>(
      [] {
        (void)layers::Conv2DImpl(2, 3, "linear", Json{{"padding", "causal"}});
      },
      {"`padding`", "causal"});
  expect_error<ValueError>(
      [] {
        (void)layers::Conv2DImpl(2, 3, "linear", Json{{"strides", 2}, {"dilation_rate", 2}});
      },
      {"strides > 1", "dilation_rate > 1"});
  expect_error<ValueError>([] { (void)layers::Conv2DImpl(3, 3, "linear", Json{{"groups", 2}}); }, {"`groups`"});
  expect_error<ValueError>(
      [] {
        (void)layers::Conv1DImpl(2, 3, "linear", Json{{"data_format", "NWC"}});
      },
      {"`data_format`"});
  auto conv = layers::Conv2D(2, 1, "linear", Json{{"groups", 2}});
  expect_error<ValueError>([&] { (*conv)(at::randn({1, 3, 3, 3})); }, {"divisible by the number of groups"});
  auto small = layers::Conv2D(2, 5);
  expect_error<ShapeError>([&] { small->compute_output_shape({{kNone, 3, 3, 1}}); }, {"smaller than"});
  auto wrong = layers::Conv1D(2, 3);
  expect_error<ShapeError>([&] { (*wrong)(at::randn({1, 8})); }, {"rank 3"});
}

// --- pooling ----------------------------------------------------------------------------
TEST(MaxPooling2D, PicksWindowMaxima) {
  auto pool = layers::MaxPooling2D();
  at::Tensor x = at::arange(16, at::kFloat).reshape({1, 4, 4, 1});
  at::Tensor y = (*pool)(x);
  EXPECT_TRUE(at::equal(y.reshape({2, 2}), at::tensor({5.0f, 7.0f, 13.0f, 15.0f}).reshape({2, 2})));
  EXPECT_EQ(pool->get_config()["strides"], Json({2, 2}));  // default: pool_size
  EXPECT_EQ(pool->get_config()["padding"], "valid");
}

TEST(MaxPooling2D, SamePaddingNeverWinsAMax) {
  auto pool = layers::MaxPooling2D(std::vector<int64_t>{2, 2}, std::vector<int64_t>{2, 2}, "same");
  at::Tensor x = -at::ones({1, 3, 3, 2});
  at::Tensor y = (*pool)(x);
  EXPECT_EQ(sizes_of(y), (Shape{1, 2, 2, 2}));
  EXPECT_TRUE(at::equal(y, -at::ones({1, 2, 2, 2})));
}

TEST(AveragePooling2D, AveragesWindowsAndExcludesPadding) {
  auto pool = layers::AveragePooling2D();
  at::Tensor x = at::arange(16, at::kFloat).reshape({1, 4, 4, 1});
  EXPECT_TRUE(at::allclose((*pool)(x).reshape({2, 2}), at::tensor({2.5f, 4.5f, 10.5f, 12.5f}).reshape({2, 2})));
  auto same = layers::AveragePooling2D(std::vector<int64_t>{2, 2}, std::vector<int64_t>{2, 2}, "same");
  at::Tensor y = (*same)(at::ones({1, 3, 3, 1}));
  EXPECT_TRUE(at::allclose(y, at::ones({1, 2, 2, 1})));  // counted padding would give 0.5 and 0.25
  at::Tensor z = (*same)(at::arange(9, at::kFloat).reshape({1, 3, 3, 1}));
  // Windows: {0,1,3,4}, {2,5}, {6,7}, {8}.
  EXPECT_TRUE(at::allclose(z.reshape({4}), at::tensor({2.0f, 3.5f, 6.5f, 8.0f})));
}

TEST(Pooling1D, WorksOnSequences) {
  auto mp = layers::MaxPooling1D(3, 1);
  at::Tensor x = at::tensor({1.0f, 5.0f, 2.0f, 0.0f, 3.0f}).reshape({1, 5, 1});
  EXPECT_TRUE(at::equal((*mp)(x).reshape({3}), at::tensor({5.0f, 5.0f, 3.0f})));
  auto ap = layers::AveragePooling1D(2);
  EXPECT_TRUE(at::allclose((*ap)(x).reshape({2}), at::tensor({3.0f, 1.0f})));
}

TEST(GlobalPooling, ReducesSpatialAxes) {
  at::Tensor x = at::randn({2, 4, 5, 3});
  auto gap = layers::GlobalAveragePooling2D();
  EXPECT_TRUE(at::allclose((*gap)(x), x.mean({1, 2})));
  auto keep = layers::GlobalAveragePooling2D(Json{{"keepdims", true}});
  EXPECT_EQ(sizes_of((*keep)(x)), (Shape{2, 1, 1, 3}));
  auto gap1 = layers::GlobalAveragePooling1D();
  at::Tensor s = at::randn({2, 7, 3});
  EXPECT_TRUE(at::allclose((*gap1)(s), s.mean(1)));
  auto gmp = layers::GlobalMaxPooling2D();
  EXPECT_TRUE(at::equal((*gmp)(x), at::amax(x, {1, 2})));
  expect_error<ShapeError>([&] { (*gap)(at::randn({2, 3})); }, {"rank 4"});
}

TEST(Pooling, RejectsBadConfigs) {
  expect_error<ValueError>([] { (void)layers::MaxPooling2DImpl(Json{{"pool_size", 0}}); }, {"`pool_size`"});
  expect_error<ValueError>([] { (void)layers::MaxPooling2DImpl(Json{{"padding", "full"}}); }, {"`padding`"});
  expect_error<ValueError>([] { (void)layers::AveragePooling2DImpl(Json{{"strides", {1, 2, 3}}}); }, {"`strides`"});
  expect_error<ValueError>(
      [] {
        (void)layers::GlobalAveragePooling2DImpl(Json{{"keep_dims", true}});
      },
      {"`keep_dims`"});
  auto pool = layers::MaxPooling2D(std::vector<int64_t>{3, 3});
  expect_error<ShapeError>([&] { (*pool)(at::randn({1, 2, 2, 1})); }, {"smaller than pool_size"});
}

}  // namespace
}  // namespace kiln
