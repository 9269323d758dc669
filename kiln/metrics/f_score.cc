#include "kiln/metrics/f_score.h"

#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/shape.h"
#include "kiln/metrics/metric_fields.h"

namespace kiln::metrics {
namespace {

constexpr double kFScoreEps = 1e-7;

// average (null or a string: the constructor checks its value), beta (FBetaScore's
// only) and threshold.
config::FieldDef<FBetaScoreOptions> average_field() {
  using O = FBetaScoreOptions;
  return {"average",
          [](config::Reader& r, O& o) {
            const Json* a = r.get("average");
            if (a && !a->is_string())
              throw ValueError(
                  r.owner() +
                  ": `average` must be null, \"micro\", \"macro\" or \"weighted\". Received: average=" + a->dump());
            if (a) o.average = a->get<std::string>();
          },
          nullptr, [](Json& j, const O& o) { j["average"] = o.average ? Json(*o.average) : Json(nullptr); }};
}

const config::FieldTable<FBetaScoreOptions>& fbeta_fields() {
  using O = FBetaScoreOptions;
  static const config::FieldTable<O> t = {average_field(), config::field("beta", &O::beta),
                                          config::field("threshold", &O::threshold)};
  return t;
}

const config::FieldTable<FBetaScoreOptions>& f1_fields() {
  using O = FBetaScoreOptions;
  static const config::FieldTable<O> t = {average_field(), config::field("threshold", &O::threshold)};
  return t;
}

}  // namespace

FBetaScore::FBetaScore(std::optional<std::string> average, double beta, std::optional<double> threshold,
                       std::string name)
    : Metric(std::move(name)), options_{.average = std::move(average), .beta = beta, .threshold = threshold} {
  const std::optional<std::string>& avg = options_.average;
  std::ostringstream os;
  if (avg && *avg != "micro" && *avg != "macro" && *avg != "weighted")
    os << class_name() << ": invalid `average` argument value. Expected one of: null, \"micro\", \"macro\", "
       << "\"weighted\". Received: average=" << *avg;
  else if (!(beta > 0))
    os << class_name() << ": invalid `beta` argument value. It should be a float > 0. Received: beta=" << beta;
  else if (threshold && !(*threshold > 0 && *threshold <= 1))
    os << class_name() << ": invalid `threshold` argument value. It should be a float in (0, 1] or null. Received: "
       << "threshold=" << *threshold;
  if (!os.str().empty()) throw ValueError(os.str());
}

std::shared_ptr<FBetaScore> FBetaScore::from_config(const Json& c) {
  std::string name = "fbeta_score";
  const FBetaScoreOptions o = read_metric_config(c, "FBetaScore", name, fbeta_fields());
  return std::make_shared<FBetaScore>(o.average, o.beta, o.threshold, name);
}

void FBetaScore::update_state(const at::Tensor& y_true_in, const at::Tensor& y_pred_in,
                              const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  at::Tensor y_pred = y_pred_in.detach().to(at::kDouble);
  at::Tensor y_true = y_true_in.detach().to(y_pred.device(), at::kDouble);
  if (y_true.dim() != 2 || y_pred.dim() != 2)
    throw ShapeError(class_name() +
                     " expects 2D inputs with shape (batch_size, output_dim). Received input shapes: "
                     "y_true " +
                     sizes_str(y_true) + " and y_pred " + sizes_str(y_pred));
  if (!y_true.sizes().equals(y_pred.sizes()))
    throw ShapeError(class_name() + ": y_true " + sizes_str(y_true) + " and y_pred " + sizes_str(y_pred) +
                     " must have the same shape");
  const int64_t classes = y_pred.size(1);
  if (!tp_.defined()) {
    const std::vector<int64_t> shape =
        options_.average && *options_.average == "micro" ? std::vector<int64_t>{} : std::vector<int64_t>{classes};
    tp_ = at::zeros(shape, y_pred.options());
    fp_ = at::zeros(shape, y_pred.options());
    fn_ = at::zeros(shape, y_pred.options());
    weights_ = at::zeros(shape, y_pred.options());
  } else if (tp_.dim() == 1 && tp_.size(0) != classes) {
    throw ShapeError(name() + ": got " + std::to_string(classes) + " classes after " + std::to_string(tp_.size(0)) +
                     " in earlier batches");
  }
  at::Tensor pred;
  if (options_.threshold) {
    pred = (y_pred > *options_.threshold).to(at::kDouble);
  } else {
    at::Tensor row_max = std::get<0>(y_pred.max(-1, /*keepdim=*/true));
    pred = ((y_pred >= row_max) & (y_pred.abs() > 1e-9)).to(at::kDouble);
  }
  at::Tensor w;
  if (sample_weight.defined()) {
    w = sample_weight.detach().to(y_pred.device(), at::kDouble);
    if (w.dim() == 2 && w.size(1) == 1) w = w.squeeze(1);
    if (w.dim() > 1 || (w.dim() == 1 && w.size(0) != y_true.size(0)))
      throw ShapeError(name() + ": sample_weight must have shape (batch,). Received: " + sizes_str(w));
    w = w.unsqueeze(-1);
  }
  const bool micro = options_.average && *options_.average == "micro";
  auto weighted_sum = [&](const at::Tensor& v) {
    at::Tensor x = w.defined() ? v * w : v;
    return micro ? x.sum() : x.sum(0);
  };
  follow_device(y_pred.device(), {&tp_, &fp_, &fn_, &weights_});
  tp_ += weighted_sum(pred * y_true);
  fp_ += weighted_sum(pred * (1.0 - y_true));
  fn_ += weighted_sum((1.0 - pred) * y_true);
  weights_ += weighted_sum(y_true);
}

at::Tensor FBetaScore::result_per_class() const {
  if (!tp_.defined()) return at::zeros({}, at::kDouble);
  at::Tensor precision = tp_ / (tp_ + fp_ + kFScoreEps);
  at::Tensor recall = tp_ / (tp_ + fn_ + kFScoreEps);
  const double b2 = options_.beta * options_.beta;
  at::Tensor f = precision * recall / (b2 * precision + recall + kFScoreEps) * (1.0 + b2);
  if (options_.average && *options_.average == "weighted")
    return (f * (weights_ / (weights_.sum() + kFScoreEps))).sum();
  if (options_.average) return f.mean();
  return f;
}

double FBetaScore::result() const { return result_per_class().mean().item<double>(); }

void FBetaScore::reset_state() {
  for (at::Tensor* t : {&tp_, &fp_, &fn_, &weights_})
    if (t->defined()) t->zero_();
}

std::vector<at::Tensor> FBetaScore::variables() const {
  if (!tp_.defined()) return {};
  return {tp_, fp_, fn_, weights_};
}

Json FBetaScore::get_config() const { return metric_config(*this, options_, fbeta_fields()); }

F1Score::F1Score(std::optional<std::string> average, std::optional<double> threshold, std::string name)
    : FBetaScore(std::move(average), 1.0, threshold, std::move(name)) {}

std::shared_ptr<F1Score> F1Score::from_config(const Json& c) {
  std::string name = "f1_score";
  const FBetaScoreOptions o = read_metric_config(c, "F1Score", name, f1_fields());
  return std::make_shared<F1Score>(o.average, o.threshold, name);
}

Json F1Score::get_config() const { return metric_config(*this, options_, f1_fields()); }

}  // namespace kiln::metrics
