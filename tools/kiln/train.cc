// kiln train SPEC.json [--output BASE] [--epochs N]
//
// Reads the spec, loads the data, builds and compiles the model, fits it
// (Keras-style progress), evaluates on the test split when there is one,
// then saves the next integer version under the output base directory.
#include <iostream>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/models/model.h"
#include "tools/kiln/cli.h"
#include "tools/kiln/spec.h"
#include "tools/kiln/versions.h"

namespace kiln::cli {
namespace {

struct TrainOptions {
  std::string spec;
  std::string output;
  int epochs = 0;
};

void run_train(const TrainOptions& o) {
  Json spec = read_spec(o.spec);

  std::string base;
  bool include_optimizer = true;
  if (spec.contains("output")) {
    check_keys(spec["output"], {"base_dir", "include_optimizer"}, "the `output` section");
    base = get_or<std::string>(spec["output"], "base_dir", "");
    include_optimizer = get_or<bool>(spec["output"], "include_optimizer", true);
  }
  if (!o.output.empty()) base = o.output;
  if (base.empty())
    throw ValueError("no output directory: set `output.base_dir` in the spec or pass --output BASE");

  // Everything that can be checked without training is checked first, so a
  // typo fails in a second rather than after an hour.
  std::optional<uint64_t> seed;
  FitArgs fit = fit_args_from_spec(spec.value("fit", Json::object()), &seed);
  if (o.epochs > 0) fit.epochs = o.epochs;
  CompileArgs compile = compile_args_from_spec(spec.value("compile", Json::object()));
  fit.callbacks = callbacks_from_spec(spec.value("callbacks", Json::array()));
  if (seed) set_random_seed(*seed);

  DataSplits data = load_data(spec["data"]);
  if (!data.y_train.defined())
    throw ValueError("the training data has no labels; set `data.label` (csv/jsonl) or `data.y` (npy/idx)");
  Shape example(data.x_train.sizes().begin() + 1, data.x_train.sizes().end());
  std::cout << "Data: " << data.description << ": " << data.x_train.size(0) << " training examples"
            << (data.has_test() ? ", " + std::to_string(data.x_test.size(0)) + " test examples" : std::string())
            << ", each " << shape_to_string(example) << "\n";

  ModelPtr model = build_model(spec["model"], example);
  model->compile(compile);
  fit.x = {data.x_train};
  fit.y = {data.y_train};
  model->fit(fit);

  if (data.has_test() && data.y_test.defined()) {
    EvaluateArgs ev;
    ev.x = {data.x_test};
    ev.y = {data.y_test};
    ev.batch_size = fit.batch_size;
    print_metrics(model->evaluate(ev), "test_", std::cout);
  }

  const std::string path = publish_next_version(*model, base, include_optimizer);
  std::cout << "Saved model to " << path << "\n";
  std::cout.flush();
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand("train", "Train a model from a declarative JSON spec (docs/SPEC.md) and save it as the next version");
  sub->add_option("spec", o->spec, "The spec file (JSON)")->required();
  sub->add_option("--output", o->output, "Base directory for versions (overrides output.base_dir)");
  sub->add_option("--epochs", o->epochs, "Number of epochs (overrides fit.epochs)")->check(positive_integer());
  return {sub, [o] { run_train(*o); }};
}

}  // namespace kiln::cli
