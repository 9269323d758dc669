// kiln ensemble --members DIR... [--xgboost SPEC] [--weights average|nelder_mead|caruana]
//               --validation DATA --output BASE [--test DATA]
//
// Deep Learning with Python's 18.1.2 as a command: pools saved models (and
// optionally gradient-boosted trees trained here) into an Ensemble whose
// weights are learned on the validation data, prints each member's and the
// ensemble's accuracy, and saves the ensemble as the next version under
// BASE: a model directory that show, predict, batch-predict and serve take
// like any model (docs/ENSEMBLE.md).
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/ensemble/ensemble.h"
#include "kiln/ensemble/gradient_boosted_trees.h"
#include "kiln/spec/spec.h"
#include "tools/kiln/cli.h"
#include "tools/kiln/versions.h"

namespace kiln::cli {
namespace {

struct EnsembleOptions {
  std::vector<std::string> members;
  std::string xgboost;
  std::string weights = "nelder_mead";
  int rounds = 50;
  std::string validation, validation_from;
  std::string test, test_from;
  std::string output;
  int64_t batch_size = 256;
};

// Examples and labels of one part ("train" or "test") of a data section.
struct LabeledData {
  at::Tensor x, y;
  std::string description;
};

// `value`: a data section (docs/SPEC.md), inline or a file, or a whole spec
// (its data section). `from`: "test" / "train"; "" = the test split when
// the data has one, else the training rows (kiln evaluate's rule).
LabeledData ensemble_data(const std::string& value, const std::string& from, const std::string& option) {
  DataSplits d = load_data(data_argument(value, option));
  const std::string part = from.empty() ? (d.has_test() ? "test" : "train") : from;
  if (part == "test" && !d.has_test())
    throw ValueError(option + ": the data has no test split; use " + option + "_from train or add `test_split`");
  LabeledData out;
  out.x = part == "test" ? d.x_test : d.x_train;
  out.y = part == "test" ? d.y_test : d.y_train;
  if (!out.y.defined()) throw ValueError(option + ": the data has no labels to score the ensemble against");
  out.description = std::to_string(out.x.size(0)) + " " + part + " examples of " + d.description;
  return out;
}

// "inputs: float32 (None, 784)" for a predictor's serving_default inputs.
std::string describe_inputs(const Json& sig) {
  const Json inputs =
      sig.contains("serving_default") ? sig["serving_default"].value("inputs", Json::object()) : Json::object();
  std::string s;
  for (auto& [name, info] : inputs.items()) {
    Shape shape;
    for (auto& d : info.value("shape", Json::array()))
      shape.push_back(d.is_number_integer() ? d.get<int64_t>() : kNone);
    s += (s.empty() ? "" : ", ") + name + ": " + info.value("dtype", "float32") + " " + shape_to_string(shape);
  }
  return s.empty() ? "(none)" : s;
}

// Positional (dtype, shape) of each input: what the ensemble feeds every member.
Json input_layout(const Json& sig) {
  Json out = Json::array();
  if (!sig.contains("serving_default")) return out;
  const Json inputs = sig["serving_default"].value("inputs", Json::object());
  for (auto& [name, info] : inputs.items())
    out.push_back(Json::array({info.value("dtype", "float32"), info.value("shape", Json::array())}));
  return out;
}

std::shared_ptr<ensemble::GradientBoostedTrees> train_trees(const std::string& value, int64_t num_class,
                                                            const LabeledData& validation) {
  Json j = json_argument(value, "--xgboost");
  check_keys(j,
             {"data", "data_from", "num_class", "max_depth", "eta", "rounds", "subsample", "colsample_bytree",
              "nthread", "early_stopping_rounds", "seed"},
             "--xgboost");
  if (!j.contains("data"))
    throw ValueError("--xgboost needs `data`: the data section (docs/SPEC.md) whose training rows train the trees");
  if (!j.contains("num_class")) j["num_class"] = num_class;
  auto options = ensemble::GradientBoostedTreesOptions::from_json(j);
  if (options.num_class < 2)
    throw ValueError("--xgboost: num_class must be >= 2. Received: num_class=" + std::to_string(options.num_class));
  LabeledData train = ensemble_data(j["data"].dump(), j.value("data_from", std::string("train")), "--xgboost data");
  auto trees = std::make_shared<ensemble::GradientBoostedTrees>(options);
  std::cout << "Training gradient-boosted trees (" << options.rounds << " rounds, max_depth " << options.max_depth
            << ") on " << train.description << std::endl;
  if (options.early_stopping_rounds > 0)
    trees->fit(train.x, train.y, validation.x, validation.y);
  else
    trees->fit(train.x, train.y);
  return trees;
}

void print_ensemble_table(const std::vector<ensemble::MemberScores>& rows, const std::vector<std::string>& kinds,
                          bool with_test, std::ostream& os) {
  size_t w = 8;
  for (auto& r : rows) w = std::max(w, r.name.size() + 2);
  os << std::left << std::setw(w) << "member" << std::setw(10) << "kind" << std::right << std::setw(8) << "weight"
     << std::setw(14) << "val_accuracy" << std::setw(10) << "val_loss";
  if (with_test) os << std::setw(15) << "test_accuracy" << std::setw(11) << "test_loss";
  os << "\n" << std::fixed;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    os << std::left << std::setw(w) << r.name << std::setw(10) << (i < kinds.size() ? kinds[i] : "") << std::right
       << std::setprecision(3) << std::setw(8) << r.weight << std::setprecision(4) << std::setw(14) << r.val_accuracy
       << std::setw(10) << r.val_log_loss;
    if (with_test) os << std::setw(15) << r.test_accuracy << std::setw(11) << r.test_log_loss;
    os << "\n";
  }
  os << std::defaultfloat;
}

void run_ensemble(const EnsembleOptions& o) {
  if (o.members.empty() && o.xgboost.empty()) throw ValueError("give the members: --members DIR... (and/or --xgboost)");
  // Members first: a wrong directory or signature fails before any data is read.
  ensemble::Ensemble ens;
  std::string first_dir;
  Json first_layout;
  std::vector<std::string> kinds;
  for (const std::string& raw : o.members) {
    std::string dir = raw;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    ensemble::PredictorPtr p = ensemble::load_predictor(dir);
    Json sig = p->signatures();
    if (first_dir.empty()) {
      first_dir = dir;
      first_layout = input_layout(sig);
    } else if (input_layout(sig) != first_layout) {
      throw ValueError("members take different inputs: " + first_dir + " takes " +
                       describe_inputs(ensemble::load_predictor(first_dir)->signatures()) + " but " + dir + " takes " +
                       describe_inputs(sig) + "; every member of an ensemble must take the same inputs");
    }
    ens.add(dir, p);
    kinds.push_back(p->kind());
  }

  LabeledData val = ensemble_data(o.validation, o.validation_from, "--validation");
  std::optional<LabeledData> test;
  if (!o.test.empty()) test = ensemble_data(o.test, o.test_from, "--test");
  std::cout << "Validation: " << val.description << "\n";
  if (test) std::cout << "Test: " << test->description << "\n";

  if (!o.xgboost.empty()) {
    const int64_t num_class = val.y.max().item<int64_t>() + 1;
    auto trees = train_trees(o.xgboost, std::max<int64_t>(num_class, 2), val);
    Json sig = trees->signatures();
    if (!first_dir.empty() && input_layout(sig) != first_layout)
      throw ValueError("members take different inputs: " + first_dir + " takes " +
                       describe_inputs(ensemble::load_predictor(first_dir)->signatures()) +
                       " but the --xgboost trees take " + describe_inputs(sig) +
                       "; give the trees the same data preprocessing (scale, flatten, reshape) as the models");
    ens.add("xgboost", trees);
    kinds.push_back(trees->kind());
  }

  double loss = 0;
  if (o.weights == "average") {
    ens.average();
  } else if (o.weights == "nelder_mead") {
    loss = ens.fit_weights(val.x, val.y);
  } else {
    loss = ens.select_greedy(val.x, val.y, o.rounds);
  }
  (void)loss;
  std::cout << "Weights: " << o.weights
            << (o.weights == "nelder_mead" ? " (Nelder-Mead on the validation log loss)"
                : o.weights == "caruana"   ? " (Caruana's greedy selection, " + std::to_string(o.rounds) + " rounds)"
                                           : " (equal)")
            << "\n\n";
  auto rows = test ? ens.evaluate(val.x, val.y, test->x, test->y, o.batch_size)
                   : ens.evaluate(val.x, val.y, val.x, val.y, o.batch_size);
  kinds.push_back("ensemble");
  print_ensemble_table(rows, kinds, test.has_value(), std::cout);

  const std::string path = publish_next_version([&](const std::string& dir) { ens.save_to(dir); }, o.output);
  std::cout << "\nSaved ensemble to " << path << "\n";
}

}  // namespace

Command add_ensemble_command(CLI::App& app) {
  auto o = std::make_shared<EnsembleOptions>();
  CLI::App* sub = app.add_subcommand(
      "ensemble",
      "Pool saved models (and gradient-boosted trees) into an ensemble with weights learned on validation data, "
      "saved as the next version under --output (docs/ENSEMBLE.md)");
  sub->add_option("--members", o->members, "Model version directories (kiln models, trees or ensembles)");
  sub->add_option("--xgboost", o->xgboost,
                  "Also train gradient-boosted trees: JSON (inline or a file) with `data` (a data section whose "
                  "training rows train them) and XGBoost options: num_class, max_depth, eta, rounds, subsample, "
                  "colsample_bytree, nthread, early_stopping_rounds, seed");
  sub->add_option("--weights", o->weights,
                  "average (equal), nelder_mead (Nelder-Mead on the validation log loss, default) or caruana "
                  "(greedy selection with replacement)")
      ->check(CLI::IsMember({"average", "nelder_mead", "caruana"}));
  sub->add_option("--rounds", o->rounds, "caruana: selection rounds")->check(positive_integer());
  sub->add_option("--validation", o->validation,
                  "Data to learn the weights on: a data section (docs/SPEC.md), inline JSON or a file")
      ->required();
  sub->add_option("--validation_from", o->validation_from,
                  "Which part of --validation: test (default when it has one) or train")
      ->check(CLI::IsMember({"test", "train"}));
  sub->add_option("--test", o->test, "Data to report test accuracy on (a data section)");
  sub->add_option("--test_from", o->test_from, "Which part of --test: test (default when it has one) or train")
      ->check(CLI::IsMember({"test", "train"}));
  sub->add_option("--output", o->output, "Base directory: the ensemble is saved as its next version")->required();
  sub->add_option("--batch_size", o->batch_size, "Examples per prediction batch")->check(positive_integer());
  return {sub, [o] { run_ensemble(*o); }};
}

}  // namespace kiln::cli
