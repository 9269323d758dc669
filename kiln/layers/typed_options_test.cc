// Typed Options structs of the augmentation, categorical, EinsumDense,
// Embedding, Masking, merging and activation layers (their field tables):
// an Options-built layer's config equals the JSON-built one's for the same
// settings, and a bad typed value gets the JSON path's message.
#include <gtest/gtest.h>

#include <functional>

#include "kiln/layers/activation_layers.h"
#include "kiln/layers/augmentation.h"
#include "kiln/layers/categorical.h"
#include "kiln/layers/einsum_dense.h"
#include "kiln/layers/embedding.h"
#include "kiln/layers/kernel_impl.h"
#include "kiln/layers/masking.h"
#include "kiln/layers/merging.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

// The config without the auto-generated name, for comparing two layers.
std::string options_config_of(const Layer& l) {
  Json c = l.get_config();
  c.erase("name");
  return c.dump();
}

TEST(TypedLayerOptions, ConfigEqualsJsonConfig) {
  EXPECT_EQ(options_config_of(layers::MaskingImpl(layers::MaskingOptions{.mask_value = 0.5})),
            options_config_of(layers::MaskingImpl(Json{{"mask_value", 0.5}})));
  EXPECT_EQ(options_config_of(layers::ConcatenateImpl(layers::ConcatenateOptions{.axis = 1})),
            options_config_of(layers::ConcatenateImpl(Json{{"axis", 1}})));
  EXPECT_EQ(layers::AddImpl(layers::MergeOptions{.base = {.name = "sum"}}).name(), "sum");
  EXPECT_EQ(options_config_of(layers::PReLUImpl(
                layers::PReLUOptions{.alpha_initializer = "ones", .shared_axes = std::vector<int64_t>{1, 2}})),
            options_config_of(layers::PReLUImpl(Json{{"alpha_initializer", "ones"}, {"shared_axes", {1, 2}}})));
  EXPECT_EQ(options_config_of(layers::PReLUImpl(layers::PReLUOptions{.shared_axes = int64_t{1}})),
            options_config_of(layers::PReLUImpl(Json{{"shared_axes", 1}})));
  EXPECT_EQ(options_config_of(layers::EinsumDenseImpl(layers::EinsumDenseOptions{
                .equation = "abc,cde->abde", .output_shape = {kNone, 2, 3}, .bias_axes = "de"})),
            options_config_of(layers::EinsumDenseImpl("abc,cde->abde", Shape{kNone, 2, 3}, "de")));
  EXPECT_EQ(options_config_of(
                layers::CategoryEncodingImpl(layers::CategoryEncodingOptions{.num_tokens = 4, .output_mode = "COUNT"})),
            options_config_of(layers::CategoryEncodingImpl(4, "count")));
  EXPECT_EQ(options_config_of(layers::HashingImpl(layers::HashingOptions{.num_bins = 4, .mask_value = 0, .salt = 7})),
            options_config_of(layers::HashingImpl(Json{{"num_bins", 4}, {"mask_value", 0}, {"salt", {7, 7}}})));
  EXPECT_EQ(options_config_of(layers::IntegerLookupImpl(layers::IntegerLookupOptions{
                .max_tokens = 8, .mask_token = 0, .vocabulary = {3, 1}, .pad_to_max_tokens = true})),
            options_config_of(layers::IntegerLookupImpl(
                Json{{"max_tokens", 8}, {"mask_token", 0}, {"vocabulary", {3, 1}}, {"pad_to_max_tokens", true}})));
  EXPECT_EQ(options_config_of(
                layers::ResizingImpl(layers::ResizingOptions{.height = 4, .width = 3, .interpolation = "nearest"})),
            options_config_of(layers::ResizingImpl(4, 3, Json{{"interpolation", "nearest"}})));
  EXPECT_EQ(options_config_of(layers::RandomFlipImpl(layers::RandomFlipOptions{.mode = "vertical", .seed = 3})),
            options_config_of(layers::RandomFlipImpl(Json{{"mode", "vertical"}, {"seed", 3}})));
  // Factors are written as given (a number or a pair); RandomRotation writes the pair.
  EXPECT_EQ(
      options_config_of(layers::RandomTranslationImpl(
          layers::RandomTranslationOptions{.height_factor = 0.2, .width_factor = {-0.1, 0.3}})),
      options_config_of(layers::RandomTranslationImpl(Json{{"height_factor", 0.2}, {"width_factor", {-0.1, 0.3}}})));
  EXPECT_EQ(options_config_of(layers::RandomZoomImpl(layers::RandomZoomOptions{.height_factor = 0.2, .seed = 4})),
            options_config_of(layers::RandomZoomImpl(Json{{"height_factor", 0.2}, {"seed", 4}})));
  layers::RandomRotationImpl rotation(layers::RandomRotationOptions{.factor = 0.1, .fill_mode = "constant"});
  EXPECT_EQ(rotation.get_config()["factor"].dump(), "[-0.1,0.1]");
  EXPECT_EQ(options_config_of(rotation),
            options_config_of(layers::RandomRotationImpl(Json{{"factor", 0.1}, {"fill_mode", "constant"}})));
}

// One field table checks both paths: a bad value gives the same message
// from JSON and from the Options struct.
TEST(TypedLayerOptions, TypedOptionsGetTheJsonPathsMessage) {
  auto same = [](const std::function<void()>& from_json, const std::function<void()>& typed) {
    const std::string m = error_of<ValueError>(from_json);
    EXPECT_FALSE(m.empty());
    EXPECT_EQ(m, error_of<ValueError>(typed));
  };
  same(
      [] {
        layers::EmbeddingImpl(Json{{"input_dim", 0}, {"output_dim", 2}});
      },
      [] { layers::EmbeddingImpl(layers::EmbeddingOptions{.input_dim = 0, .output_dim = 2}); });
  same(
      [] {
        layers::PReLUImpl(Json{{"shared_axes", {1, 0}}});
      },
      [] {
        layers::PReLUImpl(layers::PReLUOptions{.shared_axes = std::vector<int64_t>{1, 0}});
      });
  same(
      [] {
        layers::LeakyReLUImpl(Json{{"negative_slope", -0.5}});
      },
      [] { layers::LeakyReLUImpl(layers::LeakyReLUOptions{.negative_slope = -0.5}); });
  same(
      [] {
        layers::EinsumDenseImpl(Json{{"equation", "ab,bc->ac"}, {"output_shape", {4, 5}}});
      },
      [] {
        layers::EinsumDenseImpl(layers::EinsumDenseOptions{.equation = "ab,bc->ac", .output_shape = {4, 5}});
      });
  same(
      [] {
        layers::CategoryEncodingImpl(Json{{"num_tokens", 3}, {"sparse", true}});
      },
      [] { layers::CategoryEncodingImpl(layers::CategoryEncodingOptions{.num_tokens = 3, .sparse = true}); });
  same(
      [] {
        layers::HashingImpl(Json{{"num_bins", 4}, {"salt", -1}});
      },
      [] { layers::HashingImpl(layers::HashingOptions{.num_bins = 4, .salt = -1}); });
  same(
      [] {
        layers::IntegerLookupImpl(Json{{"max_tokens", 1}});
      },
      [] { layers::IntegerLookupImpl(layers::IntegerLookupOptions{.max_tokens = 1}); });
  same(
      [] {
        layers::IntegerLookupImpl(Json{{"pad_to_max_tokens", true}});
      },
      [] { layers::IntegerLookupImpl(layers::IntegerLookupOptions{.pad_to_max_tokens = true}); });
  same(
      [] {
        layers::ResizingImpl(Json{{"height", 4}, {"width", 3}, {"antialias", true}});
      },
      [] { layers::ResizingImpl(layers::ResizingOptions{.height = 4, .width = 3, .antialias = true}); });
  same(
      [] {
        layers::RandomRotationImpl(Json{{"factor", 1.5}});
      },
      [] { layers::RandomRotationImpl(layers::RandomRotationOptions{.factor = 1.5}); });
  same(
      [] {
        layers::RandomTranslationImpl(Json{{"height_factor", 0.1}});
      },
      [] { layers::RandomTranslationImpl(layers::RandomTranslationOptions{.height_factor = 0.1}); });
}

TEST(TypedLayerOptions, LeakyReLUReadsTheLegacyAlphaKey) {
  EXPECT_DOUBLE_EQ(layers::LeakyReLUImpl(Json{{"alpha", 0.1}}).negative_slope(), 0.1);
  EXPECT_EQ(layers::LeakyReLUImpl(Json{{"alpha", 0.1}}).get_config().count("alpha"), 0u);
  expect_error<ValueError>([] { layers::LeakyReLUImpl(Json{{"alpha", -0.1}}); }, {"`alpha`", "non-negative"});
  expect_error<ValueError>(
      [] {
        layers::LeakyReLUImpl(Json{{"alpha", 0.1}, {"negative_slope", 0.2}});
      },
      {"legacy name"});
}

// quantization_modes() is "float" and the registry's modes, each of which
// make_kernel_impl builds.
TEST(TypedLayerOptions, QuantizationModesComeFromTheRegistry) {
  const std::vector<std::string> modes = quantization_modes();
  ASSERT_FALSE(modes.empty());
  EXPECT_EQ(modes.front(), "float");
  KernelSpec spec;
  spec.kernel_shape = {4, 3};
  spec.kernel_reduced_axes = {0};
  spec.input_reduced_axes = {-1};
  for (const std::string& mode : modes) EXPECT_EQ(make_kernel_impl(mode, spec)->mode(), mode);
}

}  // namespace
}  // namespace kiln
