// Typed Options of the layers that move or preprocess data (Flatten,
// Reshape, UpSampling2D, ZeroPadding2D, Cropping2D, Permute, RepeatVector,
// Activation, Rescaling, Normalization) and of StringLookup: an
// Options-built object's config equals the JSON-built one's for the same
// settings, and typed options get the JSON path's error messages.
#include <gtest/gtest.h>

#include <functional>

#include "kiln/layers/activations.h"
#include "kiln/layers/preprocessing.h"
#include "kiln/layers/reshaping.h"
#include "kiln/layers/spatial.h"
#include "kiln/layers/text_preprocessing.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

TEST(DataLayerOptions, ConfigEqualsJsonConfig) {
  auto expect_same = [](const Layer& typed, const Layer& json) {
    Json a = typed.get_config(), b = json.get_config();
    a.erase("name");  // auto-generated
    b.erase("name");
    EXPECT_EQ(a.dump(), b.dump()) << json.class_name();
  };
  expect_same(layers::FlattenImpl(layers::FlattenOptions{.data_format = "channels_first"}),
              layers::FlattenImpl(Json{{"data_format", "channels_first"}}));
  expect_same(layers::ReshapeImpl(layers::ReshapeOptions{.target_shape = {4, -1}}),
              layers::ReshapeImpl(Json{{"target_shape", {4, -1}}}));
  expect_same(layers::UpSampling2DImpl(layers::UpSampling2DOptions{.size = {3}, .interpolation = "BILINEAR"}),
              layers::UpSampling2DImpl(Json{{"size", 3}, {"interpolation", "bilinear"}}));
  expect_same(layers::ZeroPadding2DImpl(layers::ZeroPadding2DOptions{.padding = {{{1, 2}, {0, 3}}}}),
              layers::ZeroPadding2DImpl(Json{{"padding", {{1, 2}, {0, 3}}}}));
  expect_same(layers::Cropping2DImpl(
                  layers::Cropping2DOptions{.cropping = {{{1, 1}, {2, 2}}}, .data_format = "channels_first"}),
              layers::Cropping2DImpl(Json{{"cropping", {1, 2}}, {"data_format", "channels_first"}}));
  expect_same(layers::PermuteImpl(layers::PermuteOptions{.dims = {2, 1}}), layers::PermuteImpl(Json{{"dims", {2, 1}}}));
  expect_same(layers::RepeatVectorImpl(layers::RepeatVectorOptions{.n = 3}), layers::RepeatVectorImpl(Json{{"n", 3}}));
  expect_same(layers::ActivationImpl(layers::ActivationOptions{.activation = "gelu"}),
              layers::ActivationImpl(Json{{"activation", "gelu"}}));
  expect_same(layers::RescalingImpl(layers::RescalingOptions{.scale = 1.0 / 255}),
              layers::RescalingImpl(Json{{"scale", 1.0 / 255}}));
  expect_same(layers::NormalizationImpl(layers::NormalizationOptions{.axis = nullptr, .mean = 0.5, .variance = 0.25}),
              layers::NormalizationImpl(Json{{"axis", nullptr}, {"mean", 0.5}, {"variance", 0.25}}));
  expect_same(layers::StringLookupImpl(layers::StringLookupOptions{.mask_token = "", .vocabulary = {"a", "b"}}),
              layers::StringLookupImpl(Json{{"mask_token", ""}, {"vocabulary", {"a", "b"}}}));
  // A config read back gives the same config (the registry path).
  layers::NormalizationImpl norm(
      Json{{"axis", {1, 2}}, {"invert", true}, {"mean", {1.0, 2.0}}, {"variance", {4.0, 1.0}}});
  EXPECT_EQ(layers::NormalizationImpl(norm.get_config()).get_config().dump(), norm.get_config().dump());
}

TEST(DataLayerOptions, TypedOptionsGetTheJsonPathsMessages) {
  auto same = [](const std::function<void()>& from_json, const std::function<void()>& typed) {
    EXPECT_EQ(error_of<ValueError>(from_json), error_of<ValueError>(typed));
  };
  same(
      [] {
        layers::ReshapeImpl(Json{{"target_shape", {-1, -1}}});
      },
      [] {
        layers::ReshapeImpl(layers::ReshapeOptions{.target_shape = {-1, -1}});
      });
  same(
      [] {
        layers::PermuteImpl(Json{{"dims", {1, 3}}});
      },
      [] {
        layers::PermuteImpl(layers::PermuteOptions{.dims = {1, 3}});
      });
  same(
      [] {
        layers::RepeatVectorImpl(Json{{"n", 0}});
      },
      [] { layers::RepeatVectorImpl(layers::RepeatVectorOptions{.n = 0}); });
  same(
      [] {
        layers::UpSampling2DImpl(Json{{"interpolation", "cubic"}});
      },
      [] { layers::UpSampling2DImpl(layers::UpSampling2DOptions{.interpolation = "cubic"}); });
  same(
      [] {
        layers::FlattenImpl(Json{{"data_format", "nhwc"}});
      },
      [] { layers::FlattenImpl(layers::FlattenOptions{.data_format = "nhwc"}); });
  same(
      [] {
        layers::RescalingImpl(Json{{"scale", "big"}});
      },
      [] { layers::RescalingImpl(layers::RescalingOptions{.scale = "big"}); });
  same([] { (void)layers::RescalingImpl(Json::object()); }, [] { layers::RescalingImpl(layers::RescalingOptions{}); });
  same(
      [] {
        layers::NormalizationImpl(Json{{"mean", 1.0}});
      },
      [] { layers::NormalizationImpl(layers::NormalizationOptions{.mean = 1.0}); });
  same(
      [] {
        layers::NormalizationImpl(Json{{"mean", 0.0}, {"variance", -1.0}});
      },
      [] { layers::NormalizationImpl(layers::NormalizationOptions{.mean = 0.0, .variance = -1.0}); });
  same(
      [] {
        layers::StringLookup(Json{{"num_oov_indices", -1}});
      },
      [] { layers::StringLookup({.num_oov_indices = -1}); });
  same(
      [] {
        layers::StringLookup(Json{{"invert", true}, {"output_mode", "count"}});
      },
      [] { layers::StringLookup({.invert = true, .output_mode = "count"}); });
  // A typed Margins2D with a negative entry: the JSON form's message.
  expect_error<ValueError>(
      [] {
        layers::ZeroPadding2DImpl(layers::ZeroPadding2DOptions{.padding = {{{-1, 0}, {0, 0}}}});
      },
      {"ZeroPadding2D", "`padding`", "non-negative"});
  expect_error<ValueError>([] { layers::ActivationImpl(layers::ActivationOptions{}); }, {"Activation", "`activation`"});
}

}  // namespace
}  // namespace kiln
