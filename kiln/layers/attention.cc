#include "kiln/layers/attention.h"

#include "kiln/layers/sharded_kernel.h"

#include <cmath>

#include "kiln/layers/config_reader.h"

namespace kiln {
namespace {
const char* const kOutputShapeExpected = "null, a positive integer or a list of positive integers";
}  // namespace

MultiHeadAttentionOptions MultiHeadAttention::options_from_config(const Json& config) {
  ConfigReader r(config, "MultiHeadAttention");
  MultiHeadAttentionOptions o;
  o.num_heads = r.positive_int("num_heads");
  o.key_dim = r.positive_int("key_dim");
  o.value_dim = r.positive_int("value_dim", o.key_dim);
  o.dropout = r.number_in("dropout", 0.0, 0.0, 1.0, /*hi_inclusive=*/false);
  o.use_bias = r.boolean("use_bias", true);
  if (const Json* os = r.get("output_shape")) {
    if (os->is_number_integer()) {
      o.output_shape = os->get<int64_t>();
    } else if (os->is_array() && !os->empty()) {
      std::vector<int64_t> dims;
      for (auto& d : *os) {
        if (!d.is_number_integer()) r.invalid("output_shape", kOutputShapeExpected);
        dims.push_back(d.get<int64_t>());
      }
      o.output_shape = dims;
    } else {
      r.invalid("output_shape", kOutputShapeExpected);
    }
  }
  if (r.get("attention_axes"))
    r.invalid("attention_axes", "null (attention over the sequence axis; other axes are not supported yet)");
  o.kernel_initializer = r.initializer("kernel_initializer", "glorot_uniform");
  o.bias_initializer = r.initializer("bias_initializer", "zeros");
  o.kernel_regularizer = r.regularizer("kernel_regularizer");
  o.bias_regularizer = r.regularizer("bias_regularizer");
  o.activity_regularizer = r.regularizer("activity_regularizer");
  r.no_constraint("kernel_constraint");
  r.no_constraint("bias_constraint");
  const Json* seed = r.get("seed");
  if (seed && !seed->is_number_integer()) r.invalid("seed", "null or an integer");
  if (seed) o.seed = seed->get<int64_t>();
  o.use_causal_mask = r.boolean("use_causal_mask", false);
  r.finish();
  return o;
}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& o)
    : MultiHeadAttention(o, layer_base_config(o.base)) {}

MultiHeadAttention::MultiHeadAttention(const Json& config) : MultiHeadAttention(options_from_config(config), config) {}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& o, const Json& base_config)
    : Layer(base_config) {
  const std::string owner = "MultiHeadAttention";
  num_heads_ = option_check::positive(owner, "num_heads", o.num_heads);
  key_dim_ = option_check::positive(owner, "key_dim", o.key_dim);
  value_dim_ = o.value_dim ? option_check::positive(owner, "value_dim", *o.value_dim) : key_dim_;
  dropout_ = option_check::in_range(owner, "dropout", o.dropout, 0.0, 1.0, /*hi_inclusive=*/false);
  use_bias_ = o.use_bias;
  output_shape_json_ = nullptr;
  if (o.output_shape) {
    if (const auto* one = std::get_if<int64_t>(&*o.output_shape)) {
      output_shape_ = {*one};
      output_shape_json_ = *one;
    } else {
      output_shape_ = std::get<std::vector<int64_t>>(*o.output_shape);
      output_shape_json_ = output_shape_;
    }
    if (output_shape_.empty()) option_check::invalid(owner, "output_shape", kOutputShapeExpected, output_shape_json_);
    for (auto d : output_shape_)
      if (d < 1) option_check::invalid(owner, "output_shape", kOutputShapeExpected, output_shape_json_);
  }
  // Resolved here so invalid names fail at construction; kept as JSON for the sublayers.
  kernel_init_ = o.kernel_initializer.resolve(owner, "kernel_initializer")->to_json();
  bias_init_ = o.bias_initializer.resolve(owner, "bias_initializer")->to_json();
  kernel_reg_ = o.kernel_regularizer;
  bias_reg_ = o.bias_regularizer;
  activity_reg_ = o.activity_regularizer;
  seed_ = o.seed ? Json(*o.seed) : Json(nullptr);
  use_causal_mask_ = o.use_causal_mask;
}

MultiHeadAttention::MultiHeadAttention(int64_t num_heads, int64_t key_dim, const Json& extra)
    : MultiHeadAttention(merged_config(extra, Json{{"num_heads", num_heads}, {"key_dim", key_dim}})) {}

std::shared_ptr<EinsumDense> MultiHeadAttention::make_dense(const std::string& name, const std::string& equation,
                                                            const Shape& output_shape,
                                                            const std::string& bias_axes) const {
  Json c;
  c["name"] = name;
  c["trainable"] = trainable();
  c["dtype"] = dtype_policy().name();
  c["equation"] = equation;
  c["output_shape"] = int_list_json(output_shape);
  c["bias_axes"] = use_bias_ ? Json(bias_axes) : Json(nullptr);
  c["kernel_initializer"] = kernel_init_;
  c["bias_initializer"] = bias_init_;
  c["kernel_regularizer"] = regularizer_json(kernel_reg_);
  c["bias_regularizer"] = regularizer_json(bias_reg_);
  return std::make_shared<EinsumDense>(c);
}

void MultiHeadAttention::check_inputs(const std::vector<Shape>& all) const {
  if (all.size() < 2 || all.size() > 4)
    throw ValueError("MultiHeadAttention '" + name() +
                     "' takes [query, value], [query, value, key] or [query, value, key, attention_mask]. "
                     "Received " +
                     std::to_string(all.size()) + " inputs");
  const std::vector<Shape> shapes(all.begin(), all.begin() + std::min<size_t>(all.size(), 3));
  for (auto& s : shapes)
    if (s.size() != 3 || s.back() < 1)
      throw ShapeError(
          "MultiHeadAttention '" + name() +
          "' expects inputs of shape (batch, seq, features) with known features. Received: " + shape_to_string(s));
  const Shape& v = shapes[1];
  const Shape& k = shapes.size() > 2 ? shapes[2] : v;
  if (v[1] >= 0 && k[1] >= 0 && v[1] != k[1])
    throw ShapeError("MultiHeadAttention '" + name() + "': value " + shape_to_string(v) + " and key " +
                     shape_to_string(k) + " must have the same sequence length");
  if (all.size() == 4) {
    const Shape& m = all[3];
    const Shape& q = shapes[0];
    bool ok = m.size() == 3;
    if (ok && q[1] >= 0 && m[1] >= 0) ok = m[1] == q[1];
    if (ok && k[1] >= 0 && m[2] >= 0) ok = m[2] == k[1];
    if (!ok)
      throw ShapeError("MultiHeadAttention '" + name() +
                       "': attention_mask must have shape (batch, query_seq, key_seq) = (batch, " +
                       std::to_string(q[1]) + ", " + std::to_string(k[1]) + "). Received: " + shape_to_string(m));
  }
}

at::Tensor MultiHeadAttention::combined_mask(const at::Tensor& attention_mask, bool use_causal_mask, int64_t query_len,
                                             int64_t key_len, const at::Device& device) const {
  at::Tensor mask;  // (B or 1, T, S) bool, true = attend
  if (attention_mask.defined()) {
    if (attention_mask.dim() != 3 || attention_mask.size(1) != query_len || attention_mask.size(2) != key_len)
      throw ShapeError("MultiHeadAttention '" + name() + "': attention_mask must have shape (batch, " +
                       std::to_string(query_len) + ", " + std::to_string(key_len) +
                       "). Received: " + shape_to_string(sizes_of(attention_mask)));
    mask = attention_mask.to(device, at::kBool);
  }
  if (use_causal_mask) {
    // Keras's causal mask: query i attends to keys j <= i (lower triangle).
    at::Tensor causal =
        at::ones({query_len, key_len}, at::TensorOptions().dtype(at::kBool).device(device)).tril().unsqueeze(0);
    mask = mask.defined() ? mask.logical_and(causal) : causal;
  }
  return mask;
}

void MultiHeadAttention::build(const std::vector<Shape>& input_shapes) {
  check_inputs(input_shapes);
  const Shape& q = input_shapes[0];
  const Shape& v = input_shapes[1];
  const Shape& k = input_shapes.size() > 2 ? input_shapes[2] : v;
  if (output_shape_.empty()) output_shape_ = {q.back()};
  query_ = make_dense("query", "abc,cde->abde", {kNone, num_heads_, key_dim_}, "de");
  key_ = make_dense("key", "abc,cde->abde", {kNone, num_heads_, key_dim_}, "de");
  value_ = make_dense("value", "abc,cde->abde", {kNone, num_heads_, value_dim_}, "de");
  // (batch, seq, heads, value_dim) x (heads, value_dim, out...) -> (batch, seq, out...).
  std::string out_letters, bias_letters;
  for (size_t i = 0; i < output_shape_.size(); ++i) out_letters += (char)('e' + i);
  Shape partial = {kNone};
  partial.insert(partial.end(), output_shape_.begin(), output_shape_.end());
  output_ = make_dense("attention_output", "abcd,cd" + out_letters + "->ab" + out_letters, partial, out_letters);
  for (auto& d : {query_, key_, value_, output_}) track(d);
  query_->build_if_needed({q});
  key_->build_if_needed({k});
  value_->build_if_needed({v});
  output_->build_if_needed({{q[0], q[1], num_heads_, value_dim_}});
  // ModelParallel with the heads sharded (query/key/value column-parallel,
  // attention_output row-parallel on the same axis): every head's attention
  // runs on the rank that holds it, with no gather (Megatron's attention).
  KernelImpl* out = output_->kernel_impl_ptr();
  bool all = true;
  for (auto& d : {query_, key_, value_}) all = plan_sharded_pair(d->kernel_impl_ptr(), out) && all;
  if (!all)
    for (auto& d : {query_, key_, value_})
      if (ShardedKernel* s = sharded_kernel(d->kernel_impl_ptr())) s->keep_output_sharded(false);
}

std::pair<at::Tensor, at::Tensor> MultiHeadAttention::attention_with_scores(const Tensors& inputs, bool training) {
  return attention_with_scores(inputs, training, inputs.size() > 3 ? inputs[3] : at::Tensor(), use_causal_mask_);
}

std::pair<at::Tensor, at::Tensor> MultiHeadAttention::attention_with_scores(const Tensors& all_inputs, bool training,
                                                                            const at::Tensor& attention_mask,
                                                                            bool use_causal_mask) {
  return attend(all_inputs, training, attention_mask, use_causal_mask, /*want_scores=*/true);
}

std::pair<at::Tensor, at::Tensor> MultiHeadAttention::attend(const Tensors& all_inputs, bool training,
                                                             const at::Tensor& attention_mask, bool use_causal_mask,
                                                             bool want_scores) {
  const Tensors inputs(all_inputs.begin(), all_inputs.begin() + std::min<size_t>(all_inputs.size(), 3));
  std::vector<Shape> shapes;
  for (auto& t : inputs) shapes.push_back(sizes_of(t));
  if (!built()) {
    for (auto& s : shapes)
      if (!s.empty()) s[0] = kNone;
    build_if_needed(shapes);
  }
  check_inputs(shapes);
  const at::Tensor& query = inputs[0];
  const at::Tensor& value = inputs[1];
  const at::Tensor& key = inputs.size() > 2 ? inputs[2] : value;
  at::Tensor q = (*query_)(query, training) * (1.0 / std::sqrt((double)key_dim_));  // (B, T, N, H)
  at::Tensor k = (*key_)(key, training);                                            // (B, S, N, H)
  at::Tensor v = (*value_)(value, training);                                        // (B, S, N, Hv)
  // As Keras's masked softmax: masked positions get a large negative logit
  // (a fully masked row becomes uniform rather than NaN).
  const double large_negative = q.scalar_type() == at::kHalf ? -3e4 : -1e9;
  if (!want_scores && q.is_cuda()) {
    // The same attention through LibTorch's fused kernels (softmax in float32
    // inside them): q is already scaled, so scale 1. A causal mask over
    // equal lengths is their is_causal (no row fully masked); any other mask
    // is added to the logits as 0 or the large negative, as below.
    const bool causal_only = use_causal_mask && !attention_mask.defined() && query.size(1) == key.size(1);
    std::optional<at::Tensor> bias;
    if (!causal_only) {
      at::Tensor mask = combined_mask(attention_mask, use_causal_mask, query.size(1), key.size(1), q.device());
      if (mask.defined())
        bias = at::zeros(mask.sizes(), q.options()).masked_fill(mask.logical_not(), large_negative).unsqueeze(1);
    }
    at::Tensor context = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias,
                                                          training ? dropout_ : 0.0, causal_only, 1.0)
                             .transpose(1, 2);  // (B, T, N, Hv)
    at::Tensor out = (*output_)(context, training);
    if (activity_reg_ && training) add_loss((*activity_reg_)(out));
    return {out, at::Tensor()};
  }
  at::Tensor logits = at::einsum("aecd,abcd->acbe", {k, q});  // (B, N, T, S)
  at::Tensor mask = combined_mask(attention_mask, use_causal_mask, query.size(1), key.size(1), logits.device());
  if (mask.defined()) {
    logits = logits.masked_fill(mask.unsqueeze(1).logical_not(), large_negative);
  }
  // Softmax in at least float32 for 16-bit compute dtypes, then back.
  at::Tensor scores =
      at::softmax(logits, -1, at::promote_types(logits.scalar_type(), at::kFloat)).to(logits.scalar_type());
  at::Tensor dropped = (training && dropout_ > 0) ? at::dropout(scores, dropout_, true) : scores;
  at::Tensor context = at::einsum("acbe,aecd->abcd", {dropped, v});  // (B, T, N, Hv)
  at::Tensor out = (*output_)(context, training);
  if (activity_reg_ && training) add_loss((*activity_reg_)(out));
  return {out, scores};
}

Tensors MultiHeadAttention::call(const Tensors& inputs, bool training) {
  return {attend(inputs, training, inputs.size() > 3 ? inputs[3] : at::Tensor(), use_causal_mask_,
                 /*want_scores=*/false)
              .first};
}

std::vector<Shape> MultiHeadAttention::compute_output_shape(const std::vector<Shape>& input_shapes) {
  check_inputs(input_shapes);
  build_if_needed(input_shapes);
  Shape out = {input_shapes[0][0], input_shapes[0][1]};
  out.insert(out.end(), output_shape_.begin(), output_shape_.end());
  return {out};
}

Json MultiHeadAttention::get_config() const {
  Json j = base_config();
  j["num_heads"] = num_heads_;
  j["key_dim"] = key_dim_;
  j["value_dim"] = value_dim_;
  j["dropout"] = dropout_;
  j["use_bias"] = use_bias_;
  j["output_shape"] = output_shape_json_;
  j["attention_axes"] = nullptr;
  j["kernel_initializer"] = kernel_init_;
  j["bias_initializer"] = bias_init_;
  j["kernel_regularizer"] = regularizer_json(kernel_reg_);
  j["bias_regularizer"] = regularizer_json(bias_reg_);
  j["activity_regularizer"] = regularizer_json(activity_reg_);
  j["kernel_constraint"] = nullptr;
  j["bias_constraint"] = nullptr;
  j["seed"] = seed_;
  j["use_causal_mask"] = use_causal_mask_;
  return j;
}

KILN_REGISTER_LAYER(MultiHeadAttention);

}  // namespace kiln
