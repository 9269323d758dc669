// The GPU part of `kiln show --system`: gpus_cuda.cc in a build with
// kiln's CUDA path, gpus_none.cc otherwise (CMake picks one).
#pragma once

#include <ostream>

namespace kiln::cli {

// The GPUs (name, memory, compute capability), the CUDA runtime, driver and
// cuDNN versions, and the default device; one line when there are none.
void print_gpus(std::ostream& os);

}  // namespace kiln::cli
