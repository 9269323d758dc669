#include "kiln/metrics/regression_metrics.h"

#include <cmath>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/shape.h"
#include "kiln/losses/loss.h"
#include "kiln/losses/regression.h"
#include "kiln/metrics/metric_fields.h"

namespace kiln::metrics {

std::shared_ptr<MeanAbsoluteError> MeanAbsoluteError::from_config(const Json& c) {
  return plain_metric_from_config<MeanAbsoluteError>(c);
}

at::Tensor MeanAbsoluteError::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  static const losses::MeanAbsoluteError fn;
  return fn.call(y_true, y_pred);
}

std::shared_ptr<MeanSquaredError> MeanSquaredError::from_config(const Json& c) {
  return plain_metric_from_config<MeanSquaredError>(c);
}

at::Tensor MeanSquaredError::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  static const losses::MeanSquaredError fn;
  return fn.call(y_true, y_pred);
}

// --- RootMeanSquaredError --------------------------------------------------------------

std::shared_ptr<RootMeanSquaredError> RootMeanSquaredError::from_config(const Json& c) {
  return plain_metric_from_config<RootMeanSquaredError>(c);
}

void RootMeanSquaredError::update_state(const at::Tensor& y_true_in, const at::Tensor& y_pred_in,
                                        const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  at::Tensor y_pred = y_pred_in.detach().to(at::kDouble);
  at::Tensor y_true = y_true_in.detach().to(y_pred.device(), at::kDouble);
  losses::squeeze_or_expand_to_same_rank(y_true, y_pred);
  losses::check_broadcastable(y_true, y_pred, name() + ": y_true and y_pred");
  Mean::update_state((y_pred - y_true).square(), at::Tensor(), sample_weight);
}

double RootMeanSquaredError::result() const { return std::sqrt(Mean::result()); }

// --- R2Score --------------------------------------------------------------------------------

namespace {
const config::FieldTable<R2Score::Options>& r2_fields() {
  using O = R2Score::Options;
  static const config::FieldTable<O> t = {{"class_aggregation",
                                           [](config::Reader& r, O& o) {
                                             if (r.has("class_aggregation"))
                                               o.class_aggregation = r.string("class_aggregation", "");
                                             r.get("class_aggregation");  // marks it read
                                           },
                                           nullptr,
                                           [](Json& j, const O& o) {
                                             j["class_aggregation"] =
                                                 o.class_aggregation ? Json(*o.class_aggregation) : Json(nullptr);
                                           }},
                                          config::field("num_regressors", &O::num_regressors)};
  return t;
}
}  // namespace

R2Score::R2Score(std::optional<std::string> class_aggregation, int64_t num_regressors, std::string name)
    : Metric(std::move(name)),
      options_{.class_aggregation = std::move(class_aggregation), .num_regressors = num_regressors} {
  const std::optional<std::string>& agg = options_.class_aggregation;
  if (agg && *agg != "uniform_average" && *agg != "variance_weighted_average")
    throw ValueError(
        "R2Score: invalid value for argument `class_aggregation`. Expected one of: null, \"uniform_average\", "
        "\"variance_weighted_average\". Received: class_aggregation=" +
        *agg);
  if (num_regressors < 0)
    throw ValueError(
        "R2Score: invalid value for argument `num_regressors`. Expected a value >= 0. Received: "
        "num_regressors=" +
        std::to_string(num_regressors));
  num_samples_ = at::zeros({}, at::kDouble);
}

std::shared_ptr<R2Score> R2Score::from_config(const Json& c) {
  std::string name = "r2_score";
  Options o;
  // class_aggregation: absent is "uniform_average", null is per output.
  if (c.is_object() && c.contains("class_aggregation")) o.class_aggregation.reset();
  o = read_metric_config(c, "R2Score", name, r2_fields(), o);
  return std::make_shared<R2Score>(o.class_aggregation, o.num_regressors, name);
}

void R2Score::update_state(const at::Tensor& y_true_in, const at::Tensor& y_pred_in, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  at::Tensor y_pred = y_pred_in.detach().to(at::kDouble);
  at::Tensor y_true = y_true_in.detach().to(y_pred.device(), at::kDouble);
  losses::squeeze_or_expand_to_same_rank(y_true, y_pred);
  if (y_true.dim() != 2 || y_pred.dim() != 2 || !y_true.sizes().equals(y_pred.sizes()))
    throw ShapeError(
        "R2Score expects 2D inputs with shape (batch_size, output_dim). Received input shapes: "
        "y_pred " +
        sizes_str(y_pred_in) + " and y_true " + sizes_str(y_true_in));
  const int64_t outputs = y_true.size(1);
  if (!sum_.defined()) {
    sum_ = at::zeros({outputs}, y_pred.options());
    squared_sum_ = at::zeros({outputs}, y_pred.options());
    total_mse_ = at::zeros({outputs}, y_pred.options());
    count_ = at::zeros({outputs}, y_pred.options());
  } else if (sum_.size(0) != outputs) {
    throw ShapeError(name() + ": got " + std::to_string(outputs) + " outputs after " + std::to_string(sum_.size(0)) +
                     " in earlier batches");
  }
  at::Tensor w = at::ones({}, y_pred.options());
  if (sample_weight.defined()) {
    w = sample_weight.detach().to(y_pred.device(), at::kDouble);
    if (w.dim() == 1) w = w.unsqueeze(1);
    losses::check_broadcastable(w, y_true, name() + ": sample_weight");
  }
  w = w.expand(y_true.sizes());
  follow_device(y_pred.device(), {&sum_, &squared_sum_, &total_mse_, &count_, &num_samples_});
  at::Tensor weighted = y_true * w;
  sum_ += weighted.sum(0);
  squared_sum_ += (y_true * weighted).sum(0);
  total_mse_ += ((y_true - y_pred).square() * w).sum(0);
  count_ += w.sum(0);
  num_samples_ += static_cast<double>(y_true.numel());
}

at::Tensor R2Score::result_per_class() const {
  if (!sum_.defined()) return at::full({}, std::nan(""), at::kDouble);
  at::Tensor mean = sum_ / count_;
  at::Tensor total = squared_sum_ - sum_ * mean;
  at::Tensor raw = 1.0 - total_mse_ / total;
  raw = at::where(raw.isinf(), at::zeros_like(raw), raw);
  at::Tensor r2;
  if (!options_.class_aggregation)
    r2 = raw;
  else if (*options_.class_aggregation == "uniform_average")
    r2 = raw.mean();
  else
    r2 = (total * raw).sum() / total.sum();
  if (options_.num_regressors != 0) {
    const double n = num_samples_.item<double>(), p = static_cast<double>(options_.num_regressors);
    if (p < n - 1) r2 = 1.0 - (1.0 - r2) * (n - 1.0) / (n - p - 1.0);
  }
  return r2;
}

double R2Score::result() const { return result_per_class().mean().item<double>(); }

void R2Score::reset_state() {
  for (at::Tensor* t : {&sum_, &squared_sum_, &total_mse_, &count_, &num_samples_})
    if (t->defined()) t->zero_();
}

std::vector<at::Tensor> R2Score::variables() const {
  if (!sum_.defined()) return {num_samples_};
  return {sum_, squared_sum_, total_mse_, count_, num_samples_};
}

Json R2Score::get_config() const { return metric_config(*this, options_, r2_fields()); }

}  // namespace kiln::metrics
