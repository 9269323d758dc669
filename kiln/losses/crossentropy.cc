#include "kiln/losses/crossentropy.h"

#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/shape.h"

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

}  // namespace

// --- SparseCategoricalCrossentropy ---------------------------------------------

SparseCategoricalCrossentropy::SparseCategoricalCrossentropy(const SparseCategoricalCrossentropyOptions& o)
    : Loss(o.name, o.reduction), from_logits_(o.from_logits), ignore_class_(o.ignore_class) {}

std::shared_ptr<SparseCategoricalCrossentropy> SparseCategoricalCrossentropy::from_config(const Json& c) {
  check_keys(c, {"from_logits", "ignore_class", "axis"}, "SparseCategoricalCrossentropy");
  if (get_or<int64_t>(c, "axis", -1) != -1)
    throw ValueError("SparseCategoricalCrossentropy: only axis=-1 is supported. Received: axis=" +
                     json_excerpt(c["axis"]));
  std::optional<int64_t> ignore;
  if (c.is_object() && c.contains("ignore_class") && !c["ignore_class"].is_null())
    ignore = get_or<int64_t>(c, "ignore_class", 0);
  return std::make_shared<SparseCategoricalCrossentropy>(
      SparseCategoricalCrossentropyOptions{.from_logits = get_or<bool>(c, "from_logits", false),
                                           .ignore_class = ignore,
                                           .reduction = get_or<std::string>(c, "reduction", "sum_over_batch_size"),
                                           .name = get_or<std::string>(c, "name", "sparse_categorical_crossentropy")});
}

at::Tensor SparseCategoricalCrossentropy::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor labels = sparse_labels(y_true_in, y_pred, class_name());
  const int64_t num_classes = y_pred.size(-1);
  at::Tensor valid;
  if (ignore_class_) {
    valid = labels != *ignore_class_;
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
  at::Tensor logp = log_probs(y_pred, from_logits_, -1);
  at::Tensor loss = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1);
  if (valid.defined()) loss = at::where(valid, loss, at::zeros_like(loss));
  return loss;
}

at::Tensor SparseCategoricalCrossentropy::valid_mask(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  if (!ignore_class_) return {};
  return sparse_labels(y_true, y_pred, class_name()) != *ignore_class_;
}

Json SparseCategoricalCrossentropy::get_config() const {
  Json c = Loss::get_config();
  c["from_logits"] = from_logits_;
  c["ignore_class"] = ignore_class_ ? Json(*ignore_class_) : Json(nullptr);
  return c;
}

// --- CategoricalCrossentropy -----------------------------------------------------

CategoricalCrossentropy::CategoricalCrossentropy(const CategoricalCrossentropyOptions& o)
    : Loss(o.name, o.reduction), from_logits_(o.from_logits), label_smoothing_(o.label_smoothing), axis_(o.axis) {
  check_label_smoothing(label_smoothing_, "CategoricalCrossentropy");
}

std::shared_ptr<CategoricalCrossentropy> CategoricalCrossentropy::from_config(const Json& c) {
  check_keys(c, {"from_logits", "label_smoothing", "axis"}, "CategoricalCrossentropy");
  return std::make_shared<CategoricalCrossentropy>(
      CategoricalCrossentropyOptions{.from_logits = get_or<bool>(c, "from_logits", false),
                                     .label_smoothing = get_or<double>(c, "label_smoothing", 0.0),
                                     .axis = get_or<int64_t>(c, "axis", -1),
                                     .reduction = get_or<std::string>(c, "reduction", "sum_over_batch_size"),
                                     .name = get_or<std::string>(c, "name", "categorical_crossentropy")});
}

at::Tensor CategoricalCrossentropy::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor y_true = y_true_in.to(y_pred.device(), at::kFloat);
  squeeze_or_expand_to_same_rank(y_true, y_pred);
  if (y_true.sizes() != y_pred.sizes())
    throw ShapeError(class_name() + ": y_true and y_pred must have the same shape (one-hot targets). Received " +
                     sizes_str(y_true) + " and " + sizes_str(y_pred) +
                     "; for integer labels use SparseCategoricalCrossentropy");
  if (label_smoothing_ > 0) {
    const double num_classes = static_cast<double>(y_true.size(-1));
    y_true = y_true * (1.0 - label_smoothing_) + label_smoothing_ / num_classes;
  }
  return -(y_true * log_probs(y_pred, from_logits_, axis_)).sum(axis_);
}

Json CategoricalCrossentropy::get_config() const {
  Json c = Loss::get_config();
  c["from_logits"] = from_logits_;
  c["label_smoothing"] = label_smoothing_;
  c["axis"] = axis_;
  return c;
}

// --- BinaryCrossentropy -------------------------------------------------------------

BinaryCrossentropy::BinaryCrossentropy(const BinaryCrossentropyOptions& o)
    : Loss(o.name, o.reduction), from_logits_(o.from_logits), label_smoothing_(o.label_smoothing), axis_(o.axis) {
  check_label_smoothing(label_smoothing_, "BinaryCrossentropy");
}

std::shared_ptr<BinaryCrossentropy> BinaryCrossentropy::from_config(const Json& c) {
  check_keys(c, {"from_logits", "label_smoothing", "axis"}, "BinaryCrossentropy");
  return std::make_shared<BinaryCrossentropy>(
      BinaryCrossentropyOptions{.from_logits = get_or<bool>(c, "from_logits", false),
                                .label_smoothing = get_or<double>(c, "label_smoothing", 0.0),
                                .axis = get_or<int64_t>(c, "axis", -1),
                                .reduction = get_or<std::string>(c, "reduction", "sum_over_batch_size"),
                                .name = get_or<std::string>(c, "name", "binary_crossentropy")});
}

at::Tensor BinaryCrossentropy::call(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor y_true = y_true_in.to(y_pred.device(), at::kFloat);
  squeeze_or_expand_to_same_rank(y_true, y_pred);
  check_broadcastable(y_true, y_pred, class_name() + ": y_true and y_pred");
  if (label_smoothing_ > 0) y_true = y_true * (1.0 - label_smoothing_) + 0.5 * label_smoothing_;
  at::Tensor elementwise;
  if (from_logits_) {
    // max(x, 0) - x * z + log(1 + exp(-|x|)): stable for large |x|.
    elementwise = y_pred.clamp_min(0) - y_pred * y_true + at::log1p(at::exp(-y_pred.abs()));
  } else {
    // Written out (not at::binary_cross_entropy, which autocast refuses);
    // the -100 floor on the logs is the same as PyTorch's kernel.
    at::Tensor p = y_pred.clamp(kEpsilon, 1.0 - kEpsilon);
    elementwise = -(y_true * p.log().clamp_min(-100.0) + (1.0 - y_true) * at::log1p(-p).clamp_min(-100.0));
  }
  return elementwise.dim() == 0 ? elementwise : elementwise.mean(axis_);
}

Json BinaryCrossentropy::get_config() const {
  Json c = Loss::get_config();
  c["from_logits"] = from_logits_;
  c["label_smoothing"] = label_smoothing_;
  c["axis"] = axis_;
  return c;
}

}  // namespace kiln::losses
