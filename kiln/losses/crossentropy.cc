#include "kiln/losses/crossentropy.h"

#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/shape.h"
#include "kiln/losses/loss_fields.h"

namespace kiln::losses {
namespace {

constexpr double kEpsilon = 1e-7;  // Keras's backend.epsilon()

void check_label_smoothing(double s, const std::string& owner) {
  if (!(s >= 0.0 && s <= 1.0)) {
    std::ostringstream os;
    os << owner << ": `label_smoothing` must be in [0, 1]. Received: label_smoothing=" << s;
    throw ValueError(os.str());
  }
}

// log of probabilities renormalised along `axis` and clipped as Keras does.
at::Tensor log_probs(const at::Tensor& y_pred, bool from_logits, int64_t axis) {
  if (from_logits) return at::log_softmax(y_pred, axis);
  at::Tensor p = y_pred / y_pred.sum(axis, /*keepdim=*/true);
  return p.clamp(kEpsilon, 1.0 - kEpsilon).log();
}

// y_true with the trailing 1 removed, as labels of y_pred's leading shape.
at::Tensor sparse_labels(at::Tensor y_true, at::Tensor y_pred, const std::string& owner) {
  squeeze_or_expand_to_same_rank(y_true, y_pred);
  if (y_pred.dim() < 1)
    throw ShapeError(owner + ": y_pred must have a class axis. Received shape " + sizes_str(y_pred));
  if (y_true.dim() == y_pred.dim() && y_true.size(-1) == 1) y_true = y_true.squeeze(-1);
  if (y_true.sizes() != y_pred.sizes().slice(0, y_pred.dim() - 1))
    throw ShapeError(owner + ": expected integer labels of shape " +
                     shape_to_string(Shape(y_pred.sizes().begin(), y_pred.sizes().end() - 1)) +
                     " (or with a trailing 1) for y_pred of shape " + sizes_str(y_pred) +
                     ". Received: " + sizes_str(y_true));
  return y_true.to(y_pred.device(), at::kLong);
}

// The keys CategoricalCrossentropy and BinaryCrossentropy share.
template <class O>
const config::FieldTable<O>& crossentropy_fields() {
  static const auto t =
      loss_fields<O>({config::field("from_logits", &O::from_logits),
                      config::field("label_smoothing", &O::label_smoothing), config::field("axis", &O::axis)});
  return t;
}

}  // namespace

// --- SparseCategoricalCrossentropy ---------------------------------------------

namespace {
const config::FieldTable<SparseCategoricalCrossentropyOptions>& sparse_ce_fields() {
  using O = SparseCategoricalCrossentropyOptions;
  // Keras's axis: accepted as -1 only, and not written.
  const config::FieldDef<O> axis{
      "axis",
      [](config::Reader& r, O&) {
        const Json* a = r.get("axis");
        if (a && r.integer("axis", -1) != -1)
          throw ValueError("SparseCategoricalCrossentropy: only axis=-1 is supported. Received: axis=" +
                           json_excerpt(*a));
      },
      nullptr, [](Json&, const O&) {}};
  static const auto t = loss_fields<O>(
      {config::field("from_logits", &O::from_logits), config::field("ignore_class", &O::ignore_class), axis});
  return t;
}
}  // namespace

SparseCategoricalCrossentropy::SparseCategoricalCrossentropy(const SparseCategoricalCrossentropyOptions& o)
    : Loss(o.name, o.reduction), options_(o) {}

std::shared_ptr<SparseCategoricalCrossentropy> SparseCategoricalCrossentropy::from_config(const Json& c) {
  return std::make_shared<SparseCategoricalCrossentropy>(
      read_loss_config(c, "SparseCategoricalCrossentropy", sparse_ce_fields()));
}

at::Tensor SparseCategoricalCrossentropy::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor labels = sparse_labels(y_true_in, y_pred, class_name());
  const int64_t num_classes = y_pred.size(-1);
  at::Tensor valid;
  if (options_.ignore_class) {
    valid = labels != *options_.ignore_class;
    labels = labels.masked_fill(valid.logical_not(), 0);
  }
  // On the CPU a clear error is cheap; on a GPU it would cost a sync per
  // step, and gather's device assert reports bad labels there.
  if (labels.device().is_cpu() && labels.numel() > 0) {
    const int64_t lo = labels.min().item<int64_t>(), hi = labels.max().item<int64_t>();
    if (lo < 0 || hi >= num_classes)
      throw ValueError(class_name() + ": labels must be in [0, " + std::to_string(num_classes) + ") for y_pred with " +
                       std::to_string(num_classes) + " classes. Received labels between " + std::to_string(lo) +
                       " and " + std::to_string(hi));
  }
  at::Tensor logp = log_probs(y_pred, options_.from_logits, -1);
  at::Tensor loss = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1);
  if (valid.defined()) loss = at::where(valid, loss, at::zeros_like(loss));
  return loss;
}

at::Tensor SparseCategoricalCrossentropy::valid_mask(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  if (!options_.ignore_class) return {};
  return sparse_labels(y_true, y_pred, class_name()) != *options_.ignore_class;
}

Json SparseCategoricalCrossentropy::get_config() const { return config::fields_json(options_, sparse_ce_fields()); }

// --- CategoricalCrossentropy -----------------------------------------------------

CategoricalCrossentropy::CategoricalCrossentropy(const CategoricalCrossentropyOptions& o)
    : Loss(o.name, o.reduction), options_(o) {
  check_label_smoothing(o.label_smoothing, "CategoricalCrossentropy");
}

std::shared_ptr<CategoricalCrossentropy> CategoricalCrossentropy::from_config(const Json& c) {
  return std::make_shared<CategoricalCrossentropy>(
      read_loss_config(c, "CategoricalCrossentropy", crossentropy_fields<CategoricalCrossentropyOptions>()));
}

at::Tensor CategoricalCrossentropy::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor y_true = y_true_in.to(y_pred.device(), at::kFloat);
  squeeze_or_expand_to_same_rank(y_true, y_pred);
  if (y_true.sizes() != y_pred.sizes())
    throw ShapeError(class_name() + ": y_true and y_pred must have the same shape (one-hot targets). Received " +
                     sizes_str(y_true) + " and " + sizes_str(y_pred) +
                     "; for integer labels use SparseCategoricalCrossentropy");
  const CategoricalCrossentropyOptions& o = options_;
  if (o.label_smoothing > 0) {
    const double num_classes = static_cast<double>(y_true.size(-1));
    y_true = y_true * (1.0 - o.label_smoothing) + o.label_smoothing / num_classes;
  }
  return -(y_true * log_probs(y_pred, o.from_logits, o.axis)).sum(o.axis);
}

Json CategoricalCrossentropy::get_config() const {
  return config::fields_json(options_, crossentropy_fields<CategoricalCrossentropyOptions>());
}

// --- BinaryCrossentropy -------------------------------------------------------------

BinaryCrossentropy::BinaryCrossentropy(const BinaryCrossentropyOptions& o) : Loss(o.name, o.reduction), options_(o) {
  check_label_smoothing(o.label_smoothing, "BinaryCrossentropy");
}

std::shared_ptr<BinaryCrossentropy> BinaryCrossentropy::from_config(const Json& c) {
  return std::make_shared<BinaryCrossentropy>(
      read_loss_config(c, "BinaryCrossentropy", crossentropy_fields<BinaryCrossentropyOptions>()));
}

at::Tensor BinaryCrossentropy::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor y_true = y_true_in.to(y_pred.device(), at::kFloat);
  squeeze_or_expand_to_same_rank(y_true, y_pred);
  check_broadcastable(y_true, y_pred, class_name() + ": y_true and y_pred");
  const BinaryCrossentropyOptions& o = options_;
  if (o.label_smoothing > 0) y_true = y_true * (1.0 - o.label_smoothing) + 0.5 * o.label_smoothing;
  at::Tensor elementwise;
  if (o.from_logits) {
    // max(x, 0) - x * z + log(1 + exp(-|x|)): stable for large |x|.
    elementwise = y_pred.clamp_min(0) - y_pred * y_true + at::log1p(at::exp(-y_pred.abs()));
  } else {
    // Written out (not at::binary_cross_entropy, which autocast refuses);
    // the -100 floor on the logs is the same as PyTorch's kernel.
    at::Tensor p = y_pred.clamp(kEpsilon, 1.0 - kEpsilon);
    elementwise = -(y_true * p.log().clamp_min(-100.0) + (1.0 - y_true) * at::log1p(-p).clamp_min(-100.0));
  }
  return elementwise.dim() == 0 ? elementwise : elementwise.mean(o.axis);
}

Json BinaryCrossentropy::get_config() const {
  return config::fields_json(options_, crossentropy_fields<BinaryCrossentropyOptions>());
}

}  // namespace kiln::losses
