// Oracle: decides which hyperparameters each trial tries, records what the
// trials report and ranks them. One interface for every search algorithm
// (RandomSearch, GridSearch, BayesianOptimization, Hyperband in oracles.h);
// pruning is a separate strategy (Pruner) that any oracle consults.
//
//   auto oracle = std::make_shared<RandomSearchOracle>(OracleOptions{.objective = "val_accuracy",
//                                                                    .max_trials = 20});
//   oracle->update_space(space);                  // from a first build(hp)
//   Trial t = oracle->create_trial("worker0");    // status RUNNING, or
//   // t.trial_id empty + next == kDone (search over) / kIdle (wait, e.g. Hyperband round)
//   oracle->update_trial(t.trial_id, {{"val_accuracy", 0.8}}, /*step=*/0);   // -> kStopped if pruned
//   oracle->end_trial(t.trial_id, TrialStatus::kCompleted);
//
// Persistence: attach_store() writes every trial change through a
// TrialStore (SQLite, WAL) and loads what an earlier run left: completed
// trials count toward max_trials, trials left RUNNING by a crash are handed
// out again (same id and values) by the next create_trial calls.
//
// Duplicates: a proposal equal to an earlier trial's active values is never
// handed out; random proposals retry, and the search ends early only when a
// finite space is exhausted (KerasTuner stops after 100 collisions).
//
// Thread safety: every public method locks; several workers may call
// concurrently (parallel and distributed tuning).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kiln/tuning/hyperparameters.h"
#include "kiln/tuning/trial.h"

namespace kiln::tuning {

class TrialStore;

// Decides from per-step reports whether a running trial should stop.
class Pruner {
 public:
  virtual ~Pruner() = default;
  // `trial` has just recorded `step`; `others` are every other trial.
  virtual bool should_prune(const Trial& trial, int step, const std::vector<const Trial*>& others,
                            const Objective& objective) const = 0;
  virtual Json to_json() const = 0;
  static std::shared_ptr<Pruner> from_json(const Json& j);  // {"type": "median"|"asha", ...}
};

// Optuna's median rule: after `n_startup_trials` trials have reported past
// `step` and from `n_warmup_steps` on, prune a trial whose best value so far
// is worse than the median of the others' best values up to the same step.
class MedianPruner : public Pruner {
 public:
  explicit MedianPruner(int n_startup_trials = 5, int n_warmup_steps = 0)
      : n_startup_trials_(n_startup_trials), n_warmup_steps_(n_warmup_steps) {}
  bool should_prune(const Trial& trial, int step, const std::vector<const Trial*>& others,
                    const Objective& objective) const override;
  Json to_json() const override;

 private:
  int n_startup_trials_, n_warmup_steps_;
};

// Asynchronous successive halving (ASHA, Li et al. 2020): rungs at
// min_resource * factor^k epochs; a trial reaching a rung continues only if
// its value there is in the top 1/factor of all trials that reached it
// (at least the best one continues).
class AshaPruner : public Pruner {
 public:
  explicit AshaPruner(int min_resource = 1, int reduction_factor = 3)
      : min_resource_(min_resource), factor_(reduction_factor) {}
  bool should_prune(const Trial& trial, int step, const std::vector<const Trial*>& others,
                    const Objective& objective) const override;
  Json to_json() const override;

 private:
  int min_resource_, factor_;
};

struct OracleOptions {
  Objective objective = Objective("val_loss");
  int max_trials = 10;  // 0: no limit (Hyperband: its own schedule)
  std::optional<uint64_t> seed;
  int max_retries_per_trial = 0;
  int max_consecutive_failed_trials = 3;
  std::shared_ptr<Pruner> pruner;  // null: no pruning
};

enum class Next { kTrial, kIdle, kDone };

class Oracle {
 public:
  explicit Oracle(OracleOptions options);
  virtual ~Oracle() = default;
  virtual std::string kind() const = 0;  // "RandomSearch", ...

  // Adds hyperparameters that `hp` declares and the space lacks.
  void update_space(const HyperParameters& hp);
  HyperParameters space() const;

  // A trial to run (`next` says kTrial), or why there is none. A trial that
  // failed with retries left, or was left RUNNING by a crash, comes first.
  Trial create_trial(const std::string& tuner_id, Next* next = nullptr);
  // Records one step (epoch). Returns kStopped when the pruner (or the
  // oracle, e.g. Hyperband epochs) says to stop, else kRunning.
  TrialStatus update_trial(const std::string& trial_id, const std::map<std::string, double>& logs, int step);
  // Ends a trial. `score` overrides the best-step objective (the tuner's
  // average over executions). FAILED with retries left is retried later.
  void end_trial(const std::string& trial_id, TrialStatus status, const std::string& message = "",
                 std::optional<double> score = std::nullopt);
  // Hands a RUNNING trial out again from scratch (same id and values, its
  // metrics cleared) without counting a failure or a retry: the worker
  // running it was lost (distributed lease expired). StateError if the
  // trial is not RUNNING.
  void requeue_trial(const std::string& trial_id, const std::string& message);
  // Sets where a trial's best-epoch checkpoint lives ("" = none kept).
  void set_checkpoint(const std::string& trial_id, const std::string& dir);

  Trial get_trial(const std::string& trial_id) const;
  std::vector<Trial> trials() const;  // in creation order
  // Completed (and pruned) trials with a score, best first.
  std::vector<Trial> get_best_trials(int n) const;
  // Counts trials in each status.
  int count(TrialStatus s) const;
  bool done() const;  // no more trials will be created
  const OracleOptions& options() const { return options_; }
  const Objective& objective() const { return options_.objective; }

  // Persistence (see the header comment).
  void attach_store(std::shared_ptr<TrialStore> store);
  // The oracle's own state (subclasses add theirs), for the store and the
  // distributed chief.
  virtual Json state() const;
  virtual void set_state(const Json& j);

 protected:
  struct Proposal {
    Next next = Next::kDone;
    HyperParameters values;
  };
  // Called with mu_ held. `trial_id` is the id the trial will get.
  virtual Proposal populate_space(const std::string& trial_id) = 0;
  // Hook: a step was recorded (mu_ held); return true to stop the trial.
  virtual bool on_step(const Trial& trial, int step) { return false; }
  // Hook: a trial ended (mu_ held).
  virtual void on_end(const Trial& trial) {}

  // Helpers for subclasses (mu_ held).
  // Random active values not tried before; nullopt after `attempts` collisions.
  std::optional<HyperParameters> random_values(int attempts = 1000);
  bool seen(const HyperParameters& hp) const;  // same active values as an earlier trial
  // The first point of the (finite) grid, in declaration order with the last
  // hyperparameter fastest and conditions respected, not tried before.
  std::optional<HyperParameters> first_unseen_grid_point() const;
  // Number of distinct points of a finite space (nullopt: infinite or huge).
  std::optional<uint64_t> space_size() const;
  std::vector<const Trial*> ended_trials() const;  // completed/stopped with a score
  Trial& trial_ref(const std::string& trial_id);
  void persist(const Trial& t);

  mutable std::mutex mu_;
  OracleOptions options_;
  HyperParameters space_;
  std::mt19937_64 rng_;
  std::map<std::string, Trial> trials_;
  std::vector<std::string> order_;      // trial ids in creation order
  std::set<std::string> fingerprints_;  // active values of every trial handed out
  std::vector<std::string> requeue_;    // RUNNING after a crash / FAILED with retries
  int next_id_ = 0;
  int consecutive_failures_ = 0;
  bool exhausted_ = false;
  std::shared_ptr<TrialStore> store_;
};

}  // namespace kiln::tuning
