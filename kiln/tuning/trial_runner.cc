#include "kiln/tuning/trial_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/subprocess.h"
#include "kiln/core/thread_pool.h"
#include "kiln/training/tfevents.h"
#include "kiln/tuning/hparams_summary.h"
#include "kiln/tuning/metric_report.h"

namespace kiln::tuning {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::mutex& print_mutex() {
  static std::mutex m;
  return m;
}

std::string arg_value(const Value& v) {
  if (auto d = std::get_if<double>(&v)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", *d);
    return buf;
  }
  if (auto b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return value_to_string(v);
}

std::string last_line_of(const std::string& path) {
  std::ifstream f(path);
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  if (last.size() > 300) last = last.substr(0, 300) + "...";
  return last;
}

}  // namespace

// --- OracleSource --------------------------------------------------------------------------------

std::optional<Trial> OracleSource::next_trial(const std::string& tuner_id, Next* next) {
  Next n = Next::kDone;
  Trial t = oracle_->create_trial(tuner_id, &n);
  if (n == Next::kTrial) {
    *next = n;
    return t;
  }
  if (n == Next::kDone && oracle_->count(TrialStatus::kRunning) > 0) n = Next::kIdle;
  *next = n;
  return std::nullopt;
}

std::vector<std::string> OracleSource::best_trial_ids(int n) {
  std::vector<std::string> ids;
  for (auto& t : oracle_->get_best_trials(n)) ids.push_back(t.trial_id);
  return ids;
}

TrialStatus OracleSource::report(const std::string& trial_id, const std::map<std::string, double>& logs, int step) {
  return oracle_->update_trial(trial_id, logs, step);
}

void OracleSource::end(const std::string& trial_id, TrialStatus status, const std::string& message) {
  oracle_->end_trial(trial_id, status, message);
}

// --- options -------------------------------------------------------------------------------------

void CommandOptions::validate() const {
  if (command.empty())
    throw ValueError("a command trial needs `command`, the program to run per trial. Received: an empty command");
  if (trials_dir.empty()) throw ValueError("a command trial needs `trials_dir`. Received: an empty path");
  if (parallel < 1)
    throw ValueError("`parallel` must be a positive integer (trials run at once). Received: parallel=" +
                     std::to_string(parallel));
  if (heartbeat_seconds < 0)
    throw ValueError("`heartbeat_seconds` must be >= 0. Received: " + std::to_string(heartbeat_seconds));
}

std::vector<std::string> trial_arguments(const HyperParameters& hp) {
  std::vector<std::string> args;
  for (auto& [name, v] : hp.values()) {
    if (name.rfind("tuner/", 0) == 0) {
      if (name == "tuner/epochs") args.push_back("--epochs=" + arg_value(v));
      continue;
    }
    args.push_back("--" + name + "=" + arg_value(v));
  }
  return args;
}

// --- one trial -----------------------------------------------------------------------------------

TrialOutcome run_command_trial(const Trial& trial, const CommandOptions& o, TrialSource& source,
                               const std::atomic<bool>* cancel) {
  auto started = Clock::now();
  const std::string dir = join_path(o.trials_dir, "trial_" + trial.trial_id);
  make_dirs(dir);
  const std::string metrics_file = join_path(dir, "metrics.jsonl");
  const std::string stdout_path = join_path(dir, "stdout.log");
  const std::string stderr_path = join_path(dir, "stderr.log");
  // A rerun (retry or resume) starts with fresh metrics.
  std::remove(metrics_file.c_str());

  std::vector<std::string> argv = {"/bin/sh", "-c", o.command + " \"$@\"", "kiln-trial"};
  for (auto& a : trial_arguments(trial.hyperparameters)) argv.push_back(a);
  // The trial sees none of these from kiln's environment, only its own.
  SubprocessOptions so{
      .argv = argv,
      .env_remove = {"CLOUD_ML_HP_METRIC_FILE", "CLOUD_ML_TRIAL_ID", "KILN_TRIAL_ID", "KILN_TRIAL_DIR",
                     "KILN_OBJECTIVE", "KILN_OBJECTIVE_DIRECTION", "KILN_PARENT_TRIAL_DIR", "KILN_INITIAL_EPOCH"}};
  std::vector<std::string>& env = so.env_set;
  env.push_back(std::string(kHypertuneFileEnv) + "=" + metrics_file);
  env.push_back("CLOUD_ML_TRIAL_ID=" + trial.trial_id);
  env.push_back("KILN_TRIAL_ID=" + trial.trial_id);
  env.push_back("KILN_TRIAL_DIR=" + dir);
  if (!o.objective.empty()) {
    env.push_back("KILN_OBJECTIVE=" + o.objective);
    env.push_back("KILN_OBJECTIVE_DIRECTION=" + o.objective_direction);
  }
  // Hyperband promotion: the program may continue from its parent trial's
  // checkpoint (what it saved in its own $KILN_TRIAL_DIR) at this epoch.
  const HyperParameters& hp = trial.hyperparameters;
  if (hp.contains("tuner/trial_id") && hp.contains("tuner/initial_epoch")) {
    std::string parent_dir = join_path(o.trials_dir, "trial_" + hp.get_string("tuner/trial_id"));
    if (path_exists(parent_dir)) {
      env.push_back("KILN_PARENT_TRIAL_DIR=" + parent_dir);
      env.push_back("KILN_INITIAL_EPOCH=" + std::to_string(hp.get_int("tuner/initial_epoch")));
    }
  }

  std::unique_ptr<EventFileWriter> events;
  if (!o.tensorboard_dir.empty()) {
    std::string tb = join_path(o.tensorboard_dir, "trial_" + trial.trial_id);
    events = std::make_unique<EventFileWriter>(tb);
    Json hp = Json::object();
    for (auto& [k, v] : trial.hyperparameters.values()) hp[k] = value_to_json(v);
    atomic_write_file(join_path(tb, "hparams.json"), Json{{"trial_id", trial.trial_id}, {"hparams", hp}}.dump(2));
    write_hparams_session_start(*events, trial.hyperparameters, trial.trial_id, unix_seconds());
  }

  std::ofstream out_log(stdout_path, std::ios::app);
  std::ofstream err_note(stderr_path, std::ios::app);  // kiln's own notes about the trial
  {
    std::ostringstream cmdline;
    for (size_t i = 4; i < argv.size(); ++i) cmdline << " " << argv[i];
    err_note << "[kiln] trial " << trial.trial_id << ": " << o.command << cmdline.str() << std::endl;
  }
  // The trial starts with SIGPIPE at its default whatever kiln inherited
  // (Subprocess's rule): if the worker dies, a program still writing its
  // metrics ends on the broken pipe instead of running on and finishing a
  // trial the chief has handed to another worker. (PDEATHSIG reaches only
  // the shell, not what it starts.)
  so.stdin_from = Stdio::kNull;
  so.stdout_to = Stdio::kPipe;
  so.stderr_to = Stdio::kFile;
  so.stderr_path = stderr_path;
  so.new_process_group = true;
  Subprocess child(so);
  const int child_out = child.take_stdout();

  HypertuneFileReader hypertune(metrics_file);
  StepCounter steps;
  bool objective_seen = false, pruned = false, lost = false, cancelled = false;
  std::string lost_message;
  Clock::time_point kill_sent{};
  auto last_beat = Clock::now();

  auto kill_group = [&](int sig) { child.signal(sig); };
  auto handle = [&](const MetricReport& r) {
    if (pruned || lost) return;
    int step = steps.assign(r);
    if (r.metrics.count(o.objective)) objective_seen = true;
    if (events) {
      for (auto& [k, v] : r.metrics) events->add_scalar(k, v, step);
      events->flush();
    }
    try {
      if (source.report(trial.trial_id, r.metrics, step) == TrialStatus::kStopped) {
        pruned = true;
        err_note << "[kiln] trial " << trial.trial_id << " pruned after step " << step << std::endl;
        kill_group(SIGTERM);
        kill_sent = Clock::now();
      }
    } catch (const std::exception& e) {
      lost = true;
      lost_message = e.what();
      err_note << "[kiln] report refused: " << lost_message << "; stopping the trial" << std::endl;
      kill_group(SIGKILL);
    }
    last_beat = Clock::now();
  };
  auto handle_line = [&](const std::string& line, bool stdout_line) {
    try {
      auto r = stdout_line ? parse_metric_line(line) : parse_hypertune_line(line);
      if (r) handle(*r);
    } catch (const FormatError& e) {
      err_note << "[kiln] ignored: " << e.what() << std::endl;
    }
  };
  auto poll_file = [&] {
    for (auto& line : hypertune.poll()) handle_line(line, false);
  };

  std::string pending;
  bool eof = false;
  int wstatus = 0;
  bool exited = false;
  while (!exited) {
    if (!eof) {
      pollfd p{child_out, POLLIN, 0};
      int rc = ::poll(&p, 1, 100);
      if (rc > 0) {
        char buf[4096];
        ssize_t n = read(child_out, buf, sizeof buf);
        if (n <= 0) {
          eof = true;
        } else {
          out_log.write(buf, n);
          out_log.flush();
          pending.append(buf, n);
          size_t start = 0, nl;
          while ((nl = pending.find('\n', start)) != std::string::npos) {
            handle_line(pending.substr(start, nl - start), true);
            start = nl + 1;
          }
          pending.erase(0, start);
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    poll_file();
    // What the program left behind in its group is killed as it is reaped.
    if (const std::optional<int> status = child.wait_for(std::chrono::milliseconds(0))) {
      wstatus = *status;
      exited = true;
      // Drain what is left in the pipe.
      char buf[4096];
      ssize_t n;
      if (!eof) {
        int fl = fcntl(child_out, F_GETFL);
        fcntl(child_out, F_SETFL, fl | O_NONBLOCK);
        while ((n = read(child_out, buf, sizeof buf)) > 0) {
          out_log.write(buf, n);
          pending.append(buf, n);
        }
      }
      if (!pending.empty()) {
        size_t start = 0, nl;
        pending += "\n";
        while ((nl = pending.find('\n', start)) != std::string::npos) {
          handle_line(pending.substr(start, nl - start), true);
          start = nl + 1;
        }
      }
      poll_file();
      break;
    }
    if (cancel && cancel->load() && !cancelled) {
      cancelled = true;
      kill_group(SIGKILL);
    }
    if (pruned && seconds_since(kill_sent) > 3) kill_group(SIGKILL);
    if (o.heartbeat_seconds > 0 && !lost && seconds_since(last_beat) >= o.heartbeat_seconds) {
      try {
        source.heartbeat(trial.trial_id);
      } catch (const std::exception& e) {
        lost = true;
        lost_message = e.what();
        err_note << "[kiln] heartbeat refused: " << lost_message << "; stopping the trial" << std::endl;
        kill_group(SIGKILL);
      }
      last_beat = Clock::now();
    }
  }
  close(child_out);

  TrialOutcome out;
  if (lost) {
    out.source_lost = true;
    out.status = TrialStatus::kFailed;
    out.message = lost_message;
    return out;
  }
  if (cancelled) {
    out.status = TrialStatus::kRunning;
    out.message = "cancelled";
    return out;
  }
  if (pruned) {
    out.status = TrialStatus::kStopped;
  } else if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) {
    if (objective_seen || o.objective.empty()) {
      out.status = TrialStatus::kCompleted;
    } else {
      out.status = TrialStatus::kFailed;
      out.message = "the program exited 0 but never reported the objective '" + o.objective +
                    "'; print \"kiln-metric " + o.objective + "=VALUE\" or write it to $" + kHypertuneFileEnv;
    }
  } else {
    out.status = TrialStatus::kFailed;
    std::string how = WIFSIGNALED(wstatus) ? "was killed by signal " + std::to_string(WTERMSIG(wstatus))
                                           : "exited with status " + std::to_string(WEXITSTATUS(wstatus));
    out.message = "the trial program " + how + " (" + stderr_path + ": " + last_line_of(stderr_path) + ")";
  }
  if (events) write_hparams_session_end(*events, out.status, unix_seconds());
  err_note << "[kiln] trial " << trial.trial_id << " " << status_name(out.status) << " after " << seconds_since(started)
           << " s" << (out.message.empty() ? "" : ": " + out.message) << std::endl;
  try {
    source.end(trial.trial_id, out.status, out.message);
  } catch (const std::exception& e) {
    out.source_lost = true;
    out.message = e.what();
  }
  if (o.verbose > 0) {
    std::ostringstream line;
    line << "Trial " << trial.trial_id << " " << status_name(out.status) << " in " << std::fixed;
    line.precision(1);
    line << seconds_since(started) << "s:";
    for (auto& a : trial_arguments(trial.hyperparameters)) line << " " << a;
    if (!out.message.empty()) line << " (" << out.message << ")";
    std::lock_guard<std::mutex> l(print_mutex());
    std::cout << line.str() << std::endl;
  }
  return out;
}

int run_command_trials(TrialSource& source, const CommandOptions& o, const std::atomic<bool>* cancel) {
  o.validate();
  make_dirs(o.trials_dir);
  std::atomic<int> ran{0};
  std::mutex err_mu;
  std::exception_ptr first_error;
  // Ended trials that still hold a best/ checkpoint; only the best
  // keep_checkpoints keep theirs (running trials are never touched).
  std::mutex ckpt_mu;
  std::set<std::string> with_checkpoint;
  auto prune_checkpoints = [&](const std::string& ended) {
    std::lock_guard<std::mutex> l(ckpt_mu);
    if (path_exists(join_path(join_path(o.trials_dir, "trial_" + ended), "best"))) with_checkpoint.insert(ended);
    auto best = source.best_trial_ids(o.keep_checkpoints);
    if (best.empty()) return;  // the source cannot rank trials: keep everything
    std::set<std::string> keep(best.begin(), best.end());
    for (auto it = with_checkpoint.begin(); it != with_checkpoint.end();) {
      if (keep.count(*it)) {
        ++it;
        continue;
      }
      remove_all(join_path(join_path(o.trials_dir, "trial_" + *it), "best"));
      it = with_checkpoint.erase(it);
    }
  };
  auto worker = [&](int index) {
    try {
      std::string tuner_id = o.parallel > 1 ? o.tuner_id + "_" + std::to_string(index) : o.tuner_id;
      while (!(cancel && cancel->load())) {
        Next next = Next::kDone;
        auto trial = source.next_trial(tuner_id, &next);
        if (!trial) {
          if (next == Next::kDone) return;
          std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_poll_seconds));
          continue;
        }
        TrialOutcome outcome = run_command_trial(*trial, o, source, cancel);
        ++ran;
        if (o.keep_checkpoints > 0 && !outcome.source_lost && outcome.status != TrialStatus::kRunning)
          prune_checkpoints(trial->trial_id);
      }
    } catch (...) {
      std::lock_guard<std::mutex> l(err_mu);
      if (!first_error) first_error = std::current_exception();
    }
  };
  {
    ThreadPool pool(ThreadPoolOptions{.num_threads = o.parallel});
    std::vector<std::future<void>> workers;
    for (int i = 0; i < o.parallel; ++i) workers.push_back(pool.submit([&worker, i] { worker(i); }));
    for (auto& f : workers) f.get();  // worker() catches its own errors into first_error
  }
  if (first_error) std::rethrow_exception(first_error);
  return ran.load();
}

}  // namespace kiln::tuning
