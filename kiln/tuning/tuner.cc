#include "kiln/tuning/tuner.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/names.h"
#include "kiln/training/callbacks.h"
#include "kiln/tuning/trial_store.h"

namespace kiln::tuning {

namespace fs = std::filesystem;

namespace {

class FunctionHyperModel : public HyperModel {
 public:
  explicit FunctionHyperModel(BuildFn f) : f_(std::move(f)) {}
  ModelPtr build(HyperParameters& hp) override { return f_(hp); }

 private:
  BuildFn f_;
};

// Reports each epoch to the oracle, keeps the execution's best epoch and
// saves that epoch's model; stops the trial when the oracle says so.
class TrialReporter : public callbacks::Callback {
 public:
  TrialReporter(Oracle& oracle, std::string trial_id, std::string best_dir, bool save_best)
      : oracle_(oracle), trial_id_(std::move(trial_id)), best_dir_(std::move(best_dir)), save_best_(save_best) {}

  void on_epoch_end(int epoch, Logs& logs) override {
    const Objective& obj = oracle_.objective();
    auto it = logs.find(obj.name());
    if (it == logs.end()) {
      std::string known;
      for (auto& [k, v] : logs) known += (known.empty() ? "" : ", ") + k;
      throw ValueError("the objective \"" + obj.name() + "\" is not in the epoch logs (" + known +
                       "); pass validation data to search() or choose one of those metrics");
    }
    if (std::isfinite(it->second) && (!best_ || obj.better(it->second, *best_))) {
      best_ = it->second;
      if (save_best_) model().save(best_dir_, /*include_optimizer=*/false);
    }
    if (oracle_.update_trial(trial_id_, logs, epoch) == TrialStatus::kStopped) {
      pruned_ = true;
      model().stop_training = true;
    }
  }
  std::optional<double> best() const { return best_; }
  bool pruned() const { return pruned_; }

 private:
  Oracle& oracle_;
  std::string trial_id_, best_dir_;
  bool save_best_;
  std::optional<double> best_;
  bool pruned_ = false;
};

std::string fmt_score(double v) {
  std::ostringstream os;
  os << std::setprecision(6) << v;
  return os.str();
}

}  // namespace

Tuner::Tuner(std::shared_ptr<Oracle> oracle, std::shared_ptr<HyperModel> hypermodel, TunerOptions options)
    : oracle_(std::move(oracle)), hypermodel_(std::move(hypermodel)), options_(std::move(options)) {
  if (!oracle_) throw ValueError("Tuner needs an oracle");
  if (!hypermodel_) throw ValueError("Tuner needs a hypermodel or a build function");
  if (options_.executions_per_trial < 1)
    throw ValueError("executions_per_trial must be >= 1. Received: " + std::to_string(options_.executions_per_trial));
  if (options_.keep_checkpoints < 0)
    throw ValueError("keep_checkpoints must be >= 0. Received: " + std::to_string(options_.keep_checkpoints));
  if (options_.project_name.empty() || options_.project_name.find('/') != std::string::npos)
    throw ValueError("project_name must be a non-empty name without '/'. Received: \"" + options_.project_name + "\"");
}

Tuner::Tuner(std::shared_ptr<Oracle> oracle, BuildFn build, TunerOptions options)
    : Tuner(std::move(oracle), std::make_shared<FunctionHyperModel>(std::move(build)), std::move(options)) {}

std::string Tuner::project_dir() const { return (fs::path(options_.directory) / options_.project_name).string(); }

std::string Tuner::trial_dir(const std::string& trial_id) const {
  return (fs::path(project_dir()) / ("trial_" + trial_id)).string();
}

void Tuner::open_project() {
  if (opened_) return;
  if (options_.overwrite && fs::exists(project_dir())) remove_all(project_dir());
  make_dirs(project_dir());
  oracle_->attach_store(std::make_shared<TrialStore>((fs::path(project_dir()) / "trials.db").string()));
  // Declare the space with a first build on default values.
  HyperParameters hp = oracle_->space();
  hypermodel_->build(hp);
  oracle_->update_space(hp);
  opened_ = true;
}

void Tuner::search(const FitArgs& args) {
  open_project();
  int run = 0;
  while (true) {
    Next next;
    Trial trial = oracle_->create_trial(options_.tuner_id, &next);
    if (next == Next::kDone) break;
    if (next == Next::kIdle) {
      // One worker: nothing else runs, so nothing will free the schedule.
      if (options_.verbose) std::cout << "Search: the oracle has no trial ready and none running; stopping\n";
      break;
    }
    ++run;
    if (options_.verbose) {
      std::cout << "\nSearch: Running Trial #" << trial.trial_id << "\n";
      for (auto& [k, v] : trial.hyperparameters.values()) std::cout << "  " << k << ": " << value_to_string(v) << "\n";
    }
    run_trial(trial, args);
    if (options_.verbose) {
      Trial t = oracle_->get_trial(trial.trial_id);
      auto best = oracle_->get_best_trials(1);
      std::cout << "Trial " << t.trial_id << " " << status_name(t.status)
                << (t.score ? " [" + oracle_->objective().name() + ": " + fmt_score(*t.score) + "]" : "")
                << (best.empty() || !best[0].score ? "" : "; best so far: " + fmt_score(*best[0].score)) << "\n";
    }
  }
}

void Tuner::run_trial(const Trial& trial, const FitArgs& args) {
  const std::string dir = trial_dir(trial.trial_id);
  make_dirs(dir);
  HyperParameters hp = oracle_->space();
  for (auto& [k, v] : trial.hyperparameters.values()) hp.set(k, v);
  FitArgs a = args;
  if (hp.contains("tuner/epochs")) a.epochs = (int)hp.get_int("tuner/epochs");
  if (hp.contains("tuner/initial_epoch")) a.initial_epoch = (int)hp.get_int("tuner/initial_epoch");
  std::string parent_ckpt;
  if (hp.contains("tuner/trial_id")) {
    Trial parent = oracle_->get_trial(hp.get_string("tuner/trial_id"));
    if (!parent.checkpoint.empty() && fs::exists(parent.checkpoint)) parent_ckpt = parent.checkpoint;
  }
  std::vector<double> scores;
  bool pruned = false;
  try {
    for (int e = 0; e < options_.executions_per_trial && !pruned; ++e) {
      HyperParameters hp_e = hp;
      ModelPtr model;
      // Fresh auto-names (sequential/dense_1/...) for every build, so a
      // resumed trial's variable paths match its checkpoint's.
      clear_session();
      try {
        model = hypermodel_->build(hp_e);
      } catch (const std::exception& ex) {
        oracle_->end_trial(trial.trial_id, TrialStatus::kInvalid, std::string("build failed: ") + ex.what());
        return;
      }
      if (!model) {
        oracle_->end_trial(trial.trial_id, TrialStatus::kInvalid, "build(hp) returned no model");
        return;
      }
      // A build may declare hyperparameters the first (default) build never
      // reached, e.g. inside a conditional scope: they join the space now.
      oracle_->update_space(hp_e);
      if (!model->compiled()) throw ValueError("build(hp) must return a compiled model (call compile() in build)");
      if (!parent_ckpt.empty()) {
        // Hyperband promotion: continue from the parent's weights.
        ModelPtr parent = load_model(parent_ckpt);
        if (!model->built()) model->build_if_needed(parent->input_shapes());
        model->set_weights(parent->get_weights());
      }
      const std::string best_dir = (fs::path(dir) / (e == 0 ? "best" : "best_" + std::to_string(e))).string();
      auto reporter =
          std::make_shared<TrialReporter>(*oracle_, trial.trial_id, best_dir, options_.keep_checkpoints > 0);
      FitArgs fa = a;
      // Resume an interrupted execution from its last epoch.
      fa.callbacks.push_back(callbacks::BackupAndRestore((fs::path(dir) / ("backup_" + std::to_string(e))).string()));
      fa.callbacks.push_back(reporter);
      hypermodel_->fit(hp_e, *model, fa);
      if (reporter->best()) scores.push_back(*reporter->best());
      pruned = reporter->pruned();
      // Keep only the first execution's best model as the trial's checkpoint.
      if (e > 0 && fs::exists(best_dir)) remove_all(best_dir);
    }
  } catch (const UserError&) {
    throw;  // a mistake in the search set-up: every trial would fail the same way
  } catch (const std::exception& ex) {
    oracle_->end_trial(trial.trial_id, TrialStatus::kFailed, ex.what());
    if (options_.verbose) std::cout << "Trial " << trial.trial_id << " failed: " << ex.what() << "\n";
    return;
  }
  std::optional<double> score;
  if (!scores.empty()) {
    double s = 0;
    for (double v : scores) s += v;
    score = s / scores.size();
  }
  const std::string best_dir = (fs::path(dir) / "best").string();
  if (fs::exists(best_dir)) oracle_->set_checkpoint(trial.trial_id, best_dir);
  oracle_->end_trial(trial.trial_id, pruned ? TrialStatus::kStopped : TrialStatus::kCompleted, "", score);
  prune_checkpoints();
}

void Tuner::prune_checkpoints() {
  auto best = oracle_->get_best_trials(-1);
  std::set<std::string> keep;
  for (size_t i = 0; i < best.size() && (int)i < options_.keep_checkpoints; ++i) keep.insert(best[i].trial_id);
  // Hyperband: a trial whose promotion may still come keeps its checkpoint.
  for (auto& t : oracle_->trials()) {
    if (t.checkpoint.empty() || keep.count(t.trial_id)) continue;
    if (oracle_->kind() == "Hyperband" && !oracle_->done()) continue;
    if (fs::exists(t.checkpoint)) remove_all(t.checkpoint);
    oracle_->set_checkpoint(t.trial_id, "");
  }
}

std::vector<HyperParameters> Tuner::get_best_hyperparameters(int n) const {
  std::vector<HyperParameters> out;
  for (auto& t : oracle_->get_best_trials(n)) out.push_back(t.hyperparameters);
  return out;
}

std::vector<ModelPtr> Tuner::get_best_models(int n) const {
  std::vector<ModelPtr> out;
  for (auto& t : oracle_->get_best_trials(n)) {
    if (t.checkpoint.empty() || !fs::exists(t.checkpoint))
      throw NotFoundError("trial " + t.trial_id + " kept no checkpoint (keep_checkpoints=" +
                          std::to_string(options_.keep_checkpoints) + "); raise keep_checkpoints or retrain it");
    out.push_back(load_model(t.checkpoint));
  }
  return out;
}

void Tuner::search_space_summary(std::ostream& os) const {
  HyperParameters space = oracle_->space();
  if (space.space().empty()) {
    // Before search(): declare the space from a default build.
    hypermodel_->build(space);
  }
  os << "Search space summary\n";
  os << "Default search space size: " << space.space().size() << "\n";
  for (auto& h : space.space()) {
    os << h.name << " (" << h.kind_name() << ")\n";
    // KerasTuner prints Python dict syntax.
    std::string c = h.config().dump();
    std::string py;
    for (size_t i = 0; i < c.size(); ++i) {
      char ch = c[i];
      if (ch == '"') {
        py += '\'';
      } else if (ch == ':' || ch == ',') {
        py += ch;
        py += ' ';
      } else {
        py += ch;
      }
    }
    auto replace_all = [&](const std::string& from, const std::string& to) {
      for (size_t p = py.find(from); p != std::string::npos; p = py.find(from, p + to.size()))
        py.replace(p, from.size(), to);
    };
    replace_all("null", "None");
    replace_all("true", "True");
    replace_all("false", "False");
    os << py << "\n";
  }
}

void Tuner::results_summary(int n, std::ostream& os) const {
  os << "Results summary\n";
  os << "Results in " << project_dir() << "\n";
  os << "Showing " << n << " best trials\n";
  const Objective& obj = oracle_->objective();
  os << "Objective(name=\"" << obj.name() << "\", direction=\"" << (obj.direction() == Direction::kMax ? "max" : "min")
     << "\")\n";
  for (auto& t : oracle_->get_best_trials(n)) {
    os << "\nTrial " << t.trial_id << " summary\n";
    os << "Hyperparameters:\n";
    for (auto& [k, v] : t.hyperparameters.values()) os << k << ": " << value_to_string(v) << "\n";
    if (t.score) os << "Score: " << fmt_score(*t.score) << "\n";
    if (t.status == TrialStatus::kStopped) os << "(pruned at step " << t.best_step << ")\n";
  }
}

void Tuner::export_history(const std::string& path, const std::string& format) const {
  export_trial_history(oracle_->trials(), path, format);
}

void export_trial_history(const std::vector<Trial>& trials, const std::string& path, const std::string& format) {
  std::ostringstream out;
  if (format == "jsonl") {
    for (auto& t : trials) {
      Json j = t.to_json();
      j["hyperparameters"] = j["hyperparameters"]["values"];
      out << j.dump() << "\n";
    }
  } else if (format == "csv") {
    out << "trial_id,status,step,metric,value\n";
    for (auto& t : trials)
      for (auto& [name, points] : t.metrics)
        for (auto& p : points)
          out << t.trial_id << "," << status_name(t.status) << "," << p.step << "," << name << ","
              << std::setprecision(10) << p.value << "\n";
  } else {
    throw ValueError("export format must be \"jsonl\" or \"csv\". Received: \"" + format + "\"");
  }
  atomic_write_file(path, out.str());
}

FinalTrainingResult retrain_on_full_data(const BuildFn& build, const HyperParameters& hp, const FitArgs& args,
                                         const std::string& monitor, int patience, double factor) {
  if (args.validation_x.empty() && !args.validation_dataset && args.validation_split <= 0)
    throw ValueError("retrain_on_full_data needs validation data in the FitArgs to find the best epoch");
  auto direction = Objective::infer_direction(monitor);
  if (!direction) throw ValueError("cannot tell whether \"" + monitor + "\" should go up or down; use a known metric");
  HyperParameters h1 = hp;
  ModelPtr probe = build(h1);
  FitArgs a = args;
  callbacks::EarlyStoppingOptions es;
  es.monitor = monitor;
  es.patience = patience;
  a.callbacks.push_back(callbacks::EarlyStopping(es));
  History hist = probe->fit(a);
  auto it = hist.history.find(monitor);
  if (it == hist.history.end() || it->second.empty())
    throw ValueError("\"" + monitor + "\" is not in the training history; check the metric name");
  size_t best = 0;
  for (size_t i = 1; i < it->second.size(); ++i) {
    bool better = *direction == Direction::kMax ? it->second[i] > it->second[best] : it->second[i] < it->second[best];
    if (better) best = i;
  }
  FinalTrainingResult r;
  r.best_epoch = (int)best + 1;
  r.final_epochs = (int)std::ceil(r.best_epoch * factor);
  // Fresh model on train + validation.
  FitArgs full = args;
  full.callbacks.clear();
  if (!args.validation_x.empty()) {
    if (args.x.size() != args.validation_x.size() || args.y.size() != args.validation_y.size())
      throw ValueError("training and validation data must have the same number of inputs and targets");
    for (size_t i = 0; i < args.x.size(); ++i) full.x[i] = at::cat({args.x[i], args.validation_x[i]});
    for (size_t i = 0; i < args.y.size(); ++i) full.y[i] = at::cat({args.y[i], args.validation_y[i]});
    full.validation_x.clear();
    full.validation_y.clear();
  }
  full.validation_split = 0;
  full.validation_dataset.reset();
  full.epochs = r.final_epochs;
  HyperParameters h2 = hp;
  r.model = build(h2);
  r.model->fit(full);
  return r;
}

}  // namespace kiln::tuning
