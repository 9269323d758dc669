// Typed Options structs for layers, losses and optimizers: a model built
// from them alone trains; an Options-built object's config equals the
// JSON-built one's for the same settings; typed options get the JSON path's
// errors; an unknown JSON key is still a ValueError naming the key.
#include <gtest/gtest.h>

#include <functional>

#include "kiln/core/names.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/layers/embedding.h"
#include "kiln/layers/group_norm.h"
#include "kiln/layers/normalization.h"
#include "kiln/layers/recurrent.h"
#include "kiln/layers/regularizers.h"
#include "kiln/losses/crossentropy.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/adam.h"
#include "kiln/optimizers/sgd.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

// The config without the auto-generated name, for comparing two layers.
Json config_of(const Layer& l) {
  Json c = l.get_config();
  c.erase("name");
  return c;
}

TEST(Options, ModelFromOptionsStructsTrains) {
  auto model = models::Sequential();
  model->add(layers::Input({6}));
  model->add(layers::Dense({.units = 8, .activation = "relu", .base = {.name = "hidden"}}));
  model->add(layers::Dropout({.rate = 0.1}));
  model->add(layers::Dense({.units = 3}));
  model->compile({.optimizer = std::make_shared<optimizers::Adam>(optimizers::AdamOptions{.learning_rate = 1e-2}),
                  .loss = std::make_shared<losses::SparseCategoricalCrossentropy>(
                      losses::SparseCategoricalCrossentropyOptions{.from_logits = true})});
  at::Tensor x = at::randn({32, 6});
  at::Tensor y = at::randint(0, 3, {32}, at::kLong);
  History h = model->fit({.x = {x}, .y = {y}, .batch_size = 8, .epochs = 2, .verbose = 0});
  ASSERT_EQ(h.history.at("loss").size(), 2u);
  EXPECT_TRUE(std::isfinite(h.history.at("loss").back()));
  EXPECT_EQ(model->layers().at(0)->name(), "hidden");
}

TEST(Options, DenseOptionsConfigEqualsJsonConfig) {
  layers::DenseImpl typed(layers::DenseOptions{.units = 5,
                                               .activation = "tanh",
                                               .use_bias = false,
                                               .kernel_initializer = "he_normal",
                                               .kernel_regularizer = l2(0.02),
                                               .base = {.name = "d_typed"}});
  layers::DenseImpl json(Json{{"units", 5},
                              {"activation", "tanh"},
                              {"use_bias", false},
                              {"kernel_initializer", "he_normal"},
                              {"kernel_regularizer", l2(0.02)->to_json()},
                              {"name", "d_json"}});
  EXPECT_EQ(config_of(typed).dump(), config_of(json).dump());
  // A config read back gives the same config (the registry path).
  layers::DenseImpl again(json.get_config());
  EXPECT_EQ(again.get_config().dump(), json.get_config().dump());
}

TEST(Options, ConvDropoutEmbeddingOptionsConfigEqualJsonConfig) {
  layers::Conv2DImpl conv_typed(
      layers::Conv2DOptions{.filters = 4, .kernel_size = {3}, .strides = {2, 1}, .padding = "same"});
  layers::Conv2DImpl conv_json(Json{{"filters", 4}, {"kernel_size", 3}, {"strides", {2, 1}}, {"padding", "same"}});
  EXPECT_EQ(config_of(conv_typed).dump(), config_of(conv_json).dump());

  layers::DropoutImpl drop_typed(layers::DropoutOptions{.rate = 0.25, .noise_shape = Shape{kNone, 1}, .seed = 7});
  layers::DropoutImpl drop_json(Json{{"rate", 0.25}, {"noise_shape", {nullptr, 1}}, {"seed", 7}});
  EXPECT_EQ(config_of(drop_typed).dump(), config_of(drop_json).dump());

  layers::EmbeddingImpl emb_typed(layers::EmbeddingOptions{.input_dim = 10, .output_dim = 4, .mask_zero = true});
  layers::EmbeddingImpl emb_json(Json{{"input_dim", 10}, {"output_dim", 4}, {"mask_zero", true}});
  EXPECT_EQ(config_of(emb_typed).dump(), config_of(emb_json).dump());
}

TEST(Options, ConvenienceConstructorsMatchOptions) {
  layers::DenseImpl a(4, "relu");
  layers::DenseImpl b(layers::DenseOptions{.units = 4, .activation = "relu"});
  EXPECT_EQ(config_of(a).dump(), config_of(b).dump());
}

TEST(Options, TypedOptionsGetTheJsonPathsErrors) {
  expect_error<ValueError>([] { layers::DenseImpl(layers::DenseOptions{.units = 0}); },
                           {"Dense", "`units`", "positive integer", "units=0"});
  expect_error<ValueError>([] { layers::DenseImpl(layers::DenseOptions{.units = 2, .activation = "relux"}); },
                           {"`activation`", "relux"});
  expect_error<ValueError>([] { layers::DenseImpl(layers::DenseOptions{.units = 2, .kernel_initializer = "nope"}); },
                           {"Dense", "`kernel_initializer`"});
  expect_error<ValueError>(
      [] {
        layers::Conv1DImpl(layers::ConvOptions{.filters = 2, .kernel_size = {3, 3}});
      },
      {"Conv1D", "`kernel_size`"});
  expect_error<ValueError>(
      [] { layers::Conv2DImpl(layers::ConvOptions{.filters = 2, .kernel_size = {3}, .padding = "causal"}); },
      {"Conv2D", "`padding`", "causal"});
  expect_error<ValueError>([] { layers::DropoutImpl(layers::DropoutOptions{.rate = 1.5}); },
                           {"Dropout", "`rate`", "rate=1.5"});
  expect_error<ValueError>([] { layers::EmbeddingImpl(layers::EmbeddingOptions{.input_dim = 3}); },
                           {"Embedding", "`output_dim`"});
}

// One field table checks both paths (config_fields.h): a bad value gives
// the same message from JSON and from the Options struct.
TEST(Options, FieldTablesGiveJsonAndTypedOptionsTheSameMessage) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const ValueError& e) {
      return e.what();
    }
    return "no error";
  };
  auto same = [&](const std::function<void()>& from_json, const std::function<void()>& typed) {
    const std::string m = message(from_json);
    EXPECT_NE(m, "no error");
    EXPECT_EQ(m, message(typed));
  };
  same(
      [] {
        layers::GroupNormalizationImpl(Json{{"groups", 0}});
      },
      [] { layers::GroupNormalizationImpl(layers::GroupNormalizationOptions{.groups = 0}); });
  same(
      [] {
        layers::BatchNormalizationImpl(Json{{"momentum", 1.5}});
      },
      [] { layers::BatchNormalizationImpl(layers::BatchNormalizationOptions{.momentum = 1.5}); });
  same(
      [] {
        layers::LayerNormalizationImpl(Json{{"epsilon", 0.0}});
      },
      [] { layers::LayerNormalizationImpl(layers::LayerNormalizationOptions{.epsilon = 0.0}); });
  same(
      [] {
        layers::Conv2DImpl(Json{{"filters", 2}, {"kernel_size", 3}, {"padding", "causal"}});
      },
      [] { layers::Conv2DImpl(layers::ConvOptions{.filters = 2, .kernel_size = {3}, .padding = "causal"}); });
  same(
      [] {
        layers::LSTMImpl(Json{{"units", 2}, {"dropout", 1.0}});
      },
      [] { layers::LSTMImpl(layers::RecurrentOptions{.units = 2, .dropout = 1.0}); });
  same(
      [] {
        layers::DenseImpl(Json{{"units", 2}, {"activation", "relux"}});
      },
      [] { layers::DenseImpl(layers::DenseOptions{.units = 2, .activation = "relux"}); });
}

TEST(Options, UnknownJsonKeyIsAValueErrorNamingTheKey) {
  expect_error<ValueError>(
      [] {
        layers::DenseImpl(Json{{"units", 3}, {"unitz", 3}});
      },
      {"unknown key `unitz`", "Dense"});
  expect_error<ValueError>(
      [] {
        layers::Conv2DImpl(Json{{"filters", 3}, {"kernel_size", 3}, {"stride", 2}});
      },
      {"unknown key `stride`", "Conv2D", "strides"});
  expect_error<ValueError>(
      [] {
        losses::CategoricalCrossentropy::from_config(Json{{"from_logit", true}});
      },
      {"unknown key `from_logit`", "CategoricalCrossentropy", "from_logits"});
  expect_error<ValueError>([] { optimizers::Adam(Json{{"beta1", 0.9}}); }, {"unknown key `beta1`", "Adam", "beta_1"});
}

TEST(Options, LossOptionsConfigEqualsJsonConfig) {
  losses::CategoricalCrossentropy typed({.from_logits = true, .label_smoothing = 0.1, .name = "cce"});
  auto json = losses::CategoricalCrossentropy::from_config(
      Json{{"from_logits", true}, {"label_smoothing", 0.1}, {"name", "cce"}});
  EXPECT_EQ(typed.get_config().dump(), json->get_config().dump());
  expect_error<ValueError>([] { losses::BinaryCrossentropy({.label_smoothing = 2.0}); }, {"label_smoothing=2"});
}

TEST(Options, OptimizerOptionsConfigEqualsJsonConfig) {
  optimizers::Adam typed(optimizers::AdamOptions{
      .learning_rate = 0.01, .beta_2 = 0.98, .amsgrad = true, .base = {.global_clipnorm = 1.0, .use_ema = true}});
  optimizers::Adam json(
      Json{{"learning_rate", 0.01}, {"beta_2", 0.98}, {"amsgrad", true}, {"global_clipnorm", 1.0}, {"use_ema", true}});
  EXPECT_EQ(typed.get_config().dump(), json.get_config().dump());

  optimizers::AdamW adamw(optimizers::AdamWOptions{});
  EXPECT_DOUBLE_EQ(adamw.weight_decay(), 0.004);
  optimizers::SGD sgd(optimizers::SGDOptions{.momentum = 0.9, .nesterov = true, .base = {.name = "my_sgd"}});
  EXPECT_EQ(sgd.get_config().dump(),
            optimizers::SGD(Json{{"momentum", 0.9}, {"nesterov", true}, {"name", "my_sgd"}}).get_config().dump());
  expect_error<ValueError>([] { optimizers::SGD(optimizers::SGDOptions{.base = {.clipnorm = 1.0, .clipvalue = 0.5}}); },
                           {"only one of `clipnorm`, `clipvalue` and `global_clipnorm`"});
}

}  // namespace
}  // namespace kiln
