#include "tools/kiln/retrain.h"

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <variant>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/subprocess.h"
#include "kiln/saving/model_io.h"
#include "kiln/tuning/trial_store.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

// Callbacks that do not fit a fixed-length retrain without validation
// data: stopping early defeats the epoch count, checkpoints and backups
// would write into the search's paths, and anything watching a val_ metric
// has nothing to watch.
bool keep_for_retrain(const Json& cb, std::string* why) {
  const std::string cls = cb.is_string() ? cb.get<std::string>() : cb.value("class_name", "");
  if (cls == "EarlyStopping" || cls == "ModelCheckpoint" || cls == "BackupAndRestore") {
    *why = cls;
    return false;
  }
  if (cb.is_object() && cb.contains("config") && cb["config"].is_object()) {
    const std::string monitor = cb["config"].value("monitor", "");
    if (monitor.rfind("val_", 0) == 0) {
      *why = cls + " (monitors " + monitor + ")";
      return false;
    }
  }
  return true;
}

// The trial's train spec for a fixed-length retrain on train + validation.
Json retrain_spec(const Json& train, const tuning::Trial& trial, int epochs, std::vector<std::string>* dropped) {
  std::map<std::string, Json> values;
  for (auto& [name, v] : trial.hyperparameters.values()) {
    if (name.rfind("tuner/", 0) == 0) continue;  // Hyperband's bookkeeping
    Json& slot = values[name];  // no structured binding in the lambda: C++17 (the sanitizer build) forbids it
    std::visit([&slot](const auto& x) { slot = Json(x); }, v);
  }
  Json s = tuning::substitute_hyperparameters(train, values);
  Json fit = s.value("fit", Json::object());
  for (const char* key : {"validation_split", "validation_steps", "validation_freq", "initial_epoch"}) fit.erase(key);
  fit["epochs"] = epochs;
  s["fit"] = fit;
  if (s.contains("callbacks") && s["callbacks"].is_array()) {
    Json kept = Json::array();
    for (auto& cb : s["callbacks"]) {
      std::string why;
      if (keep_for_retrain(cb, &why))
        kept.push_back(cb);
      else
        dropped->push_back(why);
    }
    s["callbacks"] = kept;
  }
  s.erase("output");
  return s;
}

// Runs `kiln train SPEC --output OUT`, passing its output through; returns
// the exit status and collects its "test_<metric>: <value>" lines.
int run_kiln_train(const std::string& kiln, const std::string& spec_path, const std::string& out,
                   const std::atomic<bool>* cancel, std::map<std::string, double>* test_metrics) {
  // The retrain uses the threads this process was given (--threads, KILN_NUM_THREADS).
  std::vector<std::string> argv = {
      kiln, "--threads", std::to_string(std::max(1, at::get_num_threads())), "train", spec_path, "--output", out};
  std::cout.flush();
  // In this process's group: a Ctrl-C reaches the retrain too.
  Subprocess child({.argv = argv, .stdout_to = Stdio::kPipe});
  const int out_fd = child.take_stdout();
  FILE* in = fdopen(out_fd, "r");
  if (!in) close(out_fd);
  char buf[8192];
  while (in && fgets(buf, sizeof buf, in)) {
    std::string line = buf;
    if (line.rfind("Saved model to ", 0) == 0) continue;  // the staging path; the version is printed after the rename
    std::cout << line << std::flush;
    if (line.rfind("test_", 0) == 0) {
      auto colon = line.find(": ");
      if (colon != std::string::npos) {
        try {
          (*test_metrics)[line.substr(5, colon - 5)] = std::stod(line.substr(colon + 2));
        } catch (const std::exception&) {
        }
      }
    }
  }
  // The read ends at the child's exit or, interrupted by SIGINT/SIGTERM, at
  // once: then the retrain is stopped too (its staging copy is removed).
  if (cancel && cancel->load()) child.signal(SIGTERM);
  if (in) fclose(in);
  return exit_code(child.wait());
}

std::string values_text(const tuning::Trial& t) {
  std::string s;
  for (auto& [name, v] : t.hyperparameters.values())
    if (name.rfind("tuner/", 0) != 0) s += (s.empty() ? "" : " ") + name + "=" + tuning::value_to_string(v);
  return s;
}

struct RetrainRow {
  int rank;
  std::string trial_id, values, path;
  int best_epoch, epochs;
  double score;
  std::map<std::string, double> test;
  bool skipped = false;
};

void print_retrain_table(const std::vector<RetrainRow>& rows, const std::string& objective, std::ostream& os) {
  std::vector<std::string> test_names;
  for (auto& r : rows)
    for (auto& [k, v] : r.test)
      if (std::find(test_names.begin(), test_names.end(), k) == test_names.end()) test_names.push_back(k);
  std::sort(test_names.begin(), test_names.end(), [](const std::string& a, const std::string& b) {
    return a == "loss" ? b != "loss" : b == "loss" ? false : a < b;  // loss first, as Keras lists them
  });
  size_t wp = 7, wt = 7, wv = 16;
  for (auto& r : rows) {
    wp = std::max(wp, r.path.size() + 2);
    wt = std::max(wt, r.trial_id.size() + 2);
    wv = std::max(wv, r.values.size() + 2);
  }
  const size_t ws = std::max<size_t>(objective.size() + 2, 10);
  os << std::left << std::setw(wp) << "model" << std::setw(wt) << "trial" << std::setw(wv) << "hyperparameters"
     << std::right << std::setw(11) << "best_epoch" << std::setw(8) << "epochs" << std::setw(ws) << objective;
  for (auto& n : test_names) os << std::setw(std::max<size_t>(n.size() + 7, 10)) << ("test_" + n);
  os << "\n" << std::fixed << std::setprecision(4);
  for (auto& r : rows) {
    os << std::left << std::setw(wp) << r.path << std::setw(wt) << r.trial_id << std::setw(wv) << r.values << std::right
       << std::setw(11) << r.best_epoch << std::setw(8) << r.epochs << std::setw(ws) << r.score;
    for (auto& n : test_names) {
      auto it = r.test.find(n);
      os << std::setw(std::max<size_t>(n.size() + 7, 10));
      if (it == r.test.end())
        os << "-";
      else
        os << it->second;
    }
    os << (r.skipped ? "   (kept from an earlier run)" : "") << "\n";
  }
  os << std::defaultfloat;
}

}  // namespace

namespace {
// The patch's fit.epochs (null when it sets none).
const Json* patch_epochs(const Json& patch) {
  if (!patch.is_object() || !patch.contains("fit") || !patch["fit"].is_object() || !patch["fit"].contains("epochs"))
    return nullptr;
  return &patch["fit"]["epochs"];
}
}  // namespace

void check_retrain_patch(const Json& patch) {
  if (patch.is_null()) return;
  if (!patch.is_object())
    throw ValueError(
        "--retrain_patch must be a JSON object merged into each retrain's train spec (RFC 7386), "
        "for example '{\"fit\": {\"epochs\": 12}}'. Received: " +
        json_excerpt(patch));
  if (const Json* e = patch_epochs(patch); e && (!e->is_number_integer() || e->get<int64_t>() < 1))
    throw ValueError("--retrain_patch: fit.epochs must be a positive integer. Received: " + json_excerpt(*e));
}

void check_retrain_spec(const tuning::TuneSpec& spec) {
  if (spec.train.is_null())
    throw ValueError(
        "--retrain_top needs a tune spec with `train` (a kiln train spec); a `command` spec's program trains and "
        "saves its own models");
}

void retrain_top_trials(const tuning::TuneSpec& spec, const RetrainOptions& o) {
  check_retrain_spec(spec);
  if (!(o.factor > 0) || !std::isfinite(o.factor))
    throw ValueError("--retrain_factor must be a positive number. Received: " + std::to_string(o.factor));
  check_retrain_patch(o.patch);
  // The template every rank fills in: the patch goes in before the values,
  // so it may say {"hp": "learning_rate"}.
  Json train = spec.train;
  if (!o.patch.is_null()) train.merge_patch(o.patch);
  const Json* fixed_epochs = patch_epochs(o.patch);
  const std::string project = spec.project_dir();
  tuning::TrialStore store(tuning::project_store_path(project), /*read_only=*/true);
  tuning::Objective objective = tuning::Objective::from_json(spec.objective);
  std::vector<tuning::Trial> trials = store.load_trials();
  std::vector<const tuning::Trial*> done;
  for (auto& t : trials)
    if (t.status == tuning::TrialStatus::kCompleted && t.score && t.best_step >= 0) done.push_back(&t);
  std::stable_sort(done.begin(), done.end(), [&](const tuning::Trial* a, const tuning::Trial* b) {
    return objective.better(*a->score, *b->score);
  });
  if (done.empty()) throw ValueError("--retrain_top: " + project + " has no completed trial to retrain");
  const int k = std::min<int>(o.top, (int)done.size());
  const std::string base = o.output.empty() ? join_path(project, "retrained") : o.output;
  make_dirs(base);
  for (const std::string& gone : remove_stale_staging(base))
    std::cout << "Removed " << gone << " (left by a killed run)\n";
  std::cout << "\nRetraining the best " << k << " of " << done.size() << " completed trials on the training data "
            << "including the validation part, for round(best epoch x " << o.factor << ") epochs, into " << base
            << "/1.." << k << "\n";

  std::vector<RetrainRow> rows;
  for (int r = 1; r <= k; ++r) {
    const tuning::Trial& t = *done[r - 1];
    RetrainRow row;
    row.rank = r;
    row.trial_id = t.trial_id;
    row.values = values_text(t);
    row.path = join_path(base, std::to_string(r));
    row.best_epoch = t.best_step + 1;  // steps are 0-based epochs; Keras counts from 1
    row.epochs = fixed_epochs ? fixed_epochs->get<int>() : std::max(1, (int)std::lround(row.best_epoch * o.factor));
    row.score = *t.score;
    const std::string info_path = join_path(row.path, "assets/retrain.json");
    if (path_exists(row.path)) {
      row.skipped = true;
      if (path_exists(info_path)) {
        Json info = read_json_file(info_path);
        row.test = info.value("test_metrics", Json::object()).get<std::map<std::string, double>>();
        row.epochs = info.value("epochs", row.epochs);  // what it was trained for, whatever this run says
        if (info.value("trial_id", "") != t.trial_id)
          std::cout << "Note: " << row.path << " holds trial " << info.value("trial_id", "?") << ", now rank " << r
                    << " is trial " << t.trial_id << "; remove " << base << " to retrain from the current ranking\n";
      }
      std::cout << "\n" << row.path << " exists: kept (trial " << t.trial_id << ")\n";
      rows.push_back(row);
      continue;
    }
    std::vector<std::string> dropped;
    Json s = retrain_spec(train, t, row.epochs, &dropped);
    std::cout << "\n[" << r << "/" << k << "] trial " << t.trial_id << " (" << row.values << "): best "
              << objective.name() << " " << format_metric(row.score) << " at epoch " << row.best_epoch
              << "; retraining for " << row.epochs << " epochs\n";
    if (!dropped.empty()) {
      std::string d;
      for (auto& x : dropped) d += (d.empty() ? "" : ", ") + x;
      std::cout << "(callbacks left out of the retrain: " << d << ")\n";
    }
    // Everything of this retrain lives in one staging directory owned by
    // this process; only the finished model is renamed into place.
    const std::string staging = staging_path(base, "retrain");
    make_dirs(staging);
    const std::string spec_path = join_path(staging, "train_spec.json");
    atomic_write_file(spec_path, s.dump(2));
    int rc;
    try {
      rc = run_kiln_train(o.kiln_executable, spec_path, join_path(staging, "out"), o.cancel, &row.test);
    } catch (const Error&) {  // `kiln train` could not be started
      remove_all(staging);
      throw;
    }
    const bool interrupted = o.cancel && o.cancel->load();
    const std::string model = join_path(staging, "out/1");
    if (rc != 0 || !path_exists(model)) {
      remove_all(staging);
      if (interrupted) throw StateError("interrupted; run the same command again to retrain the remaining ranks");
      throw StateError("retraining trial " + t.trial_id + " failed (kiln train exited with " + std::to_string(rc) +
                       "; its error is above)");
    }
    Json info{{"trial_id", t.trial_id},
              {"rank", r},
              {"objective", objective.to_json()},
              {"score", row.score},
              {"best_epoch", row.best_epoch},
              {"factor", o.factor},
              {"epochs", row.epochs},
              {"hyperparameters", Json::object()},
              {"test_metrics", row.test}};
    for (auto& [name, v] : t.hyperparameters.values()) {
      Json& slot = info["hyperparameters"][name];
      std::visit([&slot](const auto& x) { slot = x; }, v);
    }
    make_dirs(join_path(model, "assets"));
    atomic_write_file(join_path(model, "assets/retrain.json"), info.dump(2));
    atomic_write_file(join_path(model, "assets/train_spec.json"), s.dump(2));
    if (::rename(model.c_str(), row.path.c_str()) != 0) {
      const std::string err = std::strerror(errno);
      remove_all(staging);
      throw IOError("cannot publish " + row.path + ": " + err);
    }
    fsync_path(base);
    remove_all(staging);
    std::cout << "Saved model to " << row.path << "\n";
    rows.push_back(row);
    // A stop that came while the retrain finished keeps that version.
    if (interrupted) throw StateError("interrupted; run the same command again to retrain the remaining ranks");
  }
  std::cout << "\nRetrained models (" << objective.name() << ": the trial's best in the search)\n";
  print_retrain_table(rows, objective.name(), std::cout);
}

}  // namespace kiln::cli
