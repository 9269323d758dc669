#include "kiln/layers/regularizers.h"

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"

namespace kiln {

Regularizer::Regularizer(double l1, double l2) : l1_(l1), l2_(l2) {
  if (l1 < 0 || l2 < 0)
    throw ValueError("regularization factors must be >= 0. Received: l1=" + std::to_string(l1) +
                     ", l2=" + std::to_string(l2));
}

at::Tensor Regularizer::operator()(const at::Tensor& w) const {
  auto wf = w.to(at::kFloat);
  at::Tensor p = at::zeros({}, wf.options());
  if (l1_ > 0) p = p + l1_ * wf.abs().sum();
  if (l2_ > 0) p = p + l2_ * wf.square().sum();
  return p;
}

Json Regularizer::to_json() const {
  if (l1_ > 0 && l2_ == 0) return Json{{"class_name", "L1"}, {"config", {{"l1", l1_}}}};
  if (l2_ > 0 && l1_ == 0) return Json{{"class_name", "L2"}, {"config", {{"l2", l2_}}}};
  return Json{{"class_name", "L1L2"}, {"config", {{"l1", l1_}, {"l2", l2_}}}};
}

RegularizerPtr Regularizer::from_json(const Json& j) {
  if (j.is_null()) return nullptr;
  if (j.is_string()) {
    auto n = j.get<std::string>();
    if (n.empty()) return nullptr;
    if (n == "l1" || n == "L1") return ::kiln::l1();
    if (n == "l2" || n == "L2") return ::kiln::l2();
    if (n == "l1_l2" || n == "L1L2") return l1_l2();
    throw ValueError("unknown regularizer '" + n + "'; expected l1, l2 or l1_l2");
  }
  if (!j.is_object() || !j.contains("class_name"))
    throw ValueError("regularizer must be a name or {\"class_name\", \"config\"}. Received: " + json_excerpt(j));
  auto cls = j["class_name"].get<std::string>();
  auto cfg = j.value("config", Json::object());
  if (cls == "L1") return ::kiln::l1(get_or<double>(cfg, "l1", 0.01));
  if (cls == "L2") return ::kiln::l2(get_or<double>(cfg, "l2", 0.01));
  if (cls == "L1L2") return l1_l2(get_or<double>(cfg, "l1", 0.0), get_or<double>(cfg, "l2", 0.0));
  throw ValueError("unknown regularizer class '" + cls + "'; expected L1, L2 or L1L2");
}

RegularizerPtr l1(double f) { return std::make_shared<Regularizer>(f, 0.0); }
RegularizerPtr l2(double f) { return std::make_shared<Regularizer>(0.0, f); }
RegularizerPtr l1_l2(double a, double b) { return std::make_shared<Regularizer>(a, b); }

}  // namespace kiln
