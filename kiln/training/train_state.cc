#include "kiln/training/train_state.h"

#include <cmath>

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
  ts.loss();  // StateError without a loss
  if (s.y.size() != s.y_pred.size())
    throw ValueError("the model returns " + std::to_string(s.y_pred.size()) + " output(s) but " +
                     std::to_string(s.y.size()) + " target(s) were given; pass one target per output");
  const auto& losses = ts.output_losses();
  const auto& weights = ts.output_loss_weights();
  at::Tensor total;
  s.output_losses.assign(s.y.size(), at::Tensor());
  for (size_t i = 0; i < s.y.size(); ++i) {
    Loss* loss = i < losses.size() ? losses[i].get() : &ts.loss();
    if (!loss) continue;  // an output without a loss (Keras's dict form)
    // Losses are computed in float32 whatever the compute dtype.
    at::Tensor sw = masked_weight(s.sample_weight, output_mask(s, i), loss->reduction());
    at::Tensor l = (*loss)(s.y[i], s.y_pred[i].to(at::kFloat), sw).to(at::kFloat);
    s.output_losses[i] = l;
    const double w = i < weights.size() ? weights[i] : 1.0;
    at::Tensor weighted = w == 1.0 ? l : l * w;
    total = total.defined() ? total + weighted : weighted;
  }
  if (!total.defined()) total = at::zeros({}, at::kFloat);
  at::Tensor reg = s.model->regularization_loss();
  if (reg.defined()) total = total + reg.to(at::kFloat).sum();
  s.loss = total;
}

// The optimizer's scale_loss: the loss itself, or times a
// LossScaleOptimizer's scale (which unscales in apply_gradients).
void optimizer_scale(TrainState& ts, StepData& s) { s.scaled_loss = ts.optimizer().scale_loss(s.loss); }

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
  const double batch = static_cast<double>(s.batch_size());
  ts.loss_tracker().update(s.loss, batch);  // on the loss's device: no host read per step
  auto metrics = ts.all_metrics();
  const auto& outputs = ts.metric_outputs();
  for (size_t o = 0; o < s.output_losses.size(); ++o)
    if (Mean* t = ts.output_loss_tracker(o); t && s.output_losses[o].defined()) t->update(s.output_losses[o], batch);
  // all_metrics(): the tracker, the per-output loss trackers, then metrics.
  const size_t first_metric = metrics.size() - outputs.size();
  if (outputs.empty() || s.y.empty()) return;
  Tensors preds(s.y_pred.size());
  for (size_t i = first_metric; i < metrics.size(); ++i) {
    const size_t o = outputs[i - first_metric];
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
  p.scale_loss = optimizer_scale;
  p.backward = backward_stage;
  p.reduce_gradients = no_reduction;
  p.unscale_and_check = no_unscale;
  p.apply_gradients = apply_gradients_stage;
  p.update_metrics = update_metrics_stage;
  return p;
}

TrainState::TrainState(const CompileArgs& args)
    : args_(args), loss_tracker_(std::make_shared<Mean>("loss")), pipeline_(StepPipeline::standard()) {
  if (!args_.optimizer) throw ValueError("compile: an optimizer is required (e.g. \"adam\"). Received: optimizer=null");
  const int loss_forms = (args_.loss != nullptr) + !args_.output_losses.empty() + !args_.named_losses.empty();
  if (loss_forms > 1)
    throw ValueError(
        "compile: give one loss for every output, a list (one per output) or a dict by output name, not several");
  if (!args_.loss_weights.empty() && !args_.named_loss_weights.empty())
    throw ValueError("compile: give `loss_weights` as a list (one per output) or a dict by output name, not both");
  const int metric_forms = !args_.metrics.empty() + !args_.output_metrics.empty() + !args_.named_metrics.empty();
  if (metric_forms > 1)
    throw ValueError(
        "compile: give `metrics` (applied to every output), `output_metrics` (one list per output) or metrics by "
        "output name, not several");
  for (auto& m : args_.metrics)
    if (!m) throw ValueError("compile: received a null metric");
  for (auto& list : args_.output_metrics)
    for (auto& m : list)
      if (!m) throw ValueError("compile: received a null metric");
  for (auto& [name, list] : args_.named_metrics)
    for (auto& m : list)
      if (!m) throw ValueError("compile: received a null metric for output '" + name + "'");
  bind_unprefixed();
  if (args_.loss) losses_ = {args_.loss};
  // Names must be unique per output (bind_outputs() prefixes them per output).
  auto check_unique = [](const std::vector<MetricPtr>& list) {
    std::vector<std::string> names{"loss"};
    for (auto& m : list) {
      for (auto& n : names)
        if (n == m->name())
          throw ValueError("compile: two metrics are named '" + n + "'; metric names must be unique (give one a name)");
      names.push_back(m->name());
    }
  };
  check_unique(args_.metrics);
  for (auto& list : args_.output_metrics) check_unique(list);
  for (auto& [name, list] : args_.named_metrics) check_unique(list);
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

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Index of `name` among the outputs; ValueError naming `what` and the outputs.
size_t output_index(const std::vector<std::string>& outputs, const std::string& name, const std::string& what) {
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i] == name) return i;
  throw ValueError("compile: `" + what + "` names output '" + name +
                   "', but the model's outputs are: " + join_names(outputs));
}

template <class T>
void check_count(const std::vector<T>& list, size_t n, const std::string& what,
                 const std::vector<std::string>& outputs) {
  if (!list.empty() && list.size() != n)
    throw ValueError("compile: `" + what + "` must have one " + (what == "output_metrics" ? "list" : "entry") +
                     " per model output (" + std::to_string(n) + ": " + join_names(outputs) + "). Received " +
                     std::to_string(list.size()));
}

}  // namespace

void TrainState::bind_outputs(const std::vector<std::string>& output_names) {
  const size_t n = output_names.size();
  check_count(args_.output_losses, n, "loss", output_names);
  check_count(args_.loss_weights, n, "loss_weights", output_names);
  check_count(args_.output_metrics, n, "output_metrics", output_names);
  // Losses and weights per output.
  std::vector<LossPtr> losses(n);
  if (args_.loss) losses.assign(n, args_.loss);
  if (!args_.output_losses.empty()) losses = args_.output_losses;
  for (auto& [name, l] : args_.named_losses) losses[output_index(output_names, name, "loss")] = l;
  std::vector<double> weights(n, 1.0);
  if (!args_.loss_weights.empty()) weights = args_.loss_weights;
  for (auto& [name, w] : args_.named_loss_weights) weights[output_index(output_names, name, "loss_weights")] = w;
  for (size_t o = 0; o < n; ++o)
    if (!std::isfinite(weights[o]) || weights[o] < 0)
      throw ValueError("compile: loss weights must be finite and >= 0. Received " + std::to_string(weights[o]) +
                       " for output '" + output_names[o] + "'");
  std::vector<std::vector<MetricPtr>> per_output(n);
  for (size_t o = 0; o < args_.output_metrics.size(); ++o) per_output[o] = args_.output_metrics[o];
  for (auto& [name, list] : args_.named_metrics) {
    auto& dst = per_output[output_index(output_names, name, "metrics")];
    dst.insert(dst.end(), list.begin(), list.end());
  }
  if (args_.output_metrics.empty() && args_.named_metrics.empty())
    for (auto& l : per_output) l = args_.metrics;

  bound_outputs_ = n;
  losses_ = std::move(losses);
  loss_weights_ = std::move(weights);
  output_loss_trackers_.assign(n, nullptr);
  std::vector<std::string> names{"loss"};
  if (n > 1)
    for (size_t o = 0; o < n; ++o)
      if (losses_[o]) {
        output_loss_trackers_[o] = std::make_shared<Mean>(output_names[o] + "_loss");
        names.push_back(output_names[o] + "_loss");
      }
  if (n <= 1 && args_.named_metrics.empty()) {  // one output: metrics keep their own names
    bind_unprefixed();
    return;
  }
  std::vector<MetricPtr> metrics;
  std::vector<size_t> outputs;
  for (size_t o = 0; o < n; ++o) {
    for (auto& m : per_output[o]) {
      MetricPtr mine = m;
      if (n > 1) {
        // Copies: a flat list gives every output its own (metrics are
        // stateful), and the caller's objects keep their names for
        // compile_config. "accuracy" resolves against this output's loss.
        const bool accuracy = (m->name() == "accuracy" || m->name() == "acc") && losses_[o];
        mine = accuracy ? Metric::get(m->name(), losses_[o].get()) : Metric::from_json(m->to_json(), losses_[o].get());
        mine->set_name(output_names[o] + "_" + m->name());
      }
      metrics.push_back(mine);
      outputs.push_back(o);
    }
  }
  for (auto& m : metrics) {
    for (auto& existing : names)
      if (existing == m->name())
        throw ValueError("compile: two metrics are named '" + existing + "'; metric names must be unique");
    names.push_back(m->name());
  }
  metrics_ = std::move(metrics);
  metric_outputs_ = std::move(outputs);
}

bool TrainState::has_loss() const {
  if (args_.loss) return true;
  for (auto& l : args_.output_losses)
    if (l) return true;
  return !args_.named_losses.empty();
}

Loss& TrainState::loss() {
  if (args_.loss) return *args_.loss;
  for (auto& l : losses_)
    if (l) return *l;
  for (auto& l : args_.output_losses)
    if (l) return *l;
  if (!args_.named_losses.empty()) return *args_.named_losses.front().second;
  throw StateError("the model was compiled without a loss; call compile() with a loss before fit()/evaluate()");
}

std::vector<Metric*> TrainState::all_metrics() {
  std::vector<Metric*> out{loss_tracker_.get()};
  for (auto& t : output_loss_trackers_)
    if (t) out.push_back(t.get());
  for (auto& m : metrics_) out.push_back(m.get());
  return out;
}

std::vector<std::string> TrainState::metric_names() const {
  std::vector<std::string> out{"loss"};
  for (auto& t : output_loss_trackers_)
    if (t) out.push_back(t->name());
  for (auto& m : metrics_) out.push_back(m->name());
  return out;
}

std::optional<bool> TrainState::higher_is_better(const std::string& name) const {
  std::string n = name.rfind("val_", 0) == 0 ? name.substr(4) : name;
  if (n == "loss") return false;
  for (auto& t : output_loss_trackers_)
    if (t && t->name() == n) return false;
  for (auto& m : metrics_)
    if (m->name() == n) return m->higher_is_better();
  return std::nullopt;
}

void TrainState::reset_metrics() {
  loss_tracker_->reset_state();
  for (auto& t : output_loss_trackers_)
    if (t) t->reset_state();
  for (auto& m : metrics_) m->reset_state();
}

std::map<std::string, double> TrainState::results() const {
  // Data parallel: every replica's accumulators summed (sums and counts, so
  // the result is exact), then put back to this replica's own.
  auto dist = distribution();
  if (dist && dist->num_replicas() > 1) {
    auto metrics = const_cast<TrainState*>(this)->all_metrics();
    std::vector<at::Tensor> vars, local, summed;
    for (Metric* m : metrics)
      for (auto& v : m->variables()) vars.push_back(v);
    at::NoGradGuard ng;
    for (auto& v : vars) {
      local.push_back(v.detach().clone());
      summed.push_back(v.detach().clone());
    }
    dist->all_reduce_sum(summed);
    for (size_t i = 0; i < vars.size(); ++i) vars[i].copy_(summed[i]);
    std::map<std::string, double> out;
    try {
      out = local_results();
    } catch (...) {
      for (size_t i = 0; i < vars.size(); ++i) vars[i].copy_(local[i]);
      throw;
    }
    for (size_t i = 0; i < vars.size(); ++i) vars[i].copy_(local[i]);
    return out;
  }
  return local_results();
}

std::map<std::string, double> TrainState::local_results() const {
  std::map<std::string, double> out;
  out["loss"] = loss_tracker_->result();
  for (auto& t : output_loss_trackers_)
    if (t) out[t->name()] = t->result();
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
