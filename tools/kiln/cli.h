// The `kiln` command line: shared pieces of the subcommands.
//
// Each command lives in its own file (train.cc, evaluate.cc, predict.cc,
// show.cc) and registers itself on the CLI11 app through add_*_command(),
// which returns the subcommand and the function to run when it is chosen.
// main.cc parses, sets up threads, runs the chosen command and maps errors:
//   kiln::UserError, CLI11 parse errors, LibTorch shape errors -> exit 2
//   anything else                                              -> exit 1
// always as exactly one line on stderr: "kiln: error: <message>".
#pragma once

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/core/json.h"

namespace kiln::spec {}

namespace kiln::cli {

// The train-spec readers live in the library (kiln/spec/spec.h).
using namespace kiln::spec;

struct Command {
  CLI::App* app = nullptr;
  std::function<void()> run;  // throws on failure
  // Set by a command whose result is an exit status of its own (kiln launch
  // returns its ranks'); main() exits with it after run() returns.
  std::shared_ptr<int> exit_status;
};

Command add_train_command(CLI::App& app);
Command add_tune_trial_command(CLI::App& app);  // train.cc (hidden; run by kiln tune)
Command add_evaluate_command(CLI::App& app);
Command add_predict_command(CLI::App& app);
Command add_show_command(CLI::App& app);
Command add_tune_command(CLI::App& app);           // tune.cc
Command add_batch_predict_command(CLI::App& app);  // batch_predict.cc
Command add_export_command(CLI::App& app);         // export.cc
Command add_serve_command(CLI::App& app);          // serve.cc: the model server
Command add_launch_command(CLI::App& app);         // launch.cc: the ranks of a distributed job
Command add_quantize_command(CLI::App& app);       // quantize.cc: int8 / float8 versions of a saved model
Command add_ensemble_command(CLI::App& app);       // ensemble.cc: ensembles of saved models

// The global --device flag ("cpu", "cuda", "cuda:N"): checked against this
// machine (ValueError naming what there is: exit 2), made the default
// device, and exported as KILN_DEVICE so that the processes a command
// starts (tune's trials, launch's ranks, batch-predict's workers) use it too;
// "cuda" without an index is passed on as such, so each of launch's ranks
// takes its own GPU.
void apply_device_flag(const std::string& text);
// Whether --device was given (it wins over a spec's "device").
bool device_flag_given();

// CLI11 validator: a positive integer ("--epochs: must be a positive
// integer. Received: 0").
CLI::Validator positive_integer();

// The whole text of the file an option names; NotFoundError
// "<option>: file not found: <path>" when it cannot be read.
std::string read_option_file(const std::string& path, const std::string& option);

// A JSON argument given inline ("{...}") or as a file path.
Json json_argument(const std::string& value, const std::string& option);
// A data section (docs/SPEC.md) given as json_argument takes it, or a whole
// spec, whose data section is used.
Json data_argument(const std::string& value, const std::string& option);

// "0.8812" with four decimals, as Keras's progress bar prints metrics.
std::string format_metric(double v);

// One "<prefix><name>: <value>" line per metric, "loss" first (as Keras lists
// them), the others in name order.
void print_metrics(const std::map<std::string, double>& metrics, const std::string& prefix, std::ostream& os);

}  // namespace kiln::cli
