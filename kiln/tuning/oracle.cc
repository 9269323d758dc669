#include "kiln/tuning/oracle.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/tuning/trial_store.h"

namespace kiln::tuning {

// --- pruners ----------------------------------------------------------------------------

std::shared_ptr<Pruner> Pruner::from_json(const Json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.is_string() ? j.get<std::string>() : require(j, "type", "pruner").get<std::string>();
  Json c = j.is_object() ? j : Json::object();
  if (type == "median")
    return std::make_shared<MedianPruner>(c.value("n_startup_trials", 5), c.value("n_warmup_steps", 0));
  if (type == "asha") return std::make_shared<AshaPruner>(c.value("min_resource", 1), c.value("reduction_factor", 3));
  throw ValueError("unknown pruner \"" + type + "\"; expected \"median\" or \"asha\"");
}

namespace {
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

bool MedianPruner::should_prune(const Trial& trial, int step, const std::vector<const Trial*>& others,
                                const Objective& objective) const {
  if (step < n_warmup_steps_) return false;
  auto mine = trial.best_until(objective, step);
  if (!mine) return false;
  std::vector<double> values;
  for (const Trial* o : others) {
    // Only trials that got as far as `step` are comparable.
    auto hist = o->objective_history(objective);
    if (hist.empty() || hist.back().step < step) continue;
    if (auto b = o->best_until(objective, step)) values.push_back(*b);
  }
  if ((int)values.size() < n_startup_trials_ || values.empty()) return false;
  return objective.better(median_of(values), *mine);
}

Json MedianPruner::to_json() const {
  return Json{{"type", "median"}, {"n_startup_trials", n_startup_trials_}, {"n_warmup_steps", n_warmup_steps_}};
}

bool AshaPruner::should_prune(const Trial& trial, int step, const std::vector<const Trial*>& others,
                              const Objective& objective) const {
  // Resource = epochs done = step + 1. Only rung boundaries decide.
  const long resource = step + 1;
  long rung = min_resource_;
  while (rung < resource) rung *= factor_;
  if (rung != resource) return false;
  auto value_at = [&](const Trial& t) -> std::optional<double> {
    for (auto& p : t.objective_history(objective))
      if (p.step == step && std::isfinite(p.value)) return p.value;
    return std::nullopt;
  };
  auto mine = value_at(trial);
  if (!mine) return false;
  std::vector<double> values{*mine};
  for (const Trial* o : others)
    if (auto v = value_at(*o)) values.push_back(*v);
  // Keep the top max(1, n / factor).
  std::sort(values.begin(), values.end(), [&](double a, double b) { return objective.better(a, b); });
  const size_t keep = std::max<size_t>(1, values.size() / factor_);
  const double threshold = values[keep - 1];
  return objective.better(threshold, *mine);
}

Json AshaPruner::to_json() const {
  return Json{{"type", "asha"}, {"min_resource", min_resource_}, {"reduction_factor", factor_}};
}

// --- Oracle ---------------------------------------------------------------------------------

Oracle::Oracle(OracleOptions options) : options_(std::move(options)) {
  if (options_.max_trials < 0)
    throw ValueError("max_trials must be >= 0 (0: no limit). Received: " + std::to_string(options_.max_trials));
  if (options_.max_retries_per_trial < 0)
    throw ValueError("max_retries_per_trial must be >= 0. Received: " + std::to_string(options_.max_retries_per_trial));
  if (options_.max_consecutive_failed_trials < 1)
    throw ValueError("max_consecutive_failed_trials must be >= 1. Received: " +
                     std::to_string(options_.max_consecutive_failed_trials));
  rng_.seed(options_.seed ? *options_.seed : next_seed());
}

void Oracle::update_space(const HyperParameters& hp) {
  std::lock_guard<std::mutex> l(mu_);
  space_.merge_space(hp);
}

HyperParameters Oracle::space() const {
  std::lock_guard<std::mutex> l(mu_);
  return space_.copy_space();
}

Trial& Oracle::trial_ref(const std::string& trial_id) {
  auto it = trials_.find(trial_id);
  if (it == trials_.end()) throw NotFoundError("no trial with id '" + trial_id + "'");
  return it->second;
}

void Oracle::persist(const Trial& t) {
  if (!store_) return;
  store_->put_trial(t);
  store_->put_state("oracle", state());
}

Trial Oracle::create_trial(const std::string& tuner_id, Next* next) {
  std::lock_guard<std::mutex> l(mu_);
  auto say = [&](Next n) {
    if (next) *next = n;
  };
  // Crashed or failed trials first: same id, same values.
  while (!requeue_.empty()) {
    std::string id = requeue_.front();
    requeue_.erase(requeue_.begin());
    Trial& t = trial_ref(id);
    if (t.status == TrialStatus::kFailed) ++t.retries;
    t.set_status(TrialStatus::kRunning);
    persist(t);
    say(Next::kTrial);
    return t;
  }
  if (consecutive_failures_ >= options_.max_consecutive_failed_trials) {
    say(Next::kDone);
    return Trial{};
  }
  int started = 0;
  for (auto& id : order_)
    if (trials_.at(id).status != TrialStatus::kInvalid) ++started;
  if (options_.max_trials > 0 && started >= options_.max_trials) {
    say(Next::kDone);
    return Trial{};
  }
  const std::string id = std::to_string(next_id_);
  Proposal p = populate_space(id);
  if (p.next != Next::kTrial) {
    if (p.next == Next::kDone) exhausted_ = true;
    say(p.next);
    return Trial{};
  }
  ++next_id_;
  Trial t;
  t.trial_id = id;
  t.hyperparameters = p.values;
  t.status = TrialStatus::kRunning;
  fingerprints_.insert(p.values.fingerprint());
  trials_[id] = t;
  order_.push_back(id);
  persist(t);
  say(Next::kTrial);
  return t;
}

TrialStatus Oracle::update_trial(const std::string& trial_id, const std::map<std::string, double>& logs, int step) {
  std::lock_guard<std::mutex> l(mu_);
  Trial& t = trial_ref(trial_id);
  if (t.status != TrialStatus::kRunning)
    throw StateError("trial " + trial_id + " is " + status_name(t.status) + "; only RUNNING trials report metrics");
  t.record(logs, step, options_.objective);
  bool stop = on_step(t, step);
  if (!stop && options_.pruner) {
    std::vector<const Trial*> others;
    for (auto& [id, o] : trials_)
      if (id != trial_id) others.push_back(&o);
    stop = options_.pruner->should_prune(t, step, others, options_.objective);
  }
  persist(t);
  return stop ? TrialStatus::kStopped : TrialStatus::kRunning;
}

void Oracle::end_trial(const std::string& trial_id, TrialStatus status, const std::string& message,
                       std::optional<double> score) {
  std::lock_guard<std::mutex> l(mu_);
  Trial& t = trial_ref(trial_id);
  if (status == TrialStatus::kRunning) throw ValueError("end_trial needs a final status, not RUNNING");
  t.set_status(status);
  t.message = message;
  if (score) t.score = score;
  if (status == TrialStatus::kFailed) {
    ++consecutive_failures_;
    if (t.retries < options_.max_retries_per_trial) requeue_.push_back(trial_id);
  } else if (status == TrialStatus::kCompleted || status == TrialStatus::kStopped) {
    consecutive_failures_ = 0;
  }
  on_end(t);
  persist(t);
}

void Oracle::requeue_trial(const std::string& trial_id, const std::string& message) {
  std::lock_guard<std::mutex> l(mu_);
  Trial& t = trial_ref(trial_id);
  if (t.status != TrialStatus::kRunning)
    throw StateError("requeue_trial: trial '" + trial_id + "' is " + status_name(t.status) + ", not RUNNING");
  for (auto& id : requeue_)
    if (id == trial_id) return;
  t.metrics.clear();
  t.score.reset();
  t.best_step = -1;
  t.message = message;
  requeue_.push_back(trial_id);
  persist(t);
}

void Oracle::set_checkpoint(const std::string& trial_id, const std::string& dir) {
  std::lock_guard<std::mutex> l(mu_);
  Trial& t = trial_ref(trial_id);
  t.checkpoint = dir;
  persist(t);
}

Trial Oracle::get_trial(const std::string& trial_id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = trials_.find(trial_id);
  if (it == trials_.end()) throw NotFoundError("no trial with id '" + trial_id + "'");
  return it->second;
}

std::vector<Trial> Oracle::trials() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Trial> out;
  for (auto& id : order_) out.push_back(trials_.at(id));
  return out;
}

std::vector<Trial> Oracle::get_best_trials(int n) const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Trial> done;
  for (auto& id : order_) {
    const Trial& t = trials_.at(id);
    if ((t.status == TrialStatus::kCompleted || t.status == TrialStatus::kStopped) && t.score) done.push_back(t);
  }
  std::stable_sort(done.begin(), done.end(),
                   [&](const Trial& a, const Trial& b) { return options_.objective.better(*a.score, *b.score); });
  if (n >= 0 && (int)done.size() > n) done.resize(n);
  return done;
}

int Oracle::count(TrialStatus s) const {
  std::lock_guard<std::mutex> l(mu_);
  int n = 0;
  for (auto& [id, t] : trials_) n += t.status == s;
  return n;
}

bool Oracle::done() const {
  std::lock_guard<std::mutex> l(mu_);
  if (!requeue_.empty()) return false;
  if (exhausted_ || consecutive_failures_ >= options_.max_consecutive_failed_trials) return true;
  int started = 0;
  for (auto& [id, t] : trials_) started += t.status != TrialStatus::kInvalid;
  return options_.max_trials > 0 && started >= options_.max_trials;
}

std::optional<HyperParameters> Oracle::random_values(int attempts) {
  for (int i = 0; i < attempts; ++i) {
    HyperParameters hp = space_.copy_space();
    // Declaration order makes parents come before their children.
    for (auto& h : space_.space())
      if (hp.is_active(h)) hp.set(h.name, h.sample(rng_));
    // Drop values of inactive hyperparameters.
    HyperParameters clean = space_.copy_space();
    for (auto& [k, v] : hp.values()) clean.set(k, v);
    if (!seen(clean)) return clean;
  }
  return std::nullopt;
}

bool Oracle::seen(const HyperParameters& hp) const { return fingerprints_.count(hp.fingerprint()) > 0; }

std::optional<HyperParameters> Oracle::first_unseen_grid_point() const {
  const auto& hps = space_.space();
  std::optional<HyperParameters> found;
  std::function<bool(size_t, HyperParameters&)> walk = [&](size_t i, HyperParameters& hp) -> bool {
    if (i == hps.size()) {
      HyperParameters clean = space_.copy_space();  // active values only
      for (auto& [k, x] : hp.values()) clean.set(k, x);
      if (seen(clean)) return false;
      found = clean;
      return true;
    }
    if (!hp.is_active(hps[i])) return walk(i + 1, hp);
    for (auto& x : hps[i].grid()) {
      hp.set(hps[i].name, x);
      if (walk(i + 1, hp)) return true;
    }
    return false;
  };
  HyperParameters hp = space_.copy_space();
  walk(0, hp);
  return found;
}

std::optional<uint64_t> Oracle::space_size() const {
  // Enumerates the active combinations of a finite space (conditions make
  // the count a sum over branches); gives up above ~1e6.
  const auto& hps = space_.space();
  for (auto& h : hps)
    if (h.kind == HpKind::kFloat && !h.step) return std::nullopt;
  uint64_t total = 0;
  std::function<bool(size_t, HyperParameters&)> walk = [&](size_t i, HyperParameters& hp) -> bool {
    if (i == hps.size()) return ++total <= 1000000;
    if (!hp.is_active(hps[i])) return walk(i + 1, hp);
    for (auto& v : hps[i].grid()) {
      hp.set(hps[i].name, v);
      if (!walk(i + 1, hp)) return false;
    }
    return true;
  };
  HyperParameters hp = space_.copy_space();
  if (!walk(0, hp)) return std::nullopt;
  return total;
}

std::vector<const Trial*> Oracle::ended_trials() const {
  std::vector<const Trial*> out;
  for (auto& id : order_) {
    const Trial& t = trials_.at(id);
    if ((t.status == TrialStatus::kCompleted || t.status == TrialStatus::kStopped) && t.score) out.push_back(&t);
  }
  return out;
}

Json Oracle::state() const {
  return Json{{"kind", kind()},
              {"objective", options_.objective.to_json()},
              {"space", space_.to_json()["space"]},
              {"next_id", next_id_},
              {"consecutive_failures", consecutive_failures_}};
}

void Oracle::set_state(const Json& j) {
  if (j.contains("space")) space_.merge_space(HyperParameters::from_json(j["space"]));
  next_id_ = std::max(next_id_, j.value("next_id", 0));
  consecutive_failures_ = j.value("consecutive_failures", 0);
}

void Oracle::attach_store(std::shared_ptr<TrialStore> store) {
  std::lock_guard<std::mutex> l(mu_);
  store_ = std::move(store);
  if (auto s = store_->get_state("oracle")) {
    const std::string k = s->value("kind", "");
    if (!k.empty() && k != kind())
      throw ValueError("the tuning directory holds a " + k + " search, not " + kind() +
                       "; use another project_name or overwrite=true");
    set_state(*s);
  }
  for (auto& t : store_->load_trials()) {
    fingerprints_.insert(t.hyperparameters.fingerprint());
    if (!trials_.count(t.trial_id)) order_.push_back(t.trial_id);
    // A trial RUNNING in the store was interrupted: hand it out again.
    if (t.status == TrialStatus::kRunning ||
        (t.status == TrialStatus::kFailed && t.retries < options_.max_retries_per_trial))
      requeue_.push_back(t.trial_id);
    try {
      next_id_ = std::max(next_id_, std::stoi(t.trial_id) + 1);
    } catch (...) {
    }
    trials_[t.trial_id] = std::move(t);
  }
  for (auto& id : order_) on_end(trials_.at(id));  // let subclasses rebuild derived state
}

}  // namespace kiln::tuning
