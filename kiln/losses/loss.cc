#include "kiln/losses/loss.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/registry.h"
#include "kiln/core/shape.h"
#include "kiln/losses/crossentropy.h"
#include "kiln/losses/hinge.h"
#include "kiln/losses/probabilistic.h"
#include "kiln/losses/regression.h"

namespace kiln {
namespace {

const std::vector<std::string>& reductions() {
  static const std::vector<std::string> r = {"sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", "none"};
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

using LossRegistry = Registry<LossPtr, const Json&>;

template <class T>
Loss::Factory factory_of() {
  return [](const Json& c) -> LossPtr { return T::from_config(c); };
}

LossRegistry& registry() {
  static LossRegistry* r = [] {
    auto* reg = new LossRegistry("loss");  // never destroyed
    reg->add("SparseCategoricalCrossentropy", factory_of<losses::SparseCategoricalCrossentropy>());
    reg->add("CategoricalCrossentropy", factory_of<losses::CategoricalCrossentropy>());
    reg->add("BinaryCrossentropy", factory_of<losses::BinaryCrossentropy>());
    reg->add("MeanSquaredError", factory_of<losses::MeanSquaredError>());
    reg->add("MeanAbsoluteError", factory_of<losses::MeanAbsoluteError>());
    reg->add("Huber", factory_of<losses::Huber>());
    reg->add("KLDivergence", factory_of<losses::KLDivergence>());
    reg->add("Hinge", factory_of<losses::Hinge>());
    reg->add("SquaredHinge", factory_of<losses::SquaredHinge>());
    reg->add("LogCosh", factory_of<losses::LogCosh>());
    reg->add("Poisson", factory_of<losses::Poisson>());
    reg->add("CosineSimilarity", factory_of<losses::CosineSimilarity>());
    reg->add("BinaryFocalCrossentropy", factory_of<losses::BinaryFocalCrossentropy>());
    return reg;
  }();
  return *r;
}

// Keras's function names and aliases -> class names.
const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> a = {
      {"sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"},
      {"categorical_crossentropy", "CategoricalCrossentropy"},
      {"binary_crossentropy", "BinaryCrossentropy"},
      {"mean_squared_error", "MeanSquaredError"},
      {"mse", "MeanSquaredError"},
      {"MSE", "MeanSquaredError"},
      {"mean_absolute_error", "MeanAbsoluteError"},
      {"mae", "MeanAbsoluteError"},
      {"MAE", "MeanAbsoluteError"},
      {"huber", "Huber"},
      {"huber_loss", "Huber"},
      {"kl_divergence", "KLDivergence"},
      {"kld", "KLDivergence"},
      {"KLD", "KLDivergence"},
      {"hinge", "Hinge"},
      {"squared_hinge", "SquaredHinge"},
      {"log_cosh", "LogCosh"},
      {"logcosh", "LogCosh"},
      {"poisson", "Poisson"},
      {"cosine_similarity", "CosineSimilarity"},
      {"binary_focal_crossentropy", "BinaryFocalCrossentropy"},
  };
  return a;
}

}  // namespace

Loss::Loss(std::string name, std::string reduction) : name_(std::move(name)), reduction_(std::move(reduction)) {
  const auto& r = reductions();
  if (std::find(r.begin(), r.end(), reduction_) == r.end())
    throw ValueError("Invalid value for argument `reduction`. Expected one of {" + join(r) +
                     "}. Received: reduction=" + reduction_);
}

at::Tensor Loss::operator()(const at::Tensor& y_true, const at::Tensor& y_pred, const at::Tensor& sample_weight) const {
  at::Tensor values = call(y_true, y_pred);
  if (values.scalar_type() != at::kFloat) values = values.to(at::kFloat);
  at::Tensor weight;
  if (sample_weight.defined()) weight = sample_weight.to(values.device(), at::kFloat);

  // Masked entries get weight 0; for the averaging reductions the others are
  // scaled by total/valid so the divisor becomes the number of valid entries.
  at::Tensor mask = valid_mask(y_true, y_pred);
  if (mask.defined()) {
    mask = mask.to(values.device(), at::kFloat);
    if (reduction_ == "sum_over_batch_size" || reduction_ == "mean")
      mask = mask * (static_cast<double>(mask.numel()) / (mask.sum() + 1e-7));
    if (weight.defined()) {
      losses::squeeze_or_expand_to_same_rank(mask, weight);
      losses::check_broadcastable(mask, weight, name_ + ": sample_weight");
      weight = weight * mask;
    } else {
      weight = mask;
    }
  }

  if (weight.defined()) {
    losses::squeeze_or_expand_to_same_rank(values, weight);
    // Weights of shape (batch,) apply to every entry of a sample.
    while (weight.dim() < values.dim() && weight.dim() > 0) weight = weight.unsqueeze(-1);
    losses::check_broadcastable(values, weight, name_ + ": sample_weight");
    values = values * weight;
  }

  if (reduction_ == "none" || values.dim() == 0) return values;
  if (values.numel() == 0) return at::zeros({}, values.options());
  at::Tensor loss = values.sum();
  if (reduction_ == "sum_over_batch_size" || reduction_ == "mean") {
    loss = loss / static_cast<double>(values.numel());
  } else if (reduction_ == "mean_with_sample_weight") {
    at::Tensor divisor = weight.defined() ? weight.expand_as(values).sum()
                                          : at::full({}, static_cast<double>(values.numel()), loss.options());
    loss = at::where(divisor == 0, at::zeros_like(loss), loss / divisor);
  }
  return loss;
}

Json Loss::get_config() const { return Json{{"name", name_}, {"reduction", reduction_}}; }

Json Loss::to_json() const { return Json{{"class_name", class_name()}, {"config", get_config()}}; }

void Loss::check_keys(const Json& config, const std::vector<std::string>& allowed, const std::string& owner) {
  if (config.is_null()) return;
  std::vector<std::string> known = {"name", "reduction", "dtype"};
  known.insert(known.end(), allowed.begin(), allowed.end());
  check_config_keys(config, known, owner + " config");
}

bool Loss::register_class(const std::string& class_name, Factory factory) {
  return registry().add(class_name, std::move(factory));
}

std::vector<std::string> Loss::known_names() {
  std::vector<std::string> names;
  for (auto& [alias, cls] : aliases()) names.push_back(alias);
  for (auto& cls : registry().names()) names.push_back(cls);
  return names;
}

LossPtr Loss::get(const std::string& name) {
  std::string cls = name;
  auto a = aliases().find(name);
  if (a != aliases().end()) cls = a->second;
  Factory factory = registry().find(cls);
  if (!factory)
    throw ValueError("Could not interpret loss identifier: '" + name + "'. Known losses: " + join(known_names()));
  return factory(Json::object());
}

LossPtr Loss::from_json(const Json& j) {
  if (j.is_string()) return get(j.get<std::string>());
  if (!j.is_object() || !j.contains("class_name") || !j["class_name"].is_string())
    throw ValueError("A loss must be a name or {\"class_name\": ..., \"config\": {...}}. Received: " + json_excerpt(j));
  const std::string cls = j["class_name"].get<std::string>();
  Factory factory = registry().find(cls);
  if (!factory) {
    // Keras also writes function losses as {"class_name": "function", "config": "mse"}-like forms.
    if (aliases().count(cls)) return get(cls);
    throw ValueError("Unknown loss class '" + cls + "'. Known losses: " + join(known_names()));
  }
  Json config = j.contains("config") && !j["config"].is_null() ? j["config"] : Json::object();
  return factory(config);
}

namespace losses {

void squeeze_or_expand_to_same_rank(at::Tensor& x1, at::Tensor& x2, bool expand_rank_1) {
  const int64_t r1 = x1.dim(), r2 = x2.dim();
  if (r1 == r2) return;
  if (r1 == r2 + 1 && x1.size(-1) == 1) {
    if (r2 == 1 && expand_rank_1)
      x2 = x2.unsqueeze(-1);
    else
      x1 = x1.squeeze(-1);
  }
  if (r2 == r1 + 1 && x2.size(-1) == 1) {
    if (r1 == 1 && expand_rank_1)
      x1 = x1.unsqueeze(-1);
    else
      x2 = x2.squeeze(-1);
  }
}

void check_broadcastable(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  const auto sa = a.sizes(), sb = b.sizes();
  const size_t n = std::max(sa.size(), sb.size());
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < sa.size() ? sa[sa.size() - 1 - i] : 1;
    const int64_t db = i < sb.size() ? sb[sb.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1)
      throw ShapeError(what + ": shapes " + sizes_str(a) + " and " + sizes_str(b) + " are incompatible");
  }
}

}  // namespace losses
}  // namespace kiln
