// KerasTuner's listing (Deep Learning with Python, 13.1) in kiln's C++ API:
// a search over an MLP's width, depth, dropout and optimizer on
// Fashion-MNIST, the search's summaries, then the final-training recipe for
// the best configurations and their test accuracy. Each retrained model is
// saved under models/tuned/<rank>/1 (an ensemble can pick them up).
//
//   build/examples/example_fashion_mnist_tune [--tuner bayesian|random_search|hyperband]
//                                             [--trials 10] [--epochs 4] [--top 2]
//                                             [--train 20000] [--dir tuning]
//
// The search uses a training subset (--train samples) and training images
// 45,000-49,999 as validation data, so it takes a few minutes on 2 cores;
// the final training uses images 0-49,999; 50,000-59,999 are left for
// ensemble weights; the test set is only touched at the end. Rerun the same command after an
// interruption and the search continues where it stopped.
#include <cstdlib>
#include <iostream>
#include <string>

#include "kiln/core/threads.h"
#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/models/sequential.h"
#include "kiln/tuning/tuner.h"

using namespace kiln;
using namespace kiln::tuning;

ModelPtr build_model(HyperParameters& hp) {
  auto m = models::Sequential();
  m->add(layers::Input({784}));
  const int64_t layers = hp.Int("layers", 1, 2);
  for (int64_t i = 0; i < layers; ++i) m->add(layers::Dense(hp.Int("units", 64, 512, {.step = 64}), "relu"));
  if (hp.Boolean("dropout")) {
    auto scope = hp.conditional_scope("dropout", {true});
    m->add(layers::Dropout(hp.Float("rate", 0.1, 0.5, {.step = 0.1})));
  }
  m->add(layers::Dense(10, "softmax"));
  CompileArgs c = CompileArgs::from_names(hp.Choice("optimizer", std::vector<std::string>{"adam", "rmsprop"}),
                                          "sparse_categorical_crossentropy", {"accuracy"});
  c.optimizer->set_learning_rate(
      hp.Float("learning_rate", 1e-4, 3e-3, {.sampling = Sampling::kLog, .default_value = 1e-3}));
  m->compile(c);
  return m;
}

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  configure_threads();
  std::string kind = "bayesian", dir = "tuning";
  int trials = 10, epochs = 4, top = 2;
  int64_t n_train = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--tuner")
      kind = v;
    else if (a == "--trials")
      trials = std::atoi(v.c_str());
    else if (a == "--epochs")
      epochs = std::atoi(v.c_str());
    else if (a == "--top")
      top = std::atoi(v.c_str());
    else if (a == "--train")
      n_train = std::atoll(v.c_str());
    else if (a == "--dir")
      dir = v;
    else {
      std::cerr << "example_fashion_mnist_tune: unknown option " << a << "\n";
      return 2;
    }
  }
  auto d = datasets::fashion_mnist();
  auto x = d.x_train.to(at::kFloat).div(255.0).reshape({-1, 784});
  auto x_test = d.x_test.to(at::kFloat).div(255.0).reshape({-1, 784});
  // Validation: training images 45,000-49,999; training: the first n_train.
  // Images 50,000-59,999 stay unseen by the search and the final training,
  // so that example_fashion_mnist_ensemble can fit ensemble weights on them.
  auto x_val = x.narrow(0, 45000, 5000), y_val = d.y_train.narrow(0, 45000, 5000);
  n_train = std::min<int64_t>(n_train, 45000);
  auto x_tr = x.narrow(0, 0, n_train), y_tr = d.y_train.narrow(0, 0, n_train);

  Json extra = kind == "hyperband" ? Json{{"max_epochs", epochs}, {"factor", 3}} : Json::object();
  auto oracle = make_oracle(kind,
                            {.objective = "val_accuracy",
                             .max_trials = kind == "hyperband" ? 0 : trials,
                             .seed = 7,
                             .pruner = kind == "hyperband" ? nullptr : std::make_shared<MedianPruner>(3, 1)},
                            extra);
  Tuner tuner(oracle, build_model, {.directory = dir, .project_name = "fashion_mnist_" + kind, .verbose = 1});
  tuner.search_space_summary();
  FitArgs args;
  args.x = {x_tr};
  args.y = {y_tr};
  args.validation_x = {x_val};
  args.validation_y = {y_val};
  args.epochs = epochs;
  args.batch_size = 128;
  args.verbose = 0;
  tuner.search(args);
  std::cout << "\n";
  tuner.results_summary(3);

  std::cout << "\nFinal training of the top " << top << " configurations (train + validation, 1.2x the best epoch):\n";
  FitArgs full = args;
  full.x = {x.narrow(0, 0, 45000)};
  full.y = {d.y_train.narrow(0, 0, 45000)};
  full.epochs = 3 * epochs;
  int rank = 0;
  for (auto& hp : tuner.get_best_hyperparameters(top)) {
    auto r = retrain_on_full_data(build_model, hp, full, "val_accuracy", /*patience=*/2);
    auto scores = r.model->evaluate({.x = {x_test}, .y = {d.y_test}, .batch_size = 512});
    ++rank;
    std::cout << "rank " << rank << ": best epoch " << r.best_epoch << ", retrained " << r.final_epochs
              << " epochs, test_accuracy: " << scores["accuracy"] << "\n";
    r.model->save("models/tuned/" + std::to_string(rank) + "/1");
  }
  return 0;
}
