// The `kiln tune SPEC.json` file and the project it runs in.
//
//   {
//     "project_name": "fmnist", "directory": "tuning",
//     "tuner": "bayesian",            // or {"type": "hyperband", "max_epochs": 9, "factor": 3}
//     "objective": "val_accuracy",    // or {"name": "score", "direction": "max"}
//     "max_trials": 20, "seed": 1,
//     "max_retries_per_trial": 0, "max_consecutive_failed_trials": 3,
//     "pruner": {"type": "median", "n_startup_trials": 5},   // optional
//     "hyperparameters": [            // docs/TUNING.md's search-space format
//       {"type": "Int", "name": "units", "min_value": 32, "max_value": 256, "step": 32},
//       {"type": "Float", "name": "learning_rate", "min_value": 1e-4, "max_value": 1e-2, "sampling": "log"}
//     ],
//     "command": "build/examples/example_tune_trial_mlp --epochs=3",
//     // or, instead of command, a kiln train spec (docs/SPEC.md) whose values
//     // may be placeholders {"hp": "units"} / {"hp": "rate", "default": 0}:
//     // "train": {"model": ..., "data": ..., "compile": ..., "fit": ...} or "train.json",
//     "parallel": 2,
//     "lease_seconds": 30,            // distributed: a silent worker loses its trial after this
//     "tensorboard": true,            // <project>/logs/trial_<id>/ scalars + hparams.json
//     "keep_checkpoints": 3           // only the best 3 trials keep trial_<id>/best/ (0: all)
//   }
//
// Project directory <directory>/<project_name>/: trials.db (TrialStore:
// every trial, its status and per-step metrics), trial_<id>/ (stdout.log,
// stderr.log, metrics.jsonl), logs/ (TensorBoard), spec.json.
// Unknown keys are a ValueError naming the key (typos never pass silently).
#pragma once

#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/tuning/oracles.h"
#include "kiln/tuning/trial_runner.h"

namespace kiln::tuning {

class TrialStore;

struct TuneSpec {
  std::string project_name = "untitled_project";
  std::string directory = "tuning";
  std::string tuner = "random_search";
  Json tuner_args = Json::object();
  Json objective = "val_loss";
  int max_trials = 10;
  std::optional<uint64_t> seed;
  int max_retries_per_trial = 0;
  int max_consecutive_failed_trials = 3;
  Json pruner;  // null: none
  Json hyperparameters = Json::array();
  std::string command;
  Json train;  // null: none; else a kiln train spec run by `kiln tune-trial`
  int parallel = 1;
  double lease_seconds = 30;
  bool tensorboard = true;
  int keep_checkpoints = 0;  // > 0: only the best k trials keep trial_<id>/best/
  Json source;               // the spec as given
  // The kiln CLI that runs `train` trials (`kiln tune-trial`); set by the CLI.
  std::string kiln_executable;

  static TuneSpec from_json(const Json& j);  // ValueError naming the key
  static TuneSpec from_file(const std::string& path);
  std::string project_dir() const;
  OracleOptions oracle_options() const;
  // A fresh oracle with the spec's space (no store attached).
  std::shared_ptr<Oracle> make_oracle() const;
  // CommandOptions for trials under `trials_dir`.
  CommandOptions command_options(const std::string& trials_dir) const;
  // Writes `train` (if any) to <trials_dir>/train_spec.json for the trials.
  void write_train_spec(const std::string& trials_dir) const;
};

constexpr const char* kTrainSpecFile = "train_spec.json";

// The names of every {"hp": NAME} (optionally with "default") in `spec`.
std::vector<std::string> hyperparameter_placeholders(const Json& spec);
// `spec` with each placeholder replaced by values[NAME], else its "default";
// ValueError when neither exists.
Json substitute_hyperparameters(const Json& spec, const std::map<std::string, Json>& values);

// Opens the project for a search: an oracle with the trial store attached.
// A project that already holds trials needs resume (continue: completed
// trials kept, interrupted ones run again) or overwrite (start over);
// otherwise ValueError saying so.
std::shared_ptr<Oracle> open_tuning_project(const TuneSpec& spec, bool resume, bool overwrite);

// <project_dir>/trials.db; NotFoundError saying what a project directory is
// when it does not exist.
std::string project_store_path(const std::string& project_dir);

// The tune spec a project was started with (as given), kept in its store;
// nullopt for a store written by a library search (no spec).
std::optional<Json> stored_tune_spec(const TrialStore& store);

// KerasTuner's results_summary for a project directory (reads trials.db
// read-only): the best `n` trials, their hyperparameters and scores, and
// the counts per status.
void print_tuning_summary(const std::string& project_dir, int n, std::ostream& os = std::cout);

}  // namespace kiln::tuning
