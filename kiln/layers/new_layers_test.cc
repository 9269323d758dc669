// The layers of issue #10's "Layers users reach for" (image, activation,
// normalization, noise, augmentation and categorical preprocessing layers):
// conformance cases (joined into conformance_test.cc's list), golden
// comparisons against PyTorch (scripts/golden/make_golden.py, section
// "Layers"), and each layer's special behaviour.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/random.h"
#include "kiln/core/string_tensor.h"
#include "kiln/layers/activation_layers.h"
#include "kiln/layers/augmentation.h"
#include "kiln/layers/categorical.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/conv_transpose.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/group_norm.h"
#include "kiln/layers/noise.h"
#include "kiln/layers/reshaping.h"
#include "kiln/layers/spatial.h"
#include "kiln/layers/string_hash.h"
#include "kiln/layers/text_preprocessing.h"
#include "kiln/models/sequential.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/golden.h"
#include "kiln/testing/layer_conformance.h"
#include "kiln/testing/testing.h"

namespace kiln {

// Conformance cases of the layers above (conformance_test.cc runs them with
// its own and checks every registered layer has one).
std::vector<LayerTestCase> new_layer_cases() {
  std::vector<LayerTestCase> cases;
  auto add = [&](const std::string& name, const std::string& cls, const Json& config, std::vector<Shape> in,
                 std::vector<Shape> out, int64_t trainable = 0, int64_t non_trainable = 0) -> LayerTestCase& {
    LayerTestCase c;
    c.name = name;
    c.make = from_config(cls, config);
    c.input_shapes = std::move(in);
    c.expected_output_shapes = std::move(out);
    c.expected_trainable_params = trainable;
    c.expected_non_trainable_params = non_trainable;
    cases.push_back(c);
    return cases.back();
  };
  auto ints = [](LayerTestCase& c, int64_t high) {
    c.input_dtypes = {at::kLong};
    c.int_input_high = high;
  };
  // --- convolutions ---
  add("Conv2DTranspose_same_s2", "Conv2DTranspose",
      {{"filters", 3}, {"kernel_size", 3}, {"strides", 2}, {"padding", "same"}}, {{2, 4, 4, 2}}, {{2, 8, 8, 3}}, 57);
  add("Conv2DTranspose_valid_channels_first_op", "Conv2DTranspose",
      {{"filters", 2},
       {"kernel_size", 2},
       {"strides", 2},
       {"output_padding", 1},
       {"data_format", "channels_first"},
       {"activation", "tanh"}},
      {{2, 2, 3, 3}}, {{2, 2, 7, 7}}, 18);
  add("DepthwiseConv2D_same_dm2", "DepthwiseConv2D", {{"kernel_size", 3}, {"padding", "same"}, {"depth_multiplier", 2}},
      {{2, 5, 5, 3}}, {{2, 5, 5, 6}}, 60);
  add("DepthwiseConv2D_channels_first_strided", "DepthwiseConv2D",
      {{"kernel_size", 2}, {"strides", 2}, {"data_format", "channels_first"}, {"use_bias", false}}, {{2, 3, 5, 5}},
      {{2, 3, 2, 2}}, 12);
  add("SeparableConv2D_valid", "SeparableConv2D", {{"filters", 4}, {"kernel_size", 3}, {"activation", "relu"}},
      {{2, 5, 5, 3}}, {{2, 3, 3, 4}}, 43);
  // --- resampling and reshaping ---
  add("UpSampling2D_nearest", "UpSampling2D", Json::object(), {{2, 3, 3, 2}}, {{2, 6, 6, 2}});
  add("UpSampling2D_bilinear", "UpSampling2D", {{"size", {2, 1}}, {"interpolation", "bilinear"}}, {{2, 3, 3, 2}},
      {{2, 6, 3, 2}});
  add("ZeroPadding2D", "ZeroPadding2D", Json::object(), {{2, 3, 3, 2}}, {{2, 5, 5, 2}});
  add("Cropping2D", "Cropping2D", {{"cropping", {{1, 0}, {0, 1}}}}, {{2, 4, 4, 2}}, {{2, 3, 3, 2}});
  add("Permute", "Permute", {{"dims", {2, 1}}}, {{2, 3, 4}}, {{2, 4, 3}});
  add("RepeatVector", "RepeatVector", {{"n", 3}}, {{2, 4}}, {{2, 3, 4}});
  // --- activations ---
  add("ReLU_all_keys", "ReLU", {{"max_value", 1.5}, {"negative_slope", 0.1}, {"threshold", 0.2}}, {{3, 5}}, {{3, 5}});
  add("LeakyReLU", "LeakyReLU", Json::object(), {{3, 5}}, {{3, 5}});
  add("PReLU_shared", "PReLU", {{"shared_axes", {1}}, {"alpha_initializer", "random_uniform"}}, {{2, 3, 4}},
      {{2, 3, 4}}, 4);
  add("Softmax", "Softmax", Json::object(), {{3, 5}}, {{3, 5}});
  add("Softmax_two_axes", "Softmax", {{"axis", {1, 2}}}, {{2, 3, 4}}, {{2, 3, 4}});
  // --- normalization and noise ---
  add("GroupNormalization", "GroupNormalization", {{"groups", 2}}, {{2, 3, 3, 4}}, {{2, 3, 3, 4}}, 8);
  add("SpatialDropout2D", "SpatialDropout2D", {{"rate", 0.5}}, {{2, 3, 3, 4}}, {{2, 3, 3, 4}});
  add("GaussianNoise", "GaussianNoise", {{"stddev", 0.1}, {"seed", 1}}, {{2, 5}}, {{2, 5}});
  // --- image preprocessing and augmentation (identity at inference) ---
  add("Resizing_bilinear", "Resizing", {{"height", 4}, {"width", 3}}, {{2, 5, 6, 3}}, {{2, 4, 3, 3}});
  add("Resizing_nearest_channels_first", "Resizing",
      {{"height", 7}, {"width", 8}, {"interpolation", "nearest"}, {"data_format", "channels_first"}}, {{2, 3, 5, 6}},
      {{2, 3, 7, 8}});
  add("RandomFlip", "RandomFlip", Json::object(), {{2, 5, 6, 3}}, {{2, 5, 6, 3}});
  add("RandomTranslation", "RandomTranslation", {{"height_factor", 0.2}, {"width_factor", {-0.1, 0.3}}}, {{2, 5, 6, 3}},
      {{2, 5, 6, 3}});
  add("RandomRotation", "RandomRotation", {{"factor", 0.1}, {"fill_mode", "constant"}}, {{2, 5, 6, 3}}, {{2, 5, 6, 3}});
  add("RandomZoom", "RandomZoom", {{"height_factor", 0.2}, {"seed", 4}}, {{2, 5, 6, 3}}, {{2, 5, 6, 3}});
  // --- categorical preprocessing ---
  ints(add("CategoryEncoding_multi_hot", "CategoryEncoding", {{"num_tokens", 6}}, {{2, 3}}, {{2, 6}}), 6);
  ints(add("CategoryEncoding_one_hot", "CategoryEncoding", {{"num_tokens", 6}, {"output_mode", "one_hot"}}, {{4, 1}},
           {{4, 6}}),
       6);
  ints(add("CategoryEncoding_count", "CategoryEncoding", {{"num_tokens", 5}, {"output_mode", "count"}}, {{3, 4}},
           {{3, 5}}),
       5);
  ints(add("Hashing", "Hashing", {{"num_bins", 5}}, {{2, 3}}, {{2, 3}}), 100);
  ints(add("Hashing_salt_multi_hot", "Hashing", {{"num_bins", 4}, {"salt", 7}, {"output_mode", "multi_hot"}}, {{2, 3}},
           {{2, 4}}),
       100);
  ints(add("IntegerLookup", "IntegerLookup", {{"vocabulary", {1, 2, 3, 5}}}, {{2, 3}}, {{2, 3}}), 8);
  ints(add("IntegerLookup_count_mask", "IntegerLookup",
           {{"vocabulary", {1, 2, 3, 5}}, {"mask_token", 0}, {"output_mode", "count"}}, {{3, 4}}, {{3, 5}}),
       8);
  ints(add("IntegerLookup_invert", "IntegerLookup", {{"vocabulary", {10, 20, 30}}, {"invert", true}}, {{2, 3}},
           {{2, 3}}),
       6);
  // --- string inputs (kiln/core/string_tensor.h) ---
  auto texts = [](LayerTestCase& c, std::vector<std::string> pool) {
    c.input_dtypes = {kStringDType};
    c.string_pool = std::move(pool);
  };
  const std::vector<std::string> tokens = {"a", "b", "c", "d", "z", ""};
  const std::vector<std::string> sentences = {"The cat sat.", "a dog, a CAT!", "", "the end", "cat cat dog"};
  const char* const float32_out = "string layers give float32 encodings whatever the policy";
  texts(add("StringLookup", "StringLookup", {{"vocabulary", {"a", "b", "c", "d"}}}, {{2, 3}}, {{2, 3}}), tokens);
  texts(add("StringLookup_mask_two_oov", "StringLookup",
            {{"vocabulary", {"a", "b", "c"}}, {"mask_token", ""}, {"num_oov_indices", 2}}, {{4}}, {{4}}),
        tokens);
  LayerTestCase& multi = add("StringLookup_multi_hot", "StringLookup",
                             {{"vocabulary", {"a", "b", "c", "d"}}, {"output_mode", "multi_hot"}}, {{3, 2}}, {{3, 5}});
  texts(multi, tokens);
  multi.skip_mixed_precision = float32_out;
  texts(add("TextVectorization", "TextVectorization",
            {{"vocabulary", {"the", "cat", "dog"}}, {"output_sequence_length", 4}}, {{3}}, {{3, 4}}),
        sentences);
  LayerTestCase& counts =
      add("TextVectorization_count_bigrams", "TextVectorization",
          {{"vocabulary", {"the", "cat", "the cat"}}, {"output_mode", "count"}, {"ngrams", 2}}, {{3, 1}}, {{3, 4}});
  texts(counts, sentences);
  counts.skip_mixed_precision = float32_out;
  texts(add("Hashing_strings", "Hashing", {{"num_bins", 3}}, {{2, 3}}, {{2, 3}}), tokens);
  return cases;
}

namespace {

// --- golden comparisons against PyTorch -----------------------------------------------
TEST(NewLayersGolden, MatchPyTorch) {
  Json g = load_golden("kiln/layers/testdata/new_layers_golden.json");
  ASSERT_GE(g["cases"].size(), 50u);
  for (auto& c : g["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name + " (" + c["source"].get<std::string>() + ")");
    LayerPtr layer = LayerRegistry::create(c["class_name"].get<std::string>(), c["config"]);
    at::Tensor x = golden_tensor(c["input"]);
    Shape s = sizes_of(x);
    s[0] = kNone;
    layer->build_if_needed({s});
    Tensors w;
    for (auto& wt : c["weights"]) w.push_back(golden_tensor(wt));
    if (!w.empty()) layer->set_weights(w);
    at::Tensor y = (*layer)(x, c["training"].get<bool>());
    EXPECT_TRUE(tensors_close(y, golden_tensor(c["expected"]), c["rtol"].get<double>(), c["atol"].get<double>()))
        << name;
  }
}

// --- convolutions -------------------------------------------------------------------------
// TensorFlow's conv2d_transpose is the adjoint of its conv2d with the same
// padding: <ConvT(x), z> == <x, Conv(z)> for the same kernel.
TEST(Conv2DTranspose, IsTheAdjointOfConv2D) {
  struct G {
    int64_t k, s, h, w;
    const char* padding;
  };
  for (G g : {G{3, 2, 4, 5, "same"}, G{5, 3, 3, 4, "same"}, G{3, 2, 4, 4, "valid"}, G{2, 3, 3, 3, "valid"},
              G{4, 2, 3, 5, "same"}}) {
    SCOPED_TRACE(std::string(g.padding) + " k=" + std::to_string(g.k) + " s=" + std::to_string(g.s));
    Json cfg = {{"filters", 3}, {"kernel_size", g.k}, {"strides", g.s}, {"padding", g.padding}, {"use_bias", false}};
    layers::Conv2DTransposeImpl t(cfg);
    at::Tensor x = at::randn({2, g.h, g.w, 4}, at::kDouble);
    t.set_dtype_policy(DTypePolicy("float64"));
    at::Tensor y = t(x);
    layers::Conv2DImpl conv(Json{{"filters", 4},
                                 {"kernel_size", g.k},
                                 {"strides", g.s},
                                 {"padding", g.padding},
                                 {"use_bias", false},
                                 {"dtype", "float64"}});
    at::Tensor z = at::randn(y.sizes(), at::kDouble);
    conv.build_if_needed({sizes_of(z)});
    conv.set_weights({t.get_weights()[0]});  // (k, k, 3, 4): conv from 3 to 4 channels
    at::Tensor cz = conv(z);
    ASSERT_EQ(sizes_of(cz), sizes_of(x)) << "Conv2D must map the transposed output back to the input's shape";
    EXPECT_NEAR((y * z).sum().item<double>(), (x * cz).sum().item<double>(), 1e-9);
  }
}

TEST(Conv2DTranspose, RejectsBadConfig) {
  expect_error<ValueError>(
      [] {
        layers::Conv2DTransposeImpl(Json{{"filters", 2}, {"kernel_size", 3}, {"strides", 2}, {"output_padding", 2}});
      },
      {"output_padding", "smaller than the strides"});
  expect_error<ValueError>(
      [] {
        layers::Conv2DTransposeImpl(Json{{"filters", 2}, {"kernel_size", 3}, {"groups", 2}});
      },
      {"groups"});
  expect_error<ValueError>(
      [] {
        layers::Conv2DTransposeImpl(Json{{"filters", 2}, {"kernel_size", 3}, {"strides", 2}, {"dilation_rate", 2}});
      },
      {"Conv2DTranspose", "dilation_rate > 1"});
  expect_error<ValueError>(
      [] {
        layers::DepthwiseConv2DImpl(Json{{"kernel_size", 3}, {"strides", 2}, {"dilation_rate", 2}});
      },
      {"DepthwiseConv2D", "dilation_rate > 1"});
  expect_error<ValueError>(
      [] {
        layers::SeparableConv2DImpl(Json{{"kernel_size", 3}});
      },
      {"SeparableConv2D", "filters"});
}

TEST(DepthwiseConv2D, KerasWeightNamesAndShapes) {
  layers::SeparableConv2DImpl s(Json{{"filters", 5}, {"kernel_size", 3}, {"depth_multiplier", 2}, {"name", "sep"}});
  s.build_if_needed({{kNone, 8, 8, 3}});
  auto w = s.weights();
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0]->path(), "sep/depthwise_kernel");
  EXPECT_EQ(shape_to_string(w[0]->shape()), shape_to_string({3, 3, 3, 2}));
  EXPECT_EQ(w[1]->path(), "sep/pointwise_kernel");
  EXPECT_EQ(shape_to_string(w[1]->shape()), shape_to_string({1, 1, 6, 5}));
  EXPECT_EQ(w[2]->path(), "sep/bias");
}

// --- reshaping ------------------------------------------------------------------------------
TEST(SpatialLayers, ValuesAndErrors) {
  at::Tensor x = at::arange(6, at::kFloat).reshape({1, 2, 3});
  layers::RepeatVectorImpl rv(2);
  EXPECT_TRUE(
      at::equal(rv(at::tensor({1.0f, 2.0f}).reshape({1, 2})), at::tensor({1.0f, 2.0f, 1.0f, 2.0f}).reshape({1, 2, 2})));
  layers::PermuteImpl p(std::vector<int64_t>{2, 1});
  EXPECT_TRUE(at::equal(p(x), x.transpose(1, 2)));
  expect_error<ValueError>([] { layers::PermuteImpl(std::vector<int64_t>{1, 3}); }, {"Permute", "dims", "permutation"});
  expect_error<ShapeError>(
      [] {
        layers::RepeatVectorImpl(2)(at::zeros({1, 2, 3}));
      },
      {"RepeatVector", "(batch, features)"});
  expect_error<ShapeError>(
      [] {
        layers::Cropping2DImpl(Json{{"cropping", 2}})(at::zeros({1, 4, 5, 1}));
      },
      {"Cropping2D", "leaves nothing"});
  layers::ZeroPadding2DImpl z(Json{{"padding", {{1, 0}, {2, 1}}}});
  EXPECT_EQ(z.get_config()["padding"].dump(), "[[1,0],[2,1]]");
  EXPECT_EQ(shape_to_string(z.compute_output_shape({{kNone, 3, kNone, 2}})[0]), shape_to_string({kNone, 4, kNone, 2}));
}

// --- activations ------------------------------------------------------------------------------
TEST(ActivationLayers, KerasDefaultsAndValidation) {
  EXPECT_DOUBLE_EQ(layers::LeakyReLUImpl().negative_slope(), 0.3);
  EXPECT_DOUBLE_EQ(layers::LeakyReLUImpl(Json{{"alpha", 0.1}}).negative_slope(), 0.1);  // Keras 2 key
  expect_error<ValueError>([] { layers::LeakyReLUImpl(-0.1); }, {"LeakyReLU", "negative_slope", "non-negative"});
  expect_error<ValueError>([] { layers::ReLUImpl(Json{{"max_value", -1}}); }, {"ReLU", "max_value"});
  expect_error<ValueError>([] { layers::ReLUImpl(Json{{"threshold", -1}}); }, {"ReLU", "threshold"});
  expect_error<ValueError>([] { layers::ReLUImpl(Json{{"maxvalue", 1}}); }, {"maxvalue"});
  // threshold: x > threshold passes, at or below it the slope applies.
  layers::ReLUImpl r(Json{{"threshold", 1.0}, {"negative_slope", 0.5}});
  EXPECT_TRUE(at::allclose(r(at::tensor({0.0f, 1.0f, 2.0f})), at::tensor({-0.5f, 0.0f, 2.0f})));
  layers::PReLUImpl pr(Json{{"shared_axes", {1, 2}}});
  pr.build_if_needed({{kNone, 4, 4, 3}});
  EXPECT_EQ(shape_to_string(pr.alpha()->shape()), shape_to_string({1, 1, 3}));
  EXPECT_EQ(pr.alpha()->value().abs().sum().item<float>(), 0.0f);  // zeros: starts as ReLU
  expect_error<ValueError>([] { layers::PReLUImpl(Json{{"shared_axes", 0}}); }, {"shared_axes", "1-based"});
  expect_error<ValueError>([] { layers::SoftmaxImpl(Json{{"axis", 3}})(at::zeros({2, 3})); }, {"Softmax", "axis=3"});
}

TEST(GroupNormalization, ChannelsMustDivide) {
  expect_error<ValueError>(
      [] {
        layers::GroupNormalizationImpl(Json{{"groups", 3}})(at::zeros({2, 4}));
      },
      {"GroupNormalization", "multiple of the number of groups (3)"});
  layers::GroupNormalizationImpl gn(Json{{"groups", 2}});
  at::Tensor x = at::randn({3, 5, 4}) * 3 + 2;
  at::Tensor y = gn(x);
  // Per sample and group of 2 channels: mean 0, variance 1 - eps effect.
  at::Tensor g = y.reshape({3, 5, 2, 2}).permute({0, 2, 1, 3}).reshape({3, 2, 10});
  EXPECT_LT(g.mean(-1).abs().max().item<float>(), 1e-5);
  EXPECT_NEAR(g.var(-1, /*unbiased=*/false).mean().item<float>(), 1.0f, 1e-3);
}

// A channels_last image batch that needs no gradient (the model's input)
// used to crash in LibTorch 2.11's group_norm backward (a write through a
// null input-gradient pointer, channels-last kernel, < 2048 positions).
TEST(GroupNormalization, ChannelsLastInputWithoutGradientTrainsGammaAndBeta) {
  layers::GroupNormalizationImpl gn(Json{{"groups", 4}});
  at::Tensor x = at::randn({2, 8, 8, 16});  // (N, H, W, C): 64 positions per channel
  gn.build_if_needed({{kNone, 8, 8, 16}});
  at::Tensor loss = (gn(x, true) * at::linspace(-1, 1, 16)).pow(2).sum();
  std::vector<at::Tensor> params = {gn.weights()[0]->value(), gn.weights()[1]->value()};
  auto grads = torch::autograd::grad({loss}, params);
  // The same computation on a channels-first contiguous copy (another kernel).
  at::Tensor g = params[0].detach().requires_grad_(true), b = params[1].detach().requires_grad_(true);
  at::Tensor y = at::group_norm(x.permute({0, 3, 1, 2}).contiguous(), 4, g, b, 1e-3).permute({0, 2, 3, 1});
  auto expected = torch::autograd::grad({(y * at::linspace(-1, 1, 16)).pow(2).sum()}, {g, b});
  EXPECT_TRUE(at::allclose(grads[0], expected[0], 1e-4, 1e-4));
  EXPECT_TRUE(at::allclose(grads[1], expected[1], 1e-4, 1e-4));
}

// --- noise ------------------------------------------------------------------------------------
TEST(SpatialDropout2D, DropsWholeChannelsInTrainingOnly) {
  at::Tensor x = at::ones({16, 3, 3, 8});
  layers::SpatialDropout2DImpl d(0.5);
  EXPECT_TRUE(at::equal(d(x, false), x));
  at::Tensor y = d(x, true);
  at::Tensor per_map = y.amax({1, 2});
  EXPECT_TRUE(at::equal(per_map, y.amin({1, 2}))) << "a feature map is kept or dropped whole";
  EXPECT_TRUE(at::logical_or(per_map == 0, per_map == 2).all().item<bool>());
  const double kept = (per_map == 2).to(at::kDouble).mean().item<double>();
  EXPECT_GT(kept, 0.3);
  EXPECT_LT(kept, 0.7);
  layers::SpatialDropout2DImpl cf(Json{{"rate", 0.5}, {"data_format", "channels_first"}});
  at::Tensor z = cf(at::ones({8, 4, 3, 3}), true);
  EXPECT_TRUE(at::equal(z.amax({2, 3}), z.amin({2, 3})));
}

TEST(GaussianNoise, NoiseInTrainingOnlyAndSeeded) {
  at::Tensor x = at::zeros({2000, 10});
  layers::GaussianNoiseImpl n(0.5);
  EXPECT_TRUE(at::equal(n(x, false), x));
  at::Tensor y = n(x, true);
  EXPECT_NEAR(y.mean().item<double>(), 0.0, 0.02);
  EXPECT_NEAR(y.std().item<double>(), 0.5, 0.02);
  layers::GaussianNoiseImpl a(Json{{"stddev", 0.1}, {"seed", 9}}), b(Json{{"stddev", 0.1}, {"seed", 9}});
  EXPECT_TRUE(at::equal(a(x, true), b(x, true))) << "the same seed gives the same noise";
  expect_error<ValueError>([] { layers::GaussianNoiseImpl(1.5); }, {"GaussianNoise", "stddev"});
}

// --- augmentation -------------------------------------------------------------------------------
TEST(Augmentation, IdentityAtInferenceAndSeededInTraining) {
  at::Tensor x = at::randn({4, 6, 5, 3});
  std::vector<Json> configs = {
      {{"class_name", "RandomFlip"}, {"config", {{"seed", 1}}}},
      {{"class_name", "RandomTranslation"}, {"config", {{"height_factor", 0.3}, {"width_factor", 0.3}, {"seed", 1}}}},
      {{"class_name", "RandomRotation"}, {"config", {{"factor", 0.2}, {"seed", 1}}}},
      {{"class_name", "RandomZoom"}, {"config", {{"height_factor", 0.3}, {"seed", 1}}}}};
  for (auto& j : configs) {
    SCOPED_TRACE(j.dump());
    LayerPtr a = layer_from_json(j), b = layer_from_json(j);
    EXPECT_TRUE(at::equal((*a)(x, false), x)) << "identity at inference";
    at::Tensor ya = (*a)(x, true), yb = (*b)(x, true);
    EXPECT_TRUE(at::equal(ya, yb)) << "same seed, same transformation";
    EXPECT_FALSE(at::equal(ya, (*a)(x, true))) << "the next call draws anew";
    // seed null: LibTorch's default generator, repeatable after set_random_seed.
    Json unseeded = j;
    unseeded["config"].erase("seed");
    LayerPtr c = layer_from_json(unseeded);
    set_random_seed(77);
    at::Tensor y1 = (*c)(x, true);
    set_random_seed(77);
    EXPECT_TRUE(at::equal(y1, (*c)(x, true)));
  }
}

TEST(Augmentation, RandomFlipFlipsWholeImages) {
  at::Tensor x = at::randn({64, 4, 5, 2});
  layers::RandomFlipImpl h(Json{{"mode", "horizontal"}, {"seed", 2}});
  at::Tensor y = h(x, true);
  int flipped = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const bool same = at::equal(y[i], x[i]), mirrored = at::equal(y[i], x[i].flip({1}));
    EXPECT_TRUE(same || mirrored) << "image " << i;
    flipped += mirrored;
  }
  EXPECT_GT(flipped, 16);
  EXPECT_LT(flipped, 48);
}

TEST(Augmentation, TranslationWrapAndRotationByQuarterTurn) {
  at::Tensor x = at::randn({2, 4, 4, 3});
  // dy = 0.5 * 4 = 2 rows down, dx = -0.25 * 4 = 1 column left, wrapped around.
  layers::RandomTranslationImpl t(
      Json{{"height_factor", {0.5, 0.5}}, {"width_factor", {-0.25, -0.25}}, {"fill_mode", "wrap"}});
  EXPECT_TRUE(at::allclose(t(x, true), at::roll(x, {2, -1}, {1, 2})));
  // factor 0.25 = a quarter turn counter-clockwise (Keras: positive is counter-clockwise).
  layers::RandomRotationImpl r(Json{{"factor", {0.25, 0.25}}, {"interpolation", "nearest"}});
  EXPECT_TRUE(at::equal(r(x, true), at::rot90(x, 1, {1, 2})));
  // Unbatched images and channels_first work too.
  layers::RandomRotationImpl rc(
      Json{{"factor", {0.25, 0.25}}, {"interpolation", "nearest"}, {"data_format", "channels_first"}});
  at::Tensor cf = x.permute({0, 3, 1, 2});
  EXPECT_TRUE(at::equal(rc(cf, true), at::rot90(cf, 1, {2, 3})));
  EXPECT_TRUE(at::equal(r(x[0], true), at::rot90(x[0], 1, {0, 1})));
}

TEST(Augmentation, RejectsBadFactors) {
  expect_error<ValueError>(
      [] {
        layers::RandomTranslationImpl(Json{{"height_factor", 1.5}, {"width_factor", 0.1}});
      },
      {"RandomTranslation", "height_factor"});
  expect_error<ValueError>([] { layers::RandomTranslationImpl(Json{{"height_factor", 0.1}}); }, {"width_factor"});
  expect_error<ValueError>([] { layers::RandomZoomImpl(Json{{"height_factor", {-1.5, 0.0}}}); }, {"RandomZoom"});
  expect_error<ValueError>([] { layers::RandomRotationImpl(Json{{"factor", 1.5}}); }, {"RandomRotation", "factor"});
  expect_error<ValueError>(
      [] {
        layers::RandomZoomImpl(Json{{"height_factor", 0.5}, {"width_factor", {0.0, 2.0}}});
      },
      {"width_factor"});
  // Keras's reading: a reversed pair is sorted, a negative number is its magnitude.
  layers::RandomRotationImpl rr(Json{{"factor", {0.3, 0.1}}});
  EXPECT_EQ(rr.get_config()["factor"].dump(), "[0.1,0.3]");
  EXPECT_EQ(layers::RandomRotationImpl(Json{{"factor", -0.2}}).get_config()["factor"].dump(), "[-0.2,0.2]");
  expect_error<ValueError>(
      [] {
        layers::RandomRotationImpl(Json{{"factor", 0.1}, {"fill_mode", "mirror"}});
      },
      {"fill_mode"});
  expect_error<ValueError>([] { layers::ResizingImpl(Json{{"height", 2}}); }, {"Resizing", "width"});
}

TEST(Resizing, IntegerImagesAndShapes) {
  layers::ResizingImpl r(4, 6);
  at::Tensor img = at::randint(0, 256, {2, 8, 12, 3}, at::kByte);
  at::Tensor y = r(img);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_EQ(shape_to_string(sizes_of(y)), shape_to_string({2, 4, 6, 3}));
  // Halving with half-pixel centres averages 2x2 blocks.
  at::Tensor f = img.to(at::kFloat).reshape({2, 4, 2, 6, 2, 3}).mean({2, 4});
  EXPECT_TRUE(at::allclose(y, f, 1e-5, 1e-4));
}

// --- categorical preprocessing (Keras's documented examples) ------------------------------------
at::Tensor nl_long(std::vector<int64_t> v, Shape s) { return at::tensor(v, at::kLong).reshape(s); }
at::Tensor nl_float(std::vector<float> v, Shape s) { return at::tensor(v, at::kFloat).reshape(s); }

TEST(CategoryEncoding, KerasExamples) {
  layers::CategoryEncodingImpl one_hot(4, "one_hot");
  EXPECT_TRUE(at::equal(one_hot(nl_long({3, 2, 0, 1}, {4})),
                        nl_float({0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0}, {4, 4})));
  layers::CategoryEncodingImpl multi(4, "multi_hot");
  at::Tensor in = nl_long({0, 1, 0, 0, 1, 2, 3, 1}, {4, 2});
  EXPECT_TRUE(at::equal(multi(in), nl_float({1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1}, {4, 4})));
  layers::CategoryEncodingImpl count(4, "count");
  EXPECT_TRUE(at::equal(count(in), nl_float({1, 1, 0, 0, 2, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1}, {4, 4})));
  EXPECT_EQ(shape_to_string(one_hot.compute_output_shape({{kNone, 3}})[0]), shape_to_string({kNone, 3, 4}));
  expect_error<ValueError>([&] { count(nl_long({0, 4}, {1, 2})); }, {"CategoryEncoding", "[0, 4)", "4"});
  expect_error<ShapeError>([&] { count(nl_long({0, 1}, {1, 1, 2})); }, {"rank 1 or 2"});
}

TEST(IntegerLookup, KerasExamples) {
  const std::vector<int64_t> vocab = {12, 36, 1138, 42};
  at::Tensor data = nl_long({12, 1138, 42, 42, 1000, 36}, {2, 3});
  layers::IntegerLookupImpl lookup(Json{{"vocabulary", vocab}});
  EXPECT_TRUE(at::equal(lookup(data), nl_long({1, 3, 4, 4, 0, 2}, {2, 3})));
  layers::IntegerLookupImpl two_oov(Json{{"vocabulary", vocab}, {"num_oov_indices", 2}});
  EXPECT_TRUE(at::equal(two_oov(nl_long({12, 1138, 42, 37, 1000, 36}, {2, 3})), nl_long({2, 4, 5, 1, 0, 3}, {2, 3})));
  layers::IntegerLookupImpl masked(Json{{"vocabulary", vocab}, {"mask_token", 0}});
  EXPECT_TRUE(at::equal(masked(nl_long({12, 0, 42, 42, 1000, 36}, {2, 3})), nl_long({2, 0, 5, 5, 1, 3}, {2, 3})));
  layers::IntegerLookupImpl one_hot(Json{{"vocabulary", vocab}, {"output_mode", "one_hot"}});
  EXPECT_TRUE(at::equal(one_hot(nl_long({12, 36, 1138, 42, 7}, {5, 1})),
                        nl_float({0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0}, {5, 5})));
  layers::IntegerLookupImpl multi(Json{{"vocabulary", vocab}, {"output_mode", "multi_hot"}});
  at::Tensor md = nl_long({12, 1138, 42, 42, 42, 7, 36, 7}, {2, 4});
  EXPECT_TRUE(at::equal(multi(md), nl_float({0, 1, 0, 1, 1, 1, 0, 1, 0, 1}, {2, 5})));
  layers::IntegerLookupImpl count(Json{{"vocabulary", vocab}, {"output_mode", "count"}});
  EXPECT_TRUE(at::equal(count(md), nl_float({0, 1, 0, 1, 2, 2, 0, 1, 0, 1}, {2, 5})));
  layers::IntegerLookupImpl inverse(Json{{"vocabulary", vocab}, {"invert", true}});
  EXPECT_TRUE(at::equal(inverse(nl_long({1, 3, 4, 4, 0, 2}, {2, 3})), nl_long({12, 1138, 42, 42, -1, 36}, {2, 3})));
  // count with a mask token: the mask is dropped, not counted.
  layers::IntegerLookupImpl mcount(Json{{"vocabulary", vocab}, {"mask_token", 0}, {"output_mode", "count"}});
  EXPECT_TRUE(at::equal(mcount(nl_long({0, 12, 0, 7}, {1, 4})), nl_float({1, 1, 0, 0, 0}, {1, 5})));
}

TEST(IntegerLookup, AdaptSortsByFrequencyThenValueDescending) {
  layers::IntegerLookupImpl lookup;
  lookup.adapt(nl_long({12, 1138, 42, 42, 1000, 36}, {2, 3}));
  // Keras: layer.get_vocabulary() == [-1, 42, 1138, 1000, 36, 12] (-1 is the OOV token).
  EXPECT_EQ(lookup.get_vocabulary(), (std::vector<int64_t>{42, 1138, 1000, 36, 12}));
  EXPECT_EQ(lookup.vocabulary_size(), 6);
  EXPECT_TRUE(at::equal(lookup(nl_long({42, 12, 5}, {3})), nl_long({1, 5, 0}, {3})));
  // The adapted vocabulary is in the config: a copy from it looks up the same.
  LayerPtr copy = layer_from_json(lookup.to_json());
  EXPECT_TRUE(at::equal((*copy)(nl_long({42, 12, 5}, {3})), nl_long({1, 5, 0}, {3})));
  // max_tokens counts the reserved OOV id; mask and OOV tokens are not learned.
  layers::IntegerLookupImpl small(Json{{"max_tokens", 3}, {"mask_token", 0}});
  small.adapt(nl_long({0, 0, 0, -1, -1, 7, 7, 8, 9}, {9}));
  EXPECT_EQ(small.get_vocabulary(), (std::vector<int64_t>{7}));
  // Streaming adapt equals one pass.
  layers::IntegerLookupImpl streamed;
  int calls = 0;
  streamed.adapt([&]() -> at::Tensor {
    ++calls;
    if (calls == 1) return nl_long({12, 1138, 42}, {3});
    if (calls == 2) return nl_long({42, 1000, 36}, {3});
    return at::Tensor();
  });
  EXPECT_EQ(streamed.get_vocabulary(), lookup.get_vocabulary());
}

TEST(IntegerLookup, Errors) {
  layers::IntegerLookupImpl strict(Json{{"vocabulary", {1, 2}}, {"num_oov_indices", 0}});
  expect_error<ValueError>([&] { strict(nl_long({1, 5}, {2})); }, {"IntegerLookup", "5", "num_oov_indices"});
  expect_error<ValueError>([] { layers::IntegerLookupImpl(Json{{"vocabulary", {1, -1}}}); }, {"OOV token"});
  expect_error<ValueError>([] { layers::IntegerLookupImpl(Json{{"vocabulary", {1, 1}}}); }, {"repeated token 1"});
  expect_error<ValueError>([] { layers::IntegerLookupImpl(Json{{"output_mode", "tf_idf"}}); }, {"output_mode"});
  expect_error<ValueError>(
      [] {
        layers::IntegerLookupImpl(Json{{"invert", true}, {"output_mode", "count"}});
      },
      {"invert"});
}

// Reference values: TensorFlow's frozen Fingerprint64 values and its
// string_to_hash_bucket tests; Keras's Hashing tests; the SipHash paper.
TEST(StringHash, MatchesReferenceValues) {
  EXPECT_EQ(fingerprint64("a"), 12917804110809363939ULL);
  EXPECT_EQ(fingerprint64("b"), 11795596070477164822ULL);
  EXPECT_EQ(fingerprint64("c"), 11430444447143000872ULL);
  EXPECT_EQ(fingerprint64("d"), 4470636696479570465ULL);
  EXPECT_EQ(fingerprint64("Hello"), 15404698994557526151ULL);
  EXPECT_EQ(fingerprint64("World"), 18308117990299812472ULL);
  std::string m;
  for (int i = 0; i < 15; ++i) m.push_back((char)i);
  EXPECT_EQ(siphash24(0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL, ""), 0x726fdb47dd0e0e31ULL);
  EXPECT_EQ(siphash24(0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL, m), 0xa129ca6149be45e5ULL);
  // Longer inputs run (paths not covered by the references above).
  EXPECT_NE(fingerprint64(std::string(100, 'x')), fingerprint64(std::string(101, 'x')));
  EXPECT_NE(fingerprint64(std::string(40, 'x')), fingerprint64(std::string(20, 'x')));
}

TEST(Hashing, KerasTestExpectations) {
  const std::vector<std::string> words = {"omar", "stringer", "marlo", "wire", "skywalker"};
  layers::HashingImpl farm(Json{{"num_bins", 2}});
  EXPECT_TRUE(at::equal(farm.hash_strings(words, {5, 1}), nl_long({0, 0, 1, 0, 0}, {5, 1})));
  layers::HashingImpl ints(Json{{"num_bins", 3}});
  EXPECT_TRUE(at::equal(ints(nl_long({0, 1, 2, 3, 4}, {5, 1})), nl_long({1, 0, 1, 0, 2}, {5, 1})));
  layers::HashingImpl sip(Json{{"num_bins", 2}, {"salt", {133, 137}}});
  EXPECT_TRUE(at::equal(sip.hash_strings(words), nl_long({0, 1, 0, 1, 0}, {5})));
  layers::HashingImpl sip2(Json{{"num_bins", 2}, {"salt", {211, 137}}});
  EXPECT_TRUE(at::equal(sip2.hash_strings(words), nl_long({1, 0, 1, 0, 1}, {5})));
  layers::HashingImpl sip_ints(Json{{"num_bins", 3}, {"salt", {133, 137}}});
  EXPECT_TRUE(at::equal(sip_ints(nl_long({0, 1, 2, 3, 4}, {5, 1})), nl_long({1, 1, 2, 0, 1}, {5, 1})));
  // mask_value: bin 0 is the mask's, the rest hash into [1, num_bins).
  layers::HashingImpl masked(Json{{"num_bins", 3}, {"mask_value", 0}});
  at::Tensor y = masked(nl_long({0, 1, 2, 3, 4, 0}, {6}));
  EXPECT_EQ(y[0].item<int64_t>(), 0);
  EXPECT_EQ(y[5].item<int64_t>(), 0);
  EXPECT_TRUE((y.slice(0, 1, 5) >= 1).all().item<bool>());
  layers::HashingImpl one_hot(Json{{"num_bins", 3}, {"output_mode", "one_hot"}});
  EXPECT_TRUE(at::equal(one_hot(nl_long({0, 1}, {2, 1})), nl_float({0, 1, 0, 1, 0, 0}, {2, 3})));
}

// --- strings (Keras's documented examples) ----------------------------------------------------
using Strs = std::vector<std::string>;

TEST(StringLookup, KerasExamples) {
  const Json vocab = {"a", "b", "c", "d"};
  auto lookup = layers::StringLookup(Json{{"vocabulary", vocab}});
  // On a string tensor, as a layer: [["a","c","d"],["d","z","b"]] -> [[1,3,4],[4,0,2]].
  at::Tensor ids = lookup(strings::encode({"a", "c", "d", "d", "z", "b"}, {2, 3}));
  EXPECT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(ids, nl_long({1, 3, 4, 4, 0, 2}, {2, 3})));
  // The same on std::vector<std::string>.
  EXPECT_TRUE(at::equal((*lookup)(Strs{"a", "c", "d", "d", "z", "b"}, {2, 3}), nl_long({1, 3, 4, 4, 0, 2}, {2, 3})));
  // Two OOV ids: Fingerprint64("m") % 2 == 0, Fingerprint64("z") % 2 == 1 (Keras's example).
  auto two_oov = layers::StringLookup(Json{{"vocabulary", vocab}, {"num_oov_indices", 2}});
  EXPECT_TRUE(
      at::equal(two_oov(strings::encode({"a", "c", "d", "m", "z", "b"}, {2, 3})), nl_long({2, 4, 5, 0, 1, 3}, {2, 3})));
  auto masked = layers::StringLookup(Json{{"vocabulary", vocab}, {"mask_token", ""}});
  EXPECT_TRUE(
      at::equal(masked(strings::encode({"a", "c", "d", "d", "", "b"}, {2, 3})), nl_long({2, 4, 5, 5, 0, 3}, {2, 3})));
  auto inverse = layers::StringLookup(Json{{"vocabulary", vocab}, {"invert", true}});
  EXPECT_EQ(inverse->invert(nl_long({1, 3, 4, 4, 0, 2}, {2, 3})), (Strs{"a", "c", "d", "d", "[UNK]", "b"}));
  // invert=true as a layer: int ids -> a string tensor of the ids' shape.
  at::Tensor back = inverse(nl_long({1, 3, 4, 4, 0, 2}, {2, 3}));
  EXPECT_EQ(strings::logical_shape(back), (Shape{2, 3}));
  EXPECT_EQ(strings::decode(back), (Strs{"a", "c", "d", "d", "[UNK]", "b"}));
  auto multi = layers::StringLookup(Json{{"vocabulary", vocab}, {"output_mode", "multi_hot"}});
  at::Tensor mh = multi(strings::encode({"a", "b", "a", "z"}, {2, 2}));
  EXPECT_EQ(mh.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(mh, nl_float({0, 1, 1, 0, 0, 1, 1, 0, 0, 0}, {2, 5})));
  auto count = layers::StringLookup(Json{{"vocabulary", vocab}, {"output_mode", "count"}});
  EXPECT_TRUE(at::equal(count(strings::encode({"a", "a", "b", "z"}, {1, 4})), nl_float({1, 2, 1, 0, 0}, {1, 5})));
  auto one_hot = layers::StringLookup(Json{{"vocabulary", vocab}, {"output_mode", "one_hot"}});
  EXPECT_TRUE(at::equal(one_hot(strings::encode({"b", "z"})), nl_float({0, 0, 1, 0, 0, 1, 0, 0, 0, 0}, {2, 5})));
  // adapt from strings, a string tensor, and batch by batch: the same vocabulary.
  auto adapted = layers::StringLookup();
  adapted->adapt(Strs{"a", "c", "d", "d", "z", "b"});
  EXPECT_EQ(adapted->get_vocabulary(), (Strs{"[UNK]", "d", "z", "c", "b", "a"}));
  auto from_tensor = layers::StringLookup();
  from_tensor->adapt(strings::encode({"a", "c", "d", "d", "z", "b"}, {3, 2}));
  EXPECT_EQ(from_tensor->get_vocabulary(), adapted->get_vocabulary());
  auto batches = layers::StringLookup();
  std::vector<at::Tensor> parts = {strings::encode({"a", "c", "d"}), strings::encode({"d", "z", "b"})};
  size_t next = 0;
  batches->adapt([&]() { return next < parts.size() ? parts[next++] : at::Tensor(); });
  EXPECT_EQ(batches->get_vocabulary(), adapted->get_vocabulary());
  // The config round trip keeps the vocabulary (and the layer's name).
  auto copy = layers::StringLookup(adapted->get_config());
  EXPECT_EQ(copy->get_vocabulary(), adapted->get_vocabulary());
  EXPECT_EQ(layer_from_json(adapted->to_json())->get_config().dump(), adapted->get_config().dump());
  expect_error<ValueError>([] { layers::StringLookup(Json{{"vocabulary", {"a", "[UNK]"}}}); }, {"OOV token"});
  expect_error<ValueError>([] { layers::StringLookup(Json{{"vocab", {"a"}}}); }, {"StringLookup", "vocab"});
  expect_error<ValueError>([&] { lookup(nl_float({1, 2}, {2})); }, {"StringLookup", "string tensor", "float32"});
}

TEST(TextVectorization, StandardizeSplitAndPad) {
  auto tv = layers::TextVectorization(Json{{"output_sequence_length", 4}});
  EXPECT_EQ(tv->tokenize("The cat, the HAT!"), (Strs{"the", "cat", "the", "hat"}));
  tv->adapt(Strs{"the cat sat", "The dog sat.", "the end"});
  // Frequencies: the 3, sat 2, then cat, dog, end (ties by descending value).
  EXPECT_EQ(tv->get_vocabulary(), (Strs{"", "[UNK]", "the", "sat", "end", "dog", "cat"}));
  const at::Tensor want = nl_long({2, 6, 1, 1, 5, 0, 0, 0}, {2, 4});
  EXPECT_TRUE(at::equal((*tv)(Strs{"The cat ran away fast", "dog"}), want));
  at::Tensor ids = tv(strings::encode({"The cat ran away fast", "dog"}));
  EXPECT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(ids, want));
  EXPECT_TRUE(at::equal(tv(strings::encode({"The cat ran away fast", "dog"}, {2, 1})), want));  // (N, 1) too
  auto counts = layers::TextVectorization(Json{{"output_mode", "count"}, {"vocabulary", {"the", "cat"}}});
  EXPECT_TRUE(at::equal(counts(strings::encode({"the cat the bird"})), nl_float({1, 2, 1}, {1, 3})));
  auto multi = layers::TextVectorization(Json{{"output_mode", "multi_hot"}, {"vocabulary", {"the", "cat"}}});
  EXPECT_TRUE(at::equal(multi(strings::encode({"the cat the bird", "cat"})), nl_float({1, 1, 1, 0, 0, 1}, {2, 3})));
  auto longest = layers::TextVectorization(Json{{"vocabulary", {"a", "b"}}});  // padded to the longest text
  EXPECT_TRUE(at::equal(longest(strings::encode({"a b a", "b"})), nl_long({2, 3, 2, 3, 0, 0}, {2, 3})));
  auto limited = layers::TextVectorization(Json{{"max_tokens", 4}});
  limited->adapt(Strs{"a a a b b c"});
  EXPECT_EQ(limited->get_vocabulary(false), (Strs{"a", "b"}));
  auto chars = layers::TextVectorization(Json{{"split", "character"}, {"standardize", nullptr}});
  EXPECT_EQ(chars->tokenize("Ab"), (Strs{"A", "b"}));
  expect_error<ValueError>([] { layers::TextVectorization(Json{{"ngrams", 0}}); }, {"ngrams"});
  expect_error<ValueError>(
      [] {
        layers::TextVectorization(Json{{"ngrams", 2}, {"split", nullptr}});
      },
      {"ngrams", "split"});
  expect_error<ShapeError>([&] { tv(strings::encode({"a", "b", "c", "d"}, {2, 2})); }, {"(batch,)"});
}

// Keras's TextVectorization docstring: max_tokens=5000, output_sequence_length=4
// adapted on ["foo bar", "bar baz", "baz bada boom"]; [["foo qux bar"],
// ["qux baz"]] -> [[4, 1, 3, 0], [1, 2, 0, 0]]. And its second example, a
// given vocabulary ["earth", "wind", "and", "fire"]: "earth wind and fire"
// -> [2, 3, 4, 5], "fire and earth" -> [5, 4, 2, 0] (sequence length 4).
TEST(TextVectorization, KerasDocstringExamples) {
  auto tv =
      layers::TextVectorization(Json{{"max_tokens", 5000}, {"output_mode", "int"}, {"output_sequence_length", 4}});
  tv->adapt(strings::encode({"foo bar", "bar baz", "baz bada boom"}));
  EXPECT_TRUE(
      at::equal(tv(strings::encode({"foo qux bar", "qux baz"}, {2, 1})), nl_long({4, 1, 3, 0, 1, 2, 0, 0}, {2, 4})));
  auto given = layers::TextVectorization(
      Json{{"max_tokens", 5000}, {"output_sequence_length", 4}, {"vocabulary", {"earth", "wind", "and", "fire"}}});
  EXPECT_TRUE(at::equal(given(strings::encode({"earth wind and fire", "fire and earth"})),
                        nl_long({2, 3, 4, 5, 5, 4, 2, 0}, {2, 4})));
  // The config is written as given (no defaults filled in), vocabulary and base keys added.
  Json c = given->get_config();
  EXPECT_FALSE(c.contains("split"));
  EXPECT_EQ(c["vocabulary"], (Json{"earth", "wind", "and", "fire"}));
  auto copy = layer_from_json(given->to_json());
  EXPECT_EQ(copy->get_config().dump(), c.dump());
  EXPECT_TRUE(at::equal((*copy)(strings::encode({"fire and earth"})), nl_long({5, 4, 2, 0}, {1, 4})));
}

// ngrams (Keras): n -> the 1..n-grams, joined by a space, every unigram
// first, then every bigram; a list gives exactly those widths.
TEST(TextVectorization, Ngrams) {
  auto two = layers::TextVectorization(Json{{"ngrams", 2}});
  EXPECT_EQ(two->tokenize("The cat sat."), (Strs{"the", "cat", "sat", "the cat", "cat sat"}));
  auto only = layers::TextVectorization(Json{{"ngrams", {2, 3}}});
  EXPECT_EQ(only->tokenize("a b c"), (Strs{"a b", "b c", "a b c"}));
  EXPECT_EQ(only->tokenize("a"), Strs{});
  two->adapt(Strs{"the cat", "the cat", "a cat"});
  EXPECT_EQ(two->get_vocabulary(false), (Strs{"cat", "the cat", "the", "a cat", "a"}));
  EXPECT_EQ(two->get_config()["ngrams"], Json(2));
}

TEST(Hashing, StringTensors) {
  // Keras's documented bins: ["A", "B", "C", "D", "E"] with num_bins=3 -> [1, 0, 1, 1, 2].
  auto hashing = layers::Hashing(Json{{"num_bins", 3}});
  at::Tensor bins = hashing(strings::encode({"A", "B", "C", "D", "E"}, {5, 1}));
  EXPECT_TRUE(at::equal(bins, nl_long({1, 0, 1, 1, 2}, {5, 1})));
  EXPECT_TRUE(at::equal(bins.reshape({5}), hashing->hash_strings(Strs{"A", "B", "C", "D", "E"})));
  // With a salt (SipHash): the same bins hash_strings gives.
  auto salted = layers::Hashing(Json{{"num_bins", 2}, {"salt", {211, 137}}});
  const Strs words = {"the", "cat", "sat", "on", "mat"};
  EXPECT_TRUE(at::equal(salted(strings::encode(words)), salted->hash_strings(words)));
  auto masked = layers::Hashing(Json{{"num_bins", 3}, {"mask_value", ""}});
  EXPECT_EQ(masked(strings::encode({"", "x"}))[0].item<int64_t>(), 0);
  auto one_hot = layers::Hashing(Json{{"num_bins", 3}, {"output_mode", "one_hot"}});
  EXPECT_EQ(sizes_of(one_hot(strings::encode({"A", "B"}))), (Shape{2, 3}));
}

// --- inside a model -------------------------------------------------------------------------------
// The new layers train in a Sequential model (augmentation and noise active
// in fit, inactive in predict) and survive save / load_model.
TEST(NewLayersInAModel, TrainSaveLoadPredict) {
  set_random_seed(3);
  auto model = models::Sequential();
  model->add(layers::Input({8, 8, 1}));
  model->add(layer_from_json(Json{{"class_name", "RandomFlip"}, {"config", {{"seed", 1}}}}));
  model->add(layer_from_json(Json{{"class_name", "RandomRotation"}, {"config", {{"factor", 0.05}}}}));
  model->add(layer_from_json(Json{{"class_name", "GaussianNoise"}, {"config", {{"stddev", 0.05}}}}));
  model->add(layers::Conv2D(4, 3, "linear", Json{{"padding", "same"}}));
  model->add(layers::GroupNormalization(Json{{"groups", 2}}));
  model->add(layers::PReLU(Json{{"shared_axes", {1, 2}}}));
  model->add(layers::SpatialDropout2D(0.2));
  model->add(layers::DepthwiseConv2D(Json{{"kernel_size", 3}, {"padding", "same"}}));
  model->add(layers::Conv2DTranspose(Json{{"filters", 2}, {"kernel_size", 3}, {"strides", 2}, {"padding", "same"}}));
  model->add(layers::Cropping2D(Json{{"cropping", 4}}));
  model->add(layers::LeakyReLU());
  model->add(layers::UpSampling2D(Json{{"interpolation", "bilinear"}}));
  model->add(layers::Resizing(4, 4));
  model->add(layers::Flatten());
  model->add(layers::Dense(3));
  model->add(layers::Softmax());
  model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  at::Tensor x = at::randn({32, 8, 8, 1});
  at::Tensor y = at::randint(0, 3, {32}, at::kLong);
  FitArgs a;
  a.x = {x};
  a.y = {y};
  a.epochs = 2;
  a.batch_size = 8;
  a.verbose = 0;
  History h = model->fit(a);
  ASSERT_EQ(h.history["loss"].size(), 2u);
  EXPECT_TRUE(std::isfinite(h.history["loss"].back()));
  at::Tensor p = model->predict(x);
  EXPECT_TRUE(at::equal(p, model->predict(x))) << "no randomness at inference";
  TempDir dir;
  const std::string path = dir.path() + "/m/1";
  model->save(path);
  ModelPtr loaded = load_model(path);
  EXPECT_TRUE(at::allclose(loaded->predict(x), p, 1e-5, 1e-6));
}

}  // namespace
}  // namespace kiln
