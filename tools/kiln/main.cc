// kiln: the command line.
//
// Every command that computes takes --device cpu|cuda|cuda:N (default: the
// first GPU when there is one, else the CPU; $KILN_DEVICE).
//
//   kiln [--threads N] train SPEC.json [--output BASE] [--epochs N]
//   kiln [--threads N] evaluate MODEL_DIR (--data DATA | --spec SPEC.json)
//   kiln [--threads N] predict MODEL_DIR [--input FILE|-] [--output FILE|-]
//   kiln [--threads N] show MODEL_DIR
//   kiln tune SPEC.json [--parallel N] [--resume] [--retrain_top K] | --summary DIR | --chief | --worker
//   kiln [--threads N] ensemble --members DIR... [--xgboost SPEC] --weights average|nelder_mead|caruana
//                               --validation DATA --output BASE [--test DATA]
//   kiln [--threads N] batch-predict --model DIR --input FILES... --output DIR [--workers N]
//   kiln [--threads N] export --format onnx --model DIR --output model.onnx
//   kiln [--threads N] serve (--model_base_path DIR | --model_config_file F) [flags]
//   kiln launch --nproc_per_node N [--nnodes M --node_rank R --master_addr A --master_port P]
//               [--max_restarts K] [--threads_per_rank T] -- PROGRAM ARGS...
//
// Exit codes: 0 success; 2 user error (bad arguments, files, specs, shapes,
// sizes that do not fit in memory), reported as one line
// "kiln: error: <message>" on stderr; 1 anything else (also one line). No
// stack traces: LibTorch's are cut off.
#include <c10/util/Exception.h>

#include <algorithm>
#include <iostream>
#include <new>
#include <stdexcept>

#include "kiln/core/error.h"
#include "kiln/core/threads.h"
#include "tools/kiln/cli.h"

namespace {

// Keeps the first line, trims it; the CLI's contract is one line per error.
std::string one_line(std::string s) {
  auto nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r' || s.back() == '\t')) s.pop_back();
  return s;
}

// The whole message on one line (kiln's own messages may hold a list).
std::string joined(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// Messages quote values through json_excerpt/text_excerpt; this bound is the
// backstop that keeps the one line readable whatever a library put in it.
constexpr size_t kMaxMessage = 1000;

int fail(int code, std::string message) {
  if (message.size() > kMaxMessage) {
    size_t n = kMaxMessage;
    while (n > 0 && (static_cast<unsigned char>(message[n]) & 0xC0) == 0x80) --n;  // whole UTF-8 characters
    message.resize(n);
    message += "...";
  }
  std::cout.flush();
  std::cerr << "kiln: error: " << message << std::endl;
  return code;
}

// LibTorch reports shape problems (a spec's layers against its data, a
// model against an input) as c10::Error: those are the user's to fix.
bool is_shape_problem(const std::string& m) {
  for (const char* key : {"shape", "size", "dimension", "dim ", "channels", "Expected", "expected", "out of bounds",
                          "must match", "cannot be multiplied", "Target"})
    if (m.find(key) != std::string::npos) return true;
  return false;
}

// An allocation the machine cannot give (a layer of 1e12 units, a batch of
// millions of rows) comes from the user's numbers, not from kiln: exit 2
// with what to check. (On Linux a real shortage ends in the OOM killer, not
// in an exception.)
bool is_allocation_failure(const std::string& m) {
  return m.find("can't allocate memory") != std::string::npos || m.find("out of memory") != std::string::npos ||
         m.find("not enough memory") != std::string::npos;
}
const char* const kMemoryHint =
    "; check the sizes in the model (units, filters, input_dim...) and the batch size (--batch_size, fit.batch_size)";

// The command word: the first argument that is not an option (skipping
// --threads' value); "" if none.
std::string command_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" || a == "--device") {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] != '-') return a;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // `kiln serve` runs as a server.
  kiln::prepare_thread_environment(
      argv, command_word(argc, argv) == "serve" ? kiln::ThreadProfile::kServing : kiln::ThreadProfile::kDefault);

  CLI::App app{"kiln: train, evaluate, inspect and run Keras-style models (see README.md and docs/SPEC.md)", "kiln"};
  app.require_subcommand(1, 1);
  app.fallthrough();  // --threads may also come after the command
  int threads = 0;
  app.add_option("--threads", threads, "Intra-op threads (default: $KILN_NUM_THREADS, else every core)")
      ->check(kiln::cli::positive_integer());
  std::string device;
  app.add_option("--device", device,
                 "Where to compute: cpu, cuda or cuda:N (default: $KILN_DEVICE, else the first GPU when there is "
                 "one, else the CPU)");
  std::vector<kiln::cli::Command> commands = {
      kiln::cli::add_train_command(app),         kiln::cli::add_tune_trial_command(app),
      kiln::cli::add_evaluate_command(app),      kiln::cli::add_predict_command(app),
      kiln::cli::add_show_command(app),          kiln::cli::add_tune_command(app),
      kiln::cli::add_batch_predict_command(app), kiln::cli::add_export_command(app),
      kiln::cli::add_serve_command(app),         kiln::cli::add_launch_command(app),
      kiln::cli::add_quantize_command(app),      kiln::cli::add_ensemble_command(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string cmd;
    for (auto* sub : app.get_subcommands()) cmd = " " + sub->get_name();
    if (cmd.empty()) {
      // No command recognised: name the word that was meant to be one.
      std::string word = command_word(argc, argv);
      if (!word.empty())
        return fail(2, "unknown command '" + word +
                           "'; the commands are train, evaluate, predict, show, tune, ensemble, serve, batch-predict, "
                           "export, launch (kiln --help)");
    }
    return fail(2, joined(e.what()) + "; run 'kiln" + cmd + " --help' for usage");
  }

  try {
    kiln::ThreadConfig cfg;
    cfg.intra_op = threads;
    kiln::configure_threads(cfg);
    if (!device.empty()) kiln::cli::apply_device_flag(device);
    for (auto& c : commands)
      if (c.app->parsed()) {
        c.run();
        std::cout.flush();
        if (c.exit_status) return *c.exit_status;
      }
    std::cout.flush();
    return 0;
  } catch (const kiln::UserError& e) {
    return fail(2, joined(e.what()));
  } catch (const nlohmann::json::exception& e) {
    // A value of the wrong JSON type somewhere in a spec or request.
    return fail(2, "a JSON value has the wrong type: " + joined(e.what()));
  } catch (const c10::Error& e) {
    std::string m = one_line(e.what_without_backtrace());
    if (is_allocation_failure(m)) return fail(2, "out of memory: " + m + kMemoryHint);
    if (is_shape_problem(m))
      return fail(2,
                  "shape mismatch: " + m + "; check that the data fits the model's input shape (kiln show MODEL_DIR)");
    return fail(1, "internal error in LibTorch: " + m);
  } catch (const kiln::Error& e) {
    return fail(1, joined(e.what()));
  } catch (const std::bad_alloc&) {
    return fail(2, std::string("out of memory: an allocation failed") + kMemoryHint + " or the data `limit`");
  } catch (const std::length_error& e) {
    // std::vector refusing a size beyond max_size(): the same cause.
    return fail(2, "a size is too large (" + joined(e.what()) + ")" + kMemoryHint);
  } catch (const std::exception& e) {
    return fail(1, "internal error: " + joined(e.what()));
  }
}
