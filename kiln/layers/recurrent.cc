#include "kiln/layers/recurrent.h"

#include "kiln/core/names.h"
#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {

Shape shape_of(const at::Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

// LSTM's unit_forget_bias: the forget gate's quarter of the bias starts at 1,
// the rest from the bias initializer (Keras builds it the same way).
class UnitForgetBias : public Initializer {
 public:
  explicit UnitForgetBias(InitializerPtr base) : base_(std::move(base)) {}
  at::Tensor sample(const Shape& shape, at::ScalarType dtype) const override {
    const int64_t u = shape.at(0) / 4;
    return at::cat(
        {base_->sample({u}, dtype), at::ones({u}, at::TensorOptions().dtype(dtype)), base_->sample({2 * u}, dtype)});
  }
  Json get_config() const override { return base_->get_config(); }
  std::string class_name() const override { return base_->class_name(); }

 private:
  InitializerPtr base_;
};

// A (batch, units) dropout mask scaled by 1/(1-rate), drawn once per call.
at::Tensor dropout_mask(int64_t batch, int64_t n, double rate, const at::TensorOptions& opts) {
  return at::dropout(at::ones({batch, n}, opts), rate, /*train=*/true);
}

std::string strip_prefix(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : s;
}

}  // namespace

// --- RecurrentLayer -----------------------------------------------------------------------------

namespace {
// `kind`: "lstm", "gru" or "simple_rnn"; the keys of the other kinds are not in the table.
FieldTable<layers::RecurrentOptions> recurrent_fields(const std::string& kind, bool has_recurrent_activation) {
  using O = layers::RecurrentOptions;
  const char* const stateful = "stateful";
  const char* const use_cudnn = "use_cudnn";
  FieldTable<O> t = {field("units", &O::units).positive().required(), field("activation", &O::activation).activation()};
  if (has_recurrent_activation) t.push_back(field("recurrent_activation", &O::recurrent_activation).activation());
  t = t +
      FieldTable<O>{
          field("use_bias", &O::use_bias), field("kernel_initializer", &O::kernel_initializer),
          field("recurrent_initializer", &O::recurrent_initializer), field("bias_initializer", &O::bias_initializer),
          field("kernel_regularizer", &O::kernel_regularizer),
          field("recurrent_regularizer", &O::recurrent_regularizer), field("bias_regularizer", &O::bias_regularizer),
          field("activity_regularizer", &O::activity_regularizer), no_constraint<O>("kernel_constraint"),
          no_constraint<O>("recurrent_constraint"), no_constraint<O>("bias_constraint"),
          field("dropout", &O::dropout).in_range(0.0, 1.0, /*hi_inclusive=*/false),
          field("recurrent_dropout", &O::recurrent_dropout).in_range(0.0, 1.0, /*hi_inclusive=*/false),
          field("seed", &O::seed), field("return_sequences", &O::return_sequences),
          field("return_state", &O::return_state), field("go_backwards", &O::go_backwards),
          // Accepted as false only: kiln keeps no state between calls.
          FieldDef<O>{stateful,
                      [=](ConfigReader& r, O&) {
                        if (r.boolean(stateful, false))
                          r.invalid(stateful,
                                    "false (kiln keeps no recurrent state between calls; pass initial states as "
                                    "inputs)");
                      },
                      nullptr, [=](Json& j, const O&) { j[stateful] = false; }},
          field("unroll", &O::unroll),
          // "auto" (unset), true or false.
          FieldDef<O>{
              use_cudnn,
              [=](ConfigReader& r, O& o) {
                const Json* cudnn = r.get(use_cudnn);
                if (cudnn && !cudnn->is_boolean() && !(cudnn->is_string() && cudnn->get<std::string>() == "auto"))
                  r.invalid(use_cudnn, "\"auto\", true or false");
                if (cudnn && cudnn->is_boolean()) o.use_cudnn = cudnn->get<bool>();
              },
              nullptr, [=](Json& j, const O& o) { j[use_cudnn] = o.use_cudnn ? Json(*o.use_cudnn) : Json("auto"); }},
          field("zero_output_for_mask", &O::zero_output_for_mask)};
  if (kind == "lstm") t.push_back(field("unit_forget_bias", &O::unit_forget_bias));
  if (kind == "gru") t.push_back(field("reset_after", &O::reset_after));
  return t;
}
}  // namespace

layers::RecurrentOptions layers::RecurrentLayer::options_from_config(const Json& config, const std::string& owner,
                                                                     const std::string& kind,
                                                                     bool has_recurrent_activation) {
  return read_fields(config, owner, recurrent_fields(kind, has_recurrent_activation));
}

layers::RecurrentLayer::RecurrentLayer(const layers::RecurrentOptions& o, const Json& base_config,
                                       const std::string& owner, const std::string& kind, int gates,
                                       bool has_recurrent_activation)
    : Layer(base_config), options_(o), gates_(gates), kind_(kind), has_recurrent_activation_(has_recurrent_activation) {
  const layers::RecurrentOptions defaults;
  auto not_here = [&](const char* key, bool is_set) {
    if (is_set) throw ValueError(owner + ": `" + key + "` is not an option of " + owner + "; leave it at its default");
  };
  not_here("recurrent_activation",
           !has_recurrent_activation && o.recurrent_activation != defaults.recurrent_activation);
  not_here("unit_forget_bias", kind != "lstm" && o.unit_forget_bias != defaults.unit_forget_bias);
  not_here("reset_after", kind != "gru" && o.reset_after != defaults.reset_after);
  check_fields(owner, options_, recurrent_fields(kind, has_recurrent_activation));
  activation_ = get_activation(options_.activation);
  if (has_recurrent_activation) recurrent_activation_ = get_activation(options_.recurrent_activation);
}

Shape layers::RecurrentLayer::bias_shape() const { return {gates_ * options_.units}; }

void layers::RecurrentLayer::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  if (s.size() != 3 || s[2] < 1)
    throw ShapeError(
        class_name() + " '" + name() +
        "' needs inputs of shape (batch, time, features) with known features. Received: " + shape_to_string(s));
  if (input_shapes.size() > 1 && (int)input_shapes.size() != 1 + num_states())
    throw ValueError(class_name() + " '" + name() + "' takes the sequence and optionally " +
                     std::to_string(num_states()) + " initial state(s). Received " +
                     std::to_string(input_shapes.size()) + " inputs");
  NameScope cell(kind_ + "_cell");  // Keras's paths: lstm/lstm_cell/kernel
  kernel_ = add_weight("kernel", {s[2], gates_ * options_.units}, options_.kernel_initializer.resolved(), true,
                       options_.kernel_regularizer);
  recurrent_kernel_ = add_weight("recurrent_kernel", {options_.units, gates_ * options_.units},
                                 options_.recurrent_initializer.resolved(), true, options_.recurrent_regularizer);
  if (options_.use_bias)
    bias_ = add_weight("bias", bias_shape(), bias_build_initializer(), true, options_.bias_regularizer);
}

Tensors layers::RecurrentLayer::call(const Tensors& inputs, bool training) {
  return call_masked(inputs, {}, training, nullptr);
}

Tensors layers::RecurrentLayer::call_masked(const Tensors& inputs, const Tensors& masks, bool training,
                                            Tensors* output_masks) {
  const at::Tensor& x_in = inputs.at(0);
  const int64_t features = kernel_->shape()[0];
  if (x_in.dim() != 3 || x_in.size(2) != features)
    throw ShapeError(class_name() + " '" + name() + "' expects inputs of shape (batch, time, " +
                     std::to_string(features) + "). Received: " + shape_to_string(shape_of(x_in)));
  const int64_t batch = x_in.size(0), steps = x_in.size(1);
  at::Tensor x = x_in;
  if (training && options_.dropout > 0)
    x = x * dropout_mask(batch, features, options_.dropout, x.options()).unsqueeze(1);

  at::Tensor mask = masks.empty() ? at::Tensor() : masks[0];
  if (mask.defined()) {
    if (mask.dim() != 2 || mask.size(0) != batch || mask.size(1) != steps)
      throw ShapeError(class_name() + " '" + name() + "': the mask must have shape (batch, time) = (" +
                       std::to_string(batch) + ", " + std::to_string(steps) +
                       "). Received: " + shape_to_string(shape_of(mask)));
    mask = mask.to(at::kBool);
  }

  Tensors states;
  if (inputs.size() > 1) {
    if ((int)inputs.size() != 1 + num_states())
      throw ValueError(class_name() + " '" + name() + "' takes " + std::to_string(num_states()) +
                       " initial state(s). Received " + std::to_string(inputs.size() - 1));
    for (size_t i = 1; i < inputs.size(); ++i) {
      if (inputs[i].dim() != 2 || inputs[i].size(0) != batch || inputs[i].size(1) != options_.units)
        throw ShapeError(class_name() + " '" + name() + "': initial states must have shape (batch, units) = (" +
                         std::to_string(batch) + ", " + std::to_string(options_.units) +
                         "). Received: " + shape_to_string(shape_of(inputs[i])));
      states.push_back(inputs[i].to(x.scalar_type()));
    }
  } else {
    for (int i = 0; i < num_states(); ++i) states.push_back(at::zeros({batch, options_.units}, x.options()));
  }

  const at::Tensor u = value(recurrent_kernel_);
  at::Tensor b = bias_ ? value(bias_) : at::Tensor();
  at::Tensor xw = at::matmul(x, value(kernel_));  // all steps at once: (batch, time, gates*units)
  if (b.defined()) xw = xw + input_bias(b);
  const at::Tensor rb = b.defined() ? recurrent_bias(b) : at::Tensor();
  at::Tensor rec_mask;
  if (training && options_.recurrent_dropout > 0)
    rec_mask = dropout_mask(batch, options_.units, options_.recurrent_dropout, x.options());

  Tensors outputs;
  if (options_.return_sequences) outputs.reserve(steps);
  at::Tensor last = at::zeros({batch, options_.units}, x.options());  // the previous step's output
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t t = options_.go_backwards ? steps - 1 - k : k;
    const at::Tensor h_rec = rec_mask.defined() ? states[0] * rec_mask : states[0];
    Tensors next = step(xw.select(1, t), states, h_rec, u, rb);
    at::Tensor out = next[0];
    if (mask.defined()) {
      // Masked steps keep the previous state and repeat the previous output.
      const at::Tensor m = mask.select(1, t).unsqueeze(1);
      for (size_t i = 0; i < next.size(); ++i) next[i] = at::where(m, next[i], states[i]);
      out = at::where(m, out, last);
      if (options_.return_sequences)
        outputs.push_back(options_.zero_output_for_mask ? out * m.to(out.scalar_type()) : out);
    } else if (options_.return_sequences) {
      outputs.push_back(out);
    }
    last = out;
    states = std::move(next);
  }
  Tensors result;
  if (options_.return_sequences)
    result.push_back(steps == 0 ? at::zeros({batch, 0, options_.units}, x.options()) : at::stack(outputs, 1));
  else
    result.push_back(last);
  if (options_.return_state)
    for (auto& s : states) result.push_back(s);
  if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(result[0]));
  if (output_masks) *output_masks = compute_mask(inputs, masks);
  return result;
}

Tensors layers::RecurrentLayer::compute_mask(const Tensors& inputs, const Tensors& masks) {
  Tensors out(1 + (options_.return_state ? num_states() : 0));
  if (options_.return_sequences && !masks.empty()) out[0] = masks[0];
  return out;
}

std::vector<Shape> layers::RecurrentLayer::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  std::vector<Shape> out;
  out.push_back(options_.return_sequences ? Shape{s[0], s[1], options_.units} : Shape{s[0], options_.units});
  if (options_.return_state)
    for (int i = 0; i < num_states(); ++i) out.push_back({s[0], options_.units});
  return out;
}

Json layers::RecurrentLayer::get_config() const {
  Json j = base_config();
  write_fields(j, options_, recurrent_fields(kind_, has_recurrent_activation_));
  return j;
}

// --- LSTM ---------------------------------------------------------------------------------------

layers::LSTMImpl::LSTMImpl(const layers::RecurrentOptions& o) : layers::LSTMImpl(o, layer_base_config(o.base)) {}

layers::LSTMImpl::LSTMImpl(const layers::RecurrentOptions& o, const Json& base_config)
    : layers::RecurrentLayer(o, base_config, "LSTM", "lstm", 4, true) {}

layers::LSTMImpl::LSTMImpl(const Json& config)
    : layers::LSTMImpl(options_from_config(config, "LSTM", "lstm", true), config) {}

InitializerPtr layers::LSTMImpl::bias_build_initializer() const {
  const InitializerPtr base = layers::RecurrentLayer::bias_build_initializer();
  return options_.unit_forget_bias ? std::make_shared<UnitForgetBias>(base) : base;
}

Tensors layers::LSTMImpl::step(const at::Tensor& xw, const Tensors& states, const at::Tensor& h_rec,
                               const at::Tensor& u, const at::Tensor& rb) {
  at::Tensor z = xw + at::matmul(h_rec, u);
  auto g = z.chunk(4, 1);  // i, f, c, o
  at::Tensor i = recurrent_activation_(g[0]), f = recurrent_activation_(g[1]);
  at::Tensor c = f * states[1] + i * activation_(g[2]);
  at::Tensor h = recurrent_activation_(g[3]) * activation_(c);
  return {h, c};
}

// --- GRU ----------------------------------------------------------------------------------------

layers::GRUImpl::GRUImpl(const layers::RecurrentOptions& o) : layers::GRUImpl(o, layer_base_config(o.base)) {}

layers::GRUImpl::GRUImpl(const layers::RecurrentOptions& o, const Json& base_config)
    : layers::RecurrentLayer(o, base_config, "GRU", "gru", 3, true) {}

layers::GRUImpl::GRUImpl(const Json& config)
    : layers::GRUImpl(options_from_config(config, "GRU", "gru", true), config) {}

Shape layers::GRUImpl::bias_shape() const {
  return options_.reset_after ? Shape{2, 3 * options_.units} : Shape{3 * options_.units};
}

at::Tensor layers::GRUImpl::input_bias(const at::Tensor& bias) const {
  return options_.reset_after ? bias.select(0, 0) : bias;
}

at::Tensor layers::GRUImpl::recurrent_bias(const at::Tensor& bias) const {
  return options_.reset_after ? bias.select(0, 1) : at::Tensor();
}

Tensors layers::GRUImpl::step(const at::Tensor& xw, const Tensors& states, const at::Tensor& h_rec, const at::Tensor& u,
                              const at::Tensor& rb) {
  auto x = xw.chunk(3, 1);  // z, r, h
  const at::Tensor& h_prev = states[0];
  at::Tensor z, hh;
  if (options_.reset_after) {
    at::Tensor rec = at::matmul(h_rec, u);
    if (rb.defined()) rec = rec + rb;
    auto r3 = rec.chunk(3, 1);
    z = recurrent_activation_(x[0] + r3[0]);
    at::Tensor r = recurrent_activation_(x[1] + r3[1]);
    hh = activation_(x[2] + r * r3[2]);
  } else {
    at::Tensor rec = at::matmul(h_rec, u.narrow(1, 0, 2 * options_.units));
    auto r2 = rec.chunk(2, 1);
    z = recurrent_activation_(x[0] + r2[0]);
    at::Tensor r = recurrent_activation_(x[1] + r2[1]);
    hh = activation_(x[2] + at::matmul(r * h_rec, u.narrow(1, 2 * options_.units, options_.units)));
  }
  return {z * h_prev + (1 - z) * hh};
}

// --- SimpleRNN ----------------------------------------------------------------------------------

layers::SimpleRNNImpl::SimpleRNNImpl(const layers::RecurrentOptions& o)
    : layers::SimpleRNNImpl(o, layer_base_config(o.base)) {}

layers::SimpleRNNImpl::SimpleRNNImpl(const layers::RecurrentOptions& o, const Json& base_config)
    : layers::RecurrentLayer(o, base_config, "SimpleRNN", "simple_rnn", 1, false) {}

layers::SimpleRNNImpl::SimpleRNNImpl(const Json& config)
    : layers::SimpleRNNImpl(options_from_config(config, "SimpleRNN", "simple_rnn", false), config) {}

Tensors layers::SimpleRNNImpl::step(const at::Tensor& xw, const Tensors& states, const at::Tensor& h_rec,
                                    const at::Tensor& u, const at::Tensor& rb) {
  return {activation_(xw + at::matmul(h_rec, u))};
}

// --- Bidirectional ------------------------------------------------------------------------------

namespace {

// A recurrent layer from {"class_name", "config"}, renamed and, if asked,
// with go_backwards flipped.
std::shared_ptr<layers::RecurrentLayer> make_recurrent(const Json& j, const std::string& name, bool flip,
                                                       const std::string& key) {
  if (!j.is_object() || !j.contains("class_name") || !j["class_name"].is_string())
    throw ValueError("Bidirectional: `" + key +
                     "` must be a recurrent layer as {\"class_name\": \"LSTM\", \"config\": {...}}. Received: " +
                     j.dump().substr(0, 200));
  Json config = j.value("config", Json::object());
  if (!config.is_object()) throw ValueError("Bidirectional: `" + key + "`'s config must be an object");
  config["name"] = name;
  if (flip) config["go_backwards"] = !get_or<bool>(config, "go_backwards", false);
  auto layer = std::dynamic_pointer_cast<layers::RecurrentLayer>(
      LayerRegistry::create(j["class_name"].get<std::string>(), config));
  if (!layer)
    throw ValueError("Bidirectional: `" + key + "` must be a recurrent layer (LSTM, GRU, SimpleRNN). Received: " +
                     j["class_name"].get<std::string>());
  return layer;
}

}  // namespace

layers::BidirectionalImpl::BidirectionalImpl(const Json& config) : Layer(config) {
  ConfigReader r(config, "Bidirectional");
  const Json* layer = r.get("layer");
  if (!layer) throw ValueError("Bidirectional: the config is missing `layer` (e.g. {\"class_name\": \"LSTM\", ...})");
  const bool has_mode = config.is_object() && config.contains("merge_mode");  // null: no merging
  const Json* mode = r.get("merge_mode");
  if (!has_mode) {
    merge_mode_ = "concat";
  } else if (mode) {
    merge_mode_ = mode->is_string() ? mode->get<std::string>() : "?";
    if (merge_mode_ != "concat" && merge_mode_ != "sum" && merge_mode_ != "mul" && merge_mode_ != "ave")
      r.invalid("merge_mode", "one of \"concat\", \"sum\", \"mul\", \"ave\" or null");
  }
  const Json* backward = r.get("backward_layer");
  r.finish();

  std::string inner;
  if (layer->is_object() && layer->contains("config") && (*layer)["config"].is_object())
    inner = get_or<std::string>((*layer)["config"], "name", "");
  if (inner.empty() && layer->is_object() && layer->contains("class_name") && (*layer)["class_name"].is_string())
    inner = unique_name(to_snake_case((*layer)["class_name"].get<std::string>()));
  inner = strip_prefix(inner, "forward_");
  forward_ = make_recurrent(*layer, "forward_" + inner, false, "layer");
  if (backward) {
    std::string bname = "backward_" + inner;
    if (backward->is_object() && backward->contains("config"))
      bname = get_or<std::string>((*backward)["config"], "name", bname);
    backward_ = make_recurrent(*backward, bname, false, "backward_layer");
    if (backward_->go_backwards() == forward_->go_backwards())
      throw ValueError("Bidirectional: `backward_layer` must have the opposite go_backwards of `layer`. Received: " +
                       std::string(forward_->go_backwards() ? "true" : "false") + " for both");
    if (backward_->return_sequences() != forward_->return_sequences() ||
        backward_->return_state() != forward_->return_state())
      throw ValueError(
          "Bidirectional: `backward_layer` must have the same return_sequences and return_state as `layer`");
  } else {
    backward_ = make_recurrent(*layer, "backward_" + inner, true, "layer");
  }
  // The wrapper's dtype policy is its layers' policy.
  forward_->set_dtype_policy(dtype_policy());
  backward_->set_dtype_policy(dtype_policy());
  track(forward_);
  track(backward_);
}

void layers::BidirectionalImpl::build(const std::vector<Shape>& input_shapes) {
  const size_t n = forward_->num_states();
  if (input_shapes.size() != 1 && input_shapes.size() != 1 + 2 * n)
    throw ValueError("Bidirectional '" + name() + "' takes the sequence and optionally " + std::to_string(2 * n) +
                     " initial states (forward's, then backward's). Received " + std::to_string(input_shapes.size()) +
                     " inputs");
  std::vector<Shape> f = {input_shapes[0]}, b = {input_shapes[0]};
  for (size_t i = 0; i + 1 < input_shapes.size(); ++i) (i < n ? f : b).push_back(input_shapes[i + 1]);
  forward_->build_if_needed(f);
  backward_->build_if_needed(b);
}

Tensors layers::BidirectionalImpl::call(const Tensors& inputs, bool training) {
  return call_masked(inputs, {}, training, nullptr);
}

Tensors layers::BidirectionalImpl::call_masked(const Tensors& inputs, const Tensors& masks, bool training,
                                               Tensors* output_masks) {
  const size_t n = forward_->num_states();
  if (inputs.size() != 1 && inputs.size() != 1 + 2 * n)
    throw ValueError("Bidirectional '" + name() + "' takes the sequence and optionally " + std::to_string(2 * n) +
                     " initial states. Received " + std::to_string(inputs.size()) + " inputs");
  Tensors f = {inputs[0]}, b = {inputs[0]};
  for (size_t i = 0; i + 1 < inputs.size(); ++i) (i < n ? f : b).push_back(inputs[i + 1]);
  const at::Tensor mask = masks.empty() ? at::Tensor() : masks[0];
  Tensors fm(f.size()), bm(b.size());
  fm[0] = bm[0] = mask;
  Tensors yf = forward_->call_with_masks(f, fm, training, nullptr);
  Tensors yb = backward_->call_with_masks(b, bm, training, nullptr);
  at::Tensor of = yf[0], ob = yb[0];
  if (forward_->return_sequences()) ob = ob.flip({1});  // back to the forward time order
  Tensors out;
  if (merge_mode_ == "concat")
    out.push_back(at::cat({of, ob}, -1));
  else if (merge_mode_ == "sum")
    out.push_back(of + ob);
  else if (merge_mode_ == "mul")
    out.push_back(of * ob);
  else if (merge_mode_ == "ave")
    out.push_back((of + ob) / 2);
  else
    out = {of, ob};
  for (size_t i = 1; i < yf.size(); ++i) out.push_back(yf[i]);
  for (size_t i = 1; i < yb.size(); ++i) out.push_back(yb[i]);
  if (output_masks) *output_masks = compute_mask(inputs, masks);
  return out;
}

Tensors layers::BidirectionalImpl::compute_mask(const Tensors& inputs, const Tensors& masks) {
  const size_t merged = merge_mode_.empty() ? 2 : 1;
  Tensors out(merged + (forward_->return_state() ? 2 * forward_->num_states() : 0));
  if (forward_->return_sequences() && !masks.empty())
    for (size_t i = 0; i < merged; ++i) out[i] = masks[0];
  return out;
}

std::vector<Shape> layers::BidirectionalImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const size_t n = forward_->num_states();
  std::vector<Shape> f = {input_shapes[0]}, b = {input_shapes[0]};
  for (size_t i = 0; i + 1 < input_shapes.size(); ++i) (i < n ? f : b).push_back(input_shapes[i + 1]);
  auto sf = forward_->compute_output_shape(f);
  auto sb = backward_->compute_output_shape(b);
  std::vector<Shape> out;
  if (merge_mode_ == "concat") {
    Shape s = sf[0];
    s.back() = sf[0].back() + sb[0].back();
    out.push_back(s);
  } else if (merge_mode_.empty()) {
    out = {sf[0], sb[0]};
  } else {
    out.push_back(sf[0]);
  }
  for (size_t i = 1; i < sf.size(); ++i) out.push_back(sf[i]);
  for (size_t i = 1; i < sb.size(); ++i) out.push_back(sb[i]);
  return out;
}

Json layers::BidirectionalImpl::get_config() const {
  Json j = base_config();
  j["merge_mode"] = merge_mode_.empty() ? Json(nullptr) : Json(merge_mode_);
  j["layer"] = Json{{"class_name", forward_->class_name()}, {"config", forward_->get_config()}};
  j["backward_layer"] = Json{{"class_name", backward_->class_name()}, {"config", backward_->get_config()}};
  return j;
}

// --- TimeDistributed ----------------------------------------------------------------------------

layers::TimeDistributedImpl::TimeDistributedImpl(const Json& config) : Layer(config) {
  ConfigReader r(config, "TimeDistributed");
  const Json* layer = r.get("layer");
  if (!layer || !layer->is_object() || !layer->contains("class_name"))
    throw ValueError(
        "TimeDistributed: `layer` must be a layer as {\"class_name\": \"Dense\", \"config\": {...}}. Received: " +
        (layer ? layer->dump().substr(0, 200) : std::string("nothing")));
  r.finish();
  Json inner = *layer;
  inner.erase("build_config");  // built here, on the per-step shape
  layer_ = layer_from_json(inner);
  layer_->set_dtype_policy(dtype_policy());
  track(layer_);
}

namespace {
Shape step_shape(const Shape& s, const std::string& who) {
  if (s.size() < 3)
    throw ShapeError(who + " needs inputs of rank >= 3 (batch, time, ...). Received: " + shape_to_string(s));
  Shape inner = {kNone};
  inner.insert(inner.end(), s.begin() + 2, s.end());
  return inner;
}
}  // namespace

void layers::TimeDistributedImpl::build(const std::vector<Shape>& input_shapes) {
  layer_->build_if_needed({step_shape(input_shapes.at(0), "TimeDistributed '" + name() + "'")});
}

Tensors layers::TimeDistributedImpl::call(const Tensors& inputs, bool training) {
  if (inputs.size() != 1)
    throw ValueError("TimeDistributed '" + name() + "' takes one input. Received " + std::to_string(inputs.size()));
  const at::Tensor& x = inputs[0];
  if (x.dim() < 3)
    throw ShapeError("TimeDistributed '" + name() +
                     "' needs inputs of rank >= 3 (batch, time, ...). Received: " + shape_to_string(shape_of(x)));
  const int64_t batch = x.size(0), steps = x.size(1);
  std::vector<int64_t> folded = {batch * steps};
  for (int64_t d = 2; d < x.dim(); ++d) folded.push_back(x.size(d));
  Tensors ys = (*layer_)(Tensors{x.reshape(folded)}, training);
  Tensors out;
  for (auto& y : ys) {
    std::vector<int64_t> shape = {batch, steps};
    for (int64_t d = 1; d < y.dim(); ++d) shape.push_back(y.size(d));
    out.push_back(y.reshape(shape));
  }
  return out;
}

std::vector<Shape> layers::TimeDistributedImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  std::vector<Shape> out;
  for (auto& y : layer_->compute_output_shape({step_shape(s, "TimeDistributed '" + name() + "'")})) {
    Shape o = {s[0], s[1]};
    o.insert(o.end(), y.begin() + 1, y.end());
    out.push_back(o);
  }
  return out;
}

Json layers::TimeDistributedImpl::get_config() const {
  Json j = base_config();
  j["layer"] = Json{{"class_name", layer_->class_name()}, {"config", layer_->get_config()}};
  return j;
}

KILN_REGISTER_LAYER_AS(LSTM, layers::LSTMImpl);
KILN_REGISTER_LAYER_AS(GRU, layers::GRUImpl);
KILN_REGISTER_LAYER_AS(SimpleRNN, layers::SimpleRNNImpl);
KILN_REGISTER_LAYER_AS(Bidirectional, layers::BidirectionalImpl);
KILN_REGISTER_LAYER_AS(TimeDistributed, layers::TimeDistributedImpl);

}  // namespace kiln
