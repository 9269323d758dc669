// Embedding: maps integer ids to dense vectors (Keras's Embedding).
//
//   auto e = std::make_shared<Embedding>(1000, 64);
//   at::Tensor y = (*e)(at::randint(1000, {8, 20}));   // (8, 20, 64)
//
// Inputs are integer tensors of any shape (floating inputs are truncated to
// integers, as Keras casts them); the output appends output_dim and takes
// the compute dtype. Ids outside [0, input_dim) raise ValueError naming the
// id, not an out-of-bounds read.
// Keys: input_dim, output_dim (required), embeddings_initializer
// ("uniform": RandomUniform(-0.05, 0.05)), embeddings_regularizer,
// activity_regularizer (recorded in training calls only), embeddings_constraint (null only), mask_zero
// (false): true makes id 0 padding: the output carries the mask `ids != 0`
// (layer.h, masking), which recurrent layers, losses and metrics honour.
#pragma once

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

struct EmbeddingOptions {
  int64_t input_dim = 0;   // required: the vocabulary size
  int64_t output_dim = 0;  // required
  InitializerArg embeddings_initializer = "uniform";
  RegularizerPtr embeddings_regularizer, activity_regularizer;  // null: none
  bool mask_zero = false;
  LayerOptions base;
};

class EmbeddingImpl : public SimpleLayer {
 public:
  explicit EmbeddingImpl(const EmbeddingOptions& options);
  explicit EmbeddingImpl(const Json& config);
  EmbeddingImpl(int64_t input_dim, int64_t output_dim, const Json& extra = Json::object());

  std::string class_name() const override { return "Embedding"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  // Overridden: the default probe feeds float zeros.
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  bool supports_masking() const override { return options_.mask_zero; }
  // mask_zero: `ids != 0` (bool, the ids' shape); otherwise none.
  Tensors compute_mask(const Tensors& inputs, const Tensors& masks) override;
  // Float ids stay float32 (bfloat16 would round ids above 256); the output
  // still takes the compute dtype through value(embeddings).
  bool autocast() const override { return false; }

  // int8: rows as int8 with a per-row abs-max scale (Keras's int8 Embedding).
  void quantize(const std::string& mode) override;
  bool supports_quantization(const std::string& mode) const override { return mode == "int8"; }

  const VariablePtr& embeddings() const { return embeddings_; }  // null once quantized
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static EmbeddingOptions options_from_config(const Json& config);

 private:
  EmbeddingImpl(const EmbeddingOptions& options, const Json& base_config);

  EmbeddingOptions options_;  // checked: the layer's config
  VariablePtr embeddings_;
  VariablePtr int8_embeddings_, embeddings_scale_;  // int8 only
  void build_int8(const AddWeightFn& add);
};
KILN_LAYER_HOLDER(Embedding, EmbeddingOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_EMBEDDING_H
#include "kiln/layers/legacy_names.h"
