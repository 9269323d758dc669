#include "kiln/layers/attention.h"

#include "kiln/layers/sharded_kernel.h"

#include <cmath>

#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {
const char* const kOutputShapeExpected = "null, a positive integer or a list of positive integers";

const FieldTable<layers::MultiHeadAttentionOptions>& attention_fields() {
  using O = layers::MultiHeadAttentionOptions;
  const char* const value_dim = "value_dim";
  const char* const output_shape = "output_shape";
  const char* const attention_axes = "attention_axes";
  static const FieldTable<O> t = {
      field("num_heads", &O::num_heads).positive().required(), field("key_dim", &O::key_dim).positive().required(),
      // Unset: key_dim (read before it), written as a number.
      FieldDef<O>{value_dim, [=](ConfigReader& r, O& o) { o.value_dim = r.positive_int(value_dim, o.key_dim); },
                  [=](const std::string& owner, O& o) {
                    o.value_dim = o.value_dim ? option_check::positive(owner, value_dim, *o.value_dim) : o.key_dim;
                  },
                  [=](Json& j, const O& o) { j[value_dim] = *o.value_dim; }},
      field("dropout", &O::dropout).in_range(0.0, 1.0, /*hi_inclusive=*/false), field("use_bias", &O::use_bias),
      FieldDef<O>{output_shape,
                  [=](ConfigReader& r, O& o) {
                    const Json* os = r.get(output_shape);
                    if (!os) return;
                    if (os->is_number_integer()) {
                      o.output_shape = os->get<int64_t>();
                    } else if (os->is_array() && !os->empty()) {
                      std::vector<int64_t> dims;
                      for (auto& d : *os) {
                        if (!d.is_number_integer()) r.invalid(output_shape, kOutputShapeExpected);
                        dims.push_back(d.get<int64_t>());
                      }
                      o.output_shape = dims;
                    } else {
                      r.invalid(output_shape, kOutputShapeExpected);
                    }
                  },
                  [=](const std::string& owner, O& o) {
                    if (!o.output_shape) return;
                    const auto* one = std::get_if<int64_t>(&*o.output_shape);
                    const Shape dims = one ? Shape{*one} : std::get<std::vector<int64_t>>(*o.output_shape);
                    bool ok = !dims.empty();
                    for (auto d : dims) ok = ok && d >= 1;
                    if (!ok)
                      option_check::invalid(owner, output_shape, kOutputShapeExpected,
                                            int_or_list_json(*o.output_shape));
                  },
                  [=](Json& j, const O& o) {
                    j[output_shape] = o.output_shape ? int_or_list_json(*o.output_shape) : Json(nullptr);
                  }},
      FieldDef<O>{attention_axes,
                  [=](ConfigReader& r, O&) {
                    if (r.get(attention_axes))
                      r.invalid(attention_axes,
                                "null (attention over the sequence axis; other axes are not supported yet)");
                  },
                  nullptr, [=](Json& j, const O&) { j[attention_axes] = nullptr; }},
      field("kernel_initializer", &O::kernel_initializer), field("bias_initializer", &O::bias_initializer),
      field("kernel_regularizer", &O::kernel_regularizer), field("bias_regularizer", &O::bias_regularizer),
      field("activity_regularizer", &O::activity_regularizer), no_constraint<O>("kernel_constraint"),
      no_constraint<O>("bias_constraint"), field("seed", &O::seed), field("use_causal_mask", &O::use_causal_mask)};
  return t;
}
}  // namespace

layers::MultiHeadAttentionOptions layers::MultiHeadAttentionImpl::options_from_config(const Json& config) {
  return read_fields(config, "MultiHeadAttention", attention_fields());
}

layers::MultiHeadAttentionImpl::MultiHeadAttentionImpl(const layers::MultiHeadAttentionOptions& o)
    : layers::MultiHeadAttentionImpl(o, layer_base_config(o.base)) {}

layers::MultiHeadAttentionImpl::MultiHeadAttentionImpl(const Json& config)
    : layers::MultiHeadAttentionImpl(options_from_config(config), config) {}

layers::MultiHeadAttentionImpl::MultiHeadAttentionImpl(const layers::MultiHeadAttentionOptions& o,
                                                       const Json& base_config)
    : Layer(base_config), options_(o) {
  check_fields("MultiHeadAttention", options_, attention_fields());
  if (options_.output_shape) {
    const auto* one = std::get_if<int64_t>(&*options_.output_shape);
    output_shape_ = one ? Shape{*one} : std::get<std::vector<int64_t>>(*options_.output_shape);
  }
}

layers::MultiHeadAttentionImpl::MultiHeadAttentionImpl(int64_t num_heads, int64_t key_dim, const Json& extra)
    : layers::MultiHeadAttentionImpl(merged_config(extra, Json{{"num_heads", num_heads}, {"key_dim", key_dim}})) {}

std::shared_ptr<layers::EinsumDenseImpl> layers::MultiHeadAttentionImpl::make_dense(
    const std::string& name, const std::string& equation, const Shape& output_shape,
    const std::string& bias_axes) const {
  Json c;
  c["name"] = name;
  c["trainable"] = trainable();
  c["dtype"] = dtype_policy().name();
  c["equation"] = equation;
  c["output_shape"] = int_list_json(output_shape);
  c["bias_axes"] = options_.use_bias ? Json(bias_axes) : Json(nullptr);
  c["kernel_initializer"] = options_.kernel_initializer.resolved()->to_json();
  c["bias_initializer"] = options_.bias_initializer.resolved()->to_json();
  c["kernel_regularizer"] = regularizer_json(options_.kernel_regularizer);
  c["bias_regularizer"] = regularizer_json(options_.bias_regularizer);
  return layers::EinsumDense(c);
}

void layers::MultiHeadAttentionImpl::check_inputs(const std::vector<Shape>& all) const {
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

at::Tensor layers::MultiHeadAttentionImpl::combined_mask(const at::Tensor& attention_mask, bool use_causal_mask,
                                                         int64_t query_len, int64_t key_len,
                                                         const at::Device& device) const {
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

void layers::MultiHeadAttentionImpl::build(const std::vector<Shape>& input_shapes) {
  check_inputs(input_shapes);
  const Shape& q = input_shapes[0];
  const Shape& v = input_shapes[1];
  const Shape& k = input_shapes.size() > 2 ? input_shapes[2] : v;
  if (output_shape_.empty()) output_shape_ = {q.back()};
  query_ = make_dense("query", "abc,cde->abde", {kNone, options_.num_heads, options_.key_dim}, "de");
  key_ = make_dense("key", "abc,cde->abde", {kNone, options_.num_heads, options_.key_dim}, "de");
  value_ = make_dense("value", "abc,cde->abde", {kNone, options_.num_heads, *options_.value_dim}, "de");
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
  output_->build_if_needed({{q[0], q[1], options_.num_heads, *options_.value_dim}});
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

std::pair<at::Tensor, at::Tensor> layers::MultiHeadAttentionImpl::attention_with_scores(const Tensors& inputs,
                                                                                        bool training) {
  return attention_with_scores(inputs, training, inputs.size() > 3 ? inputs[3] : at::Tensor(),
                               options_.use_causal_mask);
}

std::pair<at::Tensor, at::Tensor> layers::MultiHeadAttentionImpl::attention_with_scores(
    const Tensors& all_inputs, bool training, const at::Tensor& attention_mask, bool use_causal_mask) {
  return attend(all_inputs, training, attention_mask, use_causal_mask, /*want_scores=*/true);
}

std::pair<at::Tensor, at::Tensor> layers::MultiHeadAttentionImpl::attend(const Tensors& all_inputs, bool training,
                                                                         const at::Tensor& attention_mask,
                                                                         bool use_causal_mask, bool want_scores) {
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
  at::Tensor q = (*query_)(query, training) * (1.0 / std::sqrt((double)options_.key_dim));  // (B, T, N, H)
  at::Tensor k = (*key_)(key, training);                                                    // (B, S, N, H)
  at::Tensor v = (*value_)(value, training);                                                // (B, S, N, Hv)
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
                                                          training ? options_.dropout : 0.0, causal_only, 1.0)
                             .transpose(1, 2);  // (B, T, N, Hv)
    at::Tensor out = (*output_)(context, training);
    if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(out));
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
  at::Tensor dropped = (training && options_.dropout > 0) ? at::dropout(scores, options_.dropout, true) : scores;
  at::Tensor context = at::einsum("acbe,aecd->abcd", {dropped, v});  // (B, T, N, Hv)
  at::Tensor out = (*output_)(context, training);
  if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(out));
  return {out, scores};
}

Tensors layers::MultiHeadAttentionImpl::call(const Tensors& inputs, bool training) {
  return {attend(inputs, training, inputs.size() > 3 ? inputs[3] : at::Tensor(), options_.use_causal_mask,
                 /*want_scores=*/false)
              .first};
}

std::vector<Shape> layers::MultiHeadAttentionImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  check_inputs(input_shapes);
  build_if_needed(input_shapes);
  Shape out = {input_shapes[0][0], input_shapes[0][1]};
  out.insert(out.end(), output_shape_.begin(), output_shape_.end());
  return {out};
}

Json layers::MultiHeadAttentionImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, attention_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(MultiHeadAttention, layers::MultiHeadAttentionImpl);

}  // namespace kiln
