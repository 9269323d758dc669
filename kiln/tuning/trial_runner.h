// Runs trials as separate worker processes: `kiln tune --command "..."`,
// `--parallel N`, and the distributed worker all go through here.
//
// Each trial runs `/bin/sh -c '<command> "$@"' <args>` where <args> are the
// trial's hyperparameters as `--name=value` (appended, so they override
// flags baked into the command; Hyperband's "tuner/epochs" becomes
// `--epochs=N`, other "tuner/..." values are not passed). The child gets:
//   CLOUD_ML_HP_METRIC_FILE  <trial dir>/metrics.jsonl (hypertune's file)
//   CLOUD_ML_TRIAL_ID, KILN_TRIAL_ID   the trial id
//   KILN_TRIAL_DIR           <trials_dir>/trial_<id> (also its working files)
// and runs in its own process group, with stdout and stderr captured to
// stdout.log / stderr.log in the trial dir. Metrics come from
// `kiln-metric name=value step=N` lines on stdout and from the hypertune
// file (metric_report.h); every report goes to the TrialSource, and when it
// answers STOPPED (pruned) the whole process group is terminated (SIGTERM,
// SIGKILL after 3 s). The child dies with its parent thread
// (PR_SET_PDEATHSIG), so a killed `kiln tune` leaves no trial running.
//
// A trial ends COMPLETED when the program exits 0 after reporting the
// objective, STOPPED when pruned, FAILED otherwise (message names the exit
// status and the last stderr line).
//
// Thread safety: run_command_trials starts `parallel` threads that share
// the TrialSource (which must be thread-safe; OracleSource is).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/tuning/oracle.h"

namespace kiln::tuning {

// Where trials come from and where their reports go: the local oracle, or
// the chief over gRPC (oracle_service.h).
class TrialSource {
 public:
  virtual ~TrialSource() = default;
  // A trial, or nullopt with *next = kIdle (ask again soon) or kDone.
  virtual std::optional<Trial> next_trial(const std::string& tuner_id, Next* next) = 0;
  // One step's metrics; kStopped means stop the trial (pruned).
  virtual TrialStatus report(const std::string& trial_id, const std::map<std::string, double>& logs, int step) = 0;
  virtual void end(const std::string& trial_id, TrialStatus status, const std::string& message) = 0;
  // Keeps a running trial's lease alive (distributed); default no-op.
  virtual void heartbeat(const std::string& trial_id) {}
  // The ids of the best `n` completed trials, best first (for keeping only
  // their checkpoints); default none known.
  virtual std::vector<std::string> best_trial_ids(int n) { return {}; }
};

// The in-process source. kDone from the oracle while trials still run
// reads as kIdle (a failing one may be retried).
class OracleSource : public TrialSource {
 public:
  explicit OracleSource(std::shared_ptr<Oracle> oracle) : oracle_(std::move(oracle)) {}
  std::optional<Trial> next_trial(const std::string& tuner_id, Next* next) override;
  TrialStatus report(const std::string& trial_id, const std::map<std::string, double>& logs, int step) override;
  void end(const std::string& trial_id, TrialStatus status, const std::string& message) override;
  std::vector<std::string> best_trial_ids(int n) override;

 private:
  std::shared_ptr<Oracle> oracle_;
};

struct CommandOptions {
  std::string command;                      // shell command line; required
  std::string trials_dir;                   // trial_<id>/ directories go here; required
  std::string objective;                    // a trial that never reports it FAILS
  std::string objective_direction = "max";  // "max" | "min" (told to the program)
  int parallel = 1;                         // concurrent trial processes
  std::string tuner_id = "tuner0";
  double heartbeat_seconds = 0;  // > 0: call source.heartbeat this often while a trial runs
  double idle_poll_seconds = 0.2;
  std::string tensorboard_dir;  // "": none; else <dir>/trial_<id>/ scalars + hparams.json
  // > 0: once a trial ends, delete the `best/` checkpoint directory of every
  // ended trial outside the best `keep_checkpoints` (0: keep all).
  int keep_checkpoints = 0;
  int verbose = 1;        // 1: one line per finished trial on stdout
  void validate() const;  // ValueError naming the field
};

struct TrialOutcome {
  TrialStatus status = TrialStatus::kFailed;
  std::string message;
  bool source_lost = false;  // the source refused a report (lease lost): end() not called
};

// `--name=value` for each active hyperparameter (see the header comment).
std::vector<std::string> trial_arguments(const HyperParameters& hp);

// Runs one trial's program to its end, reporting to `source`, and calls
// source.end() (unless the source was lost). `cancel` set: the process
// group is killed and the trial left RUNNING (resumable).
TrialOutcome run_command_trial(const Trial& trial, const CommandOptions& options, TrialSource& source,
                               const std::atomic<bool>* cancel = nullptr);

// Pulls and runs trials with options.parallel threads until the source says
// kDone (or `cancel` is set). Returns the number of trials run.
int run_command_trials(TrialSource& source, const CommandOptions& options, const std::atomic<bool>* cancel = nullptr);

}  // namespace kiln::tuning
