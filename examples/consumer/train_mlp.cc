// The README's program, built outside kiln's tree against the installed
// package: trains an MLP on the first 6,000 Fashion-MNIST images for one
// epoch, saves it, loads it back and checks the two agree.
#include <cstdio>

#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
using namespace kiln;

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "consumer_model";
  auto d = datasets::fashion_mnist();
  auto x = d.x_train.slice(0, 0, 6000).to(at::kFloat).div(255.0).reshape({-1, 784});
  auto y = d.y_train.slice(0, 0, 6000);
  auto model = models::Sequential({layers::Input({784}), layers::Dense(64, "relu"), layers::Dense(10, "softmax")});
  model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  model->fit({.x = {x}, .y = {y}, .batch_size = 64, .epochs = 1, .verbose = 0});
  model->save(out);
  auto loaded = load_model(out);
  auto xt = d.x_test.slice(0, 0, 1000).to(at::kFloat).div(255.0).reshape({-1, 784});
  auto a = model->predict(xt);
  auto b = loaded->predict(xt);
  auto yt = d.y_test.slice(0, 0, 1000);
  double acc = a.argmax(1).eq(yt).to(at::kFloat).mean().item<double>();
  std::printf("consumer: test accuracy %.4f on 1000 images, reloaded model %s\n", acc,
              a.equal(b) ? "identical" : "DIFFERENT");
  return a.equal(b) && acc > 0.6 ? 0 : 1;
}
