#include "kiln/training/step_graph.h"

#include "kiln/core/variable.h"
#include "kiln/optimizers/loss_scale_optimizer.h"
#include "kiln/training/callback.h"
#include "kiln/training/cuda/step_graph_impl.h"

namespace kiln {

CapturedTrainStep::CapturedTrainStep(TrainState& ts, const at::Device& device) : ts_(ts) {
  if (!device.is_cuda())
    reason_ = "CUDA graphs need a GPU; the model computes on " + device.str();
  else if (!available())
    reason_ = "this build of kiln has no CUDA path (configure with KILN_CUDA=ON where nvcc is installed)";
  else if (distribution())
    reason_ = "a distribution is set (its collectives run inside the backward pass)";
  else if (dynamic_cast<LossScaleOptimizer*>(&ts.optimizer()))
    reason_ = "a LossScaleOptimizer scales the loss by a value the host decides each step";
  if (reason_.empty()) impl_ = Impl::create(device);
  if (!reason_.empty()) warn("jit_compile: the train step runs eagerly: " + reason_);
}

CapturedTrainStep::~CapturedTrainStep() = default;

void CapturedTrainStep::run(StepData& s) {
  if (!impl_ || !reason_.empty()) return ts_.train_step(s);
  const bool was_capturing = reason_.empty();
  impl_->run(ts_, s, reason_, replays_);
  if (was_capturing && !reason_.empty()) warn("jit_compile: " + reason_);
}

}  // namespace kiln
