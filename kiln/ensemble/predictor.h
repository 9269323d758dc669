// Predictor: anything that maps input tensors to output tensors and can be
// loaded from a model directory: a kiln Model, a gradient-boosted tree
// model, an Ensemble of them. The model server, batch prediction and
// ensembles load through load_predictor(), which dispatches on model.json's
// class_name ("Ensemble" -> Ensemble, anything else -> kiln::load_model).
//
// Thread safety: predict() is not required to be thread safe; callers that
// share a Predictor across threads serialize calls (the server's batching
// does).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/models/model.h"

namespace kiln::ensemble {

class Predictor {
 public:
  virtual ~Predictor() = default;
  // Batched prediction: one tensor per input -> one per output.
  virtual Tensors predict(const Tensors& x, int64_t batch_size = 256) = 0;
  // Signatures as model_signatures() (kiln/saving/model_io.h) writes them.
  virtual Json signatures() = 0;
  virtual std::string kind() const = 0;  // "kiln", "xgboost", "ensemble"
  // Saves into `dir` (a directory created by the caller's AtomicDirectory).
  virtual void save_to(const std::string& dir) = 0;
};

using PredictorPtr = std::shared_ptr<Predictor>;

// A kiln Model as a Predictor.
class ModelPredictor : public Predictor {
 public:
  explicit ModelPredictor(ModelPtr model) : model_(std::move(model)) {}
  Tensors predict(const Tensors& x, int64_t batch_size = 256) override {
    return model_->predict(x, {.batch_size = batch_size});
  }
  Json signatures() override;
  std::string kind() const override { return "kiln"; }
  void save_to(const std::string& dir) override;
  const ModelPtr& model() const { return model_; }

 private:
  ModelPtr model_;
};

// Loads a model directory: an Ensemble (class_name "Ensemble"), a
// gradient-boosted tree model ("GradientBoostedTrees") or a kiln model.
PredictorPtr load_predictor(const std::string& dir);

}  // namespace kiln::ensemble
