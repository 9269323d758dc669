#include "kiln/tuning/oracles.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "kiln/core/error.h"
#include "kiln/tuning/gaussian_process.h"

namespace kiln::tuning {

// --- RandomSearch ---------------------------------------------------------------------------

Oracle::Proposal RandomSearchOracle::populate_space(const std::string&) {
  if (auto size = space_size(); size && fingerprints_.size() >= *size) return {Next::kDone, {}};
  auto v = random_values();
  // A finite space not yet exhausted but hard to hit at random: walk it.
  if (!v) v = first_unseen_grid_point();
  if (!v) return {Next::kDone, {}};
  return {Next::kTrial, *v};
}

// --- GridSearch -----------------------------------------------------------------------------

Oracle::Proposal GridSearchOracle::populate_space(const std::string&) {
  const auto& hps = space_.space();
  for (auto& h : hps)
    if (h.kind == HpKind::kFloat && !h.step)
      throw ValueError("GridSearch needs a finite space: Float '" + h.name + "' has no step; give it one");
  auto found = first_unseen_grid_point();
  if (!found) return {Next::kDone, {}};
  return {Next::kTrial, *found};
}

// --- BayesianOptimization -------------------------------------------------------------------

Oracle::Proposal BayesianOptimizationOracle::populate_space(const std::string& trial_id) {
  if (auto size = space_size(); size && fingerprints_.size() >= *size) return {Next::kDone, {}};
  const int dims = space_.encoded_size();
  const int n_init = bayes_.num_initial_points > 0 ? bayes_.num_initial_points : std::max(2, 3 * dims);
  auto completed = ended_trials();
  auto random_or_done = [&]() -> Proposal {
    auto v = random_values();
    if (!v) return Proposal{Next::kDone, {}};
    return {Next::kTrial, *v};
  };
  if ((int)completed.size() < n_init || dims == 0) return random_or_done();

  auto encode = [&](const HyperParameters& values) {
    HyperParameters hp = space_.copy_space();
    for (auto& [k, v] : values.values()) hp.set(k, v);
    return hp.encode();
  };
  const double sign = objective().direction() == Direction::kMax ? 1.0 : -1.0;
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (const Trial* t : completed) {
    X.push_back(encode(t->hyperparameters));
    y.push_back(sign * *t->score);
  }
  const double best = *std::max_element(y.begin(), y.end());
  const double worst = *std::min_element(y.begin(), y.end());
  // Constant liar: trials still running count as if they scored the worst
  // value seen, so concurrent proposals spread out instead of piling up.
  for (auto& id : order_) {
    const Trial& t = trials_.at(id);
    if (t.status == TrialStatus::kRunning) {
      X.push_back(encode(t.hyperparameters));
      y.push_back(worst);
    }
  }
  GaussianProcess gp;
  gp.fit(X, y, bayes_.alpha, rng_());

  // Candidates: random points, plus perturbations of the best trials.
  std::vector<HyperParameters> candidates;
  for (int i = 0; i < bayes_.num_candidates; ++i) {
    HyperParameters hp = space_.copy_space();
    for (auto& h : space_.space())
      if (hp.is_active(h)) hp.set(h.name, h.sample(rng_));
    candidates.push_back(std::move(hp));
  }
  std::vector<const Trial*> ranked(completed.begin(), completed.end());
  std::sort(ranked.begin(), ranked.end(),
            [&](const Trial* a, const Trial* b) { return objective().better(*a->score, *b->score); });
  std::normal_distribution<double> jitter(0.0, 0.08);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (size_t r = 0; r < std::min<size_t>(5, ranked.size()); ++r) {
    for (int m = 0; m < 100; ++m) {
      HyperParameters hp = space_.copy_space();
      for (auto& [k, v] : ranked[r]->hyperparameters.values()) hp.set(k, v);
      const size_t active = std::max<size_t>(1, hp.values().size());
      for (auto& h : space_.space()) {
        if (!hp.is_active(h)) continue;
        if (!hp.contains(h.name) || coin(rng_) < 1.0 / active + 0.1) {
          if ((h.kind == HpKind::kInt || h.kind == HpKind::kFloat) && hp.contains(h.name)) {
            double u;
            h.encode(hp.get(h.name), &u);
            u = std::clamp(u + jitter(rng_), 0.0, 1.0);
            hp.set(h.name, h.decode(&u));
          } else {
            hp.set(h.name, h.sample(rng_));
          }
        }
      }
      candidates.push_back(std::move(hp));
    }
  }
  double best_ei = -1;
  std::optional<HyperParameters> pick;
  for (auto& c : candidates) {
    HyperParameters clean = space_.copy_space();
    for (auto& [k, v] : c.values()) clean.set(k, v);
    if (seen(clean)) continue;
    double mean, sd;
    gp.predict(clean.encode(), &mean, &sd);
    double ei = GaussianProcess::expected_improvement(mean, sd, best);
    if (ei > best_ei) {
      best_ei = ei;
      pick = clean;
    }
  }
  if (!pick) return random_or_done();
  return {Next::kTrial, *pick};
}

// --- Hyperband ------------------------------------------------------------------------------

HyperbandOracle::HyperbandOracle(OracleOptions o, HyperbandOptions h) : Oracle(std::move(o)), hb_(h) {
  if (hb_.max_epochs < 1 || hb_.min_epochs < 1 || hb_.min_epochs > hb_.max_epochs)
    throw ValueError("Hyperband needs 1 <= min_epochs <= max_epochs. Received: min_epochs=" +
                     std::to_string(hb_.min_epochs) + ", max_epochs=" + std::to_string(hb_.max_epochs));
  if (hb_.factor < 2) throw ValueError("Hyperband factor must be >= 2. Received: " + std::to_string(hb_.factor));
  if (hb_.hyperband_iterations < 1)
    throw ValueError("hyperband_iterations must be >= 1. Received: " + std::to_string(hb_.hyperband_iterations));
}

int HyperbandOracle::num_brackets() const {
  double epochs = hb_.max_epochs;
  int brackets = 0;
  while (epochs >= hb_.min_epochs) {
    epochs /= hb_.factor;
    ++brackets;
  }
  return brackets;
}

int HyperbandOracle::size(int bracket, int round) const {
  const double bracket0_end = std::ceil(1.0 + std::log(hb_.max_epochs) / std::log(hb_.factor));
  const double end = bracket0_end / std::pow(hb_.factor, bracket);
  return (int)std::ceil(end * std::pow(hb_.factor, bracket - round) - 1e-9);
}

int HyperbandOracle::epochs(int bracket, int round) const {
  return (int)std::ceil(hb_.max_epochs / std::pow(hb_.factor, bracket - round) - 1e-9);
}

bool HyperbandOracle::round_done(const std::vector<Slot>& round) const {
  for (auto& s : round) {
    auto it = trials_.find(s.trial_id);
    if (it == trials_.end() || !is_final(it->second.status)) {
      // FAILED without retries left counts as done.
      if (it != trials_.end() && it->second.status == TrialStatus::kFailed &&
          std::find(requeue_.begin(), requeue_.end(), s.trial_id) == requeue_.end())
        continue;
      return false;
    }
  }
  return true;
}

bool HyperbandOracle::bracket_finished(const Bracket& b) const {
  if (b.rounds.empty() || !round_done(b.rounds.back())) return false;
  const int r = (int)b.rounds.size() - 1;
  if ((int)b.rounds.back().size() < size(b.number, r)) {
    // A short round is finished only when no more trials can join it: round 0
    // never is (it fills with new trials); later rounds when every scored
    // trial of the round before has been promoted.
    if (r == 0) return false;
    int scored = 0;
    for (auto& s : b.rounds[r - 1]) {
      const Trial& t = trials_.at(s.trial_id);
      scored += (t.status == TrialStatus::kCompleted || t.status == TrialStatus::kStopped) && t.score;
    }
    if ((int)b.rounds.back().size() < std::min(scored, size(b.number, r))) return false;
  }
  if (r + 1 == num_rounds(b.number)) return true;
  // No trial of the last round scored: nothing to promote.
  for (auto& s : b.rounds.back()) {
    const Trial& t = trials_.at(s.trial_id);
    if ((t.status == TrialStatus::kCompleted || t.status == TrialStatus::kStopped) && t.score) return false;
  }
  return true;
}

Oracle::Proposal HyperbandOracle::populate_space(const std::string& trial_id) {
  if (next_bracket_ < 0) next_bracket_ = num_brackets() - 1;
  auto tag = [&](HyperParameters hp, int bracket, int round, const std::string& parent) {
    hp.set("tuner/epochs", (int64_t)epochs(bracket, round));
    hp.set("tuner/initial_epoch", (int64_t)(round > 0 ? epochs(bracket, round - 1) : 0));
    hp.set("tuner/bracket", (int64_t)bracket);
    hp.set("tuner/round", (int64_t)round);
    if (!parent.empty()) hp.set("tuner/trial_id", parent);
    return hp;
  };
  // 1. Promotions: the top trials of a finished round move up.
  for (auto& b : brackets_) {
    for (size_t r = 1; r < b.rounds.size() + 1 && r < (size_t)num_rounds(b.number); ++r) {
      if (!round_done(b.rounds[r - 1])) break;
      if (r == b.rounds.size()) b.rounds.emplace_back();
      auto& round = b.rounds[r];
      if ((int)round.size() >= size(b.number, (int)r)) continue;
      std::vector<const Trial*> ranked;
      for (auto& s : b.rounds[r - 1]) {
        const Trial& t = trials_.at(s.trial_id);
        if ((t.status == TrialStatus::kCompleted || t.status == TrialStatus::kStopped) && t.score) ranked.push_back(&t);
      }
      std::stable_sort(ranked.begin(), ranked.end(),
                       [&](const Trial* a, const Trial* c) { return objective().better(*a->score, *c->score); });
      for (size_t i = 0; i < ranked.size() && (int)i < size(b.number, (int)r); ++i) {
        bool promoted = false;
        for (auto& s : round) promoted = promoted || s.parent_id == ranked[i]->trial_id;
        if (promoted) continue;
        round.push_back({trial_id, ranked[i]->trial_id});
        HyperParameters values = space_.copy_space();
        for (auto& [k, v] : ranked[i]->hyperparameters.values())
          if (k.rfind("tuner/", 0) != 0) values.set(k, v);
        return {Next::kTrial, tag(values, b.number, (int)r, ranked[i]->trial_id)};
      }
    }
  }
  // 2. Room in the first round of a bracket in flight.
  for (auto& b : brackets_) {
    if (b.rounds.empty()) b.rounds.emplace_back();
    if ((int)b.rounds[0].size() < size(b.number, 0)) {
      auto v = random_values();
      if (!v) return {Next::kDone, {}};
      b.rounds[0].push_back({trial_id, ""});
      return {Next::kTrial, tag(*v, b.number, 0, "")};
    }
  }
  // 3. Drop finished brackets; start the next one if any is left.
  brackets_.erase(
      std::remove_if(brackets_.begin(), brackets_.end(), [&](const Bracket& b) { return bracket_finished(b); }),
      brackets_.end());
  if (iteration_ < hb_.hyperband_iterations) {
    Bracket b;
    b.number = next_bracket_;
    b.rounds.emplace_back();
    if (--next_bracket_ < 0) {
      next_bracket_ = num_brackets() - 1;
      ++iteration_;
    }
    brackets_.push_back(b);
    auto v = random_values();
    if (!v) return {Next::kDone, {}};
    brackets_.back().rounds[0].push_back({trial_id, ""});
    return {Next::kTrial, tag(*v, b.number, 0, "")};
  }
  return brackets_.empty() ? Proposal{Next::kDone, {}} : Proposal{Next::kIdle, {}};
}

void HyperbandOracle::on_end(const Trial&) {}

Json HyperbandOracle::state() const {
  Json j = Oracle::state();
  Json bs = Json::array();
  for (auto& b : brackets_) {
    Json rounds = Json::array();
    for (auto& r : b.rounds) {
      Json slots = Json::array();
      for (auto& s : r) slots.push_back(Json{{"id", s.trial_id}, {"parent", s.parent_id}});
      rounds.push_back(slots);
    }
    bs.push_back(Json{{"bracket", b.number}, {"rounds", rounds}});
  }
  j["brackets"] = bs;
  j["iteration"] = iteration_;
  j["next_bracket"] = next_bracket_;
  return j;
}

void HyperbandOracle::set_state(const Json& j) {
  Oracle::set_state(j);
  brackets_.clear();
  if (j.contains("brackets"))
    for (auto& b : j["brackets"]) {
      Bracket br;
      br.number = b["bracket"].get<int>();
      for (auto& r : b["rounds"]) {
        br.rounds.emplace_back();
        for (auto& s : r) br.rounds.back().push_back({s["id"].get<std::string>(), s["parent"].get<std::string>()});
      }
      brackets_.push_back(br);
    }
  iteration_ = j.value("iteration", 0);
  next_bracket_ = j.value("next_bracket", -1);
}

// --- factory ----------------------------------------------------------------------------------

std::shared_ptr<Oracle> make_oracle(const std::string& kind, OracleOptions options, const Json& extra) {
  std::string k;
  for (char c : kind)
    if (c != '_') k += (char)std::tolower((unsigned char)c);
  if (k == "random" || k == "randomsearch") return std::make_shared<RandomSearchOracle>(std::move(options));
  if (k == "grid" || k == "gridsearch") return std::make_shared<GridSearchOracle>(std::move(options));
  if (k == "bayesian" || k == "bayesianoptimization") {
    BayesianOptions b;
    b.num_initial_points = extra.value("num_initial_points", 0);
    b.alpha = extra.value("alpha", 1e-4);
    return std::make_shared<BayesianOptimizationOracle>(std::move(options), b);
  }
  if (k == "hyperband") {
    HyperbandOptions h;
    h.max_epochs = extra.value("max_epochs", 100);
    h.min_epochs = extra.value("min_epochs", 1);
    h.factor = extra.value("factor", 3);
    h.hyperband_iterations = extra.value("hyperband_iterations", 1);
    return std::make_shared<HyperbandOracle>(std::move(options), h);
  }
  throw ValueError("unknown tuner \"" + kind +
                   "\"; expected \"random_search\", \"grid_search\", \"bayesian\" or \"hyperband\"");
}

}  // namespace kiln::tuning
