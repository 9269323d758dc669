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
//
// Sharded optimizer state (gradient_sync().zero_stage, ZeRO):
//   - the variables are split across the replicas by whole variable,
//     greedily by size (largest first, each to the replica with the fewest
//     bytes so far, ties to the lower rank; as PyTorch's
//     ZeroRedundancyOptimizer), the same on every replica;
//   - the optimizer gets an ownership filter (Optimizer::set_ownership):
//     each replica updates only the variables it owns and holds only their
//     slots and moving averages; the apply_gradients stage then broadcasts
//     each replica's new values from it to all (on applying steps, and on
//     every step with use_ema, whose overwrite may land on any step);
//   - stage 1 all-reduces the gradients as stage 0; stage 2 packs each
//     bucket with one owner's variables and reduces it to that owner only
//     (Distribution::reduce_sum_async); the other replicas free the bucket
//     once it is sent, so between steps a replica holds only its own
//     variables' gradient buckets. The optimizer's gradient accumulators
//     stay whole on every replica (they hold local, unreduced sums);
//   - checkpoints: TrainState::with_full_optimizer_state gathers the owners'
//     slots to the chief around a save; finish() (end of fit) gathers the
//     whole state to the chief and removes the filter everywhere, so after
//     fit() the chief's optimizer is as with stage 0 (what Model::save
//     writes) while the other replicas keep only their own slots (a whole
//     copy on each would undo the saving). When fit() starts, each replica
//     takes its variables' slots and averages from the chief (as the
//     weights), so another partition in a later fit() (other trainable
//     variables) or a restored checkpoint leaves each with exactly its own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/core/variable.h"

namespace kiln {

class TrainState;

// The buckets' plan (what ReplicaGradientSync builds, every replica alike):
// variable k's gradient goes to bucket `bucket[k]` at element `offset[k]`.
// Variables are taken in reverse order (the order backward produces their
// gradients); a bucket is closed when the next variable would take it past
// `bucket_bytes` (4 bytes an element; a larger variable gets a bucket of
// its own). With `owner` (ZeRO stage 2: each variable's owning replica) one
// bucket is open per owner, so every bucket has one owner (`root`); else
// root is -1 (all-reduced). Buckets launch in index order.
struct BucketPlan {
  std::vector<size_t> bucket;
  std::vector<int64_t> offset;
  std::vector<int64_t> bucket_numel;  // by bucket
  std::vector<int> root;              // by bucket
};
BucketPlan plan_gradient_buckets(const std::vector<int64_t>& numels, int64_t bucket_bytes,
                                 const std::vector<int>& owner = {}, int world = 1);

class ReplicaGradientSync {
 public:
  ReplicaGradientSync(TrainState& ts, std::vector<VariablePtr> variables, std::shared_ptr<Distribution> dist);
  ~ReplicaGradientSync();  // puts the previous stages back, removes the hooks and the ownership filter
  ReplicaGradientSync(const ReplicaGradientSync&) = delete;
  ReplicaGradientSync& operator=(const ReplicaGradientSync&) = delete;

  // The optimizer's finalize_variable_values; with ZeRO the owners then
  // broadcast the finalized values (a collective).
  void finalize_variable_values(const std::vector<VariablePtr>& vars);
  // ZeRO: the chief gets the whole optimizer state and the filter goes on
  // every replica (a collective, at the end of fit()); the others keep
  // their own slots only. Nothing otherwise.
  void finish();

  struct State;

 private:
  TrainState& ts_;
  std::shared_ptr<State> st_;
};

}  // namespace kiln
