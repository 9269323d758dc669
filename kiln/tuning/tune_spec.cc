#include "kiln/tuning/tune_spec.h"

#include <algorithm>
#include <set>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json_limits.h"
#include "kiln/training/tfevents.h"
#include "kiln/tuning/hparams_summary.h"
#include "kiln/tuning/trial_store.h"

namespace kiln::tuning {
namespace {

const char* kSpecStateKey = "kiln_tune_spec";

template <class T>
T get(const Json& j, const char* key, const char* expected) {
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ValueError(std::string("tune spec: `") + key + "` must be " + expected +
                     ". Received: " + json_excerpt(j.at(key)));
  }
}

// `s` as one word for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

TuneSpec TuneSpec::from_json(const Json& j) {
  if (!j.is_object()) throw ValueError("a tune spec must be a JSON object. Received: " + json_excerpt(j));
  static const std::vector<std::string> known = {"project_name",
                                                 "directory",
                                                 "tuner",
                                                 "objective",
                                                 "max_trials",
                                                 "seed",
                                                 "max_retries_per_trial",
                                                 "max_consecutive_failed_trials",
                                                 "pruner",
                                                 "hyperparameters",
                                                 "command",
                                                 "train",
                                                 "parallel",
                                                 "lease_seconds",
                                                 "tensorboard",
                                                 "keep_checkpoints"};
  for (const char* k : {"model", "data", "fit"})
    if (j.contains(k))
      throw ValueError(std::string("tune spec: `") + k +
                       "` belongs inside `train` (a kiln train spec whose values may be "
                       "{\"hp\": NAME} placeholders), not at the top level");
  check_config_keys(j, known, "the tune spec");
  TuneSpec s;
  s.source = j;
  if (j.contains("project_name")) s.project_name = get<std::string>(j, "project_name", "a string");
  if (j.contains("directory")) s.directory = get<std::string>(j, "directory", "a string");
  if (j.contains("tuner")) {
    const Json& t = j["tuner"];
    if (t.is_string()) {
      s.tuner = t.get<std::string>();
    } else if (t.is_object() && t.contains("type") && t["type"].is_string()) {
      s.tuner = t["type"].get<std::string>();
      s.tuner_args = t;
    } else {
      throw ValueError("tune spec: `tuner` must be a name (\"bayesian\") or {\"type\": ..., args}. Received: " +
                       json_excerpt(t));
    }
  }
  if (j.contains("objective")) s.objective = j["objective"];
  if (j.contains("max_trials")) s.max_trials = get<int>(j, "max_trials", "an integer");
  if (j.contains("seed")) s.seed = get<uint64_t>(j, "seed", "a non-negative integer");
  if (j.contains("max_retries_per_trial")) s.max_retries_per_trial = get<int>(j, "max_retries_per_trial", "an integer");
  if (j.contains("max_consecutive_failed_trials"))
    s.max_consecutive_failed_trials = get<int>(j, "max_consecutive_failed_trials", "an integer");
  if (j.contains("pruner")) s.pruner = j["pruner"];
  if (j.contains("hyperparameters")) s.hyperparameters = j["hyperparameters"];
  if (j.contains("command")) s.command = get<std::string>(j, "command", "a string (a shell command line)");
  if (j.contains("train")) {
    const Json& t = j["train"];
    if (t.is_string()) {
      std::string path = t.get<std::string>();
      if (!path_exists(path)) throw NotFoundError("tune spec: `train`: the train spec '" + path + "' does not exist");
      s.train = read_json_file(path);
    } else if (t.is_object()) {
      s.train = t;
    } else {
      throw ValueError("tune spec: `train` must be a kiln train spec (an object) or its file name. Received: " +
                       json_excerpt(t));
    }
  }
  if (!s.command.empty() && !s.train.is_null())
    throw ValueError("tune spec: give either `command` (any program) or `train` (a kiln train spec), not both");
  if (j.contains("parallel")) s.parallel = get<int>(j, "parallel", "a positive integer");
  if (j.contains("lease_seconds")) s.lease_seconds = get<double>(j, "lease_seconds", "a number of seconds");
  if (j.contains("tensorboard")) s.tensorboard = get<bool>(j, "tensorboard", "true or false");
  if (j.contains("keep_checkpoints")) s.keep_checkpoints = get<int>(j, "keep_checkpoints", "an integer");
  if (s.keep_checkpoints < 0)
    throw ValueError("tune spec: `keep_checkpoints` must be >= 0 (0 keeps every trial's). Received: " +
                     std::to_string(s.keep_checkpoints));
  if (s.max_trials < 0)
    throw ValueError("tune spec: `max_trials` must be >= 0 (0: the tuner's own schedule). Received: " +
                     std::to_string(s.max_trials));
  if (s.parallel < 1)
    throw ValueError("tune spec: `parallel` must be a positive integer. Received: " + std::to_string(s.parallel));
  if (!(s.lease_seconds > 0))
    throw ValueError("tune spec: `lease_seconds` must be positive. Received: " + std::to_string(s.lease_seconds));
  if (s.project_name.empty() || s.project_name.find('/') != std::string::npos)
    throw ValueError("tune spec: `project_name` must be a non-empty name without '/'. Received: \"" + s.project_name +
                     "\"");
  // Validate early what would otherwise fail inside the search.
  auto oracle = s.make_oracle();
  if (!s.train.is_null()) {
    std::set<std::string> declared;
    const HyperParameters space = oracle->space();
    for (auto& h : space.space()) declared.insert(h.name);
    for (const std::string& name : hyperparameter_placeholders(s.train))
      if (!declared.count(name))
        throw ValueError("tune spec: `train` uses {\"hp\": \"" + name +
                         "\"} but `hyperparameters` declares no such name; declare it or fix the placeholder");
  }
  return s;
}

TuneSpec TuneSpec::from_file(const std::string& path) {
  if (!path_exists(path)) throw NotFoundError("tune spec '" + path + "' does not exist");
  return from_json(read_json_file(path));
}

std::string TuneSpec::project_dir() const { return join_path(directory, project_name); }

OracleOptions TuneSpec::oracle_options() const {
  OracleOptions o;
  o.objective = Objective::from_json(objective);
  o.max_trials = max_trials;
  o.seed = seed;
  o.max_retries_per_trial = max_retries_per_trial;
  o.max_consecutive_failed_trials = max_consecutive_failed_trials;
  o.pruner = Pruner::from_json(pruner);
  return o;
}

std::shared_ptr<Oracle> TuneSpec::make_oracle() const {
  auto oracle = tuning::make_oracle(tuner, oracle_options(), tuner_args);
  HyperParameters space = HyperParameters::from_json(hyperparameters);
  if (space.space().empty())
    throw ValueError(
        "tune spec: `hyperparameters` is empty; list the search space, e.g. "
        "[{\"type\": \"Int\", \"name\": \"units\", \"min_value\": 32, \"max_value\": 256}]");
  oracle->update_space(space);
  return oracle;
}

CommandOptions TuneSpec::command_options(const std::string& trials_dir) const {
  if (command.empty() && train.is_null())
    throw ValueError(
        "tune spec: `command` is missing; give the program to run per trial (it receives "
        "--name=value arguments and reports \"kiln-metric NAME=VALUE step=N\" lines) or `train` "
        "(a kiln train spec with {\"hp\": NAME} placeholders)");
  CommandOptions c;
  if (!train.is_null()) {
    if (kiln_executable.empty())
      throw ValueError(
          "tune spec: `train` specs are run by the kiln CLI (`kiln tune`); from C++, use the Tuner "
          "API with a HyperModel instead");
    c.command = shell_quote(kiln_executable) + " tune-trial " + shell_quote(join_path(trials_dir, kTrainSpecFile));
  } else {
    c.command = command;
  }
  c.trials_dir = trials_dir;
  Objective obj = Objective::from_json(objective);
  c.objective = obj.name();
  c.objective_direction = obj.direction() == Direction::kMax ? "max" : "min";
  c.parallel = parallel;
  c.keep_checkpoints = keep_checkpoints;
  if (tensorboard) c.tensorboard_dir = join_path(trials_dir, "logs");
  return c;
}

void TuneSpec::write_train_spec(const std::string& trials_dir) const {
  if (train.is_null()) return;
  make_dirs(trials_dir);
  atomic_write_file(join_path(trials_dir, kTrainSpecFile), train.dump(2));
}

namespace {
// {"hp": NAME} or {"hp": NAME, "default": V}.
bool is_placeholder(const Json& j) {
  return j.is_object() && j.contains("hp") && j["hp"].is_string() &&
         (j.size() == 1 || (j.size() == 2 && j.contains("default")));
}
}  // namespace

std::vector<std::string> hyperparameter_placeholders(const Json& spec) {
  std::vector<std::string> out;
  if (is_placeholder(spec)) {
    out.push_back(spec["hp"].get<std::string>());
  } else if (spec.is_structured()) {
    for (auto& v : spec) {
      auto inner = hyperparameter_placeholders(v);
      out.insert(out.end(), inner.begin(), inner.end());
    }
  }
  return out;
}

Json substitute_hyperparameters(const Json& spec, const std::map<std::string, Json>& values) {
  if (is_placeholder(spec)) {
    std::string name = spec["hp"].get<std::string>();
    auto it = values.find(name);
    if (it != values.end()) return it->second;
    if (spec.contains("default")) return spec["default"];
    throw ValueError("the train spec uses {\"hp\": \"" + name +
                     "\"} but the trial has no value for it (an "
                     "inactive conditional hyperparameter?); give the placeholder a \"default\"");
  }
  if (spec.is_object()) {
    Json out = Json::object();
    for (auto& [k, v] : spec.items()) out[k] = substitute_hyperparameters(v, values);
    return out;
  }
  if (spec.is_array()) {
    Json out = Json::array();
    for (auto& v : spec) out.push_back(substitute_hyperparameters(v, values));
    return out;
  }
  return spec;
}

std::shared_ptr<Oracle> open_tuning_project(const TuneSpec& spec, bool resume, bool overwrite) {
  const std::string dir = spec.project_dir();
  const std::string db = join_path(dir, "trials.db");
  if (resume && overwrite) throw ValueError("--resume and --overwrite exclude each other; choose one");
  if (path_exists(db)) {
    if (overwrite) {
      remove_all(dir);
    } else if (!resume) {
      TrialStore existing(db, /*read_only=*/true);
      if (!existing.load_trials().empty())
        throw ValueError("the tuning project '" + dir +
                         "' already holds trials; pass --resume to continue it or --overwrite to start over");
    }
  } else if (resume) {
    throw NotFoundError("nothing to resume: '" + db + "' does not exist; run without --resume to start");
  }
  make_dirs(dir);
  atomic_write_file(join_path(dir, "spec.json"), spec.source.dump(2));
  auto store = std::make_shared<TrialStore>(db);
  if (auto old = store->get_state(kSpecStateKey)) {
    // A resumed search must search the same space for the same objective.
    for (const char* key : {"hyperparameters", "objective", "tuner"})
      if (old->value(key, Json()) != spec.source.value(key, Json()))
        throw ValueError(std::string("cannot resume '") + dir + "': the spec's `" + key +
                         "` differs from the one the project was started with (see " + dir +
                         "/spec.json history in trials.db); use --overwrite or a new project_name");
  }
  store->put_state(kSpecStateKey, spec.source);
  auto oracle = spec.make_oracle();
  oracle->attach_store(store);
  if (spec.tensorboard) {
    // TensorBoard keeps the first experiment summary it sees, so one file
    // holds it; a resumed search (same space, checked above) leaves it.
    const std::string logs = join_path(dir, "logs");
    const std::string marker = join_path(logs, "hparams_experiment");
    if (!path_exists(marker)) {
      EventFileWriter w(logs);
      write_hparams_experiment(w, oracle->space(), {Objective::from_json(spec.objective).name()}, unix_seconds());
      atomic_write_file(marker, w.path() + "\n");
    }
  }
  return oracle;
}

std::string project_store_path(const std::string& project_dir) {
  std::string db = join_path(project_dir, "trials.db");
  if (!path_exists(db))
    throw NotFoundError("'" + project_dir +
                        "' is not a tuning project (no trials.db); give the directory "
                        "<directory>/<project_name> of a `kiln tune` run");
  return db;
}

std::optional<Json> stored_tune_spec(const TrialStore& store) { return store.get_state(kSpecStateKey); }

void print_tuning_summary(const std::string& project_dir, int n, std::ostream& os) {
  TrialStore store(project_store_path(project_dir), /*read_only=*/true);
  auto spec_json = store.get_state(kSpecStateKey);
  Objective objective =
      Objective::from_json(spec_json ? spec_json->value("objective", Json("val_loss")) : Json("val_loss"));
  auto trials = store.load_trials();
  std::map<std::string, int> counts;
  std::vector<const Trial*> scored;
  for (auto& t : trials) {
    ++counts[status_name(t.status)];
    if ((t.status == TrialStatus::kCompleted || t.status == TrialStatus::kStopped) && t.score) scored.push_back(&t);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [&](const Trial* a, const Trial* b) { return objective.better(*a->score, *b->score); });
  os << "Results summary\n";
  os << "Results in " << project_dir << "\n";
  os << "Showing " << std::min<size_t>(n, scored.size()) << " best trials\n";
  os << "Objective(name=\"" << objective.name() << "\", direction=\""
     << (objective.direction() == Direction::kMax ? "max" : "min") << "\")\n";
  for (int i = 0; i < (int)scored.size() && i < n; ++i) {
    const Trial& t = *scored[i];
    os << "\nTrial " << t.trial_id << " summary\nHyperparameters:\n";
    for (auto& [k, v] : t.hyperparameters.values()) os << k << ": " << value_to_string(v) << "\n";
    os << "Score: " << *t.score << "\n";
    if (t.status == TrialStatus::kStopped) os << "(pruned)\n";
  }
  os << "\nTrials:";
  for (auto& [k, c] : counts) os << " " << k << "=" << c;
  os << " (total " << trials.size() << ")\n";
}

}  // namespace kiln::tuning
