#include "kiln/losses/hinge.h"

#include "kiln/core/error.h"
#include "kiln/losses/loss_fields.h"

namespace kiln::losses {
namespace {

// max(1 - y_true * y_pred, 0) after rank reconciliation and the {0, 1} ->
// {-1, 1} label mapping.
at::Tensor margin(const at::Tensor& y_true_in, const at::Tensor& y_pred_in, const std::string& owner) {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor y_true = y_true_in.to(y_pred.device(), at::kFloat);
  squeeze_or_expand_to_same_rank(y_true, y_pred);
  check_broadcastable(y_true, y_pred, owner + ": y_true and y_pred");
  if (((y_true == 0) | (y_true == 1)).all().item<bool>()) y_true = 2.0 * y_true - 1.0;
  return (1.0 - y_true * y_pred).clamp_min(0.0);
}

at::Tensor hinge_mean(const at::Tensor& t) { return t.dim() == 0 ? t : t.mean(-1); }

}  // namespace

Hinge::Hinge(std::string reduction, std::string name) : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<Hinge> Hinge::from_config(const Json& c) { return plain_loss_from_config<Hinge>(c); }

at::Tensor Hinge::call(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  return hinge_mean(margin(y_true, y_pred, class_name()));
}

SquaredHinge::SquaredHinge(std::string reduction, std::string name) : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<SquaredHinge> SquaredHinge::from_config(const Json& c) {
  return plain_loss_from_config<SquaredHinge>(c);
}

at::Tensor SquaredHinge::call(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  return hinge_mean(margin(y_true, y_pred, class_name()).square());
}

}  // namespace kiln::losses
