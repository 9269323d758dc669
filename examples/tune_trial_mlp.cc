// An external training program for `kiln tune --command` (and Optuna's
// driver bench/optuna_tune.py): trains an MLP on a Fashion-MNIST subset with
// the hyperparameters it gets as flags and prints one metric line per epoch,
// the protocol of docs/TUNING.md ("CLI, parallel and distributed"):
//
//   build/examples/example_tune_trial_mlp --units=128 --learning_rate=0.001 --epochs=3
//   ...
//   kiln-metric val_accuracy=0.8312 val_loss=0.4711 loss=0.5520 step=0
//
// Flags (--name=value): units (64), num_layers (1), learning_rate (1e-3),
// dropout (0), batch_size (128), epochs (3), train_samples (10000),
// val_samples (5000; taken from the end of the training set), seed (1).
// Unknown flags are an error (exit 2), so a typo in a search space shows.
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/adam.h"
#include "kiln/tuning/metric_report.h"

using namespace kiln;

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  configure_threads();
  std::map<std::string, double> f = {
      {"units", 64}, {"num_layers", 1},        {"learning_rate", 1e-3}, {"dropout", 0}, {"batch_size", 128},
      {"epochs", 3}, {"train_samples", 10000}, {"val_samples", 5000},   {"seed", 1}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string name = a.rfind("--", 0) == 0 && eq != std::string::npos ? a.substr(2, eq - 2) : "";
    char* end = nullptr;
    double v = name.empty() ? 0 : std::strtod(a.c_str() + eq + 1, &end);
    if (name.empty() || !f.count(name) || *end != '\0') {
      std::cerr << "example_tune_trial_mlp: error: unknown or malformed flag '" << a
                << "'; flags are --units= --num_layers= --learning_rate= --dropout= --batch_size= --epochs= "
                   "--train_samples= --val_samples= --seed=\n";
      return 2;
    }
    f[name] = v;
  }
  set_random_seed((uint64_t)f["seed"]);
  auto d = datasets::fashion_mnist();
  int64_t n_train = (int64_t)f["train_samples"], n_val = (int64_t)f["val_samples"];
  auto x = d.x_train.to(at::kFloat).div(255.0).reshape({-1, 784});
  auto x_train = x.narrow(0, 0, n_train), y_train = d.y_train.narrow(0, 0, n_train);
  auto x_val = x.narrow(0, x.size(0) - n_val, n_val), y_val = d.y_train.narrow(0, x.size(0) - n_val, n_val);

  auto model = models::Sequential();
  model->add(layers::Input({784}));
  for (int l = 0; l < (int)f["num_layers"]; ++l) {
    model->add(layers::Dense((int64_t)f["units"], "relu"));
    if (f["dropout"] > 0) model->add(layers::Dropout(f["dropout"]));
  }
  model->add(layers::Dense(10, "softmax"));
  CompileArgs c = CompileArgs::from_names("adam", "sparse_categorical_crossentropy", {"accuracy"});
  c.optimizer = std::make_shared<optimizers::Adam>(Json{{"learning_rate", f["learning_rate"]}});
  model->compile(c);
  model->fit({.x = {x_train},
              .y = {y_train},
              .batch_size = (int64_t)f["batch_size"],
              .epochs = (int)f["epochs"],
              .verbose = 0,
              .callbacks = {std::make_shared<tuning::MetricLineReporter>()},
              .validation_x = {x_val},
              .validation_y = {y_val}});
  return 0;
}
