// The classic Keras listing, in kiln's C++ API: an MLP on Fashion-MNIST with a
// validation split, EarlyStopping, evaluation on the test set, and a saved,
// reloaded model that predicts the same.
//
//   build/examples/example_fashion_mnist_mlp [--epochs 5]
#include <cstdlib>
#include <iostream>
#include <string>

#include "kiln/core/threads.h"
#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/models/sequential.h"
#include "kiln/saving/model_io.h"
#include "kiln/training/callbacks.h"

using namespace kiln;

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  configure_threads();
  int epochs = argc > 2 && std::string(argv[1]) == "--epochs" ? std::atoi(argv[2]) : 5;

  auto d = datasets::fashion_mnist();  // uint8 (60000, 28, 28), int64 labels
  auto x_train = d.x_train.to(at::kFloat).div(255.0).reshape({-1, 784});
  auto x_test = d.x_test.to(at::kFloat).div(255.0).reshape({-1, 784});

  auto model = models::Sequential({
      layers::Input({784}),
      layers::Dense(256, "relu"),
      layers::Dropout(0.2),
      layers::Dense(10, "softmax"),
  });
  model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  model->summary();

  model->fit(
      {.x = {x_train},
       .y = {d.y_train},
       .batch_size = 128,
       .epochs = epochs,
       .verbose = 2,
       .callbacks = {callbacks::EarlyStopping({.monitor = "val_loss", .patience = 2, .restore_best_weights = true})},
       .validation_split = 0.1});

  auto scores = model->evaluate({.x = {x_test}, .y = {d.y_test}, .batch_size = 512});
  std::cout << "test_loss: " << scores["loss"] << " - test_accuracy: " << scores["accuracy"] << "\n";

  model->save("models/example_mlp/1");
  auto restored = load_model("models/example_mlp/1");
  auto a = model->predict(x_test.narrow(0, 0, 8));
  auto b = restored->predict(x_test.narrow(0, 0, 8));
  std::cout << "reloaded model predicts identically: " << (at::equal(a, b) ? "yes" : "no") << "\n";
  return at::equal(a, b) ? 0 : 1;
}
