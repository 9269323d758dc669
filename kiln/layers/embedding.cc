#include "kiln/layers/embedding.h"

#include "kiln/layers/sharded_kernel.h"

#include "kiln/layers/config_reader.h"
#include "kiln/layers/kernel_impl.h"

namespace kiln {

EmbeddingOptions Embedding::options_from_config(const Json& config) {
  ConfigReader r(config, "Embedding");
  EmbeddingOptions o;
  o.input_dim = r.positive_int("input_dim");
  o.output_dim = r.positive_int("output_dim");
  o.embeddings_initializer = r.initializer("embeddings_initializer", "uniform");
  o.embeddings_regularizer = r.regularizer("embeddings_regularizer");
  o.activity_regularizer = r.regularizer("activity_regularizer");
  r.no_constraint("embeddings_constraint");
  o.mask_zero = r.boolean("mask_zero", false);
  r.finish();
  return o;
}

Embedding::Embedding(const EmbeddingOptions& o) : Embedding(o, layer_base_config(o.base)) {}

Embedding::Embedding(const Json& config) : Embedding(options_from_config(config), config) {}

Embedding::Embedding(const EmbeddingOptions& o, const Json& base_config) : SimpleLayer(base_config) {
  input_dim_ = option_check::positive("Embedding", "input_dim", o.input_dim);
  output_dim_ = option_check::positive("Embedding", "output_dim", o.output_dim);
  init_ = o.embeddings_initializer.resolve("Embedding", "embeddings_initializer");
  reg_ = o.embeddings_regularizer;
  activity_reg_ = o.activity_regularizer;
  mask_zero_ = o.mask_zero;
}

Embedding::Embedding(int64_t input_dim, int64_t output_dim, const Json& extra)
    : Embedding(merged_config(extra, Json{{"input_dim", input_dim}, {"output_dim", output_dim}})) {}

void Embedding::build(const std::vector<Shape>& input_shapes) {
  if (dtype_policy().quantization_mode() == "int8") {
    build_int8(weight_adder());
    return;
  }
  embeddings_ = add_weight("embeddings", {input_dim_, output_dim_}, init_, true, reg_);
}

// Keras's int8 Embedding: rows stored as int8 with one abs-max scale per row.
void Embedding::build_int8(const AddWeightFn& add) {
  int8_embeddings_ = add("embeddings", {input_dim_, output_dim_}, constant_initializer(0.0), false, at::kChar);
  embeddings_scale_ = add("embeddings_scale", {input_dim_}, constant_initializer(1.0), false, at::kFloat);
}

void Embedding::quantize(const std::string& mode) {
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

at::Tensor Embedding::call1(const at::Tensor& x, bool training) {
  at::Tensor ids = at::isIntegralType(x.scalar_type(), /*includeBool=*/false) ? x : x.to(at::kLong);
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= input_dim_)
      throw ValueError("Embedding '" + name() + "': input id " + std::to_string(lo < 0 ? lo : hi) +
                       " is out of range [0, " + std::to_string(input_dim_) + ")");
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
  if (activity_reg_ && training) add_loss((*activity_reg_)(y));
  return y;
}

std::vector<Shape> Embedding::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  s.push_back(output_dim_);
  return {s};
}

Json Embedding::get_config() const {
  Json j = base_config();
  j["input_dim"] = input_dim_;
  j["output_dim"] = output_dim_;
  j["embeddings_initializer"] = init_->to_json();
  j["embeddings_regularizer"] = regularizer_json(reg_);
  j["activity_regularizer"] = regularizer_json(activity_reg_);
  j["embeddings_constraint"] = nullptr;
  j["mask_zero"] = mask_zero_;
  return j;
}

Tensors Embedding::compute_mask(const Tensors& inputs, const Tensors& masks) {
  if (!mask_zero_) return {};
  return {inputs.at(0) != 0};
}

KILN_REGISTER_LAYER(Embedding);

}  // namespace kiln
