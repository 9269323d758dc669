// kiln train SPEC.json [--output BASE] [--epochs N] [--plot FILE.svg|FILE.png]
// kiln tune-trial SPEC.json --name=value ...   (hidden: one trial of `kiln tune`
//   over a `train` spec; placeholders {"hp": NAME} take the values, each epoch
//   prints a kiln-metric line, the best epoch is saved in $KILN_TRIAL_DIR/best,
//   and a Hyperband promotion continues from $KILN_PARENT_TRIAL_DIR/best)
//
// Reads the spec, loads the data, builds and compiles the model, fits it
// (Keras-style progress), evaluates on the test split when there is one,
// then saves the next integer version under the output base directory.
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/random.h"
#include "kiln/distribute/data_parallel.h"
#include "kiln/models/model.h"
#include "kiln/plot/history_plot.h"
#include "kiln/plot/render.h"
#include "kiln/ps/ps_strategy.h"
#include "kiln/saving/model_io.h"
#include "kiln/spec/spec.h"
#include "kiln/training/backup_and_restore.h"
#include "kiln/training/model_checkpoint.h"
#include "kiln/training/reduce_lr_on_plateau.h"
#include "kiln/tuning/metric_report.h"
#include "kiln/tuning/tune_spec.h"
#include "tools/kiln/cli.h"
#include "tools/kiln/versions.h"

namespace kiln::cli {
namespace {

struct TrainOptions {
  std::string spec;
  std::string output;
  int epochs = 0;
  std::string dtype_policy;
  std::string plot;  // the history as FILE.svg / FILE.png
};

// A spec read and checked, its data loaded and its model built and compiled,
// ready for fit().
struct Prepared {
  FitArgs fit;
  DataSplits data;
  ModelPtr model;
};

Prepared prepare(const Json& spec, int epochs) {
  // Everything that can be checked without training is checked first, so a
  // typo fails in a second rather than after an hour.
  Prepared p;
  std::optional<uint64_t> seed;
  p.fit = fit_args_from_spec(spec.value("fit", Json::object()), &seed);
  if (epochs > 0) p.fit.epochs = epochs;
  CompileArgs compile = compile_args_from_spec(spec.value("compile", Json::object()));
  p.fit.callbacks = callbacks_from_spec(spec.value("callbacks", Json::array()));
  for (const auto& cb : p.fit.callbacks)  // a schedule's rate cannot be reduced: say so now, not at the plateau
    if (dynamic_cast<const callbacks::ReduceLROnPlateauImpl*>(cb.get()))
      callbacks::ReduceLROnPlateauImpl::check_optimizer(*compile.optimizer);
  if (seed) set_random_seed(*seed);
  // Data parallel: from the spec's "distribution", or because the job was
  // started with several ranks (kiln launch, torchrun, TF_CONFIG, srun).
  // Set before the model is built, as Keras's set_distribution.
  const Json& dist = spec.value("distribution", Json());
  if (dist.is_object() && dist.value("type", Json()) == "parameter_server")
    set_distribution(ps::parameter_server_from_config(dist));  // chief, worker or ps: TF_CONFIG says which
  else
    set_distribution(distribute::distribution_from_config(dist));

  p.data = load_data(spec["data"]);
  if (!p.data.y_train.defined())
    throw ValueError("the training data has no labels; set `data.label` (csv/jsonl) or `data.y` (npy/idx)");
  Shape example(p.data.x_train.sizes().begin() + 1, p.data.x_train.sizes().end());
  if (p.data.text) example.pop_back();  // a string tensor's row width is not part of its shape
  std::string each = shape_to_string(example) + (p.data.text ? " string" : "");
  if (p.data.input_names.size() > 1) {  // named inputs: one shape per input
    each.clear();
    for (size_t i = 0; i < p.data.input_names.size(); ++i) {
      const auto& t = p.data.xs_train[i];
      each += (i ? ", " : "") + p.data.input_names[i] + " " +
              shape_to_string(Shape(t.sizes().begin() + 1, t.sizes().end()));
    }
  }
  if (is_chief())
    std::cout << "Data: " << p.data.description << ": " << p.data.x_train.size(0) << " training examples"
              << (p.data.has_test() ? ", " + std::to_string(p.data.x_test.size(0)) + " test examples" : std::string())
              << ", each " << each << "\n";

  // "dtype_policy": the global policy the model's layers take (Keras's
  // keras.mixed_precision.set_dtype_policy); layers may still name their own.
  if (spec.contains("dtype_policy")) {
    if (!spec["dtype_policy"].is_string())
      throw ValueError("`dtype_policy` must be a policy name such as \"mixed_bfloat16\". Received: " +
                       spec["dtype_policy"].dump());
    set_dtype_policy(spec["dtype_policy"].get<std::string>());
    if (is_chief()) std::cout << "Dtype policy: " << spec["dtype_policy"].get<std::string>() << "\n";
  }
  // "device": where the model trains ("cpu", "cuda", "cuda:N"; default:
  // the first GPU when there is one). --device on the command line wins.
  if (spec.contains("device") && !device_flag_given()) {
    if (!spec["device"].is_string())
      throw ValueError("`device` must be \"cpu\", \"cuda\" or \"cuda:N\". Received: " + spec["device"].dump());
    set_default_device(resolve_device(spec["device"].get<std::string>(), "the spec's `device`"));
  }
  if (is_chief() && default_device().is_cuda()) std::cout << "Device: " << default_device().str() << "\n";
  p.model = build_model(spec["model"], p.data.input_names.size() > 1 ? std::nullopt : std::optional<Shape>(example));
  p.model = adapt_model(spec["model"], p.model, p.data.x_train);
  p.model->compile(compile);
  model_data(p.data, *p.model, /*test=*/false, &p.fit.x, &p.fit.y);
  return p;
}

// A model whose weights went NaN or infinite (divergence, bad data) is
// never published: the server would load it and answer NaN.
void refuse_non_finite_weights(const models::Model& model) {
  for (auto& v : model.weights()) {
    const at::Tensor& w = v->value();
    if (!at::isFloatingType(w.scalar_type()) || w.isfinite().all().item<bool>()) continue;
    const int64_t nan = w.isnan().sum().item<int64_t>(), n = w.numel();
    throw ValueError("training ended with non-finite weights (" + v->path() + ": " + std::to_string(nan) + " NaN and " +
                     std::to_string(w.isinf().sum().item<int64_t>()) + " infinite of " + std::to_string(n) +
                     " values); the model was not saved. Check the data for NaN/inf or extreme values, scale the "
                     "features, or lower the learning rate");
  }
}

void run_train(const TrainOptions& o) {
  if (!o.plot.empty()) plot::check_plot_path(o.plot);  // before training, not after
  Json spec = read_spec(o.spec);

  std::string base;
  bool include_optimizer = true;
  if (spec.contains("output")) {
    check_keys(spec["output"], {"base_dir", "include_optimizer"}, "the `output` section");
    base = get_or<std::string>(spec["output"], "base_dir", "");
    include_optimizer = get_or<bool>(spec["output"], "include_optimizer", true);
  }
  if (!o.output.empty()) base = o.output;
  if (base.empty()) throw ValueError("no output directory: set `output.base_dir` in the spec or pass --output BASE");

  // Staging copies that killed runs left under the output base.
  // (Data parallel and parameter servers: the chief's job, as publishing is.)
  const bool chief_task = distribute::is_ps_cluster() ? distribute::resolve_ps_cluster().is_chief()
                                                      : distribute::resolve_cluster().rank == 0;
  if (chief_task)
    for (const std::string& gone : remove_stale_staging(base))
      std::cout << "Removed " << gone << " (left by a killed run)\n";

  if (!o.dtype_policy.empty()) spec["dtype_policy"] = o.dtype_policy;
  // A parameter-server job's ps task needs only the optimizer: no data, no model.
  const Json& dist = spec.value("distribution", Json());
  if (dist.is_object() && dist.value("type", Json()) == "parameter_server" &&
      distribute::resolve_ps_cluster().is_ps()) {
    auto strategy = ps::parameter_server_from_config(dist);
    strategy->serve(*compile_args_from_spec(spec.value("compile", Json::object())).optimizer);
    return;
  }
  Prepared p = prepare(spec, o.epochs);
  // The backup goes only once the model is published: a kill between the
  // end of fit() and the publish resumes from the last checkpoint instead
  // of training again from epoch 1.
  std::vector<std::string> backups_to_delete;
  for (auto& cb : p.fit.callbacks)
    if (auto b = std::dynamic_pointer_cast<callbacks::BackupAndRestoreImpl>(cb); b && b->options().delete_checkpoint) {
      b->set_delete_checkpoint(false);
      backups_to_delete.push_back(b->backup_dir());
    }
  History history = p.model->fit(p.fit);
  if (!o.plot.empty() && is_chief()) {
    const std::string name = std::filesystem::path(o.spec).stem().string();
    plot::write_figure(plot::history_figure(history.history, history.epoch, "kiln train: " + name), o.plot);
    std::cout << "Wrote " << o.plot << "\n";
  }
  // Parameter servers: the workers' and ps tasks' fit() ends with the job;
  // the chief alone evaluates and publishes.
  if (std::dynamic_pointer_cast<ps::ParameterServerStrategy>(distribution()) && !is_chief()) return;
  for (auto& cb : p.fit.callbacks)
    if (auto b = std::dynamic_pointer_cast<callbacks::BackupAndRestoreImpl>(cb); b && b->restored() && is_chief())
      std::cout << "Resumed from the backup in " << b->backup_dir() << " at epoch " << b->restored_epoch() + 1
                << ", batch " << b->restored_batch() << "\n";

  if (p.data.has_test() && p.data.y_test.defined()) {
    EvaluateArgs ev;
    model_data(p.data, *p.model, /*test=*/true, &ev.x, &ev.y);
    ev.batch_size = p.fit.batch_size;
    auto metrics = p.model->evaluate(ev);  // data parallel: every rank takes part
    if (is_chief()) print_metrics(metrics, "test_", std::cout);
  }

  refuse_non_finite_weights(*p.model);
  if (!is_chief()) {  // data parallel: the chief alone publishes
    // ModelParallel: every process takes part in gathering the shards the
    // chief's save writes.
    if (has_sharded_variables(*p.model)) gather_saved_state(*p.model, include_optimizer);
    return;
  }
  const std::string path = publish_next_version(*p.model, base, include_optimizer);
  std::cout << "Saved model to " << path << "\n";
  std::cout.flush();
  for (auto& dir : backups_to_delete) remove_all(dir);
}

// --- kiln tune-trial: one trial of `kiln tune` over a train spec ------------------------------

struct TrialOptions {
  std::string spec;
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// `--name=value` arguments as typed JSON values: numbers and true/false
// parse as JSON, anything else is a string.
std::map<std::string, Json> trial_values(const std::vector<std::string>& args) {
  std::map<std::string, Json> values;
  for (const std::string& a : args) {
    auto eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos || eq == 2)
      throw ValueError("tune-trial: arguments must be --name=value. Received: " + a);
    std::string name = a.substr(2, eq - 2), text = a.substr(eq + 1);
    Json v = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    values[name] = v.is_number() || v.is_boolean() ? v : Json(text);
  }
  return values;
}

void run_tune_trial(const TrialOptions& o, const std::vector<std::string>& extras) {
  std::map<std::string, Json> values = trial_values(extras);
  Json spec = tuning::substitute_hyperparameters(read_spec(o.spec), values);
  int epochs = 0;
  if (auto it = values.find("epochs"); it != values.end() && it->second.is_number_integer())
    epochs = it->second.get<int>();  // Hyperband's tuner/epochs
  Prepared p = prepare(spec, epochs);

  const std::string trial_dir = env_or("KILN_TRIAL_DIR", ".");
  const std::string parent_dir = env_or("KILN_PARENT_TRIAL_DIR", "");
  if (!parent_dir.empty() && path_exists(join_path(parent_dir, "best"))) {
    // Hyperband promotion: continue from the parent's best epoch.
    ModelPtr parent = load_model(join_path(parent_dir, "best"));
    p.model->build_if_needed(parent->input_shapes());
    p.model->set_weights(parent->get_weights());
    p.fit.initial_epoch = std::stoi(env_or("KILN_INITIAL_EPOCH", "0"));
    std::cout << "Continuing from " << parent_dir << "/best at epoch " << p.fit.initial_epoch << std::endl;
  }
  const std::string objective = env_or("KILN_OBJECTIVE", "");
  if (!objective.empty()) {
    // The trial's best epoch, kept for promotions and get_best_models.
    callbacks::ModelCheckpointOptions ck;
    ck.monitor = objective;
    ck.mode = env_or("KILN_OBJECTIVE_DIRECTION", "auto");
    ck.save_best_only = true;
    p.fit.callbacks.push_back(callbacks::ModelCheckpoint(join_path(trial_dir, "best"), ck));
  }
  p.fit.callbacks.push_back(std::make_shared<tuning::MetricLineReporter>());
  p.model->fit(p.fit);
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand(
      "train", "Train a model from a declarative JSON spec (docs/SPEC.md) and save it as the next version");
  sub->add_option("spec", o->spec, "The spec file (JSON)")->required();
  sub->add_option("--output", o->output, "Base directory for versions (overrides output.base_dir)");
  sub->add_option("--epochs", o->epochs, "Number of epochs (overrides fit.epochs)")->check(positive_integer());
  sub->add_option("--dtype_policy", o->dtype_policy,
                  "float32, mixed_bfloat16, mixed_float16, bfloat16, float16 (overrides the spec's dtype_policy)");
  sub->add_option("--plot", o->plot,
                  "Write the training history to FILE.svg or FILE.png: one panel per metric, train and validation "
                  "per epoch");
  return {sub, [o] { run_train(*o); }};
}

Command add_tune_trial_command(CLI::App& app) {
  auto o = std::make_shared<TrialOptions>();
  CLI::App* sub = app.add_subcommand("tune-trial", "");  // no description: hidden, run by `kiln tune`
  sub->add_option("spec", o->spec, "The train spec with {\"hp\": NAME} placeholders")->required();
  sub->allow_extras();      // the trial's --name=value arguments
  sub->fallthrough(false);  // ... stay here instead of reaching the main app's parser
  return {sub, [o, sub] { run_tune_trial(*o, sub->remaining()); }};
}

}  // namespace kiln::cli
