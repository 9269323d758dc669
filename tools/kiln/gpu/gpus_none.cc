// `kiln show --system`'s GPU lines in a build without kiln's CUDA path.
#include <ostream>

#include "tools/kiln/gpu/gpus.h"

namespace kiln::cli {

void print_gpus(std::ostream& os) {
  os << "GPUs: not supported by this build (built without KILN_CUDA: a CPU LibTorch or no nvcc); kiln computes on "
        "the CPU\n";
}

}  // namespace kiln::cli
