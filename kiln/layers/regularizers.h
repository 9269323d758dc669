// Weight regularizers with Keras's names: l1, l2, l1_l2 (L1L2).
// penalty(w) = l1 * sum(|w|) + l2 * sum(w^2), added to the training loss.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "kiln/core/json.h"

namespace kiln {

class Regularizer {
 public:
  Regularizer(double l1, double l2);
  at::Tensor operator()(const at::Tensor& w) const;
  double l1() const { return l1_; }
  double l2() const { return l2_; }
  // {"class_name": "L2", "config": {"l2": 0.01}}
  Json to_json() const;
  // "l1", "l2" (Keras default factor 0.01), "l1_l2", or the JSON above;
  // null/"" gives nullptr.
  static std::shared_ptr<Regularizer> from_json(const Json& j);

 private:
  double l1_, l2_;
};

using RegularizerPtr = std::shared_ptr<Regularizer>;

RegularizerPtr l1(double factor = 0.01);
RegularizerPtr l2(double factor = 0.01);
RegularizerPtr l1_l2(double l1 = 0.01, double l2 = 0.01);

}  // namespace kiln
