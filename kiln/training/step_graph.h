// jit_compile on a GPU: the train step captured once in a CUDA graph and
// replayed (CompileArgs::jit_compile; Keras's jit_compile=True is the
// user-facing analogue, XLA's compilation there).
//
// What is captured: the forward pass, the loss, the backward pass and the
// metric updates, for one set of input shapes, after two eager warm-up
// steps (lazy initialisation stays out of the capture). Each later batch of
// those shapes is copied into the graph's input buffers and the graph is
// replayed: one launch instead of one per operation, which is what a
// small-batch step is bound by. The optimizer's update runs after the
// replay as in every step (the fused Adam is one launch): learning-rate
// schedules, gradient accumulation and the iteration count behave as
// without capture.
//
// When it runs eagerly instead (said once, by warn()): on the CPU; in a
// build without the CUDA path; under a distribution (data or model
// parallel, parameter servers: their collectives run inside the backward
// pass); with a LossScaleOptimizer (mixed_float16: the scale is a host
// value); for batches of other shapes than the captured ones (the last,
// smaller batch of an epoch); and when the capture itself fails (an
// operation that reads a value on the host, such as MeanIoU's class-id
// check), with CUDA's reason. Every step, captured or not, computes the same
// values as an eager one, up to the order of floating-point sums.
//
// Thread safety: one fit() loop owns each.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "kiln/training/train_state.h"

namespace kiln {

class CapturedTrainStep {
 public:
  // Whether this build has the CUDA path that captures.
  static bool available();
  // For the train steps of `ts` on `device`. Says once (warn) why it will
  // run every step eagerly, if it will.
  CapturedTrainStep(TrainState& ts, const at::Device& device);
  ~CapturedTrainStep();
  // One train step on `s` (TrainState::train_step's contract).
  void run(StepData& s);
  // Why steps run eagerly ("" while capture works).
  const std::string& eager_reason() const { return reason_; }
  // Steps replayed from the graph so far.
  int64_t replays() const { return replays_; }

  struct Impl;  // the device part (kiln/training/cuda/step_graph_impl.h)

 private:
  std::unique_ptr<Impl> impl_;
  TrainState& ts_;
  std::string reason_;
  int64_t replays_ = 0;
};

}  // namespace kiln
