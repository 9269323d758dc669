#include "kiln/metrics/metric.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/registry.h"
#include "kiln/losses/loss.h"
#include "kiln/metrics/accuracy_metrics.h"
#include "kiln/metrics/confusion_metrics.h"
#include "kiln/metrics/f_score.h"
#include "kiln/metrics/iou_metrics.h"
#include "kiln/metrics/regression_metrics.h"

namespace kiln {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

using MetricRegistry = Registry<MetricPtr, const Json&>;

template <class T>
Metric::Factory factory_of() {
  return [](const Json& c) -> MetricPtr { return T::from_config(c); };
}

MetricRegistry& registry() {
  static MetricRegistry* r = [] {
    auto* reg = new MetricRegistry("metric");  // never destroyed
    using namespace metrics;
    reg->add("Mean",
             [](const Json& c) -> MetricPtr { return std::make_shared<Mean>(get_or<std::string>(c, "name", "mean")); });
    reg->add("Accuracy", factory_of<Accuracy>());
    reg->add("BinaryAccuracy", factory_of<BinaryAccuracy>());
    reg->add("CategoricalAccuracy", factory_of<CategoricalAccuracy>());
    reg->add("SparseCategoricalAccuracy", factory_of<SparseCategoricalAccuracy>());
    reg->add("TopKCategoricalAccuracy", factory_of<TopKCategoricalAccuracy>());
    reg->add("SparseTopKCategoricalAccuracy", factory_of<SparseTopKCategoricalAccuracy>());
    reg->add("AutoAccuracy", factory_of<AutoAccuracy>());
    reg->add("AUC", factory_of<AUC>());
    reg->add("Precision", factory_of<Precision>());
    reg->add("Recall", factory_of<Recall>());
    reg->add("MeanAbsoluteError", factory_of<metrics::MeanAbsoluteError>());
    reg->add("MeanSquaredError", factory_of<metrics::MeanSquaredError>());
    reg->add("RootMeanSquaredError", factory_of<metrics::RootMeanSquaredError>());
    reg->add("R2Score", factory_of<metrics::R2Score>());
    reg->add("F1Score", factory_of<metrics::F1Score>());
    reg->add("FBetaScore", factory_of<metrics::FBetaScore>());
    reg->add("MeanIoU", factory_of<metrics::MeanIoU>());
    return reg;
  }();
  return *r;
}

// Keras's function names and aliases -> class names.
const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> a = {
      {"binary_accuracy", "BinaryAccuracy"},
      {"categorical_accuracy", "CategoricalAccuracy"},
      {"sparse_categorical_accuracy", "SparseCategoricalAccuracy"},
      {"top_k_categorical_accuracy", "TopKCategoricalAccuracy"},
      {"sparse_top_k_categorical_accuracy", "SparseTopKCategoricalAccuracy"},
      {"auc", "AUC"},
      {"precision", "Precision"},
      {"recall", "Recall"},
      {"mae", "MeanAbsoluteError"},
      {"mean_absolute_error", "MeanAbsoluteError"},
      {"mse", "MeanSquaredError"},
      {"mean_squared_error", "MeanSquaredError"},
      {"root_mean_squared_error", "RootMeanSquaredError"},
      {"r2_score", "R2Score"},
      {"f1_score", "F1Score"},
      {"fbeta_score", "FBetaScore"},
      {"mean_iou", "MeanIoU"},
  };
  return a;
}

Metric::Factory find_class(const std::string& cls) { return registry().find(cls); }

// "accuracy" as Keras resolves it: by the loss when it says (Keras 2's rule),
// else by the shapes of the first batch (Keras 3's rule).
MetricPtr resolve_accuracy(const std::string& name, const Loss* loss) {
  const std::string cls = loss ? loss->class_name() : "";
  if (cls == "SparseCategoricalCrossentropy") return std::make_shared<metrics::SparseCategoricalAccuracy>(name);
  if (cls == "CategoricalCrossentropy") return std::make_shared<metrics::CategoricalAccuracy>(name);
  if (cls == "BinaryCrossentropy") return std::make_shared<metrics::BinaryAccuracy>(name);
  return std::make_shared<metrics::AutoAccuracy>(name);
}

}  // namespace

// --- Metric -------------------------------------------------------------------------------

void Metric::check_keys(const Json& config, const std::vector<std::string>& allowed, const std::string& owner) {
  if (config.is_null()) return;
  std::vector<std::string> known = {"name", "dtype"};
  known.insert(known.end(), allowed.begin(), allowed.end());
  check_config_keys(config, known, owner + " config");
}

bool Metric::register_class(const std::string& class_name, Factory factory) {
  return registry().add(class_name, std::move(factory));
}

std::vector<std::string> Metric::known_names() {
  std::vector<std::string> names = {"accuracy", "acc"};
  for (auto& [alias, cls] : aliases()) names.push_back(alias);
  for (auto& cls : registry().names()) names.push_back(cls);
  return names;
}

MetricPtr Metric::get(const std::string& name, const Loss* loss) {
  const std::string low = lower(name);
  if (low == "accuracy" || low == "acc") return resolve_accuracy(name, loss);
  auto a = aliases().find(name);
  Factory f = find_class(a != aliases().end() ? a->second : name);
  if (!f)
    throw ValueError("Could not interpret metric identifier: '" + name + "'. Known metrics: " + join(known_names()));
  MetricPtr m = f(Json::object());
  m->set_name(name);
  return m;
}

MetricPtr Metric::from_json(const Json& j, const Loss* loss) {
  if (j.is_string()) return get(j.get<std::string>(), loss);
  if (!j.is_object() || !j.contains("class_name") || !j["class_name"].is_string())
    throw ValueError("A metric must be a name or {\"class_name\": ..., \"config\": {...}}. Received: " +
                     json_excerpt(j));
  const std::string cls = j["class_name"].get<std::string>();
  Factory f = find_class(cls);
  if (!f) throw ValueError("Unknown metric class '" + cls + "'. Known metrics: " + join(known_names()));
  Json config = j.contains("config") && !j["config"].is_null() ? j["config"] : Json::object();
  return f(config);
}

// --- Mean -----------------------------------------------------------------------------------

Mean::Mean(std::string name)
    : Metric(std::move(name)), total_(at::zeros({}, at::kDouble)), count_(at::zeros({}, at::kDouble)) {}

void Mean::update_state(const at::Tensor& values_in, const at::Tensor& unused, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  at::Tensor values = values_in.detach().to(at::kDouble);
  at::Tensor weight;
  if (sample_weight.defined()) {
    weight = sample_weight.detach().to(values.device(), at::kDouble);
    losses::squeeze_or_expand_to_same_rank(values, weight);
    const int64_t wd = weight.dim();
    if (values.dim() > wd) {
      std::vector<int64_t> dims;
      for (int64_t d = wd; d < values.dim(); ++d) dims.push_back(d);
      values = values.mean(dims);
    }
    losses::check_broadcastable(values, weight, name() + ": sample_weight");
    if (weight.dim() > values.dim()) throw ShapeError(name() + ": sample_weight has more dimensions than the values");
    weight = weight.expand(values.sizes());
    values = values * weight;
    if (wd > 1) {
      std::vector<int64_t> dims;
      for (int64_t d = 1; d < wd; ++d) dims.push_back(d);
      weight = weight.mean(dims);
    }
  }
  if (values.dim() > 1) {
    std::vector<int64_t> dims;
    for (int64_t d = 1; d < values.dim(); ++d) dims.push_back(d);
    values = values.mean(dims);
  }
  // The sums stay where the values are (a GPU's: no host round trip per
  // step); they start on the host and follow the first batch.
  follow_device(values.device(), {&total_, &count_});
  total_ += values.sum();
  if (weight.defined())
    count_ += weight.sum();
  else
    count_ += static_cast<double>(values.dim() >= 1 ? values.size(0) : 1);
}

void Mean::update(double value, double weight) {
  total_ += value * weight;
  count_ += weight;
}

void Mean::update(const at::Tensor& value, double weight) {
  at::NoGradGuard ng;
  at::Tensor v = value.detach().reshape({}).to(at::kDouble);
  follow_device(v.device(), {&total_, &count_});
  total_ += v * weight;
  count_ += weight;
}

double Mean::result() const {
  const double c = count_.item<double>();
  return c == 0 ? 0.0 : total_.item<double>() / c;
}

void Mean::reset_state() {
  total_.zero_();
  count_.zero_();
}

void MeanMetricWrapper::update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                                     const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  Mean::update_state(values(y_true.detach(), y_pred.detach()), at::Tensor(), sample_weight);
}

}  // namespace kiln
