// The search algorithms, all behind the Oracle interface (oracle.h).
//
// RandomSearchOracle      uniform draws (log/reverse_log warped), no repeats.
// GridSearchOracle        every combination of a finite space in order
//                         (declaration order, last hyperparameter fastest),
//                         conditions respected; a continuous Float needs a step.
// BayesianOptimizationOracle
//                         Gaussian process (Matern 5/2, one length scale per
//                         encoded dimension, fitted by maximizing the log
//                         marginal likelihood with NLopt), expected
//                         improvement maximized over random candidates and
//                         local perturbations of the best ones; categorical
//                         values one-hot; running trials enter as "constant
//                         liar" observations (the worst value seen), so
//                         parallel workers get different proposals.
// HyperbandOracle         KerasTuner's bracket arithmetic: brackets
//                         s = B-1..0 with B = number of divisions of
//                         max_epochs by factor down to min_epochs; round r of
//                         bracket s runs ceil(ceil(1 + log_factor(max_epochs))
//                         / factor^s * factor^(s-r)) trials for
//                         ceil(max_epochs / factor^(s-r)) epochs; the top
//                         trials of a round are promoted and continue from
//                         their parent's checkpoint ("tuner/trial_id",
//                         "tuner/initial_epoch").
#pragma once

#include "kiln/tuning/oracle.h"

namespace kiln::tuning {

class RandomSearchOracle : public Oracle {
 public:
  explicit RandomSearchOracle(OracleOptions o) : Oracle(std::move(o)) {}
  std::string kind() const override { return "RandomSearch"; }

 protected:
  Proposal populate_space(const std::string& trial_id) override;
};

class GridSearchOracle : public Oracle {
 public:
  explicit GridSearchOracle(OracleOptions o) : Oracle(std::move(o)) {}
  std::string kind() const override { return "GridSearch"; }

 protected:
  Proposal populate_space(const std::string& trial_id) override;
};

struct BayesianOptions {
  int num_initial_points = 0;  // 0: 3 x number of encoded dimensions (KerasTuner's default), at least 2
  double alpha = 1e-4;         // minimum noise variance added to the kernel diagonal
  int num_candidates = 2000;   // random candidates per proposal
};

class BayesianOptimizationOracle : public Oracle {
 public:
  BayesianOptimizationOracle(OracleOptions o, BayesianOptions b = {}) : Oracle(std::move(o)), bayes_(b) {}
  std::string kind() const override { return "BayesianOptimization"; }

 protected:
  Proposal populate_space(const std::string& trial_id) override;

 private:
  BayesianOptions bayes_;
};

struct HyperbandOptions {
  int max_epochs = 100;
  int min_epochs = 1;
  int factor = 3;
  int hyperband_iterations = 1;
};

class HyperbandOracle : public Oracle {
 public:
  HyperbandOracle(OracleOptions o, HyperbandOptions h = {});
  std::string kind() const override { return "Hyperband"; }

  // The schedule (tests and summaries).
  int num_brackets() const;
  int num_rounds(int bracket) const { return bracket + 1; }
  int size(int bracket, int round) const;    // trials in that round
  int epochs(int bracket, int round) const;  // epochs trained by the end of that round

  Json state() const override;
  void set_state(const Json& j) override;

 protected:
  Proposal populate_space(const std::string& trial_id) override;
  void on_end(const Trial& trial) override;

 private:
  struct Slot {
    std::string trial_id;
    std::string parent_id;  // the trial it was promoted from ("" in round 0)
  };
  struct Bracket {
    int number = 0;
    std::vector<std::vector<Slot>> rounds;
  };
  bool round_done(const std::vector<Slot>& round) const;
  bool bracket_finished(const Bracket& b) const;
  HyperbandOptions hb_;
  std::vector<Bracket> brackets_;  // brackets in flight
  int iteration_ = 0;
  int next_bracket_ = -1;  // the bracket number to start next; -1: not started
};

// A tuner kind by name ("random_search"/"RandomSearch", "grid_search",
// "bayesian"/"BayesianOptimization", "hyperband") with its options from JSON
// ({"max_epochs", "factor", "num_initial_points", ...}).
std::shared_ptr<Oracle> make_oracle(const std::string& kind, OracleOptions options, const Json& extra = Json::object());

}  // namespace kiln::tuning
