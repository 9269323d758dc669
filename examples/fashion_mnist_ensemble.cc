// Pools diverse models into one: the tuned MLPs that
// example_fashion_mnist_tune saved (models/tuned/<rank>/1) plus
// gradient-boosted trees (XGBoost) trained on the same images, with weights
// learned on validation data (Nelder-Mead on log loss) and, for comparison,
// Caruana's greedy selection. Prints each member's and the ensemble's
// validation and test accuracy, saves the ensemble as one model directory
// and checks that the reloaded ensemble predicts identically.
//
//   build/examples/example_fashion_mnist_ensemble [--members models/tuned/1/1,models/tuned/2/1]
//                                                 [--tree_samples 10000] [--rounds 40]
//                                                 [--output models/fashion_mnist_ensemble/1]
//
// Validation data: the last 10,000 training images (the tuned models were
// retrained on all 60,000, so their validation scores are optimistic; the
// weights are fitted there all the same, and the test set decides).
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "kiln/core/threads.h"
#include "kiln/data/datasets.h"
#include "kiln/ensemble/ensemble.h"
#include "kiln/ensemble/gradient_boosted_trees.h"

using namespace kiln;
using namespace kiln::ensemble;

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  configure_threads();
  std::string members = "models/tuned/1/1,models/tuned/2/1", output = "models/fashion_mnist_ensemble/1";
  int64_t tree_samples = 10000;
  int rounds = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--members")
      members = v;
    else if (a == "--tree_samples")
      tree_samples = std::atoll(v.c_str());
    else if (a == "--rounds")
      rounds = std::atoi(v.c_str());
    else if (a == "--output")
      output = v;
    else {
      std::cerr << "example_fashion_mnist_ensemble: unknown option " << a << "\n";
      return 2;
    }
  }
  auto d = datasets::fashion_mnist();
  auto x = d.x_train.to(at::kFloat).div(255.0).reshape({-1, 784});
  auto x_test = d.x_test.to(at::kFloat).div(255.0).reshape({-1, 784});
  auto x_val = x.narrow(0, 50000, 10000), y_val = d.y_train.narrow(0, 50000, 10000);

  Ensemble ens;
  std::stringstream list(members);
  for (std::string dir; std::getline(list, dir, ',');) {
    if (dir.empty()) continue;
    ens.add(dir, load_predictor(dir));
  }
  // Trees see the same pixels; trained on the first tree_samples images
  // (not the validation ones), with early stopping on the validation set.
  tree_samples = std::min<int64_t>(tree_samples, 50000);
  auto gbt = std::make_shared<GradientBoostedTrees>(GradientBoostedTreesOptions{
      .num_class = 10, .max_depth = 5, .eta = 0.3, .rounds = rounds, .early_stopping_rounds = 5});
  gbt->fit(x.narrow(0, 0, tree_samples), d.y_train.narrow(0, 0, tree_samples), x_val, y_val);
  ens.add("xgboost", gbt);

  ens.select_greedy(x_val, y_val, 30);
  auto greedy = ens.evaluate(x_val, y_val, x_test, d.y_test, 1024);
  ens.fit_weights(x_val, y_val);
  auto weighted = ens.evaluate(x_val, y_val, x_test, d.y_test, 1024);
  std::cout << "Greedy selection (Caruana):\n" << Ensemble::format_report(greedy);
  std::cout << "\nWeighted average (Nelder-Mead on validation log loss):\n" << Ensemble::format_report(weighted);
  std::cout << "ensemble test_accuracy: " << weighted.back().test_accuracy << "\n";

  ens.save(output);
  auto again = load_predictor(output);
  auto a = ens.predict({x_test.narrow(0, 0, 256)})[0];
  auto b = again->predict({x_test.narrow(0, 0, 256)})[0];
  const bool same = at::equal(a, b);
  std::cout << "Saved ensemble to " << output << "; reloaded ensemble predicts identically: " << (same ? "yes" : "no")
            << "\n";
  return same ? 0 : 1;
}
