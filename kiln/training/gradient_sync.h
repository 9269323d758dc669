// Gradient synchronization for data-parallel fit() (kiln/distribute's
// DataParallel): while a ReplicaGradientSync lives, the train step's
// backward and reduce_gradients stages are replaced.
//
// As PyTorch DDP's reducer: the trainable variables are packed, in reverse
// order (the order backward produces their gradients), into flat float32
// buckets of Distribution::gradient_sync().bucket_bytes; a hook on each
// variable copies its gradient into its bucket the moment autograd computes
// it, and a full bucket's all-reduce starts at once (buckets start in index
// order, the same on every replica), so communication overlaps the rest of
// the backward pass. reduce_gradients waits for the buckets and hands the
// optimizer views into them.
//
// Each replica's gradient is weighted by its share of the global batch
// (rows here / rows in the global batch) before the sum, so the result is
// the gradient of the global batch's mean loss whatever the split.
// A variable without a gradient on a replica contributes zeros.
//
// With gradient_accumulation_steps = K on the optimizer, the K-1 steps that
// only accumulate are not synchronized; on the applying step the
// optimizer's accumulators are summed across replicas with the gradients.
#pragma once

#include <memory>
#include <vector>

#include "kiln/core/variable.h"

namespace kiln {

class TrainState;

class ReplicaGradientSync {
 public:
  ReplicaGradientSync(TrainState& ts, std::vector<VariablePtr> variables, std::shared_ptr<Distribution> dist);
  ~ReplicaGradientSync();  // puts the previous stages back, removes the hooks
  ReplicaGradientSync(const ReplicaGradientSync&) = delete;
  ReplicaGradientSync& operator=(const ReplicaGradientSync&) = delete;

  struct State;

 private:
  TrainState& ts_;
  std::shared_ptr<State> st_;
};

}  // namespace kiln
