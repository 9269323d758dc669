// Tuner: KerasTuner's workflow on kiln models.
//
//   auto build = [](tuning::HyperParameters& hp) {
//     auto m = std::make_shared<Sequential>();
//     m->add(Input({784}));
//     m->add(std::make_shared<Dense>(hp.Int("units", 16, 64, {.step = 16}), "relu"));
//     m->add(std::make_shared<Dense>(10, "softmax"));
//     m->compile(hp.Choice("optimizer", {"rmsprop", "adam"}), "sparse_categorical_crossentropy",
//     {"accuracy"}); return m;
//   };
//   tuning::Tuner tuner(tuning::make_oracle("bayesian", {.objective = "val_accuracy", .max_trials = 20}),
//   build,
//                       {.directory = "tuning", .project_name = "mnist", .executions_per_trial = 2});
//   tuner.search_space_summary();
//   tuner.search({.x = {x}, .y = {y}, .epochs = 10, .validation_x = {xv}, .validation_y = {yv}});
//   tuner.results_summary();
//   auto best = tuner.get_best_models(1)[0];
//
// search() forwards its FitArgs to Model::fit (Hyperband trials override
// epochs/initial_epoch); a callback reports each epoch's logs to the oracle
// (pruned trials stop after the epoch); the trial's score is its best
// epoch's objective value, averaged over executions_per_trial executions.
//
// Directory <directory>/<project_name>/: trials.db (TrialStore),
// trial_<id>/best/ (the best epoch's model, kept for the best
// keep_checkpoints trials only), trial_<id>/backup_<e>/ (BackupAndRestore
// while a trial runs: a search killed at any moment and started again with
// overwrite=false loses no completed trial and resumes the interrupted one
// from its last epoch).
//
// Thread safety: one search() at a time per Tuner.
#pragma once

#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "kiln/models/model.h"
#include "kiln/tuning/oracles.h"

namespace kiln::tuning {

// Keras's HyperModel: constructor arguments are constants, build(hp)
// declares the search space. Override fit() to tune fit arguments too.
class HyperModel {
 public:
  virtual ~HyperModel() = default;
  virtual ModelPtr build(HyperParameters& hp) = 0;
  virtual History fit(HyperParameters& hp, models::Model& model, const FitArgs& args) { return model.fit(args); }
};

using BuildFn = std::function<ModelPtr(HyperParameters&)>;

struct TunerOptions {
  std::string directory = "tuning";
  std::string project_name = "untitled_project";
  bool overwrite = false;
  int executions_per_trial = 1;
  int keep_checkpoints = 3;  // best-epoch models kept for the best k trials
  std::string tuner_id = "tuner0";
  int verbose = 1;  // 0 silent, 1 a line per trial (fit's own verbose comes from FitArgs)
};

class Tuner {
 public:
  Tuner(std::shared_ptr<Oracle> oracle, std::shared_ptr<HyperModel> hypermodel, TunerOptions options = {});
  Tuner(std::shared_ptr<Oracle> oracle, BuildFn build, TunerOptions options = {});

  void search(const FitArgs& args);

  std::vector<HyperParameters> get_best_hyperparameters(int n = 1) const;
  // The best trials' best-epoch models (loaded from their checkpoints).
  std::vector<ModelPtr> get_best_models(int n = 1) const;
  void search_space_summary(std::ostream& os = std::cout) const;
  void results_summary(int n = 10, std::ostream& os = std::cout) const;
  // Per-trial, per-epoch metrics (export_trial_history below).
  void export_history(const std::string& path, const std::string& format) const;

  Oracle& oracle() { return *oracle_; }
  std::string project_dir() const;
  std::string trial_dir(const std::string& trial_id) const;

 private:
  void open_project();
  void run_trial(const Trial& trial, const FitArgs& args);
  void prune_checkpoints();

  std::shared_ptr<Oracle> oracle_;
  std::shared_ptr<HyperModel> hypermodel_;
  TunerOptions options_;
  bool opened_ = false;
};

// The final-training recipe of Deep Learning with Python (18.1.1): train
// `hp`'s model with a patient EarlyStopping on the validation data to find
// the best epoch, then retrain a fresh model on train + validation for
// factor x that many epochs.
struct FinalTrainingResult {
  int best_epoch = 0;  // 1-based, as Keras counts epochs
  int final_epochs = 0;
  ModelPtr model;
};
FinalTrainingResult retrain_on_full_data(const BuildFn& build, const HyperParameters& hp, const FitArgs& args,
                                         const std::string& monitor = "val_loss", int patience = 10,
                                         double factor = 1.2);

// Writes every trial's per-step metrics atomically to `path`: "jsonl" (one
// object per trial: id, status, score, hyperparameter values, metrics) or
// "csv" (trial_id,status,step,metric,value). ValueError for another format.
void export_trial_history(const std::vector<Trial>& trials, const std::string& path, const std::string& format);

}  // namespace kiln::tuning
