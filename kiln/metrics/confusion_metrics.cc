#include "kiln/metrics/confusion_metrics.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/shape.h"
#include "kiln/losses/loss.h"
#include "kiln/metrics/metric_fields.h"

namespace kiln::metrics {
namespace {

constexpr double kEpsilon = 1e-7;  // Keras's backend.epsilon()

at::Tensor scalar_zero() { return at::zeros({}, at::kDouble); }

at::Tensor divide_no_nan(const at::Tensor& a, const at::Tensor& b) {
  return at::where(b == 0, at::zeros_like(a), a / at::where(b == 0, at::ones_like(b), b));
}

double divide_no_nan(double a, double b) { return b == 0 ? 0.0 : a / b; }

// y_true, y_pred (float32) and weights (float64), all of one shape, as
// Keras's update_confusion_matrix_variables lines them up.
struct Lined {
  at::Tensor y_true, y_pred, weight;  // weight undefined when none given
};

Lined line_up(const at::Tensor& y_true_in, const at::Tensor& y_pred_in, const at::Tensor& sample_weight,
              std::optional<int64_t> class_id, const std::string& owner) {
  at::Tensor y_pred = y_pred_in.detach().to(at::kFloat);
  at::Tensor y_true = y_true_in.detach().to(y_pred.device(), at::kFloat);
  losses::squeeze_or_expand_to_same_rank(y_pred, y_true);
  losses::check_broadcastable(y_true, y_pred, owner + ": y_true and y_pred");
  at::Tensor weight;
  if (sample_weight.defined()) {
    weight = sample_weight.detach().to(y_pred.device(), at::kDouble).unsqueeze(-1);
    losses::squeeze_or_expand_to_same_rank(y_true, weight, /*expand_rank_1=*/false);
  }
  if (class_id) {
    if (y_pred.dim() < 1 || *class_id < 0 || *class_id >= y_pred.size(-1))
      throw ValueError(owner + ": class_id=" + std::to_string(*class_id) + " is out of range for y_pred of shape " +
                       sizes_str(y_pred));
    if (y_true.dim() < 1 || y_true.size(-1) != y_pred.size(-1))
      throw ShapeError(owner + ": class_id needs y_true with the shape of y_pred " + sizes_str(y_pred) + ". Received " +
                       sizes_str(y_true));
    y_true = y_true.narrow(-1, *class_id, 1);
    y_pred = y_pred.narrow(-1, *class_id, 1);
  }
  auto both = at::broadcast_tensors({y_true, y_pred});
  y_true = both[0];
  y_pred = both[1];
  if (weight.defined()) {
    losses::check_broadcastable(y_pred, weight, owner + ": sample_weight");
    if (weight.dim() > y_pred.dim())
      throw ShapeError(owner + ": sample_weight of shape " + sizes_str(sample_weight) +
                       " does not fit y_pred of shape " + sizes_str(y_pred));
    weight = weight.expand(y_pred.sizes());
  }
  return {y_true, y_pred, weight};
}

// Precision's and Recall's keys besides name: thresholds (one: a number or a
// one-element list), top_k (only null) and class_id.
const config::FieldTable<ThresholdOptions>& threshold_fields() {
  using O = ThresholdOptions;
  static const config::FieldTable<O> t = {
      {"thresholds",
       [](config::Reader& r, O& o) {
         const Json* t = r.get("thresholds");
         if (!t) return;
         if (t->is_number()) {
           o.threshold = t->get<double>();
         } else if (t->is_array() && t->size() == 1 && (*t)[0].is_number()) {
           o.threshold = (*t)[0].get<double>();
         } else {
           throw ValueError(r.owner() +
                            ": only one threshold is supported (a number or a one-element list). Received: "
                            "thresholds=" +
                            json_excerpt(*t));
         }
       },
       nullptr, [](Json& j, const O& o) { j["thresholds"] = o.threshold; }},
      {"top_k",
       [](config::Reader& r, O&) {
         if (const Json* k = r.get("top_k"))
           throw ValueError(r.owner() + ": top_k is not supported. Received: top_k=" + json_excerpt(*k));
       },
       nullptr, [](Json& j, const O&) { j["top_k"] = nullptr; }},
      config::field("class_id", &O::class_id)};
  return t;
}

void check_threshold(double t, const std::string& owner) {
  if (!(t >= 0.0 && t <= 1.0)) {
    std::ostringstream os;
    os << owner << ": threshold values must be in [0, 1]. Received: " << t;
    throw ValueError(os.str());
  }
}

at::Tensor weighted_count(const at::Tensor& mask, const at::Tensor& weight) {
  at::Tensor m = mask.to(at::kDouble);
  return weight.defined() ? (m * weight).sum() : m.sum();
}

}  // namespace

// --- Precision ------------------------------------------------------------------------------

Precision::Precision(double threshold, std::optional<int64_t> class_id, std::string name)
    : Metric(std::move(name)),
      options_{.threshold = threshold, .class_id = class_id},
      true_positives_(scalar_zero()),
      false_positives_(scalar_zero()) {
  check_threshold(threshold, "Precision");
}

std::shared_ptr<Precision> Precision::from_config(const Json& c) {
  std::string name = "precision";
  const ThresholdOptions o = read_metric_config(c, "Precision", name, threshold_fields());
  return std::make_shared<Precision>(o.threshold, o.class_id, name);
}

void Precision::update_state(const at::Tensor& y_true, const at::Tensor& y_pred, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  Lined l = line_up(y_true, y_pred, sample_weight, options_.class_id, name());
  at::Tensor predicted = l.y_pred > options_.threshold;
  at::Tensor actual = l.y_true != 0;
  follow_device(predicted.device(), {&true_positives_, &false_positives_});
  true_positives_ += weighted_count(predicted & actual, l.weight);
  false_positives_ += weighted_count(predicted & actual.logical_not(), l.weight);
}

double Precision::result() const {
  const double tp = true_positives_.item<double>(), fp = false_positives_.item<double>();
  return divide_no_nan(tp, tp + fp);
}

void Precision::reset_state() {
  true_positives_.zero_();
  false_positives_.zero_();
}

Json Precision::get_config() const { return metric_config(*this, options_, threshold_fields()); }

// --- Recall -----------------------------------------------------------------------------------

Recall::Recall(double threshold, std::optional<int64_t> class_id, std::string name)
    : Metric(std::move(name)),
      options_{.threshold = threshold, .class_id = class_id},
      true_positives_(scalar_zero()),
      false_negatives_(scalar_zero()) {
  check_threshold(threshold, "Recall");
}

std::shared_ptr<Recall> Recall::from_config(const Json& c) {
  std::string name = "recall";
  const ThresholdOptions o = read_metric_config(c, "Recall", name, threshold_fields());
  return std::make_shared<Recall>(o.threshold, o.class_id, name);
}

void Recall::update_state(const at::Tensor& y_true, const at::Tensor& y_pred, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  Lined l = line_up(y_true, y_pred, sample_weight, options_.class_id, name());
  at::Tensor predicted = l.y_pred > options_.threshold;
  at::Tensor actual = l.y_true != 0;
  follow_device(predicted.device(), {&true_positives_, &false_negatives_});
  true_positives_ += weighted_count(predicted & actual, l.weight);
  false_negatives_ += weighted_count(predicted.logical_not() & actual, l.weight);
}

double Recall::result() const {
  const double tp = true_positives_.item<double>(), fn = false_negatives_.item<double>();
  return divide_no_nan(tp, tp + fn);
}

void Recall::reset_state() {
  true_positives_.zero_();
  false_negatives_.zero_();
}

Json Recall::get_config() const { return metric_config(*this, options_, threshold_fields()); }

// --- AUC ----------------------------------------------------------------------------------------

AUC::AUC(Options options) : Metric(options.name), options_(std::move(options)) {
  auto& o = options_;
  std::string curve = o.curve;
  for (auto& ch : curve) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (curve != "ROC" && curve != "PR")
    throw ValueError("AUC: invalid `curve`, expected \"ROC\" or \"PR\". Received: curve=" + o.curve);
  o.curve = curve;
  std::string method = o.summation_method;
  for (auto& ch : method) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (method != "interpolation" && method != "minoring" && method != "majoring")
    throw ValueError(
        "AUC: invalid `summation_method`, expected \"interpolation\", \"minoring\" or \"majoring\". "
        "Received: "
        "summation_method=" +
        o.summation_method);
  o.summation_method = method;

  evenly_ = o.thresholds.empty();
  if (evenly_) {
    if (o.num_thresholds <= 1)
      throw ValueError("AUC: argument `num_thresholds` must be an integer > 1. Received: num_thresholds=" +
                       std::to_string(o.num_thresholds));
    thresholds_.push_back(0.0 - kEpsilon);
    for (int64_t i = 1; i < o.num_thresholds - 1; ++i)
      thresholds_.push_back(static_cast<double>(i) / static_cast<double>(o.num_thresholds - 1));
    thresholds_.push_back(1.0 + kEpsilon);
  } else {
    for (double t : o.thresholds) check_threshold(t, "AUC");
    thresholds_.push_back(0.0 - kEpsilon);
    thresholds_.insert(thresholds_.end(), o.thresholds.begin(), o.thresholds.end());
    thresholds_.push_back(1.0 + kEpsilon);
    o.num_thresholds = static_cast<int64_t>(thresholds_.size());
  }
  const int64_t n = o.num_thresholds;
  tp_ = at::zeros({n}, at::kDouble);
  fp_ = at::zeros({n}, at::kDouble);
  tn_ = at::zeros({n}, at::kDouble);
  fn_ = at::zeros({n}, at::kDouble);
}

namespace {
// AUC's keys besides name: Keras's multi_label (only false), num_labels
// (ignored) and label_weights (only null) are written as Keras writes them;
// thresholds only when given.
const config::FieldTable<AUC::Options>& auc_fields() {
  using O = AUC::Options;
  static const config::FieldTable<O> t = {
      config::field("num_thresholds", &O::num_thresholds),
      config::field("curve", &O::curve),
      config::field("summation_method", &O::summation_method),
      {"multi_label",
       [](config::Reader& r, O&) {
         if (r.boolean("multi_label", false)) throw ValueError("AUC: multi_label=true is not supported");
       },
       nullptr, [](Json& j, const O&) { j["multi_label"] = false; }},
      {"num_labels", [](config::Reader& r, O&) { r.get("num_labels"); }, nullptr,
       [](Json& j, const O&) { j["num_labels"] = nullptr; }},
      {"label_weights",
       [](config::Reader& r, O&) {
         if (const Json* w = r.get("label_weights"))
           throw ValueError("AUC: label_weights are not supported. Received: label_weights=" + json_excerpt(*w));
       },
       nullptr, [](Json& j, const O&) { j["label_weights"] = nullptr; }},
      {"thresholds",
       [](config::Reader& r, O& o) {
         const Json* t = r.get("thresholds");
         if (!t) return;
         if (!t->is_array()) r.invalid("thresholds", "a list of numbers");
         for (const auto& v : *t)
           if (!v.is_number()) r.invalid("thresholds", "a list of numbers");
         o.thresholds = t->get<std::vector<double>>();
       },
       nullptr,
       [](Json& j, const O& o) {
         if (!o.thresholds.empty()) j["thresholds"] = o.thresholds;
       }},
      config::field("from_logits", &O::from_logits)};
  return t;
}
}  // namespace

std::shared_ptr<AUC> AUC::from_config(const Json& c) {
  std::string name = "auc";
  Options o = read_metric_config(c, "AUC", name, auc_fields());
  o.name = name;
  return std::make_shared<AUC>(o);
}

void AUC::update_state(const at::Tensor& y_true, const at::Tensor& y_pred_in, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  at::Tensor y_pred = y_pred_in.detach().to(at::kFloat);
  if (options_.from_logits) y_pred = y_pred.sigmoid();
  Lined l = line_up(y_true, y_pred, sample_weight, std::nullopt, name());
  const int64_t n = options_.num_thresholds;
  at::Tensor p = l.y_pred.clamp(0.0, 1.0).reshape({-1});
  at::Tensor y = (l.y_true != 0).reshape({-1}).to(at::kDouble);  // Keras casts labels to bool
  at::Tensor w = l.weight.defined() ? l.weight.reshape({-1}) : at::ones_like(y);
  at::Tensor pos_w = y * w, neg_w = (1.0 - y) * w;
  at::Tensor tp, fp;
  if (evenly_) {
    // Evenly spaced thresholds: each prediction falls in one bucket
    // (t_j, t_j+1]; counts above threshold i are the reversed cumulative sums.
    // p in [0, 1] is above t_0 = -eps, so bucket -1 becomes 0.
    at::Tensor bucket = (p * static_cast<double>(n - 1)).ceil().sub(1).clamp_min(0).to(at::kLong);
    at::Tensor pos_b = at::zeros({n}, y.options()).index_add_(0, bucket, pos_w);
    at::Tensor neg_b = at::zeros({n}, y.options()).index_add_(0, bucket, neg_w);
    tp = pos_b.flip({0}).cumsum(0).flip({0});
    fp = neg_b.flip({0}).cumsum(0).flip({0});
  } else {
    at::Tensor thr = at::tensor(thresholds_, at::kDouble).to(p.device(), at::kFloat);
    at::Tensor above = (p.unsqueeze(0) > thr.unsqueeze(1)).to(at::kDouble);  // (n, entries)
    tp = at::mv(above, pos_w);
    fp = at::mv(above, neg_w);
  }
  follow_device(tp.device(), {&tp_, &fp_, &tn_, &fn_});
  tp_ += tp;
  fp_ += fp;
  tn_ += neg_w.sum() - fp;
  fn_ += pos_w.sum() - tp;
}

double AUC::interpolate_pr_auc() const {
  const int64_t n = options_.num_thresholds;
  at::Tensor tp0 = tp_.slice(0, 0, n - 1), tp1 = tp_.slice(0, 1, n);
  at::Tensor dtp = tp0 - tp1;
  at::Tensor p = tp_ + fp_;
  at::Tensor p0 = p.slice(0, 0, n - 1), p1 = p.slice(0, 1, n);
  at::Tensor dp = p0 - p1;
  at::Tensor prec_slope = divide_no_nan(dtp, dp.clamp_min(0));
  at::Tensor intercept = tp1 - prec_slope * p1;
  at::Tensor safe_p_ratio =
      at::where((p0 > 0).logical_and(p1 > 0), divide_no_nan(p0, p1.clamp_min(0)), at::ones_like(p1));
  at::Tensor increment =
      divide_no_nan(prec_slope * (dtp + intercept * safe_p_ratio.log()), (tp1 + fn_.slice(0, 1, n)).clamp_min(0));
  return increment.sum().item<double>();
}

double AUC::result() const {
  if (options_.curve == "PR" && options_.summation_method == "interpolation") return interpolate_pr_auc();
  const int64_t n = options_.num_thresholds;
  at::Tensor recall = divide_no_nan(tp_, tp_ + fn_);
  at::Tensor x, y;
  if (options_.curve == "ROC") {
    x = divide_no_nan(fp_, fp_ + tn_);
    y = recall;
  } else {
    x = recall;
    y = divide_no_nan(tp_, tp_ + fp_);
  }
  at::Tensor y0 = y.slice(0, 0, n - 1), y1 = y.slice(0, 1, n);
  at::Tensor heights;
  if (options_.summation_method == "interpolation")
    heights = (y0 + y1) / 2.0;
  else if (options_.summation_method == "minoring")
    heights = at::minimum(y0, y1);
  else
    heights = at::maximum(y0, y1);
  return ((x.slice(0, 0, n - 1) - x.slice(0, 1, n)) * heights).sum().item<double>();
}

void AUC::reset_state() {
  tp_.zero_();
  fp_.zero_();
  tn_.zero_();
  fn_.zero_();
}

Json AUC::get_config() const { return metric_config(*this, options_, auc_fields()); }

}  // namespace kiln::metrics
