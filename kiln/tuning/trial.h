// Objective and Trial: what a search optimizes, and one configuration tried.
//
// Objective("val_accuracy") infers the direction for known metrics
// (accuracy, AUC, precision, recall... up; loss, MAE, MSE... down, with or
// without a "val_" or output-name prefix); a custom metric needs
// Objective("val_f2", Direction::kMax), else ValueError.
//
// Trial lifecycle (KerasTuner's statuses; legal transitions only, StateError
// otherwise):
//
//   RUNNING --> COMPLETED            trained to the end
//   RUNNING --> STOPPED              pruned (or stopped by the tuner)
//   RUNNING --> FAILED               an exception; retried while retries
//   FAILED  --> RUNNING              remain (max_retries_per_trial)
//   RUNNING --> INVALID              the model could not be built
//   RUNNING --> RUNNING              a resumed trial after a crash
//
// Per-epoch metrics are kept per step (epoch); the trial's score is the
// best value of the objective over its steps (best_step records where).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/tuning/hyperparameters.h"

namespace kiln::tuning {

enum class Direction { kMin, kMax };

class Objective {
 public:
  Objective(const std::string& name, Direction direction) : name_(name), direction_(direction) {}
  // Infers the direction; ValueError naming the metric and the fix otherwise.
  Objective(const std::string& name);  // NOLINT: implicit like KerasTuner's objective="val_accuracy"
  Objective(const char* name) : Objective(std::string(name)) {}  // NOLINT
  static std::optional<Direction> infer_direction(const std::string& metric);

  const std::string& name() const { return name_; }
  Direction direction() const { return direction_; }
  bool better(double a, double b) const { return direction_ == Direction::kMax ? a > b : a < b; }
  double worst() const;
  Json to_json() const;
  static Objective from_json(const Json& j);  // "val_accuracy" or {"name", "direction": "max"|"min"}

 private:
  std::string name_;
  Direction direction_;
};

enum class TrialStatus { kRunning, kCompleted, kStopped, kFailed, kInvalid };
std::string status_name(TrialStatus s);  // "RUNNING", "COMPLETED", ...
TrialStatus status_from_name(const std::string& s);
bool is_legal_transition(TrialStatus from, TrialStatus to);
bool is_final(TrialStatus s);  // COMPLETED, STOPPED, INVALID (FAILED may be retried)

struct MetricPoint {
  int step;
  double value;
};

struct Trial {
  std::string trial_id;
  HyperParameters hyperparameters;
  TrialStatus status = TrialStatus::kRunning;
  std::map<std::string, std::vector<MetricPoint>> metrics;  // name -> per step
  std::optional<double> score;
  int best_step = -1;
  int retries = 0;
  std::string message;     // failure reason
  std::string checkpoint;  // best-epoch model directory, if kept

  // StateError naming both statuses if illegal.
  void set_status(TrialStatus to);
  // Records one step's logs and updates score/best_step for `objective`.
  void record(const std::map<std::string, double>& logs, int step, const Objective& objective);
  // The objective's values by step (empty if never reported).
  std::vector<MetricPoint> objective_history(const Objective& objective) const;
  // Best value of the objective up to and including `step`.
  std::optional<double> best_until(const Objective& objective, int step) const;

  Json to_json() const;
  static Trial from_json(const Json& j);
};

}  // namespace kiln::tuning
