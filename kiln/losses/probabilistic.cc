#include "kiln/losses/probabilistic.h"

#include <cmath>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln::losses {
namespace {

constexpr double kProbEps = 1e-7;  // Keras's backend.epsilon()

// float32 y_true, y_pred after Keras's rank reconciliation.
void prob_prepare(const at::Tensor& y_true_in, const at::Tensor& y_pred_in, at::Tensor& y_true, at::Tensor& y_pred,
                  const std::string& owner) {
  y_pred = y_pred_in.to(at::kFloat);
  y_true = y_true_in.to(y_pred.device(), at::kFloat);
  squeeze_or_expand_to_same_rank(y_true, y_pred);
  check_broadcastable(y_true, y_pred, owner + ": y_true and y_pred");
}

at::Tensor prob_reduce_last(const at::Tensor& t, bool sum) {
  if (t.dim() == 0) return t;
  return sum ? t.sum(-1) : t.mean(-1);
}

std::string prob_reduction_of(const Json& c) { return get_or<std::string>(c, "reduction", "sum_over_batch_size"); }

}  // namespace

// --- KLDivergence -------------------------------------------------------------------------

KLDivergence::KLDivergence(std::string reduction, std::string name) : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<KLDivergence> KLDivergence::from_config(const Json& c) {
  check_keys(c, {}, "KLDivergence");
  return std::make_shared<KLDivergence>(prob_reduction_of(c), get_or<std::string>(c, "name", "kl_divergence"));
}

at::Tensor KLDivergence::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  t = t.clamp(kProbEps, 1.0);
  p = p.clamp(kProbEps, 1.0);
  return prob_reduce_last(t * (t / p).log(), /*sum=*/true);
}

// --- Poisson ------------------------------------------------------------------------------

Poisson::Poisson(std::string reduction, std::string name) : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<Poisson> Poisson::from_config(const Json& c) {
  check_keys(c, {}, "Poisson");
  return std::make_shared<Poisson>(prob_reduction_of(c), get_or<std::string>(c, "name", "poisson"));
}

at::Tensor Poisson::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  return prob_reduce_last(p - t * (p + kProbEps).log(), /*sum=*/false);
}

// --- LogCosh ------------------------------------------------------------------------------

LogCosh::LogCosh(std::string reduction, std::string name) : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<LogCosh> LogCosh::from_config(const Json& c) {
  check_keys(c, {}, "LogCosh");
  return std::make_shared<LogCosh>(prob_reduction_of(c), get_or<std::string>(c, "name", "log_cosh"));
}

at::Tensor LogCosh::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  at::Tensor x = p - t;
  return prob_reduce_last(x + at::softplus(x * -2.0) - std::log(2.0), /*sum=*/false);
}

// --- CosineSimilarity ---------------------------------------------------------------------

CosineSimilarity::CosineSimilarity(const CosineSimilarityOptions& o) : Loss(o.name, o.reduction), axis_(o.axis) {}

std::shared_ptr<CosineSimilarity> CosineSimilarity::from_config(const Json& c) {
  check_keys(c, {"axis"}, "CosineSimilarity");
  return std::make_shared<CosineSimilarity>(
      CosineSimilarityOptions{.axis = get_or<int64_t>(c, "axis", -1),
                              .reduction = prob_reduction_of(c),
                              .name = get_or<std::string>(c, "name", "cosine_similarity")});
}

at::Tensor CosineSimilarity::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  if (t.dim() == 0 || axis_ >= t.dim() || axis_ < -t.dim())
    throw ShapeError("CosineSimilarity: axis " + std::to_string(axis_) + " is out of range for inputs of rank " +
                     std::to_string(t.dim()));
  auto normalize = [&](const at::Tensor& x) {
    return x * x.square().sum(axis_, /*keepdim=*/true).clamp_min(kProbEps).rsqrt();
  };
  at::Tensor nt = normalize(t), np_ = normalize(p);
  return -(nt * np_).sum(axis_);
}

Json CosineSimilarity::get_config() const {
  Json c = Loss::get_config();
  c["axis"] = axis_;
  return c;
}

// --- BinaryFocalCrossentropy --------------------------------------------------------------

BinaryFocalCrossentropy::BinaryFocalCrossentropy(const BinaryFocalCrossentropyOptions& o)
    : Loss(o.name, o.reduction),
      apply_class_balancing_(o.apply_class_balancing),
      alpha_(o.alpha),
      gamma_(o.gamma),
      from_logits_(o.from_logits),
      label_smoothing_(o.label_smoothing),
      axis_(o.axis) {
  std::ostringstream os;
  if (!(gamma_ >= 0))
    os << "BinaryFocalCrossentropy: `gamma` must be non-negative. Received: gamma=" << gamma_;
  else if (!(alpha_ >= 0 && alpha_ <= 1))
    os << "BinaryFocalCrossentropy: `alpha` must be in [0, 1]. Received: alpha=" << alpha_;
  else if (!(label_smoothing_ >= 0 && label_smoothing_ <= 1))
    os << "BinaryFocalCrossentropy: `label_smoothing` must be in [0, 1]. Received: label_smoothing="
       << label_smoothing_;
  if (!os.str().empty()) throw ValueError(os.str());
}

std::shared_ptr<BinaryFocalCrossentropy> BinaryFocalCrossentropy::from_config(const Json& c) {
  check_keys(c, {"apply_class_balancing", "alpha", "gamma", "from_logits", "label_smoothing", "axis"},
             "BinaryFocalCrossentropy");
  return std::make_shared<BinaryFocalCrossentropy>(
      BinaryFocalCrossentropyOptions{.apply_class_balancing = get_or<bool>(c, "apply_class_balancing", false),
                                     .alpha = get_or<double>(c, "alpha", 0.25),
                                     .gamma = get_or<double>(c, "gamma", 2.0),
                                     .from_logits = get_or<bool>(c, "from_logits", false),
                                     .label_smoothing = get_or<double>(c, "label_smoothing", 0.0),
                                     .axis = get_or<int64_t>(c, "axis", -1),
                                     .reduction = prob_reduction_of(c),
                                     .name = get_or<std::string>(c, "name", "binary_focal_crossentropy")});
}

at::Tensor BinaryFocalCrossentropy::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  if (label_smoothing_ > 0) t = t * (1.0 - label_smoothing_) + 0.5 * label_smoothing_;
  if (from_logits_) p = at::sigmoid(p);
  at::Tensor clipped = p.clamp(kProbEps, 1.0 - kProbEps);
  at::Tensor bce = -(t * clipped.log() + (1.0 - t) * (1.0 - clipped).log());
  at::Tensor p_t = t * p + (1.0 - t) * (1.0 - p);
  at::Tensor focal = (1.0 - p_t).pow(gamma_) * bce;
  if (apply_class_balancing_) focal = (t * alpha_ + (1.0 - t) * (1.0 - alpha_)) * focal;
  return focal.dim() == 0 ? focal : focal.mean(axis_);
}

Json BinaryFocalCrossentropy::get_config() const {
  Json c = Loss::get_config();
  c["apply_class_balancing"] = apply_class_balancing_;
  c["alpha"] = alpha_;
  c["gamma"] = gamma_;
  c["from_logits"] = from_logits_;
  c["label_smoothing"] = label_smoothing_;
  c["axis"] = axis_;
  return c;
}

}  // namespace kiln::losses
