#include "kiln/metrics/iou_metrics.h"

#include "kiln/core/error.h"
#include "kiln/core/shape.h"
#include "kiln/metrics/metric_fields.h"

namespace kiln::metrics {

namespace {
const config::FieldTable<MeanIoU::Options>& mean_iou_fields() {
  using O = MeanIoU::Options;
  static const config::FieldTable<O> t = [] {
    config::FieldDef<O> num_classes = config::field("num_classes", &O::num_classes);
    num_classes.read = [](config::Reader& r, O& o) {
      const Json* n = r.get("num_classes");
      if (!n || !n->is_number_integer())
        throw ValueError(
            "MeanIoU needs `num_classes`, the number of classes (an integer), e.g. "
            "{\"class_name\": \"MeanIoU\", \"config\": {\"num_classes\": 3}}. Received: " +
            (n ? "num_classes=" + n->dump() : std::string("no num_classes")));
      o.num_classes = n->get<int64_t>();
    };
    return config::FieldTable<O>{num_classes, config::field("ignore_class", &O::ignore_class),
                                 config::field("sparse_y_true", &O::sparse_y_true),
                                 config::field("sparse_y_pred", &O::sparse_y_pred), config::field("axis", &O::axis)};
  }();
  return t;
}
}  // namespace

MeanIoU::MeanIoU(int64_t num_classes, std::optional<int64_t> ignore_class, bool sparse_y_true, bool sparse_y_pred,
                 int64_t axis, std::string name)
    : Metric(std::move(name)),
      options_{.num_classes = num_classes,
               .ignore_class = ignore_class,
               .sparse_y_true = sparse_y_true,
               .sparse_y_pred = sparse_y_pred,
               .axis = axis} {
  if (num_classes <= 0)
    throw ValueError("MeanIoU: `num_classes` must be a positive integer. Received: num_classes=" +
                     std::to_string(num_classes));
  total_cm_ = at::zeros({num_classes, num_classes}, at::kDouble);
}

std::shared_ptr<MeanIoU> MeanIoU::from_config(const Json& c) {
  std::string name = "mean_iou";
  const Options o = read_metric_config(c, "MeanIoU", name, mean_iou_fields());
  return std::make_shared<MeanIoU>(o.num_classes, o.ignore_class, o.sparse_y_true, o.sparse_y_pred, o.axis, name);
}

void MeanIoU::update_state(const at::Tensor& y_true_in, const at::Tensor& y_pred_in, const at::Tensor& sample_weight) {
  at::NoGradGuard no_grad;
  at::Tensor y_pred = y_pred_in.detach();
  at::Tensor y_true = y_true_in.detach().to(y_pred.device());
  if (!options_.sparse_y_true) y_true = y_true.argmax(options_.axis);
  if (!options_.sparse_y_pred) y_pred = y_pred.argmax(options_.axis);
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
  if (options_.ignore_class) {
    at::Tensor valid = y_true != *options_.ignore_class;
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
    if (lo < 0 || hi >= options_.num_classes)
      throw ValueError(name() + ": " + what + " holds class id " + std::to_string(lo < 0 ? lo : hi) + ", outside [0, " +
                       std::to_string(options_.num_classes) +
                       ") for num_classes=" + std::to_string(options_.num_classes));
  };
  check_range(y_true, "y_true");
  check_range(y_pred, "y_pred");
  follow_device(y_pred.device(), {&total_cm_});
  total_cm_.view({-1}).index_add_(0, y_true * options_.num_classes + y_pred, w);
}

double MeanIoU::result() const {
  at::Tensor tp = total_cm_.diagonal();
  at::Tensor denominator = total_cm_.sum(0) + total_cm_.sum(1) - tp;
  const double valid = (denominator > 1e-9).sum().item<double>();
  at::Tensor iou = tp / (denominator + 1e-7);
  return iou.sum().item<double>() / (valid + 1e-7);
}

Json MeanIoU::get_config() const { return metric_config(*this, options_, mean_iou_fields()); }

}  // namespace kiln::metrics
