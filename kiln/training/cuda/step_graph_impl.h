// CapturedTrainStep's device part: kiln/training/cuda/step_graph_cuda.cc in
// builds with the CUDA path (KILN_CUDA), step_graph_none.cc otherwise
// (CMakeLists.txt picks one). Private to kiln/training.
#pragma once

#include <memory>
#include <string>

#include "kiln/training/step_graph.h"

namespace kiln {

struct CapturedTrainStep::Impl {
  // nullptr where this build cannot capture.
  static std::unique_ptr<Impl> create(const at::Device& device);
  virtual ~Impl() = default;
  // One step: replayed when captured for s's shapes, captured once warm,
  // else eager. A failed capture sets `reason` (then every step is eager).
  virtual void run(TrainState& ts, StepData& s, std::string& reason, int64_t& replays) = 0;
};

}  // namespace kiln
