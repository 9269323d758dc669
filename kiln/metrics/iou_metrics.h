// Keras 3's MeanIoU: a (num_classes x num_classes) confusion matrix (rows:
// true class, columns: predicted class) accumulated over batches, weighted
// by sample_weight; result() = mean over classes that occur (in y_true or
// y_pred) of tp / (tp + fp + fn):
//   iou_c = cm[c,c] / (row_c + col_c - cm[c,c] + eps), counted where
//   row_c + col_c - cm[c,c] > 1e-9; result = sum(iou) / (count + eps).
// Inputs of any shape are flattened. By default both y_true and y_pred hold
// class ids (sparse_y_true / sparse_y_pred true); set either to false to take
// the argmax over `axis` of one-hot labels or scores. Entries whose true
// class is ignore_class count for nothing.
#pragma once

#include <optional>

#include "kiln/metrics/metric.h"

namespace kiln::metrics {

class MeanIoU : public Metric {
 public:
  // num_classes > 0 (ValueError otherwise).
  explicit MeanIoU(int64_t num_classes, std::optional<int64_t> ignore_class = std::nullopt, bool sparse_y_true = true,
                   bool sparse_y_pred = true, int64_t axis = -1, std::string name = "mean_iou");
  // Keys: num_classes (required), ignore_class, sparse_y_true,
  // sparse_y_pred, axis, name.
  static std::shared_ptr<MeanIoU> from_config(const Json& config);

  // ValueError for a class id outside [0, num_classes) (other than
  // ignore_class); ShapeError when y_true, y_pred and sample_weight do not
  // flatten to the same length.
  void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                    const at::Tensor& sample_weight = at::Tensor()) override;
  double result() const override;
  void reset_state() override { total_cm_.zero_(); }
  std::vector<at::Tensor> variables() const override { return {total_cm_}; }
  std::string class_name() const override { return "MeanIoU"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }
  const at::Tensor& confusion_matrix() const { return total_cm_; }

  struct Options {  // the config's keys besides name
    int64_t num_classes = 0;
    std::optional<int64_t> ignore_class;
    bool sparse_y_true = true;
    bool sparse_y_pred = true;
    int64_t axis = -1;
  };

 private:
  Options options_;
  at::Tensor total_cm_;  // float64 CPU (num_classes, num_classes)
};

}  // namespace kiln::metrics
