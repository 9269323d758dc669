// TEMPORARY: minimal definitions of the losses/metrics/optimizers base
// classes so kiln_training_test links before the `losses` branch is merged.
// Delete this file when merging `losses`.
#include <cmath>

#include "kiln/core/error.h"
#include "kiln/losses/loss.h"
#include "kiln/metrics/metric.h"
#include "kiln/optimizers/optimizer.h"

namespace kiln {

Loss::Loss(std::string name, std::string reduction)
    : name_(std::move(name)), reduction_(std::move(reduction)) {}
at::Tensor Loss::operator()(const at::Tensor& y_true, const at::Tensor& y_pred, const at::Tensor& sw) const {
  at::Tensor l = call(y_true, y_pred).to(at::kFloat);
  if (sw.defined()) l = l * sw.to(at::kFloat).reshape({-1});
  if (reduction_ == "none") return l;
  if (reduction_ == "sum") return l.sum();
  return l.sum() / (double)std::max<int64_t>(1, l.numel());
}
Json Loss::get_config() const { return Json{{"name", name_}, {"reduction", reduction_}}; }
Json Loss::to_json() const { return Json{{"class_name", class_name()}, {"config", get_config()}}; }

namespace {
struct StubMSE : Loss {
  StubMSE() : Loss("mean_squared_error") {}
  at::Tensor call(const at::Tensor& t, const at::Tensor& p) const override {
    auto d = (p - t.to(p.scalar_type())).pow(2);
    return d.dim() > 1 ? d.flatten(1).mean(1) : d;
  }
  std::string class_name() const override { return "MeanSquaredError"; }
};
struct StubSCCE : Loss {
  bool logits;
  explicit StubSCCE(bool l) : Loss("sparse_categorical_crossentropy"), logits(l) {}
  at::Tensor call(const at::Tensor& t, const at::Tensor& p) const override {
    at::Tensor lp = logits ? at::log_softmax(p, -1) : at::log(p.clamp(1e-7, 1 - 1e-7));
    return -lp.gather(-1, t.reshape({-1, 1}).to(at::kLong)).reshape({-1});
  }
  std::string class_name() const override { return "SparseCategoricalCrossentropy"; }
  Json get_config() const override {
    Json j = Loss::get_config();
    j["from_logits"] = logits;
    return j;
  }
};
}  // namespace

std::shared_ptr<Loss> Loss::get(const std::string& name) {
  if (name == "mse" || name == "mean_squared_error") return std::make_shared<StubMSE>();
  if (name == "sparse_categorical_crossentropy") return std::make_shared<StubSCCE>(false);
  throw ValueError("stub: unknown loss " + name);
}
std::shared_ptr<Loss> Loss::from_json(const Json& j) {
  if (j.value("class_name", "") == "SparseCategoricalCrossentropy")
    return std::make_shared<StubSCCE>(j["config"].value("from_logits", false));
  if (j.value("class_name", "") == "MeanSquaredError") return std::make_shared<StubMSE>();
  throw ValueError("stub: unknown loss " + j.dump());
}

Mean::Mean(std::string name) : Metric(std::move(name)) { reset_state(); }
void Mean::update_state(const at::Tensor& values, const at::Tensor&, const at::Tensor& sw) {
  at::Tensor v = values.to(at::kDouble).reshape({-1});
  at::Tensor w = sw.defined() ? sw.to(at::kDouble).reshape({-1}) : at::ones_like(v);
  total_.add_((v * w).sum());
  count_.add_(w.sum());
}
void Mean::update(double value, double weight) {
  total_.add_(value * weight);
  count_.add_(weight);
}
double Mean::result() const {
  double c = count_.item<double>();
  return c == 0 ? 0.0 : total_.item<double>() / c;
}
void Mean::reset_state() {
  total_ = at::zeros({}, at::kDouble);
  count_ = at::zeros({}, at::kDouble);
}

namespace {
struct StubAcc : Metric {
  at::Tensor total = at::zeros({}, at::kDouble), count = at::zeros({}, at::kDouble);
  StubAcc() : Metric("accuracy") {}
  void update_state(const at::Tensor& t, const at::Tensor& p, const at::Tensor& sw) override {
    at::Tensor ok = p.argmax(-1).eq(t.reshape({-1}).to(at::kLong)).to(at::kDouble);
    at::Tensor w = sw.defined() ? sw.to(at::kDouble).reshape({-1}) : at::ones_like(ok);
    total.add_((ok * w).sum());
    count.add_(w.sum());
  }
  double result() const override {
    double c = count.item<double>();
    return c == 0 ? 0 : total.item<double>() / c;
  }
  void reset_state() override {
    total.zero_();
    count.zero_();
  }
  std::vector<at::Tensor> variables() const override { return {total, count}; }
  std::string class_name() const override { return "SparseCategoricalAccuracy"; }
  bool higher_is_better() const override { return true; }
};
}  // namespace

std::shared_ptr<Metric> Metric::get(const std::string& name, const Loss*) {
  if (name == "accuracy") return std::make_shared<StubAcc>();
  throw ValueError("stub: unknown metric " + name);
}
std::shared_ptr<Metric> Metric::from_json(const Json& j, const Loss* l) { return get("accuracy", l); }

Optimizer::Optimizer(const Json& config, double default_lr, const std::string& default_name)
    : name_(config.value("name", default_name)), lr_(config.value("learning_rate", default_lr)) {}

void Optimizer::apply_gradients(const std::vector<at::Tensor>& grads, const std::vector<VariablePtr>& vars) {
  at::NoGradGuard ng;
  ++iterations_;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!grads[i].defined()) continue;
    auto& slots = slots_[vars[i]->path()];
    if (slots.empty())
      for (size_t k = 0; k < slot_names().size(); ++k) slots.push_back(at::zeros_like(vars[i]->value()));
    at::Tensor v = vars[i]->value();
    update_step(grads[i], v, slots, learning_rate(), iterations_);
  }
}
double Optimizer::learning_rate() const { return lr_; }
void Optimizer::set_learning_rate(double lr) { lr_ = lr; }
Json Optimizer::get_config() const { return Json{{"name", name_}, {"learning_rate", lr_}}; }
std::map<std::string, at::Tensor> Optimizer::state_dict() const {
  std::map<std::string, at::Tensor> out;
  for (auto& [path, slots] : slots_)
    for (size_t k = 0; k < slots.size(); ++k) out[path + "/" + slot_names()[k]] = slots[k].clone();
  out["iterations"] = at::full({}, iterations_, at::kLong);
  out["learning_rate"] = at::full({}, lr_, at::kDouble);
  return out;
}
void Optimizer::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  slots_.clear();
  for (auto& [k, v] : state) {
    if (k == "iterations")
      iterations_ = v.item<int64_t>();
    else if (k == "learning_rate")
      lr_ = v.item<double>();
  }
  auto names = slot_names();
  for (auto& [k, v] : state) {
    for (size_t s = 0; s < names.size(); ++s) {
      std::string suffix = "/" + names[s];
      if (k.size() > suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0) {
        auto& slots = slots_[k.substr(0, k.size() - suffix.size())];
        slots.resize(names.size());
        slots[s] = v.clone();
      }
    }
  }
}

namespace {
struct StubSGD : Optimizer {
  explicit StubSGD(const Json& c) : Optimizer(c, 0.01, "SGD") {}
  std::string class_name() const override { return "SGD"; }
  void update_step(const at::Tensor& g, at::Tensor& v, std::vector<at::Tensor>&, double lr,
                   int64_t) override {
    v.sub_(g * lr);
  }
};
struct StubAdam : Optimizer {
  explicit StubAdam(const Json& c) : Optimizer(c, 0.001, "adam") {}
  std::string class_name() const override { return "Adam"; }
  std::vector<std::string> slot_names() const override { return {"m", "v"}; }
  void update_step(const at::Tensor& g, at::Tensor& var, std::vector<at::Tensor>& s, double lr,
                   int64_t step) override {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-7;
    double alpha = lr * std::sqrt(1 - std::pow(b2, step)) / (1 - std::pow(b1, step));
    s[0].add_(g - s[0], 1 - b1);
    s[1].add_(g.square() - s[1], 1 - b2);
    var.sub_(s[0] * alpha / (s[1].sqrt() + eps));
  }
};
}  // namespace

std::shared_ptr<Optimizer> Optimizer::get(const std::string& name) {
  if (name == "sgd") return std::make_shared<StubSGD>(Json::object());
  if (name == "adam") return std::make_shared<StubAdam>(Json::object());
  throw ValueError("stub: unknown optimizer " + name);
}
std::shared_ptr<Optimizer> Optimizer::from_json(const Json& j) {
  std::string cn = j.value("class_name", "");
  Json c = j.value("config", Json::object());
  if (cn == "SGD") return std::make_shared<StubSGD>(c);
  if (cn == "Adam") return std::make_shared<StubAdam>(c);
  throw ValueError("stub: unknown optimizer " + j.dump());
}

}  // namespace kiln
