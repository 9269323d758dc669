#include "kiln/metrics/confusion_metrics.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/shape.h"
#include "kiln/losses/loss.h"

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

double parse_threshold(const Json& c, const std::string& owner) {
  if (!c.is_object() || !c.contains("thresholds") || c["thresholds"].is_null()) return 0.5;
  const Json& t = c["thresholds"];
  double v;
  if (t.is_number()) {
    v = t.get<double>();
  } else if (t.is_array() && t.size() == 1 && t[0].is_number()) {
    v = t[0].get<double>();
  } else {
    throw ValueError(
        owner +
        ": only one threshold is supported (a number or a one-element list). Received: thresholds=" + json_excerpt(t));
  }
  return v;
}

std::optional<int64_t> parse_class_id(const Json& c) {
  if (!c.is_object() || !c.contains("class_id") || c["class_id"].is_null()) return std::nullopt;
  return get_or<int64_t>(c, "class_id", 0);
}

void check_top_k(const Json& c, const std::string& owner) {
  if (c.is_object() && c.contains("top_k") && !c["top_k"].is_null())
    throw ValueError(owner + ": top_k is not supported. Received: top_k=" + json_excerpt(c["top_k"]));
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
      threshold_(threshold),
      class_id_(class_id),
      true_positives_(scalar_zero()),
      false_positives_(scalar_zero()) {
  check_threshold(threshold, "Precision");
}

std::shared_ptr<Precision> Precision::from_config(const Json& c) {
  check_keys(c, {"thresholds", "top_k", "class_id"}, "Precision");
  check_top_k(c, "Precision");
  return std::make_shared<Precision>(parse_threshold(c, "Precision"), parse_class_id(c),
                                     get_or<std::string>(c, "name", "precision"));
}

void Precision::update_state(const at::Tensor& y_true, const at::Tensor& y_pred, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  Lined l = line_up(y_true, y_pred, sample_weight, class_id_, name());
  at::Tensor predicted = l.y_pred > threshold_;
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

Json Precision::get_config() const {
  Json c = Metric::get_config();
  c["thresholds"] = threshold_;
  c["top_k"] = nullptr;
  c["class_id"] = class_id_ ? Json(*class_id_) : Json(nullptr);
  return c;
}

// --- Recall -----------------------------------------------------------------------------------

Recall::Recall(double threshold, std::optional<int64_t> class_id, std::string name)
    : Metric(std::move(name)),
      threshold_(threshold),
      class_id_(class_id),
      true_positives_(scalar_zero()),
      false_negatives_(scalar_zero()) {
  check_threshold(threshold, "Recall");
}

std::shared_ptr<Recall> Recall::from_config(const Json& c) {
  check_keys(c, {"thresholds", "top_k", "class_id"}, "Recall");
  check_top_k(c, "Recall");
  return std::make_shared<Recall>(parse_threshold(c, "Recall"), parse_class_id(c),
                                  get_or<std::string>(c, "name", "recall"));
}

void Recall::update_state(const at::Tensor& y_true, const at::Tensor& y_pred, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  Lined l = line_up(y_true, y_pred, sample_weight, class_id_, name());
  at::Tensor predicted = l.y_pred > threshold_;
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

Json Recall::get_config() const {
  Json c = Metric::get_config();
  c["thresholds"] = threshold_;
  c["top_k"] = nullptr;
  c["class_id"] = class_id_ ? Json(*class_id_) : Json(nullptr);
  return c;
}

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

std::shared_ptr<AUC> AUC::from_config(const Json& c) {
  check_keys(c,
             {"num_thresholds", "curve", "summation_method", "thresholds", "multi_label", "num_labels", "label_weights",
              "from_logits"},
             "AUC");
  if (get_or<bool>(c, "multi_label", false)) throw ValueError("AUC: multi_label=true is not supported");
  if (c.is_object() && c.contains("label_weights") && !c["label_weights"].is_null())
    throw ValueError("AUC: label_weights are not supported. Received: label_weights=" +
                     json_excerpt(c["label_weights"]));
  Options o;
  o.num_thresholds = get_or<int64_t>(c, "num_thresholds", 200);
  o.curve = get_or<std::string>(c, "curve", "ROC");
  o.summation_method = get_or<std::string>(c, "summation_method", "interpolation");
  o.thresholds = get_or<std::vector<double>>(c, "thresholds", {});
  o.from_logits = get_or<bool>(c, "from_logits", false);
  o.name = get_or<std::string>(c, "name", "auc");
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

Json AUC::get_config() const {
  Json c = Metric::get_config();
  c["num_thresholds"] = options_.num_thresholds;
  c["curve"] = options_.curve;
  c["summation_method"] = options_.summation_method;
  c["multi_label"] = false;
  c["num_labels"] = nullptr;
  c["label_weights"] = nullptr;
  if (!evenly_) c["thresholds"] = options_.thresholds;
  c["from_logits"] = options_.from_logits;
  return c;
}

}  // namespace kiln::metrics
