#include "kiln/metrics/accuracy_metrics.h"

#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/shape.h"
#include "kiln/losses/loss.h"
#include "kiln/metrics/metric_fields.h"

namespace kiln::metrics {
namespace {

void check_k(int64_t k, const std::string& owner) {
  if (k < 1) throw ValueError(owner + ": `k` must be a positive integer. Received: k=" + std::to_string(k));
}

at::Tensor hits(const at::Tensor& a, const at::Tensor& b) { return a.eq(b).to(at::kFloat); }

// Integer labels from (N,) or (N, 1)-shaped y_true; `reshape` reports whether
// the trailing 1 was removed (the hits are then reshaped back, as in Keras).
at::Tensor squeeze_labels(const at::Tensor& y_true, const at::Tensor& y_pred, bool* reshaped) {
  *reshaped = false;
  if (y_true.dim() == y_pred.dim() && y_true.dim() > 0 && y_true.size(-1) == 1) {
    *reshaped = true;
    return y_true.squeeze(-1);
  }
  return y_true;
}

// Whether each label's score is >= the k-th largest score of its row.
at::Tensor in_top_k(const at::Tensor& labels, const at::Tensor& y_pred, int64_t k, const std::string& owner) {
  if (y_pred.dim() < 1) throw ShapeError(owner + ": y_pred needs a class axis. Received shape " + sizes_str(y_pred));
  const int64_t num_classes = y_pred.size(-1);
  at::Tensor pred = y_pred.to(at::kFloat).reshape({-1, num_classes});
  at::Tensor lbl = labels.to(pred.device(), at::kLong).reshape({-1});
  if (lbl.size(0) != pred.size(0))
    throw ShapeError(owner + ": " + std::to_string(lbl.size(0)) + " labels for " + std::to_string(pred.size(0)) +
                     " rows of predictions " + sizes_str(y_pred));
  if (lbl.numel() > 0 && lbl.device().is_cpu()) {
    const int64_t lo = lbl.min().item<int64_t>(), hi = lbl.max().item<int64_t>();
    if (lo < 0 || hi >= num_classes)
      throw ValueError(owner + ": labels must be in [0, " + std::to_string(num_classes) +
                       "). Received labels between " + std::to_string(lo) + " and " + std::to_string(hi));
  }
  at::Tensor kth = std::get<0>(pred.topk(std::min(k, num_classes), -1)).select(-1, -1);
  at::Tensor target = pred.gather(-1, lbl.unsqueeze(-1)).squeeze(-1);
  return (target >= kth).to(at::kFloat).reshape(labels.sizes());
}

}  // namespace

// --- Accuracy ---------------------------------------------------------------------------

std::shared_ptr<Accuracy> Accuracy::from_config(const Json& c) { return plain_metric_from_config<Accuracy>(c); }

at::Tensor Accuracy::values(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor y_pred = y_pred_in;
  at::Tensor y_true = y_true_in.to(y_pred.device(), y_pred.scalar_type());
  losses::squeeze_or_expand_to_same_rank(y_true, y_pred);
  losses::check_broadcastable(y_true, y_pred, name());
  return hits(y_true, y_pred);
}

// --- BinaryAccuracy ------------------------------------------------------------------------

namespace {
const config::FieldTable<BinaryAccuracy::Options>& binary_accuracy_fields() {
  static const config::FieldTable<BinaryAccuracy::Options> t = {
      config::field("threshold", &BinaryAccuracy::Options::threshold)};
  return t;
}
}  // namespace

BinaryAccuracy::BinaryAccuracy(std::string name, double threshold)
    : MeanMetricWrapper(std::move(name)), options_{.threshold = threshold} {}

std::shared_ptr<BinaryAccuracy> BinaryAccuracy::from_config(const Json& c) {
  std::string name = "binary_accuracy";
  const Options o = read_metric_config(c, "BinaryAccuracy", name, binary_accuracy_fields());
  return std::make_shared<BinaryAccuracy>(name, o.threshold);
}

at::Tensor BinaryAccuracy::values(const at::Tensor& y_true_in, const at::Tensor& y_pred_in) const {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor y_true = y_true_in.to(y_pred.device(), at::kFloat);
  losses::squeeze_or_expand_to_same_rank(y_true, y_pred);
  losses::check_broadcastable(y_true, y_pred, name());
  return hits(y_true, y_pred.gt(options_.threshold).to(at::kFloat));
}

Json BinaryAccuracy::get_config() const { return metric_config(*this, options_, binary_accuracy_fields()); }

// --- CategoricalAccuracy ---------------------------------------------------------------------

std::shared_ptr<CategoricalAccuracy> CategoricalAccuracy::from_config(const Json& c) {
  return plain_metric_from_config<CategoricalAccuracy>(c);
}

at::Tensor CategoricalAccuracy::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  if (y_true.sizes() != y_pred.sizes())
    throw ShapeError(name() + ": expected one-hot y_true with the shape of y_pred " + sizes_str(y_pred) +
                     ". Received " + sizes_str(y_true) + "; for integer labels use sparse_categorical_accuracy");
  return hits(y_true.argmax(-1).to(y_pred.device()), y_pred.argmax(-1));
}

// --- SparseCategoricalAccuracy ---------------------------------------------------------------

std::shared_ptr<SparseCategoricalAccuracy> SparseCategoricalAccuracy::from_config(const Json& c) {
  return plain_metric_from_config<SparseCategoricalAccuracy>(c);
}

at::Tensor SparseCategoricalAccuracy::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  bool reshaped = false;
  at::Tensor labels = squeeze_labels(y_true, y_pred, &reshaped);
  if (y_pred.dim() < 1 || labels.sizes() != y_pred.sizes().slice(0, y_pred.dim() - 1))
    throw ShapeError(name() + ": expected integer labels of shape " +
                     shape_to_string(Shape(y_pred.sizes().begin(), y_pred.sizes().end() - 1)) +
                     " (or with a trailing 1) for y_pred of shape " + sizes_str(y_pred) + ". Received " +
                     sizes_str(y_true));
  // Labels compare as integers (float labels are truncated, as a cast does).
  return hits(labels.to(y_pred.device(), at::kLong), y_pred.argmax(-1));
}

// --- TopK ------------------------------------------------------------------------------------------

namespace {
const config::FieldTable<TopKOptions>& top_k_fields() {
  static const config::FieldTable<TopKOptions> t = {config::field("k", &TopKOptions::k)};
  return t;
}

// SparseTopKCategoricalAccuracy's: Keras's from_sorted_ids, accepted as false
// only and not written.
const config::FieldTable<TopKOptions>& sparse_top_k_fields() {
  static const config::FieldTable<TopKOptions> t =
      top_k_fields() +
      config::FieldTable<TopKOptions>{{"from_sorted_ids",
                                       [](config::Reader& r, TopKOptions&) {
                                         if (r.boolean("from_sorted_ids", false))
                                           throw ValueError(
                                               "SparseTopKCategoricalAccuracy: from_sorted_ids=true is not supported");
                                       },
                                       nullptr, [](Json&, const TopKOptions&) {}}};
  return t;
}
}  // namespace

TopKCategoricalAccuracy::TopKCategoricalAccuracy(int64_t k, std::string name)
    : MeanMetricWrapper(std::move(name)), options_{.k = k} {
  check_k(k, "TopKCategoricalAccuracy");
}

std::shared_ptr<TopKCategoricalAccuracy> TopKCategoricalAccuracy::from_config(const Json& c) {
  std::string name = "top_k_categorical_accuracy";
  const TopKOptions o = read_metric_config(c, "TopKCategoricalAccuracy", name, top_k_fields());
  return std::make_shared<TopKCategoricalAccuracy>(o.k, name);
}

at::Tensor TopKCategoricalAccuracy::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  if (y_true.sizes() != y_pred.sizes())
    throw ShapeError(name() + ": expected one-hot y_true with the shape of y_pred " + sizes_str(y_pred) +
                     ". Received " + sizes_str(y_true));
  return in_top_k(y_true.argmax(-1), y_pred, options_.k, name());
}

Json TopKCategoricalAccuracy::get_config() const { return metric_config(*this, options_, top_k_fields()); }

SparseTopKCategoricalAccuracy::SparseTopKCategoricalAccuracy(int64_t k, std::string name)
    : MeanMetricWrapper(std::move(name)), options_{.k = k} {
  check_k(k, "SparseTopKCategoricalAccuracy");
}

std::shared_ptr<SparseTopKCategoricalAccuracy> SparseTopKCategoricalAccuracy::from_config(const Json& c) {
  std::string name = "sparse_top_k_categorical_accuracy";
  const TopKOptions o = read_metric_config(c, "SparseTopKCategoricalAccuracy", name, sparse_top_k_fields());
  return std::make_shared<SparseTopKCategoricalAccuracy>(o.k, name);
}

at::Tensor SparseTopKCategoricalAccuracy::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  return in_top_k(y_true, y_pred, options_.k, name());
}

Json SparseTopKCategoricalAccuracy::get_config() const { return metric_config(*this, options_, top_k_fields()); }

// --- AutoAccuracy ------------------------------------------------------------------------------

std::shared_ptr<AutoAccuracy> AutoAccuracy::from_config(const Json& c) {
  return plain_metric_from_config<AutoAccuracy>(c);
}

at::Tensor AutoAccuracy::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  if (resolved_.empty()) {
    const bool is_binary = y_pred.dim() == 0 || y_pred.size(-1) == 1;
    const bool is_sparse = y_true.dim() < y_pred.dim() || (y_true.dim() > 0 && y_true.size(-1) == 1);
    resolved_ = is_binary ? "binary_accuracy" : is_sparse ? "sparse_categorical_accuracy" : "categorical_accuracy";
  }
  if (resolved_ == "binary_accuracy") return BinaryAccuracy(name()).values(y_true, y_pred);
  if (resolved_ == "sparse_categorical_accuracy") return SparseCategoricalAccuracy(name()).values(y_true, y_pred);
  return CategoricalAccuracy(name()).values(y_true, y_pred);
}

}  // namespace kiln::metrics
