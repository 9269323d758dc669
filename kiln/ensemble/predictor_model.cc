#include "kiln/ensemble/predictor_model.h"

#include <algorithm>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/ensemble/ensemble.h"
#include "kiln/ensemble/gradient_boosted_trees.h"
#include "kiln/saving/model_io.h"

namespace kiln::ensemble {
namespace {

Shape signature_shape(const Json& j) {
  Shape s;
  if (j.is_array())
    for (auto& d : j) s.push_back(d.is_number_integer() ? d.get<int64_t>() : kNone);
  return s;
}

ModelPtr load_predictor_model(const std::string& dir) {
  Json mj = read_model_json(dir);
  const std::string cls = mj["class_name"].get<std::string>();
  PredictorPtr p =
      cls == "Ensemble" ? PredictorPtr(Ensemble::load(dir)) : PredictorPtr(GradientBoostedTrees::load(dir));
  return std::make_shared<PredictorModel>(p, cls, cls == "Ensemble" ? "ensemble" : "gradient_boosted_trees");
}

const bool kRegistered = register_model_directory_loader("Ensemble", load_predictor_model) &&
                         register_model_directory_loader("GradientBoostedTrees", load_predictor_model);

}  // namespace

PredictorModel::PredictorModel(PredictorPtr predictor, std::string class_name, const std::string& name)
    : models::Model(Json{{"name", name}}), predictor_(std::move(predictor)), class_name_(std::move(class_name)) {
  (void)kRegistered;
  Json sig = predictor_->signatures();
  const Json& def = sig.contains("serving_default") ? sig["serving_default"] : Json::object();
  const Json inputs = def.value("inputs", Json::object()), outputs = def.value("outputs", Json::object());
  for (auto& [k, v] : inputs.items()) {
    input_names_.push_back(k);
    input_shapes_.push_back(signature_shape(v.value("shape", Json::array())));
    input_dtypes_.push_back(dtype_from_string(v.value("dtype", "float32")));
  }
  for (auto& [k, v] : outputs.items()) {
    output_names_.push_back(k);
    output_shapes_.push_back(signature_shape(v.value("shape", Json::array())));
  }
  if (input_shapes_.empty())
    throw FormatError("the " + class_name_ + " has no input signature to serve it with (signatures: " + sig.dump() +
                      ")");
  num_outputs_ = output_names_.size();
  mark_built();
}

Tensors PredictorModel::call(const Tensors& inputs, bool training) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = inputs.empty() || inputs[0].dim() == 0 ? 1 : inputs[0].size(0);
  return predictor_->predict(inputs, std::max<int64_t>(n, 1));
}

}  // namespace kiln::ensemble
