#include "kiln/tuning/trial.h"

#include <cmath>
#include <limits>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"

namespace kiln::tuning {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::optional<Direction> Objective::infer_direction(const std::string& metric) {
  static const char* kMax[] = {"accuracy",
                               "acc",
                               "auc",
                               "precision",
                               "recall",
                               "top_k_categorical_accuracy",
                               "sparse_top_k_categorical_accuracy",
                               "f1_score",
                               "fbeta_score",
                               "r2_score",
                               "true_positives",
                               "true_negatives",
                               "iou",
                               "mean_iou"};
  static const char* kMin[] = {"loss",
                               "mae",
                               "mse",
                               "mape",
                               "msle",
                               "rmse",
                               "mean_absolute_error",
                               "mean_squared_error",
                               "root_mean_squared_error",
                               "mean_absolute_percentage_error",
                               "mean_squared_logarithmic_error",
                               "crossentropy",
                               "hinge",
                               "squared_hinge",
                               "kl_divergence",
                               "poisson",
                               "logcosh",
                               "false_positives",
                               "false_negatives"};
  std::string m = metric.rfind("val_", 0) == 0 ? metric.substr(4) : metric;
  // Exact names first, then output-prefixed names ("head_accuracy").
  for (auto k : kMax)
    if (m == k) return Direction::kMax;
  for (auto k : kMin)
    if (m == k) return Direction::kMin;
  for (auto k : kMax)
    if (ends_with(m, std::string("_") + k)) return Direction::kMax;
  for (auto k : kMin)
    if (ends_with(m, std::string("_") + k)) return Direction::kMin;
  return std::nullopt;
}

Objective::Objective(const std::string& name) : name_(name), direction_(Direction::kMin) {
  if (name.empty()) throw ValueError("an objective needs a metric name, e.g. \"val_accuracy\"");
  auto d = infer_direction(name);
  if (!d)
    throw ValueError("cannot infer the direction of objective \"" + name + "\"; give it explicitly: Objective(\"" +
                     name + "\", Direction::kMax) or {\"name\": \"" + name + "\", \"direction\": \"max\"}");
  direction_ = *d;
}

double Objective::worst() const {
  return direction_ == Direction::kMax ? -std::numeric_limits<double>::infinity()
                                       : std::numeric_limits<double>::infinity();
}

Json Objective::to_json() const {
  return Json{{"name", name_}, {"direction", direction_ == Direction::kMax ? "max" : "min"}};
}

Objective Objective::from_json(const Json& j) {
  if (j.is_string()) return Objective(j.get<std::string>());
  if (!j.is_object())
    throw ValueError("objective must be a metric name or {\"name\", \"direction\"}. Received: " + json_excerpt(j));
  std::string name = require(j, "name", "objective").get<std::string>();
  if (!j.contains("direction") || j["direction"].is_null()) return Objective(name);
  std::string d = j["direction"].get<std::string>();
  if (d != "max" && d != "min")
    throw ValueError("objective direction must be \"max\" or \"min\". Received: \"" + d + "\"");
  return Objective(name, d == "max" ? Direction::kMax : Direction::kMin);
}

std::string status_name(TrialStatus s) {
  switch (s) {
    case TrialStatus::kRunning:
      return "RUNNING";
    case TrialStatus::kCompleted:
      return "COMPLETED";
    case TrialStatus::kStopped:
      return "STOPPED";
    case TrialStatus::kFailed:
      return "FAILED";
    case TrialStatus::kInvalid:
      return "INVALID";
  }
  return "RUNNING";
}

TrialStatus status_from_name(const std::string& s) {
  for (auto t : {TrialStatus::kRunning, TrialStatus::kCompleted, TrialStatus::kStopped, TrialStatus::kFailed,
                 TrialStatus::kInvalid})
    if (status_name(t) == s) return t;
  throw FormatError("unknown trial status \"" + s + "\"");
}

bool is_legal_transition(TrialStatus from, TrialStatus to) {
  switch (from) {
    case TrialStatus::kRunning:
      return true;  // to any status, RUNNING included (resume)
    case TrialStatus::kFailed:
      return to == TrialStatus::kRunning;  // retry
    default:
      return false;  // COMPLETED, STOPPED, INVALID are final
  }
}

bool is_final(TrialStatus s) {
  return s == TrialStatus::kCompleted || s == TrialStatus::kStopped || s == TrialStatus::kInvalid;
}

void Trial::set_status(TrialStatus to) {
  if (!is_legal_transition(status, to))
    throw StateError("trial " + trial_id + ": illegal transition " + status_name(status) + " -> " + status_name(to));
  status = to;
}

void Trial::record(const std::map<std::string, double>& logs, int step, const Objective& objective) {
  for (auto& [name, value] : logs) {
    auto& points = metrics[name];
    if (!points.empty() && points.back().step == step)
      points.back().value = value;
    else
      points.push_back({step, value});
  }
  auto it = logs.find(objective.name());
  if (it != logs.end() && std::isfinite(it->second) && (!score || objective.better(it->second, *score))) {
    score = it->second;
    best_step = step;
  }
}

std::vector<MetricPoint> Trial::objective_history(const Objective& objective) const {
  auto it = metrics.find(objective.name());
  return it == metrics.end() ? std::vector<MetricPoint>{} : it->second;
}

std::optional<double> Trial::best_until(const Objective& objective, int step) const {
  std::optional<double> best;
  for (auto& p : objective_history(objective))
    if (p.step <= step && std::isfinite(p.value) && (!best || objective.better(p.value, *best))) best = p.value;
  return best;
}

Json Trial::to_json() const {
  Json m = Json::object();
  for (auto& [name, points] : metrics) {
    Json arr = Json::array();
    for (auto& p : points) arr.push_back(Json::array({p.step, p.value}));
    m[name] = arr;
  }
  return Json{{"trial_id", trial_id},
              {"hyperparameters", hyperparameters.to_json()},
              {"status", status_name(status)},
              {"metrics", m},
              {"score", score ? Json(*score) : Json(nullptr)},
              {"best_step", best_step},
              {"retries", retries},
              {"message", message},
              {"checkpoint", checkpoint}};
}

Trial Trial::from_json(const Json& j) {
  Trial t;
  t.trial_id = require(j, "trial_id", "trial").get<std::string>();
  t.hyperparameters = HyperParameters::from_json(require(j, "hyperparameters", "trial"));
  t.status = status_from_name(require(j, "status", "trial").get<std::string>());
  if (j.contains("metrics"))
    for (auto& [name, arr] : j["metrics"].items())
      for (auto& p : arr) t.metrics[name].push_back({p[0].get<int>(), p[1].get<double>()});
  if (j.contains("score") && !j["score"].is_null()) t.score = j["score"].get<double>();
  t.best_step = j.value("best_step", -1);
  t.retries = j.value("retries", 0);
  t.message = j.value("message", "");
  t.checkpoint = j.value("checkpoint", "");
  return t;
}

}  // namespace kiln::tuning
