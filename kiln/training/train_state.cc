#include "kiln/training/train_state.h"

#include "kiln/core/error.h"
#include "kiln/core/torch_compat.h"
#include "kiln/models/model.h"

namespace kiln {
namespace {

// Keras 3's apply_mask: an output's mask (true = valid entry) as a sample
// weight. For the averaging reductions the valid entries are scaled by
// total/valid, so the loss is the mean over valid entries only.
at::Tensor masked_weight(const at::Tensor& sample_weight, const at::Tensor& mask, const std::string& reduction) {
  if (!mask.defined()) return sample_weight;
  at::Tensor m = mask.to(at::kFloat);
  if (reduction == "sum_over_batch_size" || reduction == "mean")
    m = m * (static_cast<double>(m.numel()) / (m.sum() + 1e-7));
  if (!sample_weight.defined()) return m;
  at::Tensor w = sample_weight.to(at::kFloat);
  while (w.dim() < m.dim() && w.dim() > 0) w = w.unsqueeze(-1);  // (batch,) weights every step of a sample
  return w * m;
}

at::Tensor output_mask(const StepData& s, size_t i) {
  return i < s.y_pred_masks.size() ? s.y_pred_masks[i] : at::Tensor();
}

void forward_stage(TrainState& ts, StepData& s) {
  s.y_pred = s.model->call_with_masks(s.x, {}, s.training, &s.y_pred_masks);
  // A subclassed model compiled before it was built counts its outputs only
  // when built: the first step that returns another number binds the
  // metrics to each named output ("output_0_accuracy", ...).
  if (s.y_pred.size() != ts.bound_outputs()) {
    std::vector<std::string> names = s.model->output_names();
    if (names.size() != s.y_pred.size())
      throw ValueError("model '" + s.model->name() + "' returns " + std::to_string(s.y_pred.size()) +
                       " outputs but output_names() lists " + std::to_string(names.size()) +
                       "; make output_names() name every output");
    ts.bind_outputs(names);
  }
}

void compute_loss_stage(TrainState& ts, StepData& s) {
  Loss& loss = ts.loss();
  if (s.y.size() != s.y_pred.size())
    throw ValueError("the model returns " + std::to_string(s.y_pred.size()) + " output(s) but " +
                     std::to_string(s.y.size()) + " target(s) were given; pass one target per output");
  at::Tensor total;
  for (size_t i = 0; i < s.y.size(); ++i) {
    // Losses are computed in float32 whatever the compute dtype.
    at::Tensor w = masked_weight(s.sample_weight, output_mask(s, i), loss.reduction());
    at::Tensor l = loss(s.y[i], s.y_pred[i].to(at::kFloat), w).to(at::kFloat);
    total = total.defined() ? total + l : l;
  }
  at::Tensor reg = s.model->regularization_loss();
  if (reg.defined()) total = total + reg.to(at::kFloat).sum();
  s.loss = total;
}

void identity_scale(TrainState&, StepData& s) { s.scaled_loss = s.loss; }

void backward_stage(TrainState&, StepData& s) {
  s.grads.assign(s.variables.size(), at::Tensor());
  if (s.variables.empty() || !s.scaled_loss.requires_grad()) return;
  Tensors values;
  values.reserve(s.variables.size());
  for (auto& v : s.variables) values.push_back(v->value());
  s.grads = compat::grad({s.scaled_loss}, values);
}

void no_reduction(TrainState&, StepData&) {}
void no_unscale(TrainState&, StepData&) {}

void apply_gradients_stage(TrainState& ts, StepData& s) {
  if (!s.apply_update || s.variables.empty()) return;
  ts.optimizer().apply_gradients(s.grads, s.variables);
}

void update_metrics_stage(TrainState& ts, StepData& s) {
  at::NoGradGuard ng;
  ts.loss_tracker().update(s.loss.detach().item<double>(), static_cast<double>(s.batch_size()));
  auto metrics = ts.all_metrics();
  if (metrics.size() <= 1 || s.y.empty()) return;
  const auto& outputs = ts.metric_outputs();
  Tensors preds(s.y_pred.size());
  for (size_t i = 1; i < metrics.size(); ++i) {
    const size_t o = outputs[i - 1];
    if (o >= s.y.size() || o >= s.y_pred.size()) continue;
    if (!preds[o].defined()) {
      preds[o] = s.y_pred[o].detach();
      if (at::isFloatingType(preds[o].scalar_type())) preds[o] = preds[o].to(at::kFloat);
    }
    // Keras 3's MeanMetricWrapper (accuracy, mae, ...) weights masked entries 0.
    at::Tensor mask = output_mask(s, o);
    const bool masked = mask.defined() && dynamic_cast<MeanMetricWrapper*>(metrics[i]) != nullptr;
    metrics[i]->update_state(s.y[o], preds[o], masked ? masked_weight(s.sample_weight, mask, "sum") : s.sample_weight);
  }
}

}  // namespace

StepPipeline StepPipeline::standard() {
  StepPipeline p;
  p.forward = forward_stage;
  p.compute_loss = compute_loss_stage;
  p.scale_loss = identity_scale;
  p.backward = backward_stage;
  p.reduce_gradients = no_reduction;
  p.unscale_and_check = no_unscale;
  p.apply_gradients = apply_gradients_stage;
  p.update_metrics = update_metrics_stage;
  return p;
}

TrainState::TrainState(const CompileArgs& args)
    : args_(args), loss_tracker_(std::make_shared<Mean>("loss")), pipeline_(StepPipeline::standard()) {
  if (!args_.optimizer)
    throw ValueError("compile: an optimizer is required (e.g. \"adam\"). Received: optimizer=null");
  if (!args_.metrics.empty() && !args_.output_metrics.empty())
    throw ValueError(
        "compile: give `metrics` (applied to every output) or `output_metrics` (one list per output), not "
        "both");
  for (auto& m : args_.metrics)
    if (!m) throw ValueError("compile: received a null metric");
  for (auto& list : args_.output_metrics)
    for (auto& m : list)
      if (!m) throw ValueError("compile: received a null metric");
  bind_unprefixed();
  // Names must be unique per output (bind_outputs() prefixes them per output).
  auto check_unique = [](const std::vector<MetricPtr>& list) {
    std::vector<std::string> names{"loss"};
    for (auto& m : list) {
      for (auto& n : names)
        if (n == m->name())
          throw ValueError("compile: two metrics are named '" + n +
                           "'; metric names must be unique (give one a name)");
      names.push_back(m->name());
    }
  };
  check_unique(args_.metrics);
  for (auto& list : args_.output_metrics) check_unique(list);
}

void TrainState::bind_unprefixed() {
  // Flat metrics on output 0 (per-output lists: list i on output i), under
  // their own names.
  metrics_.clear();
  metric_outputs_.clear();
  for (auto& m : args_.metrics) {
    metrics_.push_back(m);
    metric_outputs_.push_back(0);
  }
  for (size_t o = 0; o < args_.output_metrics.size(); ++o)
    for (auto& m : args_.output_metrics[o]) {
      metrics_.push_back(m);
      metric_outputs_.push_back(o);
    }
}

void TrainState::bind_outputs(const std::vector<std::string>& output_names) {
  const size_t n = output_names.size();
  bound_outputs_ = n;
  if (!args_.output_metrics.empty() && args_.output_metrics.size() != n)
    throw ValueError("compile: `output_metrics` must have one list per model output (" + std::to_string(n) +
                     "). Received " + std::to_string(args_.output_metrics.size()) + " lists");
  if (n <= 1) {  // one output: metrics keep their own names
    bind_unprefixed();
    return;
  }
  std::vector<MetricPtr> metrics;
  std::vector<size_t> outputs;
  const Loss* loss = args_.loss.get();
  for (size_t o = 0; o < n; ++o) {
    const std::vector<MetricPtr>& list =
        args_.output_metrics.empty() ? args_.metrics : args_.output_metrics[o];
    for (auto& m : list) {
      // Copies: a flat list gives every output its own (metrics are stateful),
      // and the caller's objects keep their names for compile_config.
      MetricPtr mine = Metric::from_json(m->to_json(), loss);
      mine->set_name(output_names[o] + "_" + m->name());
      metrics.push_back(mine);
      outputs.push_back(o);
    }
  }
  std::vector<std::string> names{"loss"};
  for (auto& m : metrics) {
    for (auto& existing : names)
      if (existing == m->name())
        throw ValueError("compile: two metrics are named '" + existing + "'; metric names must be unique");
    names.push_back(m->name());
  }
  metrics_ = std::move(metrics);
  metric_outputs_ = std::move(outputs);
}

Loss& TrainState::loss() {
  if (!args_.loss)
    throw StateError(
        "the model was compiled without a loss; call compile() with a loss before fit()/evaluate()");
  return *args_.loss;
}

std::vector<Metric*> TrainState::all_metrics() {
  std::vector<Metric*> out{loss_tracker_.get()};
  for (auto& m : metrics_) out.push_back(m.get());
  return out;
}

std::vector<std::string> TrainState::metric_names() const {
  std::vector<std::string> out{"loss"};
  for (auto& m : metrics_) out.push_back(m->name());
  return out;
}

std::optional<bool> TrainState::higher_is_better(const std::string& name) const {
  std::string n = name.rfind("val_", 0) == 0 ? name.substr(4) : name;
  if (n == "loss") return false;
  for (auto& m : metrics_)
    if (m->name() == n) return m->higher_is_better();
  return std::nullopt;
}

void TrainState::reset_metrics() {
  loss_tracker_->reset_state();
  for (auto& m : metrics_) m->reset_state();
}

std::map<std::string, double> TrainState::results() const {
  std::map<std::string, double> out;
  out["loss"] = loss_tracker_->result();
  for (auto& m : metrics_) out[m->name()] = m->result();
  return out;
}

void TrainState::train_step(StepData& s) {
  s.training = true;
  const StepPipeline& p = pipeline_;
  p.forward(*this, s);
  // After forward: an unbuilt model creates its variables on its first call.
  if (s.variables.empty()) s.variables = s.model->trainable_weights();
  p.compute_loss(*this, s);
  p.scale_loss(*this, s);
  p.backward(*this, s);
  p.reduce_gradients(*this, s);
  p.unscale_and_check(*this, s);
  p.apply_gradients(*this, s);
  p.update_metrics(*this, s);
}

void TrainState::test_step(StepData& s) {
  s.training = false;
  at::NoGradGuard ng;
  pipeline_.forward(*this, s);
  pipeline_.compute_loss(*this, s);
  pipeline_.update_metrics(*this, s);
}

}  // namespace kiln
