// A build without the CUDA path: jit_compile runs every step eagerly.
#include "kiln/training/cuda/step_graph_impl.h"

namespace kiln {

bool CapturedTrainStep::available() { return false; }

std::unique_ptr<CapturedTrainStep::Impl> CapturedTrainStep::Impl::create(const at::Device&) { return nullptr; }

}  // namespace kiln
