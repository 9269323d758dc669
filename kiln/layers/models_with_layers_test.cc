// The layers inside Sequential and Functional models: Keras's auto names,
// variable paths, config round trips of whole models, summary param counts,
// and the global dtype policy.
#include <gtest/gtest.h>

#include "kiln/core/names.h"
#include "kiln/layers/activations.h"
#include "kiln/layers/attention.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/layers/einsum_dense.h"
#include "kiln/layers/embedding.h"
#include "kiln/layers/merging.h"
#include "kiln/layers/normalization.h"
#include "kiln/layers/pooling.h"
#include "kiln/layers/preprocessing.h"
#include "kiln/layers/reshaping.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"

namespace kiln {
namespace {

template <class T, class... A>
std::shared_ptr<T> make(A&&... a) {
  return std::make_shared<T>(std::forward<A>(a)...);
}

TEST(LayerNames, AutoNamesFollowKeras) {
  clear_session();
  EXPECT_EQ(make<layers::DenseImpl>(2)->name(), "dense");
  EXPECT_EQ(make<layers::DenseImpl>(2)->name(), "dense_1");
  EXPECT_EQ(make<layers::Conv2DImpl>(2, 3)->name(), "conv2d");
  EXPECT_EQ(make<layers::Conv1DImpl>(2, 3)->name(), "conv1d");
  EXPECT_EQ(make<layers::MaxPooling2DImpl>()->name(), "max_pooling2d");
  EXPECT_EQ(make<layers::GlobalAveragePooling2DImpl>()->name(), "global_average_pooling2d");
  EXPECT_EQ(make<layers::BatchNormalizationImpl>()->name(), "batch_normalization");
  EXPECT_EQ(make<layers::LayerNormalizationImpl>()->name(), "layer_normalization");
  EXPECT_EQ(make<layers::MultiHeadAttentionImpl>(2, 2)->name(), "multi_head_attention");
  EXPECT_EQ(make<layers::EinsumDenseImpl>("ab,bc->ac", Shape{2})->name(), "einsum_dense");
  EXPECT_EQ(make<layers::ActivationImpl>("relu")->name(), "activation");
  EXPECT_EQ(make<layers::AddImpl>()->name(), "add");
  EXPECT_EQ(make<layers::DenseImpl>(2, "linear", Json{{"name", "dense_7"}})->name(), "dense_7");
  EXPECT_EQ(make<layers::DenseImpl>(2)->name(), "dense_8");
}

TEST(Sequential, VariablePathsNestUnderTheModel) {
  clear_session();
  auto model = make<models::SequentialImpl>(std::vector<LayerPtr>{
      make<layers::DenseImpl>(4, "relu"), make<layers::DropoutImpl>(0.5), make<layers::DenseImpl>(2)});
  at::Tensor y = (*model)(at::randn({3, 5}));
  EXPECT_EQ(y.sizes(), at::IntArrayRef({3, 2}));
  std::vector<std::string> paths;
  for (auto& v : model->weights()) paths.push_back(v->path());
  EXPECT_EQ(paths, (std::vector<std::string>{"sequential/dense/kernel", "sequential/dense/bias",
                                             "sequential/dense_1/kernel", "sequential/dense_1/bias"}));
}

TEST(Sequential, SmallCnnRoundTripsThroughItsConfig) {
  auto model = make<models::SequentialImpl>();
  model->add(layers::Input({8, 8, 1}));
  model->add(make<layers::RescalingImpl>(1.0 / 255));
  model->add(make<layers::Conv2DImpl>(4, 3, "relu", Json{{"padding", "same"}}));
  model->add(make<layers::BatchNormalizationImpl>());
  model->add(make<layers::MaxPooling2DImpl>());
  model->add(make<layers::Conv2DImpl>(6, 3, "relu"));
  model->add(make<layers::GlobalAveragePooling2DImpl>());
  model->add(make<layers::DropoutImpl>(0.25));
  model->add(make<layers::DenseImpl>(3, "softmax"));
  at::Tensor x = at::randint(0, 256, {2, 8, 8, 1}).to(at::kFloat);
  at::Tensor y = (*model)(x);
  EXPECT_TRUE(at::allclose(y.sum(-1), at::ones({2})));
  LayerPtr copy = layer_from_json(parse_json(model->to_json().dump(), "model"));
  EXPECT_EQ(copy->get_config().dump(), model->get_config().dump());
  copy->set_weights(model->get_weights());
  EXPECT_TRUE(at::equal((*copy)(x), y));
}

TEST(Functional, TwoInputsAndAResidualAddRoundTrip) {
  clear_session();
  auto a = layers::Input({8}, at::kFloat, "features");
  auto b = layers::Input({8}, at::kFloat, "skip");
  auto h = (*make<layers::DenseImpl>(8, "relu"))(a);
  auto sum = (*make<layers::AddImpl>())(KerasTensors{h, b})[0];
  auto norm = (*make<layers::LayerNormalizationImpl>())(sum);
  auto cat = (*make<layers::ConcatenateImpl>())(KerasTensors{norm, a})[0];
  auto out = (*make<layers::DenseImpl>(3))(cat);
  auto model = make<models::FunctionalImpl>(KerasTensors{a, b}, KerasTensors{out}, "residual");
  EXPECT_EQ(out.shape, (Shape{kNone, 3}));

  at::Tensor xa = at::randn({4, 8}), xb = at::randn({4, 8});
  at::Tensor y = (*model)(Tensors{xa, xb})[0];
  EXPECT_EQ(y.sizes(), at::IntArrayRef({4, 3}));

  Json cfg = model->get_config();
  auto rebuilt = make<models::FunctionalImpl>(parse_json(cfg.dump(), "functional config"));
  EXPECT_EQ(rebuilt->get_config().dump(), cfg.dump());
  EXPECT_EQ(rebuilt->input_names(), (std::vector<std::string>{"features", "skip"}));
  rebuilt->set_weights(model->get_weights());
  EXPECT_TRUE(at::equal((*rebuilt)(Tensors{xa, xb})[0], y));
  // The residual is wired in: changing the skip input changes the output (a
  // constant shift would not: LayerNormalization removes it).
  EXPECT_FALSE(at::allclose((*rebuilt)(Tensors{xa, xb + at::randn_like(xb)})[0], y));

  // And through the registry, as load_model will do.
  LayerPtr via_registry = layer_from_json(model->to_json());
  EXPECT_EQ(via_registry->class_name(), "Functional");
  via_registry->set_weights(model->get_weights());
  EXPECT_TRUE(at::equal((*via_registry)(Tensors{xa, xb})[0], y));
}

TEST(Functional, AttentionBlockWithEmbeddings) {
  auto ids = layers::Input({6}, at::kLong, "tokens");
  auto emb = (*make<layers::EmbeddingImpl>(20, 8))(ids);
  auto att = (*make<layers::MultiHeadAttentionImpl>(2, 4))(KerasTensors{emb, emb})[0];
  auto res = (*make<layers::AddImpl>())(KerasTensors{emb, att})[0];
  auto pooled = (*make<layers::GlobalAveragePooling1DImpl>())((*make<layers::LayerNormalizationImpl>())(res));
  auto out = (*make<layers::DenseImpl>(2))(pooled);
  auto model = make<models::FunctionalImpl>(KerasTensors{ids}, KerasTensors{out});
  at::Tensor x = at::randint(0, 20, {3, 6});
  at::Tensor y = (*model)(x);
  auto rebuilt = make<models::FunctionalImpl>(model->get_config());
  rebuilt->set_weights(model->get_weights());
  EXPECT_TRUE(at::equal((*rebuilt)(x), y));
  // Embedding 20*8; attention 4 * (2*4*8 + 8); LayerNormalization 2*8; Dense 8*2 + 2.
  EXPECT_EQ(model->count_params(), 160 + 288 + 16 + 18);
}

TEST(Summary, PrintsKerasParamCounts) {
  auto model = make<models::SequentialImpl>();
  model->add(layers::Input({784}));
  model->add(make<layers::DenseImpl>(64, "relu"));
  model->add(make<layers::BatchNormalizationImpl>());
  model->add(make<layers::DenseImpl>(10));
  std::string s = model->summary_string();
  EXPECT_NE(s.find("50,240"), std::string::npos) << s;  // 784 * 64 + 64
  EXPECT_NE(s.find("(None, 64)"), std::string::npos) << s;
  EXPECT_NE(s.find("256"), std::string::npos) << s;  // BatchNormalization(64)
  EXPECT_NE(s.find("650"), std::string::npos) << s;  // 64 * 10 + 10
  EXPECT_NE(s.find("Total params: 51,146"), std::string::npos) << s;
  EXPECT_NE(s.find("Trainable params: 51,018"), std::string::npos) << s;
  EXPECT_NE(s.find("Non-trainable params: 128"), std::string::npos) << s;
}

TEST(Summary, FunctionalModelsListConnections) {
  clear_session();
  auto a = layers::Input({4}, at::kFloat, "in_a");
  auto b = layers::Input({4}, at::kFloat, "in_b");
  auto sum = (*make<layers::AddImpl>())(KerasTensors{(*make<layers::DenseImpl>(4))(a), b})[0];
  auto model = make<models::FunctionalImpl>(KerasTensors{a, b}, KerasTensors{(*make<layers::DenseImpl>(2))(sum)});
  std::string s = model->summary_string();
  EXPECT_NE(s.find("add (Add)"), std::string::npos) << s;
  EXPECT_NE(s.find("in_b[0][0]"), std::string::npos) << s;
  EXPECT_NE(s.find("Total params: 30"), std::string::npos) << s;  // 20 + 10
}

TEST(DTypePolicy, GlobalMixedPolicyReachesEveryLayer) {
  set_dtype_policy("mixed_bfloat16");
  auto model = make<models::SequentialImpl>(
      std::vector<LayerPtr>{make<layers::Conv2DImpl>(4, 3), make<layers::BatchNormalizationImpl>(),
                            make<layers::FlattenImpl>(), make<layers::DenseImpl>(3)});
  set_dtype_policy("float32");
  at::Tensor y = (*model)(at::randn({2, 5, 5, 2}));
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  for (auto& v : model->weights()) EXPECT_EQ(v->dtype(), at::kFloat) << v->path();
  EXPECT_EQ(model->layers()[0]->get_config()["dtype"]["config"]["name"], "mixed_bfloat16");
  EXPECT_EQ(make<layers::DenseImpl>(2)->dtype_policy().name(), "float32");
}

}  // namespace
}  // namespace kiln
