// Keras's names (issue 30): the layer and model holders (layers::Dense,
// models::Sequential) and the old kiln:: spellings kept for one release.
// migrate_names: skip (this file spells the old names on purpose)
#include <gtest/gtest.h>

#include <type_traits>

#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/layers/merging.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"

namespace kiln {
namespace {

Json without_name(Json config) {
  config.erase("name");
  return config;
}

TEST(LayerHolder, EveryConstructorOfTheClass) {
  auto a = layers::Dense(64, "relu");
  auto b = layers::Dense({.units = 64, .activation = "relu"});
  auto c = layers::Dense(Json{{"units", 64}, {"activation", "relu"}});
  auto d = layers::Dense(std::make_shared<layers::DenseImpl>(64, "relu"));
  for (const layers::Dense& h : {a, b, c, d}) {
    ASSERT_TRUE(h);
    EXPECT_EQ(h->units(), 64);
    EXPECT_EQ(without_name(h->get_config()), without_name(a->get_config()));
  }
  EXPECT_EQ(a->class_name(), "Dense");
  layers::Dense empty = nullptr;
  EXPECT_FALSE(empty);
  EXPECT_TRUE(layers::Dropout(0.5));
}

TEST(LayerHolder, CopiesShareOneLayer) {
  auto a = layers::Dense(3);
  layers::Dense b = a;
  EXPECT_EQ(a.get(), b.get());
  b->set_trainable(false);
  EXPECT_FALSE(a->trainable());
  LayerPtr p = a;  // to any base: LayerPtr, or the class itself
  std::shared_ptr<layers::DenseImpl> s = a;
  EXPECT_EQ(p.get(), a.get());
  EXPECT_EQ(s, a.ptr());
  EXPECT_TRUE(p == a);
  EXPECT_EQ(&*a, a.get());
}

TEST(LayerHolder, CallsTensorsAndKerasTensors) {
  auto dense = layers::Dense(4);
  at::Tensor y = dense(at::ones({2, 3}));
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{2, 4}));

  auto in = layers::Input({8});
  auto h = layers::Dense(4, "relu")(in);
  auto out = layers::Add()({h, layers::Dense(4)(in)});
  auto model = models::Functional(KerasTensors{in}, KerasTensors{out});
  EXPECT_EQ(model->layers().size(), 4u);  // InputLayer, two Dense, Add
  EXPECT_EQ((*model)(at::ones({2, 8})).sizes(), (at::IntArrayRef{2, 4}));
  ModelPtr as_model = model;
  EXPECT_EQ(as_model.get(), model.get());
}

TEST(LayerHolder, SequentialFromAnInitializerListWithInput) {
  auto model = models::Sequential({layers::Input({784}), layers::Dense(256, "relu"), layers::Dense(10, "softmax")});
  EXPECT_TRUE(model->built());
  ASSERT_EQ(model->layers().size(), 2u);
  EXPECT_EQ(model->input_shapes().at(0), (Shape{kNone, 784}));
  EXPECT_EQ((*model)(at::zeros({3, 784})).sizes(), (at::IntArrayRef{3, 10}));

  auto unbuilt = models::Sequential({layers::Dense(2), layers::Dropout(0.1)});
  EXPECT_FALSE(unbuilt->built());
  EXPECT_EQ(unbuilt->layers().size(), 2u);
  EXPECT_EQ(models::Sequential()->layers().size(), 0u);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(LegacyNames, OldSpellingsAreTheSameTypes) {
  static_assert(std::is_same_v<kiln::Dense, layers::DenseImpl>);
  static_assert(std::is_same_v<kiln::DenseOptions, layers::DenseOptions>);
  static_assert(std::is_same_v<kiln::Add, layers::AddImpl>);
  static_assert(std::is_same_v<kiln::InputLayer, layers::InputLayerImpl>);
  static_assert(std::is_same_v<kiln::Sequential, models::SequentialImpl>);
  static_assert(std::is_same_v<kiln::Functional, models::FunctionalImpl>);
  static_assert(std::is_same_v<kiln::Model, models::Model>);
  // Old user code, unchanged: what it meant before.
  auto model = std::make_shared<kiln::Sequential>();
  model->add(kiln::Input({3}));
  model->add(std::make_shared<kiln::Dense>(kiln::DenseOptions{.units = 2}));
  EXPECT_EQ(model->layers().at(0)->class_name(), "Dense");
  EXPECT_EQ((*model)(at::ones({1, 3})).sizes(), (at::IntArrayRef{1, 2}));
}
#pragma GCC diagnostic pop

}  // namespace
}  // namespace kiln
