#include "kiln/losses/probabilistic.h"

#include <cmath>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/losses/loss_fields.h"

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

}  // namespace

// --- KLDivergence -------------------------------------------------------------------------

KLDivergence::KLDivergence(std::string reduction, std::string name) : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<KLDivergence> KLDivergence::from_config(const Json& c) {
  return plain_loss_from_config<KLDivergence>(c);
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

std::shared_ptr<Poisson> Poisson::from_config(const Json& c) { return plain_loss_from_config<Poisson>(c); }

at::Tensor Poisson::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  return prob_reduce_last(p - t * (p + kProbEps).log(), /*sum=*/false);
}

// --- LogCosh ------------------------------------------------------------------------------

LogCosh::LogCosh(std::string reduction, std::string name) : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<LogCosh> LogCosh::from_config(const Json& c) { return plain_loss_from_config<LogCosh>(c); }

at::Tensor LogCosh::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  at::Tensor x = p - t;
  return prob_reduce_last(x + at::softplus(x * -2.0) - std::log(2.0), /*sum=*/false);
}

// --- CosineSimilarity ---------------------------------------------------------------------

namespace {
const config::FieldTable<CosineSimilarityOptions>& cosine_fields() {
  static const auto t = loss_fields<CosineSimilarityOptions>({config::field("axis", &CosineSimilarityOptions::axis)});
  return t;
}
}  // namespace

CosineSimilarity::CosineSimilarity(const CosineSimilarityOptions& o) : Loss(o.name, o.reduction), options_(o) {}

std::shared_ptr<CosineSimilarity> CosineSimilarity::from_config(const Json& c) {
  return std::make_shared<CosineSimilarity>(read_loss_config(c, "CosineSimilarity", cosine_fields()));
}

at::Tensor CosineSimilarity::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  const int64_t axis = options_.axis;
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  if (t.dim() == 0 || axis >= t.dim() || axis < -t.dim())
    throw ShapeError("CosineSimilarity: axis " + std::to_string(axis) + " is out of range for inputs of rank " +
                     std::to_string(t.dim()));
  auto normalize = [&](const at::Tensor& x) {
    return x * x.square().sum(axis, /*keepdim=*/true).clamp_min(kProbEps).rsqrt();
  };
  at::Tensor nt = normalize(t), np_ = normalize(p);
  return -(nt * np_).sum(axis);
}

Json CosineSimilarity::get_config() const { return config::fields_json(options_, cosine_fields()); }

// --- BinaryFocalCrossentropy --------------------------------------------------------------

namespace {
const config::FieldTable<BinaryFocalCrossentropyOptions>& focal_fields() {
  using O = BinaryFocalCrossentropyOptions;
  static const auto t = loss_fields<O>(
      {config::field("apply_class_balancing", &O::apply_class_balancing), config::field("alpha", &O::alpha),
       config::field("gamma", &O::gamma), config::field("from_logits", &O::from_logits),
       config::field("label_smoothing", &O::label_smoothing), config::field("axis", &O::axis)});
  return t;
}
}  // namespace

BinaryFocalCrossentropy::BinaryFocalCrossentropy(const BinaryFocalCrossentropyOptions& o)
    : Loss(o.name, o.reduction), options_(o) {
  std::ostringstream os;
  if (!(o.gamma >= 0))
    os << "BinaryFocalCrossentropy: `gamma` must be non-negative. Received: gamma=" << o.gamma;
  else if (!(o.alpha >= 0 && o.alpha <= 1))
    os << "BinaryFocalCrossentropy: `alpha` must be in [0, 1]. Received: alpha=" << o.alpha;
  else if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1))
    os << "BinaryFocalCrossentropy: `label_smoothing` must be in [0, 1]. Received: label_smoothing="
       << o.label_smoothing;
  if (!os.str().empty()) throw ValueError(os.str());
}

std::shared_ptr<BinaryFocalCrossentropy> BinaryFocalCrossentropy::from_config(const Json& c) {
  return std::make_shared<BinaryFocalCrossentropy>(read_loss_config(c, "BinaryFocalCrossentropy", focal_fields()));
}

at::Tensor BinaryFocalCrossentropy::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  const BinaryFocalCrossentropyOptions& o = options_;
  at::Tensor t, p;
  prob_prepare(y_true_in, y_pred_in, t, p, class_name());
  if (o.label_smoothing > 0) t = t * (1.0 - o.label_smoothing) + 0.5 * o.label_smoothing;
  if (o.from_logits) p = at::sigmoid(p);
  at::Tensor clipped = p.clamp(kProbEps, 1.0 - kProbEps);
  at::Tensor bce = -(t * clipped.log() + (1.0 - t) * (1.0 - clipped).log());
  at::Tensor p_t = t * p + (1.0 - t) * (1.0 - p);
  at::Tensor focal = (1.0 - p_t).pow(o.gamma) * bce;
  if (o.apply_class_balancing) focal = (t * o.alpha + (1.0 - t) * (1.0 - o.alpha)) * focal;
  return focal.dim() == 0 ? focal : focal.mean(o.axis);
}

Json BinaryFocalCrossentropy::get_config() const { return config::fields_json(options_, focal_fields()); }

}  // namespace kiln::losses
