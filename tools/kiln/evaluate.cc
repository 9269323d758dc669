// kiln evaluate MODEL_DIR (--data DATA | --spec SPEC.json) [--split test|train]
//                         [--batch_size N] [--json]
//
// Loads a saved model (with the loss and metrics it was compiled with) and
// prints its metrics on a data section: the test split when the source has
// one, else the training data. An ensemble or gradient-boosted trees
// (kiln ensemble; compiled with nothing, their outputs are class
// probabilities) print loss, the sparse categorical cross-entropy of those
// probabilities, and accuracy, as `kiln ensemble` scores its members.
#include <iostream>
#include <map>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/ensemble/ensemble.h"
#include "kiln/ensemble/predictor_model.h"
#include "kiln/models/model.h"
#include "kiln/spec/spec.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

struct EvaluateOptions {
  std::string model_dir;
  std::string data;
  std::string spec;
  std::string split;
  int64_t batch_size = 32;
  bool json = false;
};

void run_evaluate(const EvaluateOptions& o) {
  if (o.data.empty() == o.spec.empty())
    throw ValueError(
        "give the data to evaluate on with exactly one of --data (a data section: inline JSON or a file) "
        "or --spec (a training spec, whose data section is used)");
  Json data_spec;
  if (!o.spec.empty()) {
    data_spec = read_spec(o.spec)["data"];
  } else {
    data_spec = data_argument(o.data, "--data");
  }

  ModelPtr model = load_model(o.model_dir);
  const bool predictor = dynamic_cast<ensemble::PredictorModel*>(model.get()) != nullptr;
  if (!model->compiled() && !predictor)
    throw ValueError(o.model_dir +
                     " was saved without a loss (no compile config); train it with `kiln train` or "
                     "compile before save");
  DataSplits data = load_data(data_spec);
  std::string split = o.split.empty() ? (data.has_test() ? "test" : "train") : o.split;
  if (split == "test" && !data.has_test())
    throw ValueError("--split test: the data has no test split; use --split train or add `test_split`/a test file");
  EvaluateArgs ev;
  model_data(data, *model, split == "test", &ev.x, &ev.y);
  if (!ev.y[0].defined()) throw ValueError("the " + split + " data has no labels to evaluate against");
  ev.batch_size = o.batch_size;
  std::map<std::string, double> metrics;
  if (predictor) {  // never compiled: scored as kiln ensemble scores members
    const at::Tensor p = model->predict(ev.x, {.batch_size = o.batch_size}).at(0);
    const at::Tensor y = ev.y[0].reshape({-1}).to(at::kLong);
    if (p.dim() != 2 || y.size(0) != p.size(0))
      throw ValueError(o.model_dir + " gives (batch, classes) probabilities, which need one class label per " +
                       "example; the " + split + " labels have shape " + shape_to_string(ev.y[0].sizes().vec()));
    if (y.numel() && (y.min().item<int64_t>() < 0 || y.max().item<int64_t>() >= p.size(1)))
      throw ValueError("the " + split + " labels must be class indices in [0, " + std::to_string(p.size(1)) +
                       ") for the " + std::to_string(p.size(1)) + " classes of " + o.model_dir);
    metrics = {{"loss", ensemble::Ensemble::log_loss(p, y)}, {"accuracy", ensemble::Ensemble::accuracy(p, y)}};
  } else {
    metrics = model->evaluate(ev);
  }
  if (o.json) {
    Json j = Json::object();
    j["split"] = split;
    j["examples"] = ev.x[0].size(0);
    for (auto& [k, v] : metrics) j[k] = v;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "Evaluated " << o.model_dir << " on " << ev.x[0].size(0) << " " << split << " examples of "
              << data.description << "\n";
    print_metrics(metrics, "", std::cout);
  }
}

}  // namespace

Command add_evaluate_command(CLI::App& app) {
  auto o = std::make_shared<EvaluateOptions>();
  CLI::App* sub = app.add_subcommand("evaluate", "Print a saved model's loss and metrics on a data set");
  sub->add_option("model_dir", o->model_dir, "A model version directory, e.g. models/fashion_mnist/1")->required();
  sub->add_option("--data", o->data, "A data section (docs/SPEC.md): inline JSON or a JSON file");
  sub->add_option("--spec", o->spec, "A training spec whose data section to use");
  sub->add_option("--split", o->split, "test (default when the data has one) or train")
      ->check(CLI::IsMember({"test", "train"}));
  sub->add_option("--batch_size", o->batch_size, "Examples per batch")->check(positive_integer());
  sub->add_flag("--json", o->json, "Print one JSON object instead of lines");
  return {sub, [o] { run_evaluate(*o); }};
}

}  // namespace kiln::cli
