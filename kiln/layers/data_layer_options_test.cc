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
  expect_same(Flatten(FlattenOptions{.data_format = "channels_first"}),
              Flatten(Json{{"data_format", "channels_first"}}));
  expect_same(Reshape(ReshapeOptions{.target_shape = {4, -1}}), Reshape(Json{{"target_shape", {4, -1}}}));
  expect_same(UpSampling2D(UpSampling2DOptions{.size = {3}, .interpolation = "BILINEAR"}),
              UpSampling2D(Json{{"size", 3}, {"interpolation", "bilinear"}}));
  expect_same(ZeroPadding2D(ZeroPadding2DOptions{.padding = {{{1, 2}, {0, 3}}}}),
              ZeroPadding2D(Json{{"padding", {{1, 2}, {0, 3}}}}));
  expect_same(Cropping2D(Cropping2DOptions{.cropping = {{{1, 1}, {2, 2}}}, .data_format = "channels_first"}),
              Cropping2D(Json{{"cropping", {1, 2}}, {"data_format", "channels_first"}}));
  expect_same(Permute(PermuteOptions{.dims = {2, 1}}), Permute(Json{{"dims", {2, 1}}}));
  expect_same(RepeatVector(RepeatVectorOptions{.n = 3}), RepeatVector(Json{{"n", 3}}));
  expect_same(Activation(ActivationOptions{.activation = "gelu"}), Activation(Json{{"activation", "gelu"}}));
  expect_same(Rescaling(RescalingOptions{.scale = 1.0 / 255}), Rescaling(Json{{"scale", 1.0 / 255}}));
  expect_same(Normalization(NormalizationOptions{.axis = nullptr, .mean = 0.5, .variance = 0.25}),
              Normalization(Json{{"axis", nullptr}, {"mean", 0.5}, {"variance", 0.25}}));
  StringLookup lookup_typed(StringLookupOptions{.mask_token = "", .vocabulary = {"a", "b"}});
  StringLookup lookup_json(Json{{"mask_token", ""}, {"vocabulary", {"a", "b"}}});
  EXPECT_EQ(lookup_typed.get_config().dump(), lookup_json.get_config().dump());
  // A config read back gives the same config (the registry path).
  Normalization norm(Json{{"axis", {1, 2}}, {"invert", true}, {"mean", {1.0, 2.0}}, {"variance", {4.0, 1.0}}});
  EXPECT_EQ(Normalization(norm.get_config()).get_config().dump(), norm.get_config().dump());
}

TEST(DataLayerOptions, TypedOptionsGetTheJsonPathsMessages) {
  auto same = [](const std::function<void()>& from_json, const std::function<void()>& typed) {
    EXPECT_EQ(error_of<ValueError>(from_json), error_of<ValueError>(typed));
  };
  same([] { Reshape(Json{{"target_shape", {-1, -1}}}); }, [] { Reshape(ReshapeOptions{.target_shape = {-1, -1}}); });
  same([] { Permute(Json{{"dims", {1, 3}}}); }, [] { Permute(PermuteOptions{.dims = {1, 3}}); });
  same([] { RepeatVector(Json{{"n", 0}}); }, [] { RepeatVector(RepeatVectorOptions{.n = 0}); });
  same(
      [] {
        UpSampling2D(Json{{"interpolation", "cubic"}});
      },
      [] { UpSampling2D(UpSampling2DOptions{.interpolation = "cubic"}); });
  same([] { Flatten(Json{{"data_format", "nhwc"}}); }, [] { Flatten(FlattenOptions{.data_format = "nhwc"}); });
  same([] { Rescaling(Json{{"scale", "big"}}); }, [] { Rescaling(RescalingOptions{.scale = "big"}); });
  same([] { Rescaling(Json::object()); }, [] { Rescaling(RescalingOptions{}); });
  same([] { Normalization(Json{{"mean", 1.0}}); }, [] { Normalization(NormalizationOptions{.mean = 1.0}); });
  same(
      [] {
        Normalization(Json{{"mean", 0.0}, {"variance", -1.0}});
      },
      [] { Normalization(NormalizationOptions{.mean = 0.0, .variance = -1.0}); });
  same(
      [] {
        StringLookup(Json{{"num_oov_indices", -1}});
      },
      [] { StringLookup(StringLookupOptions{.num_oov_indices = -1}); });
  same(
      [] {
        StringLookup(Json{{"invert", true}, {"output_mode", "count"}});
      },
      [] { StringLookup(StringLookupOptions{.invert = true, .output_mode = "count"}); });
  // A typed Margins2D with a negative entry: the JSON form's message.
  expect_error<ValueError>(
      [] {
        ZeroPadding2D(ZeroPadding2DOptions{.padding = {{{-1, 0}, {0, 0}}}});
      },
      {"ZeroPadding2D", "`padding`", "non-negative"});
  expect_error<ValueError>([] { Activation(ActivationOptions{}); }, {"Activation", "`activation`"});
}

}  // namespace
}  // namespace kiln
