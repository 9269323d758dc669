// kiln tune ... --retrain_top K [--retrain_factor 1.2] [--retrain_output BASE]
//
// Deep Learning with Python's final-training recipe (18.1.1) for a tuning
// project over a `train` spec: the best K completed trials by the
// objective, each retrained from scratch with its hyperparameters on the
// training data *including* the validation part (fit.validation_split
// dropped, no validation during the retrain) for round(best_epoch x factor)
// epochs, where best_epoch is the 1-based epoch at which the trial's
// objective was best. Rank r is saved as version r under BASE (default
// <project>/retrained), a model directory like any `kiln train` output, with
// assets/retrain.json saying which trial, values and epochs it came from.
// --retrain_patch JSON (inline or a file) merges into each retrain's spec
// (RFC 7386): the search can run on a subset with a short schedule and the
// retrains on all the data with a long one.
//
// Each retrain runs `kiln train` in its own process (as trials do). A
// version that already exists is kept (a rerun after an interrupt resumes
// with the next rank); a retrain that is killed leaves only a staging
// directory under a hidden name that the next run removes.
#pragma once

#include <atomic>
#include <string>

#include "kiln/tuning/tune_spec.h"

namespace kiln::cli {

struct RetrainOptions {
  int top = 0;  // K
  double factor = 1.2;
  std::string output;  // "" = <project>/retrained
  // RFC 7386 JSON merge patch applied to the tune spec's `train` before
  // each trial's values are put in (null = none), so it may hold {"hp": ...}
  // placeholders: a longer schedule, more data than the search used. A
  // patch that sets fit.epochs fixes the epoch count for every rank instead
  // of round(best_epoch x factor); the validation keys of fit are dropped
  // from a retrain whatever the patch says.
  Json patch;
  std::string kiln_executable;                // runs `kiln train`
  const std::atomic<bool>* cancel = nullptr;  // SIGINT/SIGTERM seen
};

// ValueError unless `patch` is null or an object (with a positive integer
// fit.epochs where it sets one).
void check_retrain_patch(const Json& patch);

// ValueError unless `spec` can be retrained (it has a `train` spec).
void check_retrain_spec(const tuning::TuneSpec& spec);

// Retrains and prints a table (rank, trial, values, epochs, search score,
// test metrics). ValueError when the spec has no `train` or the project no
// completed trial; StateError when interrupted.
void retrain_top_trials(const tuning::TuneSpec& spec, const RetrainOptions& options);

}  // namespace kiln::cli
