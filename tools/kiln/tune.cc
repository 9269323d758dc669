// kiln tune: hyperparameter search over any program (docs/TUNING.md,
// "CLI, parallel and distributed").
//
//   kiln tune SPEC.json [--parallel N] [--resume | --overwrite] [--max_trials N]
//             [--retrain_top K [--retrain_factor 1.2] [--retrain_output BASE]
//              [--retrain_patch JSON]]   (tools/kiln/retrain.h)
//   kiln tune --summary PROJECT_DIR [--num_trials N] [--export FILE.jsonl|FILE.csv]
//   kiln tune --summary PROJECT_DIR --plot FILE.svg|FILE.png   draw the search (tuning_plot.h)
//   kiln tune SPEC.json --chief [--address HOST:PORT]     serve the oracle (port 0: any;
//                                                         prints "chief listening on PORT")
//   kiln tune SPEC.json --worker [--oracle HOST:PORT] [--tuner_id ID]
//
// Workers may instead take KerasTuner's environment variables:
// KERASTUNER_ORACLE_IP, KERASTUNER_ORACLE_PORT, KERASTUNER_TUNER_ID ("chief"
// there makes this process the chief). SIGINT/SIGTERM stop the running
// trials' processes and leave them RUNNING in the store, so --resume runs
// them again; so does kill -9 (the children die with the parent).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/plot/render.h"
#include "kiln/tuning/oracle_service.h"
#include "kiln/tuning/trial_store.h"
#include "kiln/tuning/tune_spec.h"
#include "kiln/tuning/tuner.h"
#include "kiln/tuning/tuning_plot.h"
#include "tools/kiln/cli.h"
#include "tools/kiln/retrain.h"

namespace kiln::cli {
namespace {

std::atomic<bool> g_cancel{false};
extern "C" void on_signal(int) { g_cancel.store(true); }

// This kiln binary's path: `train` trials run it as `kiln tune-trial`.
std::string self_executable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw IOError("cannot find the kiln executable (/proc/self/exe)");
  return std::string(buf, n);
}

struct TuneOptions {
  std::string spec;
  std::string summary;
  std::string export_path;
  std::string plot_path;
  int num_trials = 10;
  int parallel = 0;
  int max_trials = -1;
  bool resume = false, overwrite = false;
  bool chief = false, worker = false;
  std::string address = "0.0.0.0:0";
  std::string oracle;
  std::string tuner_id;
  int retrain_top = 0;
  double retrain_factor = 1.2;
  std::string retrain_output;
  std::string retrain_patch;
};

void run_tune(const TuneOptions& o) {
  if (!o.summary.empty() && !o.plot_path.empty()) {
    tuning::write_tuning_plot(o.summary, o.plot_path);
    std::cout << "Wrote " << o.plot_path << "\n";
    if (o.export_path.empty()) return;
  }
  if (!o.plot_path.empty()) plot::check_plot_path(o.plot_path);  // a search's plot: bad names fail first
  if (!o.summary.empty()) {
    if (!o.export_path.empty()) {
      const size_t dot = o.export_path.rfind('.');
      const std::string ext = dot == std::string::npos ? "" : o.export_path.substr(dot + 1);
      if (ext != "jsonl" && ext != "csv")
        throw ValueError("--export: name a .jsonl or .csv file. Received: " + o.export_path);
      tuning::TrialStore store(tuning::project_store_path(o.summary), /*read_only=*/true);
      tuning::export_trial_history(store.load_trials(), o.export_path, ext);
      std::cout << "Wrote " << o.export_path << "\n";
      return;
    }
    tuning::print_tuning_summary(o.summary, o.num_trials);
    return;
  }
  if (o.spec.empty()) throw ValueError("kiln tune needs SPEC.json (or --summary PROJECT_DIR)");
  Json j = json_argument(o.spec, "spec");
  if (o.max_trials >= 0) j["max_trials"] = o.max_trials;
  if (o.parallel > 0) j["parallel"] = o.parallel;
  tuning::TuneSpec spec = tuning::TuneSpec::from_json(j);
  spec.kiln_executable = self_executable();
  if (o.retrain_top > 0) check_retrain_spec(spec);  // before the search, not after it
  Json retrain_patch;
  if (!o.retrain_patch.empty()) {
    if (o.retrain_top == 0) throw ValueError("--retrain_patch needs --retrain_top K (it changes the retrains)");
    retrain_patch = json_argument(o.retrain_patch, "--retrain_patch");
    check_retrain_patch(retrain_patch);
  }

  bool chief = o.chief, worker = o.worker;
  std::string oracle_target = o.oracle, tuner_id = o.tuner_id;
  if (!chief && !worker) {
    if (auto env = tuning::worker_config_from_env()) {
      if (env->tuner_id == "chief") {
        chief = true;
      } else {
        worker = true;
        if (oracle_target.empty()) oracle_target = env->target();
        if (tuner_id.empty()) tuner_id = env->tuner_id;
      }
    }
  }
  if (chief && worker) throw ValueError("--chief and --worker exclude each other; choose one");
  if (worker && o.retrain_top > 0)
    throw ValueError(
        "--retrain_top is for the chief or a local search, not a --worker (it retrains the project's best)");

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  if (worker) {
    if (oracle_target.empty()) {
      auto env = tuning::worker_config_from_env();
      if (!env)
        throw ValueError(
            "a worker needs the chief's address: --oracle HOST:PORT or KERASTUNER_ORACLE_IP and "
            "KERASTUNER_ORACLE_PORT");
      oracle_target = env->target();
    }
    if (tuner_id.empty()) tuner_id = "worker" + std::to_string(getpid());
    tuning::RemoteOracleSource source(oracle_target, tuner_id);
    auto c = spec.command_options(join_path(spec.project_dir(), tuner_id));
    spec.write_train_spec(c.trials_dir);
    c.tuner_id = tuner_id;
    c.heartbeat_seconds = spec.lease_seconds / 3;
    int n = tuning::run_command_trials(source, c, &g_cancel);
    std::cout << "worker " << tuner_id << ": ran " << n << " trials" << std::endl;
    return;
  }

  auto oracle = tuning::open_tuning_project(spec, o.resume, o.overwrite);
  if (chief) {
    std::string address = o.address;
    if (const char* port = std::getenv("KERASTUNER_ORACLE_PORT"); port && o.address == "0.0.0.0:0")
      address = std::string("0.0.0.0:") + port;
    tuning::OracleChief server(oracle, {.address = address, .lease_seconds = spec.lease_seconds});
    std::cout << "kiln tune: chief listening on port " << server.port() << std::endl;
    while (!g_cancel.load() && !server.done()) {
      struct timespec ts {
        0, 100000000
      };
      nanosleep(&ts, nullptr);
    }
    if (!g_cancel.load()) server.wait_until_done(2.0);
    server.shutdown();
  } else {
    tuning::OracleSource source(oracle);
    auto c = spec.command_options(spec.project_dir());
    spec.write_train_spec(c.trials_dir);
    tuning::run_command_trials(source, c, &g_cancel);
  }
  if (g_cancel.load()) throw StateError("interrupted; run the same command with --resume to continue");
  std::cout << "\n";
  tuning::print_tuning_summary(spec.project_dir(), 3);
  if (!o.plot_path.empty()) {
    tuning::write_tuning_plot(spec.project_dir(), o.plot_path);
    std::cout << "Wrote " << o.plot_path << "\n";
  }
  if (o.retrain_top > 0)
    retrain_top_trials(spec, {.top = o.retrain_top,
                              .factor = o.retrain_factor,
                              .output = o.retrain_output,
                              .patch = retrain_patch,
                              .kiln_executable = spec.kiln_executable,
                              .cancel = &g_cancel});
}

}  // namespace

Command add_tune_command(CLI::App& app) {
  auto o = std::make_shared<TuneOptions>();
  CLI::App* sub = app.add_subcommand(
      "tune", "Search hyperparameters: run a program per trial (docs/TUNING.md), in parallel or distributed");
  sub->add_option("spec", o->spec, "The tune spec (JSON file or inline JSON)");
  sub->add_option("--summary", o->summary, "Print the results of a tuning project directory and exit");
  sub->add_option("--num_trials", o->num_trials, "Trials shown by --summary")->check(positive_integer());
  sub->add_option("--export", o->export_path,
                  "With --summary: write every trial's per-epoch metrics to FILE.jsonl or FILE.csv");
  sub->add_option("--plot", o->plot_path,
                  "Draw the search to FILE.svg or FILE.png: objective per trial, best so far, one panel per "
                  "hyperparameter (with --summary, or after a search)");
  sub->add_option("--parallel", o->parallel, "Trials run at once (overrides the spec)")->check(positive_integer());
  sub->add_option("--max_trials", o->max_trials, "Trial budget (overrides the spec)")->check(CLI::NonNegativeNumber);
  sub->add_flag("--resume", o->resume, "Continue an interrupted search (completed trials are kept)");
  sub->add_flag("--overwrite", o->overwrite, "Delete the project's earlier trials and start over");
  sub->add_flag("--chief", o->chief, "Serve the oracle to workers over gRPC (distributed tuning)");
  sub->add_option("--address", o->address, "The chief's HOST:PORT (port 0 picks a free one)");
  sub->add_flag("--worker", o->worker, "Pull trials from a chief (see --oracle)");
  sub->add_option("--oracle", o->oracle,
                  "The chief's HOST:PORT (default: $KERASTUNER_ORACLE_IP:$KERASTUNER_ORACLE_PORT)");
  sub->add_option("--tuner_id", o->tuner_id, "This worker's id (default: $KERASTUNER_TUNER_ID)");
  sub->add_option("--retrain_top", o->retrain_top,
                  "After the search: retrain the best K completed trials on train + validation data for "
                  "round(best epoch x --retrain_factor) epochs, saved as versions 1..K (docs/TUNING_CLI.md)")
      ->check(positive_integer());
  sub->add_option("--retrain_factor", o->retrain_factor, "Epochs of a retrain per best epoch of its trial (1.2)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--retrain_output", o->retrain_output,
                  "Base directory of the retrained versions (default: <project>/retrained)");
  sub->add_option("--retrain_patch", o->retrain_patch,
                  "JSON merged into each retrain's train spec (RFC 7386; inline or a file), e.g. more data or "
                  "'{\"fit\": {\"epochs\": 12}}' (fixes the epochs)");
  return {sub, [o] { run_tune(*o); }};
}

}  // namespace kiln::cli
