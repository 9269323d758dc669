// MultiHeadAttention with Keras's weights and semantics.
//
//   auto mha = std::make_shared<MultiHeadAttention>(MultiHeadAttentionOptions{.num_heads = 4, .key_dim = 16});
//   at::Tensor y = (*mha)(Tensors{query, value})[0];          // self-attention: {x, x}
//   at::Tensor y2 = (*mha)(Tensors{query, value, key})[0];
//
// Inputs are (batch, seq, features); query and value/key may differ in seq
// and features. Four EinsumDense sublayers hold the weights under Keras's
// names and shapes:
//   query/kernel (query_dim, heads, key_dim), query/bias (heads, key_dim)
//   key/kernel   (key_dim_in, heads, key_dim), key/bias (heads, key_dim)
//   value/kernel (value_dim_in, heads, value_dim), value/bias (heads, value_dim)
//   attention_output/kernel (heads, value_dim, out...), .../bias (out...)
// scores = softmax(q k^T / sqrt(key_dim)) over the keys, dropout on the
// scores in training, then the weighted values are projected back to
// output_shape (default: the query's feature size).
// Keys: num_heads, key_dim (required), value_dim (null = key_dim), dropout
// (0), use_bias (true), output_shape (null, int or list), attention_axes
// (null only: attention over the sequence axis), kernel_initializer
// ("glorot_uniform"), bias_initializer ("zeros"), kernel_regularizer,
// bias_regularizer, activity_regularizer, kernel_constraint, bias_constraint
// (null only), seed (null; dropout uses LibTorch's generator).
// Activity penalties are recorded in training calls only.
// Masks (Keras's call arguments): `attention_mask` (batch, query_seq,
// key_seq), true/nonzero = attend, given as a 4th input {query, value, key,
// mask} or to attention_with_scores(); `use_causal_mask` (query i attends to
// keys j <= i) as a call argument or, for Functional graphs and specs, the
// config key "use_causal_mask" (default false; a kiln extension, since a
// Functional node here has no call kwargs). Masked logits get -1e9 (-3e4 in
// float16) before the softmax, as Keras does.
// Not supported yet: attention_axes other than the sequence axis, inputs of rank != 3.
#pragma once

#include <optional>
#include <variant>
#include "kiln/layers/einsum_dense.h"
#include "kiln/layers/layer_holder.h"

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

struct MultiHeadAttentionOptions {
  int64_t num_heads = 0;             // required, > 0
  int64_t key_dim = 0;               // required, > 0
  std::optional<int64_t> value_dim;  // unset: key_dim
  double dropout = 0.0;              // in [0, 1)
  bool use_bias = true;
  // Unset: the query's feature size; get_config() writes it in the form given.
  std::optional<std::variant<int64_t, std::vector<int64_t>>> output_shape;
  InitializerArg kernel_initializer = "glorot_uniform";
  InitializerArg bias_initializer = "zeros";
  RegularizerPtr kernel_regularizer, bias_regularizer, activity_regularizer;  // null: none
  std::optional<int64_t> seed;
  bool use_causal_mask = false;
  LayerOptions base;
};

class MultiHeadAttentionImpl : public Layer {
 public:
  explicit MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options);
  explicit MultiHeadAttentionImpl(const Json& config);
  MultiHeadAttentionImpl(int64_t num_heads, int64_t key_dim, const Json& extra = Json::object());

  std::string class_name() const override { return "MultiHeadAttention"; }
  // input_shapes: {query, value} or {query, value, key}.
  void build(const std::vector<Shape>& input_shapes) override;
  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

  // The output and the attention scores (batch, heads, query_seq, key_seq),
  // as Keras's return_attention_scores=True. Builds if needed.
  std::pair<at::Tensor, at::Tensor> attention_with_scores(const Tensors& inputs, bool training = false);
  // Explicit masks (see above); an undefined attention_mask means none.
  std::pair<at::Tensor, at::Tensor> attention_with_scores(const Tensors& inputs, bool training,
                                                          const at::Tensor& attention_mask, bool use_causal_mask);

  int64_t num_heads() const { return options_.num_heads; }
  int64_t key_dim() const { return options_.key_dim; }
  int64_t value_dim() const { return *options_.value_dim; }
  const std::shared_ptr<EinsumDenseImpl>& query_dense() const { return query_; }
  const std::shared_ptr<EinsumDenseImpl>& key_dense() const { return key_; }
  const std::shared_ptr<EinsumDenseImpl>& value_dense() const { return value_; }
  const std::shared_ptr<EinsumDenseImpl>& output_dense() const { return output_; }
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static MultiHeadAttentionOptions options_from_config(const Json& config);

 private:
  MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options, const Json& base_config);

  std::shared_ptr<EinsumDenseImpl> make_dense(const std::string& name, const std::string& equation,
                                              const Shape& output_shape, const std::string& bias_axes) const;
  void check_inputs(const std::vector<Shape>& shapes) const;
  at::Tensor combined_mask(const at::Tensor& attention_mask, bool use_causal_mask, int64_t query_len, int64_t key_len,
                           const at::Device& device) const;
  // The attention, and the scores when `want_scores`. Without scores on a
  // GPU it runs LibTorch's fused attention (flash or memory-efficient
  // kernels), which never writes the (batch, heads, T, S) scores out.
  std::pair<at::Tensor, at::Tensor> attend(const Tensors& inputs, bool training, const at::Tensor& attention_mask,
                                           bool use_causal_mask, bool want_scores);

  MultiHeadAttentionOptions options_;  // checked: the layer's config (value_dim set)
  Shape output_shape_;                 // resolved at build (empty: query's last dim)
  std::shared_ptr<EinsumDenseImpl> query_, key_, value_, output_;
};
KILN_LAYER_HOLDER(MultiHeadAttention, MultiHeadAttentionOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_ATTENTION_H
#include "kiln/layers/legacy_names.h"
