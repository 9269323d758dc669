// PredictorModel: a Predictor (an Ensemble, gradient-boosted trees) as a
// kiln Model, so that everything that loads model directories through
// load_model() -- `kiln show`, `kiln predict`, `kiln batch-predict`, the
// model server -- takes an ensemble directory like any model.
//
//   ModelPtr m = load_model("models/fmnist_ensemble/1");   // class_name "Ensemble"
//   at::Tensor p = m->predict(x);                          // the mixed probabilities
//
// This file registers model-directory loaders (kiln/saving/model_io.h) for
// the class names "Ensemble" and "GradientBoostedTrees". The model is
// inference only: its inputs and outputs come from the saved signatures,
// it has no layers or variables, and fit(), save() and quantize() do not
// apply (save the Predictor itself).
//
// Thread safety: call() serializes on a mutex (Predictor::predict need not
// be thread safe; the server calls from several threads).
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "kiln/ensemble/predictor.h"
#include "kiln/models/model.h"

namespace kiln::ensemble {

class PredictorModel : public models::Model {
 public:
  // `class_name` as model.json names it; `signatures` as Predictor::signatures().
  PredictorModel(PredictorPtr predictor, std::string class_name, const std::string& name);

  std::string class_name() const override { return class_name_; }
  std::vector<Shape> input_shapes() const override { return input_shapes_; }
  std::vector<at::ScalarType> input_dtypes() const override { return input_dtypes_; }
  std::vector<std::string> input_names() const override { return input_names_; }
  std::vector<std::string> output_names() const override { return output_names_; }
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override { return output_shapes_; }
  void build(const std::vector<Shape>& input_shapes) override {}
  bool autocast() const override { return false; }
  Tensors call(const Tensors& inputs, bool training) override;

  const PredictorPtr& predictor() const { return predictor_; }

 private:
  PredictorPtr predictor_;
  std::string class_name_;
  std::vector<Shape> input_shapes_, output_shapes_;
  std::vector<at::ScalarType> input_dtypes_;
  std::vector<std::string> input_names_, output_names_;
  std::mutex mu_;  // guards calls into predictor_
};

}  // namespace kiln::ensemble
