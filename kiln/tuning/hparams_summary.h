// TensorBoard's HParams tab for a search: the experiment (hyperparameters
// with their domains, the metrics) in the log root, and for each trial a
// session start (its values) and end (its status) in the trial's own run,
// next to its scalars. Messages are TensorBoard's (proto/tensorboard/plugins/
// hparams), wrapped in tensorflow.Event records with plugin_name "hparams".
//
//   logs/events.out.tfevents...            _hparams_/experiment
//   logs/trial_0007/events.out.tfevents... _hparams_/session_start_info,
//                                          val_accuracy, ..., _hparams_/session_end_info
#pragma once

#include <string>
#include <vector>

#include "kiln/tuning/hyperparameters.h"
#include "kiln/tuning/trial.h"

namespace kiln {
class EventFileWriter;
}

namespace kiln::tuning {

// Writes the experiment summary: every hyperparameter of `space` (Int/Float
// with their interval, Boolean and Choice with their values, Fixed as its one
// value) and `metrics` (scalar tags in each trial's run).
void write_hparams_experiment(EventFileWriter& w, const HyperParameters& space, const std::vector<std::string>& metrics,
                              double wall_time);

// A trial's session start: its active values; group = its trial id.
void write_hparams_session_start(EventFileWriter& w, const HyperParameters& values, const std::string& trial_id,
                                 double wall_time);

// A trial's session end. COMPLETED is success, FAILED failure; STOPPED
// (pruned) and anything else is written as unknown, since the plugin has no
// "stopped" status and a pruned trial did not fail.
void write_hparams_session_end(EventFileWriter& w, TrialStatus status, double wall_time);

}  // namespace kiln::tuning
