#include "kiln/metrics/iou_metrics.h"

#include "kiln/core/error.h"
#include "kiln/core/shape.h"

namespace kiln::metrics {

MeanIoU::MeanIoU(int64_t num_classes, std::optional<int64_t> ignore_class, bool sparse_y_true, bool sparse_y_pred,
                 int64_t axis, std::string name)
    : Metric(std::move(name)),
      num_classes_(num_classes),
      ignore_class_(ignore_class),
      sparse_y_true_(sparse_y_true),
      sparse_y_pred_(sparse_y_pred),
      axis_(axis) {
  if (num_classes <= 0)
    throw ValueError("MeanIoU: `num_classes` must be a positive integer. Received: num_classes=" +
                     std::to_string(num_classes));
  total_cm_ = at::zeros({num_classes, num_classes}, at::kDouble);
}

std::shared_ptr<MeanIoU> MeanIoU::from_config(const Json& c) {
  check_keys(c, {"num_classes", "ignore_class", "sparse_y_true", "sparse_y_pred", "axis"}, "MeanIoU");
  if (!c.is_object() || !c.contains("num_classes") || !c["num_classes"].is_number_integer())
    throw ValueError(
        "MeanIoU needs `num_classes`, the number of classes (an integer), e.g. "
        "{\"class_name\": \"MeanIoU\", \"config\": {\"num_classes\": 3}}. Received: " +
        (c.is_object() && c.contains("num_classes") ? "num_classes=" + c["num_classes"].dump()
                                                    : std::string("no num_classes")));
  std::optional<int64_t> ignore;
  if (c.contains("ignore_class") && !c["ignore_class"].is_null()) ignore = get_or<int64_t>(c, "ignore_class", 0);
  return std::make_shared<MeanIoU>(c["num_classes"].get<int64_t>(), ignore, get_or<bool>(c, "sparse_y_true", true),
                                   get_or<bool>(c, "sparse_y_pred", true), get_or<int64_t>(c, "axis", -1),
                                   get_or<std::string>(c, "name", "mean_iou"));
}

void MeanIoU::update_state(const at::Tensor& y_true_in, const at::Tensor& y_pred_in, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  at::Tensor y_pred = y_pred_in.detach();
  at::Tensor y_true = y_true_in.detach().to(y_pred.device());
  if (!sparse_y_true_) y_true = y_true.argmax(axis_);
  if (!sparse_y_pred_) y_pred = y_pred.argmax(axis_);
  // Keras casts to the metric dtype, then to int: truncation toward zero.
  y_true = y_true.to(at::kDouble).reshape({-1}).to(at::kLong);
  y_pred = y_pred.to(at::kDouble).reshape({-1}).to(at::kLong);
  if (y_true.numel() != y_pred.numel())
    throw ShapeError(name() + ": y_true " + sizes_str(y_true_in) + " and y_pred " + sizes_str(y_pred_in) +
                     " hold different numbers of entries (" + std::to_string(y_true.numel()) + " vs " +
                     std::to_string(y_pred.numel()) + ")");
  at::Tensor w = at::ones({y_true.numel()}, at::TensorOptions(at::kDouble).device(y_pred.device()));
  if (sample_weight.defined()) {
    at::Tensor sw = sample_weight.detach().to(y_pred.device(), at::kDouble).reshape({-1});
    if (sw.numel() != 1 && sw.numel() != y_true.numel())
      throw ShapeError(name() + ": sample_weight " + sizes_str(sample_weight) + " does not match the " +
                       std::to_string(y_true.numel()) + " entries of y_true");
    w = w * sw;
  }
  if (ignore_class_) {
    at::Tensor valid = y_true != *ignore_class_;
    y_true = y_true * valid;
    y_pred = y_pred * valid;
    w = w * valid.to(at::kDouble);
  }
  // Out-of-range ids are one clear error (on a GPU, an index_add_ beyond the
  // matrix would be a device-side assert that ends the process): the one
  // host read per step this metric makes.
  auto check_range = [&](const at::Tensor& ids, const char* what) {
    if (ids.numel() == 0) return;
    const at::Tensor bounds = at::stack({ids.min(), ids.max()}).cpu();
    const int64_t lo = bounds[0].item<int64_t>(), hi = bounds[1].item<int64_t>();
    if (lo < 0 || hi >= num_classes_)
      throw ValueError(name() + ": " + what + " holds class id " + std::to_string(lo < 0 ? lo : hi) + ", outside [0, " +
                       std::to_string(num_classes_) + ") for num_classes=" + std::to_string(num_classes_));
  };
  check_range(y_true, "y_true");
  check_range(y_pred, "y_pred");
  follow_device(y_pred.device(), {&total_cm_});
  total_cm_.view({-1}).index_add_(0, y_true * num_classes_ + y_pred, w);
}

double MeanIoU::result() const {
  at::Tensor tp = total_cm_.diagonal();
  at::Tensor denominator = total_cm_.sum(0) + total_cm_.sum(1) - tp;
  const double valid = (denominator > 1e-9).sum().item<double>();
  at::Tensor iou = tp / (denominator + 1e-7);
  return iou.sum().item<double>() / (valid + 1e-7);
}

Json MeanIoU::get_config() const {
  Json c = Metric::get_config();
  c["num_classes"] = num_classes_;
  c["ignore_class"] = ignore_class_ ? Json(*ignore_class_) : Json(nullptr);
  c["sparse_y_true"] = sparse_y_true_;
  c["sparse_y_pred"] = sparse_y_pred_;
  c["axis"] = axis_;
  return c;
}

}  // namespace kiln::metrics
