// Special cases of Embedding and MultiHeadAttention.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/device.h"
#include "kiln/core/names.h"
#include "kiln/layers/attention.h"
#include "kiln/layers/embedding.h"
#include "kiln/models/functional.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

// --- Embedding ----------------------------------------------------------------------
TEST(Embedding, LooksUpRows) {
  auto e = layers::Embedding(6, 3);
  at::Tensor ids = at::tensor({0, 5, 2, 2}, at::kLong).reshape({2, 2});
  at::Tensor y = (*e)(ids);
  EXPECT_EQ(sizes_of(y), (Shape{2, 2, 3}));
  at::Tensor table = e->embeddings()->value();
  EXPECT_TRUE(at::equal(y[0][1], table[5]));
  EXPECT_TRUE(at::equal(y[1][0], table[2]));
  EXPECT_TRUE(at::equal(y[1][0], y[1][1]));
  // Keras's default: RandomUniform(-0.05, 0.05).
  EXPECT_LE(table.abs().max().item<float>(), 0.05f);
  EXPECT_EQ(e->get_config()["embeddings_initializer"]["class_name"], "RandomUniform");
  // int32 and float ids work too.
  EXPECT_TRUE(at::equal((*e)(ids.to(at::kInt)), y));
  EXPECT_TRUE(at::equal((*e)(ids.to(at::kFloat)), y));
}

TEST(Embedding, OutOfRangeIdsAreAUserError) {
  auto e = layers::Embedding(4, 2);
  expect_error<ValueError>([&] { (*e)(at::tensor({1, 4}, at::kLong)); }, {"input id 4", "[0, 4)"});
  expect_error<ValueError>([&] { (*e)(at::tensor({-1}, at::kLong)); }, {"input id -1"});
}

TEST(Embedding, SymbolicIntegerInputsAndFunctionalModels) {
  auto in = layers::Input({5}, at::kLong);
  auto e = layers::Embedding(10, 4);
  auto out = (*e)(in);
  EXPECT_EQ(out.shape, (Shape{kNone, 5, 4}));
  EXPECT_EQ(out.dtype, at::kFloat);
  auto model = models::Functional(KerasTensors{in}, KerasTensors{out});
  at::Tensor ids = at::randint(0, 10, {3, 5}, at::kLong);
  EXPECT_TRUE(at::equal((*model)(ids), (*e)(ids)));
}

TEST(Embedding, MixedPrecisionKeepsLargeIdsExact) {
  auto e = layers::Embedding(2000, 2, Json{{"dtype", "mixed_bfloat16"}});
  at::Tensor ids = at::tensor({1001.0f, 1999.0f});  // not representable in bfloat16
  at::Tensor y = (*e)(ids);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(y[0], e->embeddings()->value()[1001].to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(y[1], e->embeddings()->value()[1999].to(at::kBFloat16)));
}

TEST(Embedding, RejectsBadConfigs) {
  expect_error<ValueError>([] { (void)layers::EmbeddingImpl(0, 4); }, {"Embedding", "`input_dim`", "input_dim=0"});
  expect_error<ValueError>([] { (void)layers::EmbeddingImpl(Json{{"input_dim", 4}}); }, {"missing `output_dim`"});
  expect_error<ValueError>([] { (void)layers::EmbeddingImpl(4, 2, Json{{"mask_zero", "yes"}}); }, {"`mask_zero`"});
}

// --- MultiHeadAttention -----------------------------------------------------------------
TEST(MultiHeadAttention, KerasWeightNamesAndShapes) {
  clear_session();
  auto mha = layers::MultiHeadAttention(4, 8, Json{{"value_dim", 6}});
  (*mha)(Tensors{at::randn({2, 5, 16}), at::randn({2, 7, 12})});
  std::vector<std::pair<std::string, Shape>> expected = {
      {"multi_head_attention/query/kernel", {16, 4, 8}},
      {"multi_head_attention/query/bias", {4, 8}},
      {"multi_head_attention/key/kernel", {12, 4, 8}},
      {"multi_head_attention/key/bias", {4, 8}},
      {"multi_head_attention/value/kernel", {12, 4, 6}},
      {"multi_head_attention/value/bias", {4, 6}},
      {"multi_head_attention/attention_output/kernel", {4, 6, 16}},
      {"multi_head_attention/attention_output/bias", {16}},
  };
  auto ws = mha->weights();
  ASSERT_EQ(ws.size(), expected.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    EXPECT_EQ(ws[i]->path(), expected[i].first);
    EXPECT_EQ(ws[i]->shape(), expected[i].second) << ws[i]->path();
  }
  Json c = mha->get_config();
  EXPECT_EQ(c["num_heads"], 4);
  EXPECT_EQ(c["key_dim"], 8);
  EXPECT_EQ(c["value_dim"], 6);
  EXPECT_TRUE(c["output_shape"].is_null());
  EXPECT_EQ(c["use_bias"], true);
}

// Per-head matmuls: an independent reference for the einsum formulation.
at::Tensor reference_mha(const layers::MultiHeadAttentionImpl& m, const at::Tensor& xq, const at::Tensor& xv,
                         at::Tensor* scores_out) {
  const int64_t heads = m.num_heads(), kd = m.key_dim(), vd = m.value_dim();
  auto proj = [](const at::Tensor& x, const layers::EinsumDenseImpl& d, int64_t h, int64_t k) {
    at::Tensor w = d.kernel()->value();
    at::Tensor y = at::matmul(x, w.reshape({w.size(0), h * k})) + d.bias()->value().reshape({h * k});
    return y.reshape({x.size(0), x.size(1), h, k});
  };
  at::Tensor q = proj(xq, *m.query_dense(), heads, kd);
  at::Tensor k = proj(xv, *m.key_dense(), heads, kd);
  at::Tensor v = proj(xv, *m.value_dense(), heads, vd);
  at::Tensor wo = m.output_dense()->kernel()->value();  // (heads, vd, out)
  at::Tensor out = m.output_dense()->bias()->value().expand({xq.size(0), xq.size(1), wo.size(2)}).clone();
  std::vector<at::Tensor> all_scores;
  for (int64_t h = 0; h < heads; ++h) {
    at::Tensor qh = q.select(2, h), kh = k.select(2, h), vh = v.select(2, h);
    at::Tensor s = at::softmax(at::matmul(qh, kh.transpose(1, 2)) / std::sqrt((double)kd), -1);
    all_scores.push_back(s);
    out = out + at::matmul(at::matmul(s, vh), wo[h]);
  }
  *scores_out = at::stack(all_scores, 1);
  return out;
}

TEST(MultiHeadAttention, MatchesPerHeadReference) {
  auto mha = layers::MultiHeadAttention(3, 4, Json{{"bias_initializer", "random_normal"}});
  at::Tensor xq = at::randn({2, 5, 6}), xv = at::randn({2, 7, 6});
  auto [out, scores] = mha->attention_with_scores({xq, xv});
  at::Tensor ref_scores;
  at::Tensor ref = reference_mha(*mha, xq, xv, &ref_scores);
  EXPECT_EQ(sizes_of(out), (Shape{2, 5, 6}));
  EXPECT_EQ(sizes_of(scores), (Shape{2, 3, 5, 7}));
  EXPECT_TRUE(at::allclose(out, ref, 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(scores, ref_scores, 1e-4, 1e-6));
  EXPECT_TRUE(at::allclose(scores.sum(-1), at::ones({2, 3, 5}), 1e-5, 1e-6));
  // The plain call returns the same output.
  EXPECT_TRUE(at::allclose((*mha)(Tensors{xq, xv})[0], out));
}

TEST(MultiHeadAttention, SelfAttentionIsPermutationEquivariant) {
  auto mha = layers::MultiHeadAttention(2, 4);
  at::Tensor x = at::randn({1, 6, 8});
  at::Tensor perm = at::tensor({3, 0, 5, 1, 4, 2}, at::kLong);
  at::Tensor y = (*mha)(Tensors{x, x})[0];
  at::Tensor xp = x.index_select(1, perm);
  at::Tensor yp = (*mha)(Tensors{xp, xp})[0];
  EXPECT_TRUE(at::allclose(yp, y.index_select(1, perm), 1e-4, 1e-5));
}

TEST(MultiHeadAttention, DropoutAppliesToScoresOnlyInTraining) {
  auto mha = layers::MultiHeadAttention(2, 4, Json{{"dropout", 0.5}});
  at::Tensor x = at::randn({2, 6, 8});
  at::Tensor a = (*mha)(Tensors{x, x}, false)[0];
  EXPECT_TRUE(at::equal(a, (*mha)(Tensors{x, x}, false)[0]));
  EXPECT_FALSE(at::allclose((*mha)(Tensors{x, x}, true)[0], a));
}

TEST(MultiHeadAttention, OutputShapeAndSeparateKey) {
  auto mha = layers::MultiHeadAttention(2, 3, Json{{"output_shape", {2, 5}}});
  at::Tensor y = (*mha)(Tensors{at::randn({2, 4, 6}), at::randn({2, 3, 7}), at::randn({2, 3, 9})})[0];
  EXPECT_EQ(sizes_of(y), (Shape{2, 4, 2, 5}));
  EXPECT_EQ(mha->key_dense()->kernel()->shape(), (Shape{9, 2, 3}));
  EXPECT_EQ(mha->compute_output_shape({{kNone, 4, 6}, {kNone, 3, 7}, {kNone, 3, 9}})[0], (Shape{kNone, 4, 2, 5}));
}

TEST(MultiHeadAttention, RejectsBadConfigsAndInputs) {
  expect_error<ValueError>([] { (void)layers::MultiHeadAttentionImpl(0, 4); }, {"MultiHeadAttention", "`num_heads`"});
  expect_error<ValueError>([] { (void)layers::MultiHeadAttentionImpl(2, 4, Json{{"dropout", 1.0}}); }, {"`dropout`"});
  expect_error<ValueError>(
      [] {
        (void)layers::MultiHeadAttentionImpl(2, 4, Json{{"attention_axes", {1}}});
      },
      {"`attention_axes`"});
  auto mha = layers::MultiHeadAttention(2, 4);
  expect_error<ValueError>([&] { (*mha)(Tensors{at::randn({2, 3, 4})}); }, {"[query, value]"});
  expect_error<ShapeError>([&] { (*mha)(Tensors{at::randn({2, 4}), at::randn({2, 4})}); }, {"(batch, seq, features)"});
  expect_error<ShapeError>(
      [&] {
        (*mha)(Tensors{at::randn({2, 3, 4}), at::randn({2, 5, 4}), at::randn({2, 6, 4})});
      },
      {"same sequence length"});
}

TEST(MultiHeadAttention, PaddingMaskEqualsDroppingTheMaskedKeys) {
  auto mha = layers::MultiHeadAttention(2, 4, Json{{"bias_initializer", "random_normal"}});
  at::Tensor q = at::randn({2, 3, 6}), v = at::randn({2, 5, 6});
  (*mha)(Tensors{q, v});
  // Keys 3 and 4 masked for every query: the result must equal attention over
  // the first three keys only, and their scores must be zero.
  at::Tensor mask = at::ones({2, 3, 5}, at::kBool);
  mask.narrow(2, 3, 2).fill_(false);
  auto [masked, scores] = mha->attention_with_scores(Tensors{q, v, v}, false, mask, false);
  at::Tensor truncated = (*mha)(Tensors{q, v.narrow(1, 0, 3)})[0];
  EXPECT_TRUE(at::allclose(masked, truncated, 1e-5, 1e-6));
  EXPECT_EQ(scores.narrow(3, 3, 2).abs().max().item<float>(), 0.0f);
  // The same mask given as a 4th input (as a Functional graph would pass it).
  EXPECT_TRUE(at::allclose((*mha)(Tensors{q, v, v, mask.to(at::kFloat)})[0], masked));
  // A wrong mask shape names the expected one.
  expect_error<ShapeError>([&] { (*mha)(Tensors{q, v, v, at::ones({2, 3, 4})}); }, {"attention_mask", "(batch, 3, 5)"});
}

TEST(MultiHeadAttention, CausalMaskHidesTheFuture) {
  auto mha = layers::MultiHeadAttention(2, 4, Json{{"use_causal_mask", true}});
  at::Tensor x = at::randn({1, 6, 8});
  at::Tensor y = (*mha)(Tensors{x, x})[0];
  // Changing positions 4 and 5 changes nothing before position 4.
  at::Tensor x2 = x.clone();
  x2.narrow(1, 4, 2).normal_();
  at::Tensor y2 = (*mha)(Tensors{x2, x2})[0];
  EXPECT_TRUE(at::allclose(y.narrow(1, 0, 4), y2.narrow(1, 0, 4), 1e-5, 1e-6));
  EXPECT_FALSE(at::allclose(y.narrow(1, 4, 2), y2.narrow(1, 4, 2)));
  // Position 0 attends to itself only.
  auto [out, scores] = mha->attention_with_scores(Tensors{x, x}, false);
  EXPECT_NEAR(scores.index({0, 0, 0, 0}).item<float>(), 1.0f, 1e-6);
  // The flag survives the config round trip; without it the future leaks in.
  EXPECT_TRUE(mha->get_config()["use_causal_mask"].get<bool>());
  auto plain = layers::MultiHeadAttention(2, 4);
  plain->build_if_needed({{kNone, 6, 8}, {kNone, 6, 8}});
  for (size_t i = 0; i < plain->weights().size(); ++i) plain->weights()[i]->assign(mha->weights()[i]->value());
  EXPECT_FALSE(at::allclose((*plain)(Tensors{x, x})[0].narrow(1, 0, 4), y.narrow(1, 0, 4)));
}

// On a GPU the layer's call runs LibTorch's fused attention; it must give
// what the scores path (kiln's einsum and masked softmax) gives: no mask, a
// causal one, a padding mask with a fully masked query row (uniform, not
// NaN, as Keras), and a causal mask over unequal lengths.
TEST(MultiHeadAttentionCUDA, FusedAttentionMatchesTheScoresPath) {
  const at::Device gpu(at::kCUDA, 0);
  DeviceScope on_gpu("cuda:0");  // the layers' variables there
  const bool tf32 = tf32_enabled();
  set_tf32_enabled(false);  // IEEE float32 products on both paths
  for (bool causal : {false, true}) {
    auto mha = layers::MultiHeadAttention(4, 16, Json{{"use_causal_mask", causal}});
    at::Tensor q = at::randn({2, 7, 32}).to(gpu), v = at::randn({2, 7, 32}).to(gpu);
    at::Tensor fused = (*mha)(Tensors{q, v})[0];
    at::Tensor reference = mha->attention_with_scores(Tensors{q, v}).first;
    EXPECT_TRUE(at::allclose(fused, reference, 1e-5, 1e-5)) << "causal " << causal;
    at::Tensor mask = at::ones({2, 7, 7}, at::kBool);
    mask.narrow(2, 5, 2).fill_(false);
    mask[1][3].fill_(false);  // a query that sees nothing
    fused = (*mha)(Tensors{q, v, v, mask.to(at::kFloat).to(gpu)})[0];
    reference = mha->attention_with_scores(Tensors{q, v, v}, false, mask.to(gpu), causal).first;
    EXPECT_FALSE(fused.isnan().any().item<bool>());
    EXPECT_TRUE(at::allclose(fused, reference, 1e-5, 1e-5)) << "masked, causal " << causal;
  }
  auto mha = layers::MultiHeadAttention(2, 8, Json{{"use_causal_mask", true}});
  at::Tensor q = at::randn({1, 3, 16}).to(gpu), v = at::randn({1, 5, 16}).to(gpu);
  EXPECT_TRUE(at::allclose((*mha)(Tensors{q, v})[0], mha->attention_with_scores(Tensors{q, v}).first, 1e-5, 1e-5));
  set_tf32_enabled(tf32);
}

TEST(MultiHeadAttention, FrozenBeforeBuildFreezesItsSublayers) {
  auto mha = layers::MultiHeadAttention(2, 4, Json{{"trainable", false}});
  (*mha)(Tensors{at::randn({1, 3, 4}), at::randn({1, 3, 4})});
  EXPECT_TRUE(mha->trainable_weights().empty());
  mha->set_trainable(true);
  EXPECT_EQ(mha->trainable_weights().size(), 8u);
}

}  // namespace
}  // namespace kiln
