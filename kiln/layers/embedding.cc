#include "kiln/layers/embedding.h"

#include "kiln/layers/sharded_kernel.h"

#include "kiln/layers/config_fields.h"
#include "kiln/layers/kernel_impl.h"

namespace kiln {

namespace {
const FieldTable<layers::EmbeddingOptions>& embedding_fields() {
  using O = layers::EmbeddingOptions;
  static const FieldTable<O> t = {field("input_dim", &O::input_dim).positive().required(),
                                  field("output_dim", &O::output_dim).positive().required(),
                                  field("embeddings_initializer", &O::embeddings_initializer),
                                  field("embeddings_regularizer", &O::embeddings_regularizer),
                                  field("activity_regularizer", &O::activity_regularizer),
                                  no_constraint<O>("embeddings_constraint"),
                                  field("mask_zero", &O::mask_zero)};
  return t;
}
}  // namespace

layers::EmbeddingOptions layers::EmbeddingImpl::options_from_config(const Json& config) {
  return read_fields(config, "Embedding", embedding_fields());
}

layers::EmbeddingImpl::EmbeddingImpl(const layers::EmbeddingOptions& o)
    : layers::EmbeddingImpl(o, layer_base_config(o.base)) {}

layers::EmbeddingImpl::EmbeddingImpl(const Json& config) : layers::EmbeddingImpl(options_from_config(config), config) {}

layers::EmbeddingImpl::EmbeddingImpl(const layers::EmbeddingOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Embedding", options_, embedding_fields());
}

layers::EmbeddingImpl::EmbeddingImpl(int64_t input_dim, int64_t output_dim, const Json& extra)
    : layers::EmbeddingImpl(merged_config(extra, Json{{"input_dim", input_dim}, {"output_dim", output_dim}})) {}

void layers::EmbeddingImpl::build(const std::vector<Shape>& input_shapes) {
  if (dtype_policy().quantization_mode() == "int8") {
    build_int8(weight_adder());
    return;
  }
  embeddings_ = add_weight("embeddings", {options_.input_dim, options_.output_dim},
                           options_.embeddings_initializer.resolved(), true, options_.embeddings_regularizer);
}

// Keras's int8 Embedding: rows stored as int8 with one abs-max scale per row.
void layers::EmbeddingImpl::build_int8(const AddWeightFn& add) {
  int8_embeddings_ =
      add("embeddings", {options_.input_dim, options_.output_dim}, constant_initializer(0.0), false, at::kChar);
  embeddings_scale_ = add("embeddings_scale", {options_.input_dim}, constant_initializer(1.0), false, at::kFloat);
}

void layers::EmbeddingImpl::quantize(const std::string& mode) {
  if (mode != "int8")
    throw ValueError("Embedding '" + name() + "' supports quantize(\"int8\") only. Received: mode=" + mode);
  if (!built() || !embeddings_)
    throw StateError("Embedding '" + name() + "' must be built (and not yet quantized) before quantize(\"int8\")");
  if (embeddings_->sharded())
    throw ValueError("Embedding '" + name() + "' has a sharded table (ModelParallel); quantize the model loaded " +
                     "from its gathered model directory instead");
  const std::string path = embeddings_->path();
  build_int8(weight_adder(path.substr(0, path.rfind('/'))));
  auto [q, scale] = quantize_table("int8", embeddings_->value().detach());
  int8_embeddings_->assign(q);
  embeddings_scale_->assign(scale.reshape({-1}));
  remove_weight(embeddings_);
  embeddings_ = nullptr;
  set_dtype_policy(dtype_policy().quantized("int8"));
}

at::Tensor layers::EmbeddingImpl::call1(const at::Tensor& x, bool training) {
  at::Tensor ids = at::isIntegralType(x.scalar_type(), /*includeBool=*/false) ? x : x.to(at::kLong);
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= options_.input_dim)
      throw ValueError("Embedding '" + name() + "': input id " + std::to_string(lo < 0 ? lo : hi) +
                       " is out of range [0, " + std::to_string(options_.input_dim) + ")");
  }
  at::Tensor y;
  if (int8_embeddings_) {
    // Dequantized rows: take the int8 rows and their scales, divide.
    at::Tensor rows = at::embedding(int8_embeddings_->value(), ids).to(at::kFloat);
    at::Tensor scale = at::embedding(embeddings_scale_->value().unsqueeze(1), ids);
    y = compute_cast(rows / scale);
  } else {
    const std::string& path = embeddings_->path();
    y = sharded_embedding_lookup(embeddings_, value(embeddings_), ids, path.substr(0, path.rfind('/')));
  }
  if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(y));
  return y;
}

std::vector<Shape> layers::EmbeddingImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  s.push_back(options_.output_dim);
  return {s};
}

Json layers::EmbeddingImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, embedding_fields());
  return j;
}

Tensors layers::EmbeddingImpl::compute_mask(const Tensors& inputs, const Tensors& masks) {
  if (!options_.mask_zero) return {};
  return {inputs.at(0) != 0};
}

KILN_REGISTER_LAYER_AS(Embedding, layers::EmbeddingImpl);

}  // namespace kiln
