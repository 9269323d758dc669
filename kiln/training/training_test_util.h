// Shared by kiln/training tests: small layers that depend on nothing but the
// Layer base (so the trainer is tested on its own), a separable problem and
// a model factory. Each factory call starts a fresh name session, like a new
// process, so variable paths match between "runs".
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <string>

#include "kiln/core/initializers.h"
#include "kiln/core/names.h"
#include "kiln/core/random.h"
#include "kiln/layers/layer.h"
#include "kiln/losses/loss.h"
#include "kiln/metrics/metric.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/optimizer.h"

namespace kiln::testing_training {

// y = act(x W + b), glorot_uniform W, zero b.
class TinyDense : public SimpleLayer {
 public:
  explicit TinyDense(int64_t units, std::string activation = "linear")
      : SimpleLayer(Json::object()), units_(units), act_(std::move(activation)) {}
  std::string class_name() const override { return "TinyDense"; }
  void build(const std::vector<Shape>& s) override {
    kernel_ = add_weight("kernel", {s[0].back(), units_}, Initializer::get("glorot_uniform"));
    bias_ = add_weight("bias", {units_}, Initializer::get("zeros"));
  }
  at::Tensor call1(const at::Tensor& x, bool) override {
    at::Tensor y = at::matmul(x, value(kernel_)) + value(bias_);
    if (act_ == "relu") return at::relu(y);
    if (act_ == "softmax") return at::softmax(y, -1);
    return y;
  }

 private:
  int64_t units_;
  std::string act_;
  VariablePtr kernel_, bias_;
};

// Dropout: draws from LibTorch's generator while training (checks that
// checkpoints carry the generator state).
class TinyDropout : public SimpleLayer {
 public:
  explicit TinyDropout(double rate) : SimpleLayer(Json::object()), rate_(rate) {}
  std::string class_name() const override { return "TinyDropout"; }
  at::Tensor call1(const at::Tensor& x, bool training) override { return at::dropout(x, rate_, training); }

 private:
  double rate_;
};

// Two Gaussian blobs in 2-D, labels 0/1 (int64), linearly separable.
struct Problem {
  at::Tensor x, y;
};
inline Problem blobs(int64_t n, uint64_t seed = 3) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor y = at::arange(n, at::kLong).remainder(2);
  at::Tensor centers = at::stack({y.to(at::kFloat) * 2 - 1, y.to(at::kFloat) * 2 - 1}, 1) * 2.0;
  at::Tensor x = centers + at::randn({n, 2}, gen, at::TensorOptions().dtype(at::kFloat)) * 0.5;
  return {x, y};
}

// FitArgs for `epochs` silent epochs on `p` in batches of `batch`.
inline FitArgs quiet(const Problem& p, int epochs, int64_t batch = 16) {
  FitArgs a;
  a.x = {p.x};
  a.y = {p.y};
  a.epochs = epochs;
  a.batch_size = batch;
  a.verbose = 0;
  return a;
}

inline LossPtr scce_logits() {
  return Loss::from_json(Json{{"class_name", "SparseCategoricalCrossentropy"}, {"config", {{"from_logits", true}}}});
}

inline OptimizerPtr optimizer(const std::string& cls, double lr) {
  return Optimizer::from_json(Json{{"class_name", cls}, {"config", {{"learning_rate", lr}}}});
}

// 2 -> 8 (relu) -> [dropout] -> 2 logits, compiled with `opt`, sparse CE
// from logits and accuracy.
inline std::shared_ptr<models::SequentialImpl> make_model(OptimizerPtr opt, double dropout = 0.0) {
  clear_session();
  std::vector<LayerPtr> layers{std::make_shared<TinyDense>(8, "relu")};
  if (dropout > 0) layers.push_back(std::make_shared<TinyDropout>(dropout));
  layers.push_back(std::make_shared<TinyDense>(2));
  auto model = models::Sequential(layers, "model");
  CompileArgs args;
  args.optimizer = std::move(opt);
  args.loss = scce_logits();
  args.metrics = {Metric::get("accuracy", args.loss.get())};
  model->compile(args);
  return model;
}

inline bool same_weights(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].sizes().equals(b[i].sizes()) || !at::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace kiln::testing_training
